#!/usr/bin/env bash
# cli_mpi.sh — crew train under mpirun, on one machine (tests/cli_mpi_netns.sh: across two hosts):
# - 2, 3 and 4 processes, and 2 processes x 2 threads, end with weights bitwise equal to one
#   replica accumulating the same micro-batches, and to the same number of threads in one process;
#   so do 2 processes sharding the optimizer state, the gradients and the parameters (ZeRO-1/2/3);
# - a run killed mid-way on 4 processes, resumed on 1 process, killed again and resumed on
#   2 processes x 2 threads, ends bitwise equal to the uninterrupted run;
# - a process stopped for good (SIGSTOP) is named within the collective deadline, the run exits 1
#   and its checkpoints stay usable; one killed (SIGKILL) is named by mpirun, which ends the job
#   (no hang), and the checkpoints stay usable too;
# - a run's settings kept by its checkpoint (--augment) reach every process of a resume;
# - processes that disagree on the model file are refused with exit 2, naming the rank;
# - only rank 0 writes the run directory;
# - crew verify runs its N replicas across the processes and rank 0 gives the one verdict;
# - pipelines across processes (a replica's stages spread over processes, or whole replicas in
#   each) end with data parallelism's weights, resume from a checkpoint on another layout, refuse
#   layouts that cannot work, and name a stage's process that stops.
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
# Where the batches were prepared, each process by its own cores (its affinity mask, here all of
# the machine's): 2 ranks on 2 cores prepare their own; 1 rank beside a spare core has a loader
# thread. The same weights either way (above).
if [ "$(nproc)" = 2 ]; then
  grep -Eq '"loader":[[:space:]]*"inline"' "$TMP/mpi2x2/config.json" && grep -Eq '"loader":[[:space:]]*"threads"' "$TMP/mpi2/config.json" && ok \
    || fail "2 processes: config.json does not say inline for 2 ranks a process and threads for 1"
fi
# Optimizer sharding across the processes (through the MPI communicator's ordered all-reduce and
# broadcasts): the same weights.
"${MPIRUN[@]}" -np 2 "$CREW" train $MODEL "${COMMON[@]}" --devices cpu:2 --shard-optimizer --run-dir "$TMP/mpi2x2s" \
  > "$TMP/mpi2x2s.out" 2>&1 || fail "mpirun -np 2 --shard-optimizer: $(tail -n 3 "$TMP/mpi2x2s.out")"
cmp -s "$TMP/four/weights.safetensors" "$TMP/mpi2x2s/weights.safetensors" && ok \
  || fail "2 processes x 2 sharded threads: weights differ from 4 threads"
# Gradients and parameters sharded across the processes (ZeRO-2 and 3: each unit reduce-scattered
# and gathered through the MPI communicator), 2 processes of 1 and of 2 threads: the same weights.
for level in gradients parameters; do
  for t in 1 2; do
    "${MPIRUN[@]}" -np 2 "$CREW" train $MODEL "${COMMON[@]}" --devices cpu:$t --shard $level --run-dir "$TMP/mpi2x$t-$level" \
      > "$TMP/mpi2x$t-$level.out" 2>&1 || fail "mpirun -np 2 --devices cpu:$t --shard $level: $(tail -n 3 "$TMP/mpi2x$t-$level.out")"
    cmp -s "$TMP/one/weights.safetensors" "$TMP/mpi2x$t-$level/weights.safetensors" && ok \
      || fail "2 processes x $t threads sharding $level: weights differ from one replica accumulating"
  done
done

# --allreduce fast: MPI's own all-reduce between the processes, and the plan says what that costs.
# With one micro-batch per process, two processes' sum has one order only (a + b = b + a), so here
# the bits are still the ordered run's.
FAST=(--data "$DATA" --max-steps 8 --batch-per-device 8)
"${MPIRUN[@]}" -np 2 "$CREW" train $MODEL "${FAST[@]}" --quiet --run-dir "$TMP/ord2" > /dev/null 2>&1 || fail "ordered"
"${MPIRUN[@]}" -np 2 "$CREW" train $MODEL "${FAST[@]}" --allreduce fast --run-dir "$TMP/fast2" > "$TMP/fast2.out" 2>&1 \
  || fail "--allreduce fast: $(tail -n 3 "$TMP/fast2.out")"
