# shellcheck shell=bash
# netns_hosts.sh — two "hosts" for MPI tests, made of network namespaces ${PREFIX}a (10.213.0.1)
# and ${PREFIX}b (10.213.0.2) joined by a veth pair, and an mpirun across them over Open MPI's TCP
# transport (sourced, not run). Needs root (ip netns). Usage:
#   netns_up P || { echo "skipped: no network namespaces"; exit 77; }
#   trap 'netns_down P' EXIT
#   NETNS_MPI_ENV="OMP_NUM_THREADS CREW_SEED" netns_mpirun P 1 -- ./prog args...
NETNS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NETNS_ADDR_A=10.213.0.1
NETNS_ADDR_B=10.213.0.2
NETNS_NET=10.213.0.0/24

# netns_veth PREFIX: the stem of the pair's names (then "a" and "b"), unique to PREFIX and within
# IFNAMSIZ (15 chars). The ends are made inside the namespaces, so they never meet the root's names.
netns_veth() { printf 'cv%08x' "$(printf %s "$1" | cksum | cut -d' ' -f1)"; }

# netns_up PREFIX: makes both namespaces and the link, lo and veth up. Non-zero, leaving nothing
# behind, when that cannot be done (no root, no netns support, or the names are already taken).
netns_up() {
  local p=$1 v; v=$(netns_veth "$1")
  command -v ip > /dev/null || return 1
  ip netns add "${p}a" 2> /dev/null || return 1         # not made by us: leave it alone
  if ! ip netns add "${p}b" 2> /dev/null; then ip netns del "${p}a"; return 1; fi
  if ! { ip -n "${p}a" link add "${v}a" type veth peer name "${v}b" netns "${p}b" &&
         ip -n "${p}a" addr add "$NETNS_ADDR_A/24" dev "${v}a" &&
         ip -n "${p}b" addr add "$NETNS_ADDR_B/24" dev "${v}b" &&
         ip -n "${p}a" link set lo up && ip -n "${p}a" link set "${v}a" up &&
         ip -n "${p}b" link set lo up && ip -n "${p}b" link set "${v}b" up; }; then
    netns_down "$p"; return 1
  fi
}

# netns_down PREFIX: kills what still runs in the namespaces (a hung orted would keep one alive
# after its name is gone), then deletes them, which deletes the veth pair. Idempotent.
netns_down() {
  local ns pid
  for ns in "${1}a" "${1}b"; do
    for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -9 "$pid" 2> /dev/null || true; done
    ip netns del "$ns" 2> /dev/null || true
  done
}

# netns_mpirun PREFIX NP_PER_HOST -- CMD ARGS...: mpirun inside ${PREFIX}a with NP_PER_HOST ranks on
# each host (ranks 0..N-1 on a, N..2N-1 on b), under timeout ${NETNS_MPI_TIMEOUT:-60} seconds.
# PATH, LD_LIBRARY_PATH and the variables named in NETNS_MPI_ENV that are set reach the ranks.
netns_mpirun() {
  local p=$1 n=$2 v; shift 2; [ "${1:-}" = -- ] && shift
  local args=(
    --allow-run-as-root --oversubscribe
    --host "$NETNS_ADDR_A:$n,$NETNS_ADDR_B:$n" -np $((2 * n)) --map-by slot
    # Both "hosts" see the same cores: default core binding pins each host's first rank to core 0.
    --bind-to none
    # Launch b's orted with our agent, never ssh. 10.213.0.1 needs no agent: it is an address of
    # ns a, so mpirun takes it for its own node.
    --mca plm rsh --mca plm_rsh_agent "$NETNS_DIR/netns_agent.sh"
    # b's orted must not launch further daemons itself (tree spawn): only mpirun knows the agent.
    --mca plm_rsh_no_tree_spawn 1
    # orted in b calls back mpirun's oob port on 10.213.0.1: keep oob off lo (and anything else).
    --mca oob_tcp_if_include "$NETNS_NET"
    # ob1 over tcp,self only: pml ucx or btl vader would move messages through shared memory
    # (/dev/shm is common to both namespaces), never over the veth.
    --mca pml ob1 --mca btl "tcp,self" --mca btl_tcp_if_include "$NETNS_NET"
    # osc ucx would still initialise UCX (and warn) with pml ob1.
    --mca osc ^ucx)
  for v in PATH LD_LIBRARY_PATH ${NETNS_MPI_ENV:-}; do [ -n "${!v+set}" ] && args+=(-x "$v"); done
  # NETNS_PREFIX tells netns_agent.sh (a child of mpirun) which namespaces the hosts are.
  # timeout -k: mpirun may sit out the first TERM while it waits on a lost daemon.
  NETNS_PREFIX=$p OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout -k 5 "${NETNS_MPI_TIMEOUT:-60}" ip netns exec "${p}a" mpirun "${args[@]}" "$@" < /dev/null
}
