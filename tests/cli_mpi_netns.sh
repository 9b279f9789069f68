#!/usr/bin/env bash
# cli_mpi_netns.sh — crew across two hosts: two ranks in two network namespaces joined by a veth
# pair (tests/netns_hosts.sh), talking over Open MPI's TCP transport only, with mpirun launching
# the second host's daemon through a script that enters its namespace instead of ssh. The run
# must end with weights bitwise equal to the same run on two threads of one process, and rank 0's
# run directory must hold every replica's timings; a 2-stage pipeline with a stage on each host
# must end as the same pipeline on two threads. Skipped (77) without MPI or without the right
# to make network namespaces (not root, or no netns support).
. "$(dirname "$0")/lib_cli.sh"
. "$(dirname "$0")/netns_hosts.sh"
need_fashion

"$CREW" --version | grep -q '^MPI: Open MPI' || { echo "skipped: this crew was built without Open MPI"; exit 77; }
command -v mpirun > /dev/null || { echo "skipped: no mpirun"; exit 77; }
P=crmn$$
netns_up "$P" || { echo "skipped: no network namespaces"; exit 77; }
trap 'netns_down "$P"' EXIT

CREW_ABS=$(readlink -f "$CREW")
DATA_ABS=$(readlink -f "$DATA")
MODEL=$(readlink -f examples/fashion_cnn.json)
COMMON=(--data "$DATA_ABS" --max-steps 16 --batch-per-device 8 --drift-check-every 4 --quiet)

"$CREW" train "$MODEL" "${COMMON[@]}" --devices cpu:2 --run-dir "$TMP/threads" > /dev/null || fail "two threads"
NETNS_MPI_TIMEOUT=300 netns_mpirun "$P" 1 -- "$CREW_ABS" train "$MODEL" "${COMMON[@]}" --run-dir "$TMP/hosts" \
  > "$TMP/hosts.out" 2>&1 || fail "two hosts: $(tail -n 5 "$TMP/hosts.out")"
cmp -s "$TMP/threads/weights.safetensors" "$TMP/hosts/weights.safetensors" && ok \
  || fail "two hosts: weights differ from two threads of one process"
# Two host names (netns_agent.sh): the planner's buckets for a network, several of them, on a
# communication thread each; the weights above show they leave the bits alone.
grep -A3 '"gradient_buckets"' "$TMP/hosts/config.json" | grep -q '"rule":[[:space:]]*"hosts"' && ok \
  || fail "two hosts: config.json's gradient buckets are not the planner's for several hosts"
grep -A1 '"gradient_buckets"' "$TMP/hosts/config.json" | grep -Eq '"count":[[:space:]]*(1[0-9]|[2-9])' && ok \
  || fail "two hosts: fewer than 2 gradient buckets"
n=$(grep -m1 '"type":"step"' "$TMP/hosts/metrics.jsonl" 2> /dev/null | grep -o '"rank":' | wc -l)
[ "$n" = 2 ] && ok || fail "two hosts: a step record holds $n replicas' timings, not 2"
# A pipeline with a stage on each host: the activations and their gradients cross the veth.
"$CREW" train "$MODEL" "${COMMON[@]}" --devices cpu:2 --pipeline 2 --run-dir "$TMP/pipe-threads" > /dev/null   || fail "a pipeline as two threads"
NETNS_MPI_TIMEOUT=300 netns_mpirun "$P" 1 -- "$CREW_ABS" train "$MODEL" "${COMMON[@]}" --devices cpu:1 --pipeline 2   --run-dir "$TMP/pipe-hosts" > "$TMP/pipe-hosts.out" 2>&1 || fail "a pipeline on two hosts: $(tail -n 5 "$TMP/pipe-hosts.out")"
cmp -s "$TMP/pipe-threads/weights.safetensors" "$TMP/pipe-hosts/weights.safetensors" && ok   || fail "a pipeline on two hosts: weights differ from the same pipeline as two threads"
report
