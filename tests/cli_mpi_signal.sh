#!/usr/bin/env bash
# cli_mpi_signal.sh — a stop under mpirun keeps the work (docs/CHECKPOINTS.md, "Stopping a run"),
# with Open MPI's mpirun or MPICH's mpiexec (Hydra), whichever this crew was built with:
# - SIGTERM to mpirun (a scheduler at a time limit), SIGINT to mpirun (Ctrl-C), SIGTERM to every
#   rank (scancel), SIGTERM to rank 1 alone: every rank stops after the same step, rank 0 writes
#   its checkpoint and prints the resume command, the job exits 1; resumed from that checkpoint,
#   the run's next checkpoints equal an uninterrupted run's byte for byte;
# - a stop that cannot end (rank 1 stopped with SIGSTOP, so the step cannot finish) is given up after
#   --stop-grace: rank 0 says so, naming the newest checkpoint and the resume command;
# - Open MPI: a rank killed with SIGKILL: mpirun ends the others with SIGTERM (1 s before its
#   SIGKILL, by default), and rank 0's last line names the lost process and the newest checkpoint.
#   Hydra kills the others at once, with SIGKILL: nothing to say (docs/CHECKPOINTS.md).
# The runs are endless (100000 epochs): each ends only by the signal sent to it, wherever it is,
# and runs are compared at a checkpoint after the stop, so no case depends on how fast a machine is.
# Skipped (77) when this crew was built without MPI or its launcher is missing.
. "$(dirname "$0")/lib_cli.sh"

family=$("$CREW" --version | sed -n 's/^MPI: \(Open MPI\|MPICH\).*/\1/p')
[ -n "$family" ] || { echo "skipped: this crew was built without MPI"; exit 77; }
if [ "$family" = MPICH ]; then
  launcher=$(command -v mpiexec.mpich || command -v mpiexec.hydra || true)
  rank_var=PMI_RANK
else
  launcher=$(command -v mpirun || true)
  rank_var=OMPI_COMM_WORLD_RANK
fi
[ -n "$launcher" ] || { echo "skipped: no launcher for $family"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # CI runs as root
# Open MPI's mpirun, signalled, sends the ranks SIGCONT at once, SIGTERM odls_base_sigkill_timeout
# seconds later and SIGKILL as long again: 10 s leaves the stop ample time. Hydra forwards the signal
# at once and never kills.
if [ "$family" = MPICH ]; then MPI=("$launcher"); else MPI=("$launcher" --oversubscribe --bind-to none); fi
SLOW=(--mca odls_base_sigkill_timeout 10)
[ "$family" = MPICH ] && SLOW=()

tiny_images "$TMP/data" 320
echo '{"input_shape": [12, 12, 1], "layers": [{"type": "flatten"}, {"type": "dense", "units": 16, "activation": "relu"},
  {"type": "dense", "units": 10}], "training": {"batch_per_device": 8, "seed": 1}}' > "$TMP/mlp.json"
M="$TMP/mlp.json"
# 2 processes of 8 samples = 16 a step; one process accumulating 2 micro-batches is the same run.
RUN=(--data "$TMP/data" --epochs 100000 --global-batch 16 --checkpoint-every 20 --keep-checkpoints 1000000 --quiet)

