#!/usr/bin/env bash
# cli_checkpoint.sh — a crash loses minutes, never the run:
# - training killed with SIGKILL mid-run, three times, and resumed each time ends with weights
#   bitwise equal to an uninterrupted run; also when a run started on 4 replicas is resumed on 1,
#   and one started on 1 is resumed on 4. Each kill is set off by the run's own progress, not by a
#   clock: the moment a given checkpoint appears the run is killed, wherever it then is in the
#   steps after it (computing, writing its metrics, writing the next checkpoint), so the test
#   behaves the same on a fast, a slow and a loaded machine;
# - a damaged newest checkpoint (truncated, a flipped byte, a deleted file) is refused, named,
#   and the previous one is used; a checkpoint a kill left half-written (its temporary directory)
#   is passed over;
# - a disk that fills while a checkpoint is written leaves the previous checkpoint intact;
# - SIGINT finishes the step, saves a checkpoint and says how to resume.
. "$(dirname "$0")/lib_cli.sh"
need_fashion

MODEL=examples/fashion_cnn.json
LAST=48 # the runs' last step
COMMON=(--data "$DATA" --max-steps 48 --batch-per-device 8 --global-batch 32 --checkpoint-every 4 --quiet)
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:4 --run-dir "$TMP/ref" > /dev/null || fail "the uninterrupted run"
REF="$TMP/ref/weights.safetensors"

# running PID: the process exists and has not ended (a child that ended but was not waited for
# yet is a zombie, which kill -0 still finds).
running() { local st; st=$(cut -d ' ' -f 3 "/proc/$1/stat" 2> /dev/null); [ -n "$st" ] && [ "$st" != Z ]; }