grep -q "all-reduce between the processes: MPI's own (--allreduce fast)" "$TMP/fast2.out" \
  && cmp -s "$TMP/ord2/weights.safetensors" "$TMP/fast2/weights.safetensors" && ok \
  || fail "--allreduce fast on 2 processes: no note in the plan, or other weights than the ordered run"

# One record, rank 0's: every replica's timings in each step line, and nothing written by others.
n_replicas=$(grep -m1 '"type":"step"' "$TMP/mpi4/metrics.jsonl" | grep -o '"rank":' | wc -l)
[ "$n_replicas" = 4 ] && ok || fail "-np 4: a step record holds $n_replicas replicas' timings, not 4"
grep -q '"devices":4' "$TMP/mpi4/metrics.jsonl" && ok || fail "-np 4: the run record does not say 4 devices"
[ -f "$TMP/mpi4/report.html" ] && [ -f "$TMP/mpi4/config.json" ] && ok || fail "-np 4: no report or config"

# ---- crew verify under mpirun: the N-replica side spans the processes, rank 0 alone prints
"${MPIRUN[@]}" -np 2 "$CREW" verify $MODEL --data "$DATA" --devices cpu:2 --steps 4 --batch-per-device 8 --json \
  > "$TMP/verify.out" 2>&1 || fail "verify on 2 processes x 2: $(tail -n 3 "$TMP/verify.out")"
json_field "$TMP/verify.out" devices | grep -qx 4 && json_field "$TMP/verify.out" bitwise_equal | grep -qx true \
  && ok || fail "verify on 2 processes x 2: $(tail -n 1 "$TMP/verify.out")"
[ "$(grep -c '^PASS' "$TMP/verify.out")" = 1 ] && grep -q "on 2 MPI ranks x cpu:2 = 4 replicas" "$TMP/verify.out" && ok \
  || fail "verify under mpirun: not one verdict from rank 0: $(head -n 2 "$TMP/verify.out")"

# ---- crew scale under mpirun: trials of process 0 alone and of both processes, the MPI link
# measured between them, one verdict from rank 0, its JSON naming the processes and the link
"${MPIRUN[@]}" -np 2 "$CREW" scale $MODEL --data "$DATA" --steps 4 --warmup 1 --repeats 1 --batch-per-device 8 --json \
  > "$TMP/scale.out" 2> "$TMP/scale.err" || fail "scale on 2 processes: $(tail -n 3 "$TMP/scale.err")"
last=$(tail -n 1 "$TMP/scale.out")
echo "$last" | grep -q '"trials":\[{"devices":1,.*},{"devices":2,' \
  && echo "$last" | grep -q '"mpi":{"processes":2,"alpha_s":[0-9][0-9.e+-]*,"bytes_per_s":[0-9][0-9.e+-]*}' \
  && echo "$last" | grep -q '"link_projection":\[{"devices":1,' && [ "$(grep -c '^scaling of ' "$TMP/scale.out")" = 1 ] \
  && ok || fail "scale under mpirun: $(echo "$last" | cut -c1-300)"
"${MPIRUN[@]}" -np 2 "$CREW" scale $MODEL --data "$DATA" --link 25Gbit > "$TMP/scale2.out" 2>&1
[ $? -eq 2 ] && grep -q "leave out --link" "$TMP/scale2.out" && ok || fail "scale --link under mpirun: $(head -n 2 "$TMP/scale2.out")"
# --from is read by process 0 before any trial: a bad run directory ends every process at once
"${MPIRUN[@]}" -np 2 "$CREW" scale $MODEL --data "$DATA" --from "$TMP/no-such-run" > "$TMP/scale3.out" 2>&1
[ $? -eq 2 ] && grep -q "no-such-run/metrics.jsonl" "$TMP/scale3.out" && ok \
  || fail "scale --from a missing run under mpirun: $(head -n 3 "$TMP/scale3.out")"

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
  # A killed process holds the run directory's lock (RUN_DIR/lock, a POSIX record lock) until its
  # exit completes, and a big one (an ASan build's shadow memory) unmaps for a while first: the next
  # attempt must not start before the kernel has dropped the lock (/proc/locks; up to 60 s).
  local ino polls=0
  ino=$(stat -c %i "$dir/lock" 2> /dev/null) || ino=
  while [ -n "$ino" ] && grep -q ":$ino " /proc/locks 2> /dev/null && [ $polls -lt 6000 ]; do
    sleep 0.01; polls=$((polls + 1))
  done
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