running() { local st; st=$(cut -d ' ' -f 3 "/proc/$1/stat" 2> /dev/null); [ -n "$st" ] && [ "$st" != Z ]; }
# last_step DIR: the newest step in DIR/metrics.jsonl (0 before the first).
last_step() { local s; s=$(grep -o '"type":"step","step":[0-9]*' "$1/metrics.jsonl" 2> /dev/null | tail -n 1 | grep -o '[0-9]*$'); echo "${s:-0}"; }
# until_step PID DIR K: polls until DIR's run has logged step K or later; fails when PID ended first.
until_step() {
  local polls=0
  while [ "$(last_step "$2")" -lt "$3" ]; do
    running "$1" || return 1
    polls=$((polls + 1)); [ $polls -lt 60000 ] || return 1
    sleep 0.01
  done
}
# until_checkpoint PID DIR C: polls until DIR holds the complete checkpoint of step C.
until_checkpoint() {
  local polls=0 c; c=$(printf 'step-%08d' "$3")
  until [ -f "$2/checkpoints/$c/COMPLETE" ]; do
    running "$1" || [ -f "$2/checkpoints/$c/COMPLETE" ] || return 1
    polls=$((polls + 1)); [ $polls -lt 60000 ] || return 1
    sleep 0.01
  done
}
# ranks DIR [R]: the pids of the crew processes (MPI ranks, not the launcher) training into DIR; of
# rank R only, when given.
ranks() {
  local p want="$rank_var=${2:-}"
  for p in $(pgrep -f "crew train $M .*--run-dir $1"); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -q "^$want" && echo "$p"
  done
}
# end_job PID DIR STEPS: waits for the job PID to end; with STEPS > 0 at most until its run has
# logged that many more steps (a stop takes one or two), else at most 2 minutes (Open MPI's mpirun
# itself ends a signalled job within twice its odls_base_sigkill_timeout): a run that does not
# stop is killed, and fails. Sets rc.
end_job() {
  local from polls=0; from=$(last_step "$2")
  while running "$1"; do
    polls=$((polls + 1))
    if { [ "$3" -gt 0 ] && [ "$(last_step "$2")" -gt $((from + $3)) ]; } || [ $polls -gt 2400 ]; then
      fail "$2: the run did not stop (step $(last_step "$2"), signalled at $from)"
      pkill -KILL -P "$1"; kill -KILL $(ranks "$2") "$1" 2> /dev/null
    fi
    sleep 0.05
  done
  wait "$1"; rc=$?
}

declare -A stopped_at # case -> the step it stopped after
# stop_case NAME SLOW|FAST HOW: a run on 2 processes, signalled per HOW once it has logged step 40.
stop_case() {
  local name=$1 speed=$2 how=$3 d=$TMP/$1 job launcher_pid
  local opts=("${MPI[@]}"); [ "$speed" = SLOW ] && opts+=("${SLOW[@]}")
  "${opts[@]}" -np 2 "$CREW" train "$M" "${RUN[@]}" --run-dir "$d" > "$d.out" 2>&1 &
  job=$!
  until_step $job "$d" 40 || { fail "$name: the run never reached step 40: $(tail -n 3 "$d.out")"; return; }
  case $how in
    TERM-mpirun) kill -TERM $job ;;
    INT-mpirun) kill -INT $job ;;
    TERM-ranks) kill -TERM $(ranks "$d") ;;
    TERM-rank1) kill -TERM $(ranks "$d" 1) ;;
  esac
  if [ "$speed" = SLOW ]; then end_job $job "$d" 0; else end_job $job "$d" 2000; fi
  # Every process exits 1. Hydra's mpiexec, itself signalled, exits 0 now and then all the same
  # (MPICH 4.0.2: 2 in 8 with a plain MPI program whose processes all return 1).
  [ "$rc" = 1 ] || { [ "$family" = MPICH ] && [ "${how#*-}" = mpirun ] && [ "$rc" = 0 ]; } && ok \
    || fail "$name: the job exited $rc, not 1: $(tail -n 5 "$d.out")"
  local s; s=$(sed -n 's/^crew train: stopped by signal after step \([0-9]*\) of [0-9]*; the last checkpoint is .*/\1/p' "$d.out")
  if [ -z "$s" ] || [ ! -f "$d/checkpoints/$(printf 'step-%08d' "$s")/COMPLETE" ]; then
    fail "$name: no checkpoint of the step it stopped after: $(tail -n 5 "$d.out")"; return
  fi
  grep -q "^crew train: resume with (under mpirun, as before): crew train .* --resume $d\$" "$d.out" && ok \
    || fail "$name: no resume command: $(tail -n 3 "$d.out")"
  [ -z "$(ranks "$d")" ] && ok || fail "$name: processes are left: $(ranks "$d")"
  stopped_at[$name]=$s
}

# next_after S: the first regular checkpoint (every 20 steps) after step S, and one more.
next_after() { echo $(( (($1 / 20) + 2) * 20 )); }
# resume_to NAME: resumes NAME's run on one process until it holds the checkpoint after its stop,
# then stops it (SIGINT); its checkpoint is then compared with the uninterrupted run's.
resume_to() {
  local d=$TMP/$1 c pid
  c=$(next_after "${stopped_at[$1]}")
  "$CREW" train "$M" "${RUN[@]}" --devices cpu:1 --resume "$d" > "$d.resume" 2>&1 &
  pid=$!
  until_checkpoint $pid "$d" "$c" || fail "$1: the resume never wrote step $c: $(tail -n 3 "$d.resume")"
  kill -INT $pid; wait $pid
  grep -q "resumed from $d/checkpoints/$(printf 'step-%08d' "${stopped_at[$1]}") " "$d.resume" && ok \
    || fail "$1: not resumed from the stop's checkpoint: $(head -n 2 "$d.resume")"
}

