#!/usr/bin/env bash
# cli_rundir_lock.sh — one run at a time in a run directory (docs/CHECKPOINTS.md, "One run at a
# time"); tests/test_run_lock.c holds the race of two new runs at the same instant. Here the holder
# is a crew train that runs until the test ends it, so each contender certainly meets it:
# - a --resume of the directory is refused (exit 2, one line naming the holder's process and host)
#   and writes nothing there;
# - --replace is refused the same way, and the holder's run is left as it is;
# - the holder killed with SIGKILL (its lock left behind) blocks nothing: a --resume then runs, and
#   a second --resume while that one runs is refused, naming it.
. "$(dirname "$0")/lib_cli.sh"
tiny_images "$TMP/data" 320
echo '{"input_shape": [12, 12, 1], "layers": [{"type": "flatten"}, {"type": "dense", "units": 16, "activation": "relu"},
  {"type": "dense", "units": 10}], "training": {"batch_per_device": 8, "seed": 1}}' > "$TMP/mlp.json"
M="$TMP/mlp.json"
R="$TMP/r"
# Long enough that only the test ends it; a checkpoint every 10 steps so that it can be resumed.
RUN=(--data "$TMP/data" --devices cpu:1 --epochs 100000 --checkpoint-every 10 --quiet)
HOST=$(hostname)
# timeout: a contender that is not refused would train for a long time; it fails the test instead.
CONTEND=(timeout -k 5 120 "$CREW" train "$M" "${RUN[@]}")

running() { local st; st=$(cut -d ' ' -f 3 "/proc/$1/stat" 2> /dev/null); [ -n "$st" ] && [ "$st" != Z ]; }
# wait_for PID FILE PATTERN: until FILE holds PATTERN (polling; fails when PID ended first).
wait_for() {
  local polls=0
  until grep -q "$3" "$2" 2> /dev/null; do
    running "$1" || return 1
    polls=$((polls + 1)); [ $polls -lt 60000 ] || return 1
    sleep 0.01
  done
}
count_runs() { grep -c '"type":"run"' "$R/metrics.jsonl"; }

"$CREW" train "$M" "${RUN[@]}" --run-dir "$R" > /dev/null 2> "$TMP/holder.err" &
holder=$!
wait_for $holder "$R/metrics.jsonl" '"type":"step"' || fail "the holder never trained: $(cat "$TMP/holder.err")"
wait_for $holder "$R/metrics.jsonl" '"step":10,' || fail "the holder never reached step 10"
config=$(md5sum < "$R/config.json")

expect_exit 2 "run directory $R is in use by crew train, process $holder on host $HOST, since" -- "${CONTEND[@]}" --resume "$R"
expect_exit 2 "run directory $R is in use by crew train, process $holder on host $HOST" -- "${CONTEND[@]}" --run-dir "$R" --replace
[ "$(md5sum < "$R/config.json")" = "$config" ] && [ "$(count_runs)" = 1 ] && [ -d "$R/checkpoints" ] && ok \
  || fail "a refused contender changed the holder's run: $(count_runs) run lines"
grep -q "crew train, process $holder on host $HOST" "$R/lock" && ok || fail "the lock file does not name its holder: $(cat "$R/lock")"

# The holder dies with its lock: nothing stands in the next run's way.
kill -KILL $holder; wait $holder 2> /dev/null
"$CREW" train "$M" "${RUN[@]}" --resume "$R" > /dev/null 2> "$TMP/resume.err" &
resumer=$!
wait_for $resumer "$TMP/resume.err" "resumed from" && wait_for $resumer "$R/metrics.jsonl" '"type":"step"' && ok \
  || fail "a lock left by a killed run blocked the resume: $(cat "$TMP/resume.err")"
expect_exit 2 "run directory $R is in use by crew train, process $resumer on host $HOST" -- "${CONTEND[@]}" --resume "$R"
kill -INT $resumer; wait $resumer; rc=$?
[ $rc = 1 ] && grep -q "stopped by signal" "$TMP/resume.err" && ok || fail "the resume's stop: exit $rc: $(cat "$TMP/resume.err")"
[ ! -s "$R/lock" ] && ok || fail "a stopped run left its lock file saying '$(cat "$R/lock")'"
report
