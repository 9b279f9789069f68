#!/usr/bin/env bash
# cli_rundir.sh — a run directory holds one run, and a resumed run is the run it resumes
# (docs/CHECKPOINTS.md, "Run directories and resume"):
# - --run-dir naming a file, --run-dir "" and --resume "" are bad usage (exit 2) and write nothing
#   (crew eval --weights "" too); two runs in the default directory never share one;
# - a new run in a directory that holds another run is refused (exit 2) and changes nothing; an
#   empty directory is fine; --replace deletes exactly crew's files of the old run, and a later
#   --resume continues the new run;
# - resuming with another model file (another layer type, or the same tensors with another
#   activation) is refused (exit 2) with the difference named, the checkpoints and config.json
#   untouched; the right model file then resumes;
# - a run with augmentation and a padded last batch, stopped by SIGINT with --quiet, says on stderr
#   how to resume; the command it prints, and a bare --resume without the run's flags, both end
#   with weights bitwise equal to the uninterrupted run's; a flag that would change the resumed
#   run (--augment, --seed, --threads-per-device) is refused, naming it;
# - the weights of the stopped run are marked unfinished, and crew eval says so on stderr;
# - a batch-norm run resumed on another device count is refused.
. "$(dirname "$0")/lib_cli.sh"
CREW=$(cd "$(dirname "$CREW")" && pwd)/$(basename "$CREW") # one test runs it in another directory

# A small dataset of 12x12 images, so that runs are fast and crops and flips mean something.
tiny_images "$TMP/data" 560
D="$TMP/data"
mlp() { # $1: activation of the hidden layer
  echo '{"name": "tiny", "input_shape": [12, 12, 1], "layers": [{"type": "flatten"},
   {"type": "dense", "units": 16, "activation": "'"$1"'"}, {"type": "dense", "units": 10}],
   "training": {"epochs": 1, "batch_per_device": 8, "seed": 1}}'
}
mlp relu > "$TMP/mlp.json"
mlp tanh > "$TMP/mlp_tanh.json"
echo '{"input_shape": [12, 12, 1], "layers": [{"type": "conv2d", "filters": 4, "kernel_size": 3},
  {"type": "flatten"}, {"type": "dense", "units": 10}]}' > "$TMP/cnn.json"
echo '{"input_shape": [12, 12, 1], "layers": [{"type": "conv2d", "filters": 2, "kernel_size": 3},
  {"type": "batch_norm"}, {"type": "flatten"}, {"type": "dense", "units": 10}]}' > "$TMP/bn.json"
M="$TMP/mlp.json"
SHORT=(--data "$D" --devices cpu:1 --checkpoint-every 10 --quiet)

# Everything under a directory, with checksums: what "changes nothing" is checked against.
snapshot() { (cd "$1" && find . -print0 | sort -z | xargs -0 -n 50 sh -c 'for f; do [ -f "$f" ] && md5sum "$f" || echo "$f"; done' sh); }
# The weights file's metadata value for KEY (crew writes the header without spaces).
weights_meta() { head -c 4096 "$1" | grep -ao "\"$2\":\"[^\"]*\"" | head -n 1 | sed 's/.*:"\(.*\)"/\1/'; }

# ---------------------------------------------------------------- bad run directories
touch "$TMP/a-file"
expect_exit 2 "a-file" -- "$CREW" train "$M" "${SHORT[@]}" --max-steps 5 --run-dir "$TMP/a-file"
[ -f "$TMP/a-file" ] && [ ! -s "$TMP/a-file" ] && ok || fail "--run-dir FILE changed the file"
mkdir "$TMP/cwd"
expect_exit 2 "--run-dir" -- env -C "$TMP/cwd" "$CREW" train "$M" "${SHORT[@]}" --max-steps 5 --run-dir ""
expect_exit 2 "--resume" -- env -C "$TMP/cwd" "$CREW" train "$M" "${SHORT[@]}" --resume ""
[ -z "$(ls -A "$TMP/cwd")" ] && ok || fail "an empty --run-dir or --resume wrote $(ls -A "$TMP/cwd")"
expect_exit 2 "--weights" -- "$CREW" eval "$M" --weights "" --data "$D"
expect_exit 2 "a-file" -- "$CREW" train "$M" "${SHORT[@]}" --resume "$TMP/a-file"
expect_exit 2 "no-such-run" -- "$CREW" train "$M" "${SHORT[@]}" --resume "$TMP/no-such-run"
[ ! -e "$TMP/no-such-run" ] && ok || fail "--resume of a missing directory created it"