stop_case to-mpirun SLOW TERM-mpirun
stop_case ctrl-c SLOW INT-mpirun
stop_case to-every-rank FAST TERM-ranks
# Any process's signal stops the run: rank 1's is shared with the others at the step's end (the
# library's "one rank program", main a57ea4c: every process's first rank reads its cancel flag).
stop_case to-rank-1 FAST TERM-rank1
grep -q "stopped by signal after step" "$TMP/to-rank-1.out" && ok || fail "a signal to rank 1 alone did not stop the run"

# The uninterrupted run, on one process, up to the last checkpoint the comparisons need.
far=0
for name in "${!stopped_at[@]}"; do c=$(next_after "${stopped_at[$name]}"); [ "$c" -gt $far ] && far=$c; done
if [ $far -gt 0 ]; then
  "$CREW" train "$M" "${RUN[@]}" --devices cpu:1 --run-dir "$TMP/ref" > "$TMP/ref.out" 2>&1 &
  ref=$!
  until_checkpoint $ref "$TMP/ref" "$far" || fail "the uninterrupted run never wrote step $far"
  kill -INT $ref; wait $ref
fi
for name in "${!stopped_at[@]}"; do
  resume_to "$name"
  c=$(printf 'step-%08d' "$(next_after "${stopped_at[$name]}")")
  cmp -s "$TMP/ref/checkpoints/$c/model.safetensors" "$TMP/$name/checkpoints/$c/model.safetensors" \
    && cmp -s "$TMP/ref/checkpoints/$c/optimizer.safetensors" "$TMP/$name/checkpoints/$c/optimizer.safetensors" && ok \
    || fail "$name: stopped after step ${stopped_at[$name]} and resumed, its $c differs from the uninterrupted run's"
done

# ---- a stop that cannot end: rank 1 stopped for good, rank 0 signalled; --stop-grace 2 gives up.
d=$TMP/grace
"${MPI[@]}" -np 2 "$CREW" train "$M" "${RUN[@]}" --stop-grace 2 --run-dir "$d" > "$d.out" 2>&1 &
job=$!
if until_step $job "$d" 40; then
  r1=$(ranks "$d" 1)
  kill -STOP $r1
  kill -TERM $(ranks "$d" 0)
  for _ in $(seq 1200); do [ -n "$(ranks "$d" 0)" ] || break; sleep 0.05; done # rank 0 ends by itself
  kill -KILL $r1 2> /dev/null
  for _ in $(seq 1200); do running $job || break; sleep 0.05; done
  running $job && { fail "grace: the job did not end"; pkill -KILL -P $job; kill -KILL $job; }
  wait $job
  newest=$(sed -n 's/^crew train: the stop did not end within --stop-grace 2 s: exiting without a checkpoint of its step; the newest checkpoint is \([^;]*\); resume with: crew train .*/\1/p' "$d.out")
  [ -n "$newest" ] && [ -f "$newest/COMPLETE" ] && ok || fail "grace: rank 0 did not give up naming the newest checkpoint: $(tail -n 4 "$d.out")"
else
  fail "grace: the run never reached step 40: $(tail -n 3 "$d.out")"
fi

# ---- a rank killed: Open MPI's mpirun sends the survivors SIGTERM before its SIGKILL (its defaults)
if [ "$family" = "Open MPI" ]; then
  d=$TMP/killed
  "${MPI[@]}" -np 2 "$CREW" train "$M" "${RUN[@]}" --run-dir "$d" > "$d.out" 2>&1 &
  job=$!
  if until_step $job "$d" 40; then
    victim=$(ranks "$d" 1)
    kill -KILL $victim
    for _ in $(seq 1200); do running $job || break; sleep 0.05; done
    running $job && { fail "killed: the job did not end"; pkill -KILL -P $job; kill -KILL $job; }
    wait $job
    grep -q "^crew train: MPI rank 1 (process $victim on host $(hostname)) has ended, so this run cannot finish its step: the newest checkpoint is $d/checkpoints/step-[0-9]*; resume with: crew train .* --resume $d\$" "$d.out" \
      && ok || fail "killed: rank 0's last line does not name the lost process: $(grep -v '^ ' "$d.out" | tail -n 6)"
  else
    fail "killed: the run never reached step 40: $(tail -n 3 "$d.out")"
  fi
fi
report
