#!/usr/bin/env bash
# cli_mpi.sh — crew train under mpirun, on one machine (tests/cli_mpi_netns.sh: across two hosts):
# - 2, 3 and 4 processes, and 2 processes x 2 threads, end with weights bitwise equal to one
#   replica accumulating the same micro-batches, and to the same number of threads in one process;
# - a run killed mid-way on 4 processes, resumed on 1 process, killed again and resumed on
#   2 processes x 2 threads, ends bitwise equal to the uninterrupted run;
# - a process stopped for good (SIGSTOP) is named within the collective deadline, the run exits 1
#   and its checkpoints stay usable;
# - a run's settings kept by its checkpoint (--augment) reach every process of a resume;
# - processes that disagree on the model file are refused with exit 2, naming the rank;
# - only rank 0 writes the run directory.
# Skipped (77) when this crew was built without MPI or mpirun is missing.
. "$(dirname "$0")/lib_cli.sh"
need_fashion

"$CREW" --version | grep -q '^MPI: Open MPI\|^MPI: MPICH' || { echo "skipped: this crew was built without MPI"; exit 77; }
command -v mpirun > /dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # CI runs as root
# --oversubscribe: 4 processes on a 2-core machine; --bind-to none: no process pinned to a core
# another already has. timeout: a hang fails the test instead of holding it.
MPIRUN=(timeout -k 5 300 mpirun --oversubscribe --bind-to none)

MODEL=examples/fashion_cnn.json
# Weights files are compared whole: runs of the same steps write the same bytes, metadata included.
COMMON=(--data "$DATA" --max-steps 12 --batch-per-device 8 --global-batch 96 --drift-check-every 3 --quiet)
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:1 --run-dir "$TMP/one" > /dev/null || fail "one replica accumulating"
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:4 --run-dir "$TMP/four" > /dev/null || fail "four threads"

for np in 2 3 4; do
  "${MPIRUN[@]}" -np $np "$CREW" train $MODEL "${COMMON[@]}" --run-dir "$TMP/mpi$np" > "$TMP/mpi$np.out" 2>&1 \
    || fail "mpirun -np $np: $(tail -n 3 "$TMP/mpi$np.out")"
  cmp -s "$TMP/one/weights.safetensors" "$TMP/mpi$np/weights.safetensors" && ok \
    || fail "mpirun -np $np: weights differ from one replica accumulating"
done
"${MPIRUN[@]}" -np 2 "$CREW" train $MODEL "${COMMON[@]}" --devices cpu:2 --run-dir "$TMP/mpi2x2" > "$TMP/mpi2x2.out" 2>&1 \
  || fail "mpirun -np 2 --devices cpu:2: $(tail -n 3 "$TMP/mpi2x2.out")"
cmp -s "$TMP/four/weights.safetensors" "$TMP/mpi2x2/weights.safetensors" && ok \
  || fail "2 processes x 2 threads: weights differ from 4 threads"
cmp -s "$TMP/one/weights.safetensors" "$TMP/four/weights.safetensors" && ok \
  || fail "4 threads: weights differ from one replica accumulating"

# One record, rank 0's: every replica's timings in each step line, and nothing written by others.
n_replicas=$(grep -m1 '"type":"step"' "$TMP/mpi4/metrics.jsonl" | grep -o '"rank":' | wc -l)
[ "$n_replicas" = 4 ] && ok || fail "-np 4: a step record holds $n_replicas replicas' timings, not 4"
grep -q '"devices":4' "$TMP/mpi4/metrics.jsonl" && ok || fail "-np 4: the run record does not say 4 devices"
[ -f "$TMP/mpi4/report.html" ] && [ -f "$TMP/mpi4/config.json" ] && ok || fail "-np 4: no report or config"

# ---- resume across process counts: 4 processes -> 1 process -> 2 processes x 2 threads
LONG=(--data "$DATA" --max-steps 24 --batch-per-device 8 --global-batch 32 --checkpoint-every 4 --quiet)
"$CREW" train $MODEL "${LONG[@]}" --devices cpu:1 --run-dir "$TMP/ref" > /dev/null || fail "the uninterrupted run"