# ---------------------------------------------------------------- one run per directory
# Two runs with the default directory, started within the same second, get one each.
mkdir "$TMP/cwd2"
for _ in 1 2; do env -C "$TMP/cwd2" "$CREW" train "$M" "${SHORT[@]}" --max-steps 5 2> /dev/null || fail "a run in the default directory"; done
[ "$(ls "$TMP/cwd2/runs" | wc -l)" -eq 2 ] && ok || fail "two runs share a default directory: $(ls "$TMP/cwd2/runs")"
R="$TMP/old"
"$CREW" train "$M" "${SHORT[@]}" --max-steps 40 --run-dir "$R" 2> /dev/null || fail "the first run"
before=$(snapshot "$R")
expect_exit 2 "holds another run" -- "$CREW" train "$M" "${SHORT[@]}" --max-steps 25 --run-dir "$R"
[ "$(snapshot "$R")" = "$before" ] && ok || fail "a refused run changed $R"
expect_exit 2 "--replace" -- "$CREW" train "$M" "${SHORT[@]}" --max-steps 25 --resume "$R" --replace
mkdir "$TMP/empty"
"$CREW" train "$M" "${SHORT[@]}" --max-steps 5 --run-dir "$TMP/empty" 2> /dev/null && [ -f "$TMP/empty/weights.safetensors" ] &&
  ok || fail "a run in an empty existing directory"
# --replace: crew's files go, anything else stays; the directory then holds the new run alone.
echo notes > "$R/notes.txt"; mkdir "$R/mine"; echo x > "$R/mine/x"
"$CREW" train "$M" "${SHORT[@]}" --max-steps 25 --run-dir "$R" --replace 2> /dev/null || fail "--replace"
[ -f "$R/notes.txt" ] && [ -f "$R/mine/x" ] && ok || fail "--replace deleted files crew does not own"
steps=$(cd "$R/checkpoints" && echo step-*)
[ "$steps" = "step-00000010 step-00000020 step-00000025" ] && ok || fail "after --replace the checkpoints are $steps"
"$CREW" train "$M" "${SHORT[@]}" --max-steps 25 --run-dir "$TMP/fresh25" 2> /dev/null || fail "a fresh 25-step run"
"$CREW" train "$M" --data "$D" --devices cpu:1 --quiet --resume "$R" 2> "$TMP/resume.err" || fail "resuming the replaced run"
grep -q "step-00000025 (step 25)" "$TMP/resume.err" && cmp -s "$R/weights.safetensors" "$TMP/fresh25/weights.safetensors" &&
  ok || fail "--resume after --replace did not continue the new run: $(cat "$TMP/resume.err")"

# ---------------------------------------------------------------- the wrong model file
W="$TMP/wrong"
"$CREW" train "$M" "${SHORT[@]}" --max-steps 30 --run-dir "$W" 2> /dev/null || fail "the MLP run"
before=$(snapshot "$W")
expect_exit 2 "belongs to another model: layer 0" -- "$CREW" train "$TMP/cnn.json" "${SHORT[@]}" --resume "$W"
expect_exit 2 "activation is relu in the checkpoint's run, tanh" -- "$CREW" train "$TMP/mlp_tanh.json" "${SHORT[@]}" --resume "$W"
[ "$(snapshot "$W")" = "$before" ] && ok || fail "a refused resume changed $W: $(ls "$W/checkpoints")"
"$CREW" train "$M" "${SHORT[@]}" --resume "$W" 2> "$TMP/wrong.err" && grep -q "resumed from" "$TMP/wrong.err" && ok ||
  fail "the right model file no longer resumes: $(cat "$TMP/wrong.err")"

# ---------------------------------------------------------------- SIGINT, augmentation, the resume line
# 7 samples a batch: 480 do not divide, so --pad-last changes the steps per epoch.
LONG=(--data "$D" --devices cpu:1 --batch-per-device 7 --epochs 400 --augment crop=2,flip --pad-last --checkpoint-every 2000 --quiet)
"$CREW" train "$M" "${LONG[@]}" --run-dir "$TMP/whole" 2> /dev/null || fail "the uninterrupted run"
[ "$(weights_meta "$TMP/whole/weights.safetensors" finished)" = true ] && ok || fail "finished weights are not marked finished"
mkdir "$TMP/with space"; S="$TMP/with space/run"
"$CREW" train "$M" "${LONG[@]}" --run-dir "$S" > "$TMP/int.out" 2> "$TMP/int.err" &
pid=$!
# SIGINT once the first checkpoint is there (step 2000 of 27600): the signal lands mid-run.
for _ in $(seq 1 6000); do
  ls -d "$S"/checkpoints/step-* > /dev/null 2>&1 && break
  kill -0 $pid 2> /dev/null || break
  sleep 0.05
done
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 1 ] && ok || fail "SIGINT: exit $rc (wanted 1; did the run end before the signal?): $(cat "$TMP/int.err")"
[ ! -s "$TMP/int.out" ] && grep -q "stopped by signal after step [0-9]* of 27600" "$TMP/int.err" && ok ||
  fail "SIGINT with --quiet: stdout '$(cat "$TMP/int.out")', stderr '$(cat "$TMP/int.err")'"