# newest_checkpoint DIR: the step of the newest complete checkpoint in DIR/checkpoints, or 0.
newest_checkpoint() {
  local newest; newest=$(ls "$1/checkpoints" 2> /dev/null | grep -x 'step-[0-9]\{8\}' | sort | tail -n 1)
  [ -n "$newest" ] && echo $((10#${newest#step-})) || echo 0
}

# wait_for_checkpoint DIR K PID: waits until DIR holds a complete checkpoint of step K or later;
# fails when process PID ended first (or after 60000 polls, 10 minutes or more: a run that makes
# no progress at all). Polling, not timing: how long it takes does not matter.
wait_for_checkpoint() {
  local polls=0
  while [ "$(newest_checkpoint "$1")" -lt "$2" ]; do
    running "$3" || { [ "$(newest_checkpoint "$1")" -ge "$2" ]; return; }
    polls=$((polls + 1))
    [ $polls -lt 60000 ] || return 1
    sleep 0.01
  done
}

# kill_and_resume DIR FIRST LATER K...: starts a run on FIRST devices; for each K, kills it with
# SIGKILL as soon as its checkpoint of step K (or a later one) is in place, then resumes it on
# LATER devices; the last resume runs to the end. Each kill must land mid-run (exit by SIGKILL, no
# weights written), and each resume must start from a checkpoint at or after its kill point.
# An attempt is killed only after it wrote a checkpoint of its own: the kill of the one before may
# land a few checkpoints late on a loaded machine, and an attempt killed before it started would
# leave nothing to check.
kill_and_resume() {
  local dir=$1 first=$2 later=$3 n=0 at pid rc before target
  shift 3
  rm -rf "$dir"
  local how=(--devices "$first" --run-dir "$dir")
  for at in "$@"; do
    n=$((n + 1))
    before=$(newest_checkpoint "$dir")
    target=$at
    [ "$before" -lt "$at" ] || target=$((before + 1))
    "$CREW" train $MODEL "${COMMON[@]}" "${how[@]}" > "$TMP/attempt.out" 2> "$TMP/attempt-$n.err" &
    pid=$!
    if ! wait_for_checkpoint "$dir" "$target" $pid; then
      kill -9 $pid 2> /dev/null; wait $pid 2> /dev/null
      fail "$dir: attempt $n ended before its checkpoint of step $at: $(tail -n 3 "$TMP/attempt-$n.err")"
      return
    fi
    kill -9 $pid 2> /dev/null
    wait $pid 2> /dev/null
    rc=$?
    [ $rc -eq 137 ] && [ ! -e "$dir/weights.safetensors" ] && ok ||
      fail "$dir: the kill after the checkpoint of step $at did not land mid-run (exit $rc)"
    how=(--devices "$later" --resume "$dir")
  done
  "$CREW" train $MODEL "${COMMON[@]}" "${how[@]}" > "$TMP/attempt.out" 2> "$TMP/attempt-last.err" ||
    { fail "$dir: the last resume failed: $(cat "$TMP/attempt-last.err")"; return; }
  # Every resume started where a kill left it: from the checkpoint of step K or a later one.
  n=0
  local froms=""
  for at in "$@"; do
    n=$((n + 1))
    local file=$TMP/attempt-$((n + 1)).err
    [ $n -eq $# ] && file=$TMP/attempt-last.err
    local from; from=$(sed -n 's/.*resumed from .*(step \([0-9]*\)).*/\1/p' "$file" | tail -n 1)
    [ -n "$from" ] && [ "$from" -ge "$at" ] && [ "$from" -lt "$LAST" ] && ok ||
      fail "$dir: resume $n, after the kill at the checkpoint of step $at, resumed from step '${from}': $(cat "$file")"
    froms="$froms $from"
  done
  echo "$dir: killed once the checkpoints of steps $* were in place; resumed from steps$froms" >&2
}

kill_and_resume "$TMP/same" cpu:4 cpu:4 4 16 28
cmp -s "$REF" "$TMP/same/weights.safetensors" && ok || fail "killed and resumed on 4 replicas: weights differ"
kill_and_resume "$TMP/down" cpu:4 cpu:1 8 20 28
cmp -s "$REF" "$TMP/down/weights.safetensors" && ok || fail "started on 4, resumed on 1: weights differ"
kill_and_resume "$TMP/up" cpu:1 cpu:4 4 12 24
cmp -s "$REF" "$TMP/up/weights.safetensors" && ok || fail "started on 1, resumed on 4: weights differ"

# Resuming on a device count that cannot share the global batch says what to choose.
expect_exit 2 "choose 1, 2, 4 devices" -- "$CREW" train $MODEL "${COMMON[@]}" --devices cpu:3 --resume "$TMP/ref"

# Damage the newest checkpoint three ways; each time the run falls back and still ends equal.
damage() { # $1: how; $2: run dir
  local newest; newest=$(ls -d "$2"/checkpoints/step-* | grep -v refused | sort | tail -n 1)
  case $1 in
    truncate) truncate -s 1000 "$newest/model.safetensors" ;;
    flip) printf '\x55' | dd of="$newest/optimizer.safetensors" bs=1 seek=4000 conv=notrunc 2> /dev/null ;;
    delete) rm "$newest/state.json" ;;
  esac
  basename "$newest"
}
for how in truncate flip delete; do
  rm -rf "$TMP/dmg"; cp -r "$TMP/ref" "$TMP/dmg"; rm "$TMP/dmg/weights.safetensors"
  rm -rf "$TMP/dmg/checkpoints/step-00000048"   # as if killed between step 46 and 48
  bad=$(damage $how "$TMP/dmg")
  "$CREW" train $MODEL "${COMMON[@]}" --devices cpu:2 --resume "$TMP/dmg" > "$TMP/dmg.out" 2> "$TMP/dmg.err"
  grep -q "refused .*$bad" "$TMP/dmg.err" && grep -q "falling back" "$TMP/dmg.err" && ok ||
    fail "$how: no refusal of $bad reported: $(cat "$TMP/dmg.err")"
  cmp -s "$REF" "$TMP/dmg/weights.safetensors" && ok || fail "$how: the fallback run ended with other weights"
done

# A kill while a checkpoint is being written leaves its temporary directory with partial files
# (the kills above land there only by chance): one planted in place of the newest checkpoint is
# passed over, and the run resumes from the one before and ends equal.
rm -rf "$TMP/half"; cp -r "$TMP/ref" "$TMP/half"; rm "$TMP/half/weights.safetensors"
rm -rf "$TMP/half/checkpoints/step-00000048"
mv "$TMP/half/checkpoints/step-00000044" "$TMP/half/checkpoints/step-00000044.tmp-99999"
truncate -s 1000 "$TMP/half/checkpoints/step-00000044.tmp-99999/optimizer.safetensors"
rm "$TMP/half/checkpoints/step-00000044.tmp-99999/COMPLETE"
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:2 --resume "$TMP/half" > /dev/null 2> "$TMP/half.err" ||
  fail "resume past a half-written checkpoint: $(cat "$TMP/half.err")"