# signal_rank1 DIR SIGNAL [TRAIN FLAGS]: a 2-process run into DIR (collective deadline 3 s) whose rank 1 gets
# SIGNAL once DIR holds the checkpoint of step 4; sets rc to the job's exit status and rank1 to the
# process signalled. The job must end within 60 s, a bound no loaded machine comes near: never a
# hang. Its output is in DIR.out.
signal_rank1() {
  local dir=$1 sig=$2 pid polls=0 p
  shift 2
  "${MPIRUN[@]}" -np 2 "$CREW" train $MODEL --data "$DATA" --max-steps 300 --batch-per-device 8 --checkpoint-every 2 \
    --collective-timeout 3 --quiet "$@" --run-dir "$dir" > "$dir.out" 2>&1 &
  pid=$!
  while [ "$(newest_checkpoint "$dir")" -lt 4 ] && [ $polls -lt 30000 ]; do sleep 0.01; polls=$((polls + 1)); done
  rank1=""
  for p in $(pgrep -f "crew train $MODEL .*--run-dir $dir"); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && { kill -"$sig" "$p"; rank1=$p; }
  done
  [ -n "$rank1" ] || fail "$dir: no process of rank 1 found to signal"
  for _ in $(seq 600); do kill -0 $pid 2> /dev/null || break; sleep 0.1; done
  if kill -0 $pid 2> /dev/null; then
    fail "$dir: a rank sent SIG$sig held the run for 60 s"; pkill -KILL -P $pid; kill -KILL $pid
  fi
  wait $pid; rc=$?
  [ -n "$rank1" ] && kill -KILL "$rank1" 2> /dev/null
  "$CREW" train $MODEL --data "$DATA" --devices cpu:2 --quiet --resume "$dir" > "$dir.resume" 2>&1 \
    && [ -f "$dir/weights.safetensors" ] && ok || fail "$dir: the run could not be resumed: $(tail -n 2 "$dir.resume")"
}

# A process stopped for good is named by the others within the deadline; the run exits 1.
signal_rank1 "$TMP/stopped" STOP
[ $rc = 1 ] && ok || fail "a stopped rank: exit $rc, not 1: $(tail -n 3 "$TMP/stopped.out")"
grep -q "MPI rank 1 (host [^,]*, replica 1) did not answer within 3 s" "$TMP/stopped.out" && ok \
  || fail "a stopped rank is not named: $(head -n 3 "$TMP/stopped.out")"
# ...and with --allreduce fast, whose MPI collective cannot say who is missing, reported as such.
signal_rank1 "$TMP/fast_stopped" STOP --allreduce fast
[ $rc = 1 ] && grep -q "MPI's all-reduce did not complete within 3 s: a process is missing" "$TMP/fast_stopped.out" \
  && ok || fail "--allreduce fast, a stopped rank: exit $rc: $(head -n 3 "$TMP/fast_stopped.out")"
# A process killed with SIGKILL: mpirun itself notices, names the rank and ends the job (Open MPI
# 4.1 kills the survivors; there is no recovery to wait for).
signal_rank1 "$TMP/killed" KILL
[ $rc != 0 ] && ok || fail "a killed rank: exit 0"
grep -q "rank 1" "$TMP/killed.out" && ok || fail "a killed rank is not named: $(head -n 5 "$TMP/killed.out")"

# ---- pipelines across processes: a replica's stages on several processes (activations over MPI),
# or whole replicas in each (each stage's gradients over MPI); every layout ends with the weights
# of data parallelism on the same micro-batches, bit for bit.
PMODEL=examples/fashion_mlp.json # 6 layers
PIPE=(--data "$DATA" --max-steps 12 --batch-per-device 8 --global-batch 32 --checkpoint-every 4 --quiet)
"$CREW" train $PMODEL "${PIPE[@]}" --devices cpu:4 --run-dir "$TMP/pdp" > /dev/null || fail "the pipelines' reference"
for layout in "2 1 2" "4 1 4" "4 1 2" "2 2 2" "2 4 2"; do
  read -r np per k <<< "$layout" # processes, devices per process, stages
  d="$TMP/pp-$np-$per-$k"
  "${MPIRUN[@]}" -np $np "$CREW" train $PMODEL "${PIPE[@]}" --devices cpu:$per --pipeline $k --run-dir "$d" \
    > "$d.out" 2>&1 || fail "mpirun -np $np --devices cpu:$per --pipeline $k: $(tail -n 3 "$d.out")"
  cmp -s "$TMP/pdp/weights.safetensors" "$d/weights.safetensors" && ok \
    || fail "mpirun -np $np --devices cpu:$per --pipeline $k: weights differ from data parallelism"