line=$(grep "resume with: crew train " "$TMP/int.err" | sed 's/.*resume with: crew //')
[ -n "$line" ] && ok || fail "SIGINT with --quiet printed no resume line: $(cat "$TMP/int.err")"
# The stopped run's weights say so, and crew eval warns about them.
[ "$(weights_meta "$S/weights.safetensors" finished)" = false ] && [ "$(weights_meta "$S/weights.safetensors" total_steps)" = 27600 ] &&
  ok || fail "the stopped run's weights are not marked unfinished"
"$CREW" eval "$M" --weights "$S/weights.safetensors" --data "$D" > /dev/null 2> "$TMP/eval.err"
grep -q "unfinished run, after [0-9]* of its 27600 steps" "$TMP/eval.err" && ok || fail "crew eval said nothing of the unfinished run: $(cat "$TMP/eval.err")"
"$CREW" eval "$M" --weights "$TMP/whole/weights.safetensors" --data "$D" > /dev/null 2> "$TMP/eval.err"
[ ! -s "$TMP/eval.err" ] && ok || fail "crew eval warned about finished weights: $(cat "$TMP/eval.err")"
cp -r "$S" "$TMP/bare"
# A flag that would change the resumed run is refused, naming it; the directory is left as it was.
before=$(snapshot "$TMP/bare")
expect_exit 2 "--augment crop=4" -- "$CREW" train "$M" --data "$D" --devices cpu:1 --augment crop=4 --resume "$TMP/bare"
expect_exit 2 "--seed 9" -- "$CREW" train "$M" --data "$D" --devices cpu:1 --seed 9 --resume "$TMP/bare"
expect_exit 2 "--threads-per-device 2" -- "$CREW" train "$M" --data "$D" --devices cpu:1 --threads-per-device 2 --resume "$TMP/bare"
expect_exit 2 "--init-weights" -- "$CREW" train "$M" --data "$D" --init-weights "$TMP/whole/weights.safetensors" --resume "$TMP/bare"
[ "$(snapshot "$TMP/bare")" = "$before" ] && ok || fail "a refused resume changed the run directory"
# The printed command, word for word (its quoting included), finishes the run as if never stopped.
eval "\"\$CREW\" $line" > /dev/null 2>&1 || fail "the printed resume command failed: $line"
cmp -s "$TMP/whole/weights.safetensors" "$S/weights.safetensors" && ok ||
  fail "SIGINT + the printed resume command: the weights differ from the uninterrupted run's"
# So does a bare --resume: the checkpoint brings the augmentation and the padded batch back.
"$CREW" train "$M" --data "$D" --devices cpu:1 --quiet --resume "$TMP/bare" 2> /dev/null || fail "the bare resume failed"
cmp -s "$TMP/whole/weights.safetensors" "$TMP/bare/weights.safetensors" && ok ||
  fail "SIGINT + a bare --resume: the weights differ from the uninterrupted run's"

# ---------------------------------------------------------------- a resume past many damaged checkpoints
# Its info event names the checkpoint it used first, lists what it set aside while that fits, and
# counts the rest: never a message cut mid-sentence (on stderr and in metrics.jsonl alike). A long
# run directory makes every path in it long.
L="$TMP/a-run-directory-with-a-long-name-as-experiment-trackers-make-them-0123456789-0123456789-0123456789/run"
"$CREW" train "$M" "${SHORT[@]}" --max-steps 60 --checkpoint-every 4 --keep-checkpoints 20 --run-dir "$L" 2> /dev/null || fail "the long run"
rm "$L/weights.safetensors"
for s in $(seq 16 4 60); do rm "$L/checkpoints/step-$(printf %08d "$s")/COMPLETE"; done # 12 damaged
"$CREW" train "$M" "${SHORT[@]}" --max-steps 60 --resume "$L" 2> "$TMP/many.err" || fail "the resume past 12 damaged: $(cat "$TMP/many.err")"
info=$(grep "crew train: info: " "$TMP/many.err" | sed 's/^crew train: info: //')
event=$(grep '"kind":"info"' "$L/metrics.jsonl" | tail -n 1 | sed 's/.*"message":"\(.*\)"}$/\1/')
case $info in
  "resumed from $L/checkpoints/step-00000012 (step 12), falling back past 12 damaged checkpoints, set aside as step-XXXXXXXX.refused-"*"; and "*" more (step-"*")") ok ;;
  *) fail "the resume's note past 12 damaged checkpoints: '$info'" ;;
esac
[ "$event" = "$info" ] && ok || fail "metrics.jsonl's event differs from stderr's: '$event'"
[ "$(ls "$L/checkpoints" | grep -c refused)" = 12 ] && ok || fail "not 12 set aside: $(ls "$L/checkpoints")"

# ---------------------------------------------------------------- batch norm and the device count
"$CREW" train "$TMP/bn.json" --data "$D" --devices cpu:2 --batch-per-device 4 --max-steps 6 --checkpoint-every 3 --quiet \
  --run-dir "$TMP/bn" 2> /dev/null || fail "the batch-norm run"
expect_exit 2 "resume it on 2 devices" -- "$CREW" train "$TMP/bn.json" --data "$D" --devices cpu:1 --resume "$TMP/bn"
report
