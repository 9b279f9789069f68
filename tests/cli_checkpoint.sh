#!/usr/bin/env bash
# cli_checkpoint.sh — a crash loses minutes, never the run:
# - training killed with SIGKILL at random moments and resumed each time ends with weights
#   bitwise equal to an uninterrupted run; also when a run started on 4 replicas is resumed on 1,
#   and one started on 1 is resumed on 4;
# - a damaged newest checkpoint (truncated, a flipped byte, a deleted file) is refused, named,
#   and the previous one is used;
# - a disk that fills while a checkpoint is written leaves the previous checkpoint intact;
# - SIGINT finishes the step, saves a checkpoint and says how to resume.
. "$(dirname "$0")/lib_cli.sh"
need_fashion

MODEL=examples/fashion_cnn.json
COMMON=(--data "$DATA" --max-steps 48 --batch-per-device 8 --global-batch 32 --checkpoint-every 4 --quiet)
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:4 --run-dir "$TMP/ref" > /dev/null || fail "the uninterrupted run"
REF="$TMP/ref/weights.safetensors"

# Starts (or resumes) a run in the background and kills it with SIGKILL after a random delay,
# until one attempt finishes. $1: run dir; $2: devices of the first start; $3: devices of resumes.
kill_and_resume() {
  local dir=$1 first=$2 later=$3 attempt=0 kills=0
  while [ ! -f "$dir/weights.safetensors" ] && [ $attempt -lt 40 ]; do
    # Killed before its first checkpoint, a run starts afresh (--resume needs one to resume from).
    if ! ls -d "$dir"/checkpoints/step-???????? > /dev/null 2>&1; then
      rm -rf "$dir"
      "$CREW" train $MODEL "${COMMON[@]}" --devices "$first" --run-dir "$dir" > /dev/null 2>&1 &
    else
      "$CREW" train $MODEL "${COMMON[@]}" --devices "$later" --resume "$dir" > /dev/null 2>&1 &
    fi
    local pid=$!
    # 0.2 to 1.2 s: long enough to get past start-up, short enough to land mid-run.
    sleep "0.$((RANDOM % 10 + 2))"
    if [ $((attempt % 3)) -ne 2 ] && kill -9 $pid 2> /dev/null; then kills=$((kills + 1)); fi
    wait $pid 2> /dev/null
    attempt=$((attempt + 1))
  done
  echo "$dir: $kills kills in $attempt attempts" >&2
  [ "$kills" -ge 2 ] && ok || fail "$dir: only $kills kills landed (the run is too fast for this test?)"
}

kill_and_resume "$TMP/same" cpu:4 cpu:4
cmp -s "$REF" "$TMP/same/weights.safetensors" && ok || fail "killed and resumed on 4 replicas: weights differ"
kill_and_resume "$TMP/down" cpu:4 cpu:1
cmp -s "$REF" "$TMP/down/weights.safetensors" && ok || fail "started on 4, resumed on 1: weights differ"
kill_and_resume "$TMP/up" cpu:1 cpu:4
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

# SIGINT: the current step finishes, a checkpoint is written, the message says how to resume.
"$CREW" train $MODEL --data "$DATA" --max-steps 100000 --batch-per-device 8 --devices cpu:2 --checkpoint-every 100000 \
  --run-dir "$TMP/int" > "$TMP/int.out" 2>&1 &
pid=$!
sleep 1.5
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 1 ] && grep -q "resume with: crew train" "$TMP/int.out" && ok || fail "SIGINT: exit $rc: $(tail -3 "$TMP/int.out")"
ls "$TMP/int/checkpoints"/step-* > /dev/null 2>&1 && ok || fail "SIGINT: no checkpoint written"
report