done
# The plan says where the stages are.
"${MPIRUN[@]}" -np 4 "$CREW" train $PMODEL --data "$DATA" --max-steps 2 --batch-per-device 8 --devices cpu:1 --pipeline 2 \
  --run-dir "$TMP/pp-plan" > "$TMP/pp-plan.out" 2>&1 || fail "the pipeline plan under mpirun"
grep -q "pipeline: 2 stages x 2 replicas = 4 devices" "$TMP/pp-plan.out" \
  && grep -q "across 4 processes: each replica's stages span 2 of them, 1 stage in each" "$TMP/pp-plan.out" && ok \
  || fail "the pipeline plan under mpirun: $(head -n 6 "$TMP/pp-plan.out")"
# A pipeline's checkpoint of step 4 (the later ones removed) resumes on other processes and
# stages: rank 0's checkpoint reaches the stages of the other processes.
P="$TMP/pp-resumed"
cp -r "$TMP/pp-2-1-2" "$P"
rm -rf "$P/weights.safetensors" "$P/checkpoints/step-00000008" "$P/checkpoints/step-00000012"
"${MPIRUN[@]}" -np 4 "$CREW" train $PMODEL --data "$DATA" --quiet --devices cpu:1 --pipeline 4 --resume "$P" \
  > "$P.out" 2>&1 || fail "the pipeline's resume on 4 processes: $(tail -n 3 "$P.out")"
grep -q "resumed from .*step-00000004 (step 4)" "$P.out" && cmp -s "$TMP/pdp/weights.safetensors" "$P/weights.safetensors" \
  && ok || fail "a pipeline resumed from step 4 on 4 processes x 4 stages: weights differ ($(tail -n 2 "$P.out"))"
# Layouts that cannot work are one line and exit 2.
"${MPIRUN[@]}" -np 3 "$CREW" train $PMODEL --data "$DATA" --devices cpu:1 --pipeline 2 --run-dir "$TMP/pp-bad" \
  > "$TMP/pp-bad.out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "3 processes cannot hold replicas of 2 pipeline stages that span 2 processes" "$TMP/pp-bad.out" \
  && ok || fail "3 processes, 2 stages of 1 device each: exit $rc: $(head -n 2 "$TMP/pp-bad.out")"
"${MPIRUN[@]}" -np 2 "$CREW" train $PMODEL --data "$DATA" --devices cpu:1 --pipeline 2 --allreduce fast \
  --run-dir "$TMP/pp-fast" > "$TMP/pp-fast.out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "drop --allreduce fast" "$TMP/pp-fast.out" && ok \
  || fail "a pipeline with --allreduce fast: exit $rc: $(head -n 2 "$TMP/pp-fast.out")"
# A stage's process stopped for good is named by the process waiting for its activations.
signal_rank1 "$TMP/pp-stopped" STOP --devices cpu:1 --pipeline 2
[ $rc = 1 ] && grep -q "rank 1 (MPI rank 1, host [^)]*) sent nothing to rank 0 within 3 s\|MPI rank 1 (host [^,]*, rank 1) did not answer within 3 s" \
  "$TMP/pp-stopped.out" && ok || fail "a stopped pipeline stage: exit $rc: $(head -n 3 "$TMP/pp-stopped.out")"

# ---- processes that disagree are refused before anything is written
"${MPIRUN[@]}" -np 1 "$CREW" train examples/fashion_mlp.json --data "$DATA" --max-steps 2 --run-dir "$TMP/mixed" : \
  -np 1 "$CREW" train $MODEL --data "$DATA" --max-steps 2 --run-dir "$TMP/mixed" > "$TMP/mixed.out" 2>&1
rc=$?
[ $rc = 2 ] && ok || fail "different model files: exit $rc, not 2"
grep -q "MPI rank 1 (host [^)]*) differs from rank 0 in the model file" "$TMP/mixed.out" && ok \
  || fail "different model files: $(head -n 2 "$TMP/mixed.out")"
[ ! -e "$TMP/mixed" ] && ok || fail "different model files: the run directory was made"

report
