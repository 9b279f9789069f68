#!/usr/bin/env bash
# netns_agent.sh — Open MPI's remote-launch agent (plm_rsh_agent) for netns_hosts.sh. mpirun runs it
# as `AGENT [ssh-like options] HOST WORD...`; it runs the WORDs, joined by spaces as ssh would send
# them to a remote shell, through sh -c inside the namespace that is HOST, under a host name of its own.
# NETNS_PREFIX (exported by netns_mpirun) names the namespaces. NETNS_AGENT_LOG=FILE logs each call.
# Open MPI 4.1 calls it as `AGENT 10.213.0.2 "" orted --daemonize -mca ...` (an empty word where a
# PATH/LD_LIBRARY_PATH prefix goes), with -x before the host when the agent's name is ssh.
set -eu
[ -z "${NETNS_AGENT_LOG:-}" ] || printf "%s\n" "$# args: $*" >> "$NETNS_AGENT_LOG"
p=${NETNS_PREFIX:?netns_agent.sh: NETNS_PREFIX is unset (run through netns_mpirun)}
while [ $# -gt 0 ]; do              # skip options an ssh-minded caller may add (-x, -T, -o X, ...)
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;   # ssh options that take an argument
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "netns_agent.sh: usage: HOST COMMAND..." >&2; exit 255; }
case $1 in
  10.213.0.1) ns=${p}a ;;
  10.213.0.2) ns=${p}b ;;
  *) echo "netns_agent.sh: unknown host $1" >&2; exit 255 ;;
esac
shift
# A host name of its own too (a UTS namespace: MPI_Get_processor_name), as a second machine has:
# crew plans for processes on several hosts by their names.
exec ip netns exec "$ns" unshare --uts sh -c "echo $ns > /proc/sys/kernel/hostname && $*"