grep -q "resumed from .*step-00000040" "$TMP/half.err" && ok || fail "half-written checkpoint: $(cat "$TMP/half.err")"
cmp -s "$REF" "$TMP/half/weights.safetensors" && ok || fail "half-written checkpoint: the run ended with other weights"

# A disk that fills while the next checkpoint is written: the run fails (exit 1), the previous
# checkpoint is intact, and resuming from it finishes the run.
rm -rf "$TMP/full"; cp -r "$TMP/ref" "$TMP/full"; rm "$TMP/full/weights.safetensors"
rm -rf "$TMP/full/checkpoints/step-00000048" "$TMP/full/checkpoints/step-00000044"
before=$(cat "$TMP/full/checkpoints/step-00000040/COMPLETE")
(ulimit -f 1200; "$CREW" train $MODEL "${COMMON[@]}" --devices cpu:2 --resume "$TMP/full" > /dev/null 2> "$TMP/full.err")
rc=$?
[ $rc -eq 1 ] && grep -q "File too large\|No space" "$TMP/full.err" && ok || fail "disk full: exit $rc: $(cat "$TMP/full.err")"
[ "$(cat "$TMP/full/checkpoints/step-00000040/COMPLETE")" = "$before" ] && [ ! -e "$TMP/full/checkpoints/step-00000044" ] && ok ||
  fail "disk full: the previous checkpoint changed or a partial one appeared"
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:2 --resume "$TMP/full" > /dev/null 2>&1 || fail "resume after the full disk"
cmp -s "$REF" "$TMP/full/weights.safetensors" && ok || fail "disk full: resumed run ended with other weights"

# SIGINT: the current step finishes, a checkpoint is written, the message says how to resume. The
# signal is sent once the run is training (a step line in metrics.jsonl), not after a guessed delay.
"$CREW" train $MODEL --data "$DATA" --max-steps 100000 --batch-per-device 8 --devices cpu:2 --checkpoint-every 100000 \
  --run-dir "$TMP/int" > "$TMP/int.out" 2>&1 &
pid=$!
polls=0
until grep -q '"type":"step"' "$TMP/int/metrics.jsonl" 2> /dev/null || ! running $pid || [ $polls -ge 60000 ]; do
  polls=$((polls + 1))
  sleep 0.01
done
grep -q '"type":"step"' "$TMP/int/metrics.jsonl" 2> /dev/null && ok || fail "SIGINT: the run never started training"
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 1 ] && grep -q "resume with: crew train" "$TMP/int.out" && ok || fail "SIGINT: exit $rc: $(tail -3 "$TMP/int.out")"
ls "$TMP/int/checkpoints"/step-* > /dev/null 2>&1 && ok || fail "SIGINT: no checkpoint written"
# A GPT on byte tokens resumes exactly too, across replica counts: its tied table, its optimizer
# moments and the token windows' order all come back from the checkpoint.
awk 'BEGIN { for (i = 0; i < 900; i++) printf "%d the cat sat on the mat.\n", i % 89 }' > "$TMP/corpus.txt"
"$CREW" prep text "$TMP/corpus.txt" --seq-len 16 --out "$TMP/text" > /dev/null || fail "prep text"
printf '{"layers": [{"type": "gpt", "layers": 2, "heads": 2, "width": 32, "context": 16, "vocab": 256}]}' > "$TMP/gpt.json"
MODEL=$TMP/gpt.json
# long enough (96 steps of ~10 ms) that a kill set off by the checkpoint of step 12 lands mid-run
LAST=96
COMMON=(--data "$TMP/text" --max-steps $LAST --batch-per-device 8 --global-batch 16 --checkpoint-every 4 --quiet)
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:2 --run-dir "$TMP/gpt-ref" > /dev/null || fail "the uninterrupted GPT run"
REF="$TMP/gpt-ref/weights.safetensors"
kill_and_resume "$TMP/gpt" cpu:2 cpu:1 4 12
cmp -s "$REF" "$TMP/gpt/weights.safetensors" && ok || fail "a GPT started on 2 replicas, resumed on 1: weights differ"
report