newest_checkpoint() {
  local newest; newest=$(ls "$1/checkpoints" 2> /dev/null | grep -x 'step-[0-9]\{8\}' | sort | tail -n 1)
  [ -n "$newest" ] && echo $((10#${newest#step-})) || echo 0
}
# start_and_kill DIR K CMD...: runs CMD in the background and, once DIR holds a checkpoint of step
# K or later, kills every process of it with SIGKILL (a crash: nothing gets to clean up).
start_and_kill() {
  local dir=$1 at=$2 polls=0 pid
  shift 2
  "$@" > "$TMP/attempt.out" 2>&1 &
  pid=$!
  while [ "$(newest_checkpoint "$dir")" -lt "$at" ] && kill -0 $pid 2> /dev/null && [ $polls -lt 30000 ]; do
    sleep 0.01; polls=$((polls + 1))
  done
  pkill -KILL -P $pid 2> /dev/null # mpirun's children, the crew processes
  pkill -KILL -f "crew train $MODEL .*--run-dir $dir" 2> /dev/null
  kill -KILL $pid 2> /dev/null
  wait $pid 2> /dev/null
  [ "$(newest_checkpoint "$dir")" -ge "$at" ] || fail "$dir: no checkpoint of step $at before the kill: $(tail -n 3 "$TMP/attempt.out")"
  [ ! -f "$dir/weights.safetensors" ] || fail "$dir: the kill at step $at came after the end of the run"
}
R="$TMP/resumed"
start_and_kill "$R" 8 "${MPIRUN[@]}" -np 4 "$CREW" train $MODEL "${LONG[@]}" --run-dir "$R"
start_and_kill "$R" 16 "$CREW" train $MODEL "${LONG[@]}" --devices cpu:1 --resume "$R"
"${MPIRUN[@]}" -np 2 "$CREW" train $MODEL "${LONG[@]}" --devices cpu:2 --resume "$R" > "$TMP/last.out" 2>&1 \
  || fail "the resume on 2 processes x 2 threads: $(tail -n 3 "$TMP/last.out")"
cmp -s "$TMP/ref/weights.safetensors" "$R/weights.safetensors" && ok \
  || fail "4 processes -> 1 process -> 2 x 2: weights differ from the uninterrupted run"

# ---- settings that come back from the checkpoint reach every process: a run with --augment,
# killed, resumed under mpirun without the flag, equals the uninterrupted run
AUG=(--data "$DATA" --max-steps 24 --batch-per-device 8 --global-batch 16 --checkpoint-every 4 --quiet)
"$CREW" train $MODEL "${AUG[@]}" --augment crop=2,flip --devices cpu:1 --run-dir "$TMP/aug-ref" > /dev/null || fail "augmented run"
A="$TMP/aug"
start_and_kill "$A" 8 "${MPIRUN[@]}" -np 2 "$CREW" train $MODEL "${AUG[@]}" --augment crop=2,flip --run-dir "$A"
"${MPIRUN[@]}" -np 2 "$CREW" train $MODEL --data "$DATA" --quiet --resume "$A" > "$TMP/aug.out" 2>&1 \
  || fail "the augmented run's resume: $(tail -n 3 "$TMP/aug.out")"
cmp -s "$TMP/aug-ref/weights.safetensors" "$A/weights.safetensors" && ok \
  || fail "an augmented run resumed under mpirun without --augment differs from the uninterrupted run"

# ---- a process stopped for good is named within the deadline; the checkpoints stay usable
S="$TMP/stopped"
"${MPIRUN[@]}" -np 2 "$CREW" train $MODEL --data "$DATA" --max-steps 300 --batch-per-device 8 --checkpoint-every 2 \
  --collective-timeout 3 --quiet --run-dir "$S" > "$TMP/stop.out" 2>&1 &
pid=$!
polls=0
while [ "$(newest_checkpoint "$S")" -lt 4 ] && [ $polls -lt 30000 ]; do sleep 0.01; polls=$((polls + 1)); done
stopped=""
for p in $(pgrep -f "crew train $MODEL .*--run-dir $S"); do
  tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && { kill -STOP "$p"; stopped=$p; }
done
[ -n "$stopped" ] || fail "no process of rank 1 found to stop"
# The deadline is 3 s; 60 s is a bound no loaded machine comes near, and never a hang.
for _ in $(seq 600); do kill -0 $pid 2> /dev/null || break; sleep 0.1; done
if kill -0 $pid 2> /dev/null; then
  fail "a stopped rank held the run for 60 s"; pkill -KILL -P $pid; kill -KILL $pid
fi
wait $pid; rc=$?
[ $rc = 1 ] && ok || fail "a stopped rank: exit $rc, not 1: $(tail -n 3 "$TMP/stop.out")"
grep -q "MPI rank 1 (host [^,]*, replica 1) did not answer within 3 s" "$TMP/stop.out" && ok \
  || fail "a stopped rank is not named: $(head -n 3 "$TMP/stop.out")"
[ -n "$stopped" ] && kill -KILL "$stopped" 2> /dev/null
"$CREW" train $MODEL --data "$DATA" --devices cpu:2 --quiet --resume "$S" > "$TMP/stop-resume.out" 2>&1 \
  && [ -f "$S/weights.safetensors" ] && ok || fail "the stopped run could not be resumed: $(tail -n 2 "$TMP/stop-resume.out")"

# ---- processes that disagree are refused before anything is written
"${MPIRUN[@]}" -np 1 "$CREW" train examples/fashion_mlp.json --data "$DATA" --max-steps 2 --run-dir "$TMP/mixed" : \
  -np 1 "$CREW" train $MODEL --data "$DATA" --max-steps 2 --run-dir "$TMP/mixed" > "$TMP/mixed.out" 2>&1
rc=$?
[ $rc = 2 ] && ok || fail "different model files: exit $rc, not 2"
grep -q "MPI rank 1 (host [^)]*) differs from rank 0 in the model file" "$TMP/mixed.out" && ok \
  || fail "different model files: $(head -n 2 "$TMP/mixed.out")"
[ ! -e "$TMP/mixed" ] && ok || fail "different model files: the run directory was made"

report
