#!/usr/bin/env bash
# cli_rundir_links.sh — nothing outside a run directory is ever removed, or written through a
# symbolic link (docs/CHECKPOINTS.md, "Symbolic links"):
# - a dead writer's temporary checkpoint (checkpoints/step-*.tmp-<pid>) that is a link to another
#   directory: a resume removes nothing there;
# - a resume whose run directory holds a link where crew keeps its files (metrics.jsonl, tb/,
#   checkpoints/, a checkpoint's directory, a checkpoint's file, weights.safetensors, config.json)
#   is refused before anything is read or written (exit 2, one line naming the link and its
#   target), and what the link points to is unchanged; --replace removes such links, never
#   following them;
# - a --run-dir or --resume that is itself a link to a directory is followed, and said; one to
#   nothing is refused;
# - a dataset's manifest.json or array that is a link to a file outside the dataset is read, and
#   said (crew train, crew eval); a link within the dataset is read without a word.
. "$(dirname "$0")/lib_cli.sh"

tiny_images "$TMP/data" 320
D="$TMP/data"
echo '{"input_shape": [12, 12, 1], "layers": [{"type": "flatten"}, {"type": "dense", "units": 16, "activation": "relu"},
  {"type": "dense", "units": 10}], "training": {"epochs": 1, "batch_per_device": 8, "seed": 1}}' > "$TMP/mlp.json"
M="$TMP/mlp.json"
RUN=(--data "$D" --devices cpu:1 --checkpoint-every 4 --quiet)

# Everything under a directory, with checksums.
snapshot() { (cd "$1" && find . -print0 | sort -z | xargs -0 -n 50 sh -c 'for f; do [ -f "$f" ] && md5sum "$f" || echo "$f"; done' sh); }
# victim DIR: a directory outside any run, holding files of the names crew writes.
victim() {
  mkdir -p "$1"
  for f in model.safetensors optimizer.safetensors state.json COMPLETE metrics.jsonl notes.txt; do echo "not crew's: $f" > "$1/$f"; done
}

# ---------------------------------------------------------------- a stale temporary that is a link
"$CREW" train "$M" "${RUN[@]}" --max-steps 8 --run-dir "$TMP/r" 2> /dev/null || fail "the first run"
victim "$TMP/v1"; before=$(snapshot "$TMP/v1")
# 2147483646: above any pid_max, so its writer is dead and the temporary stale
ln -s "$TMP/v1" "$TMP/r/checkpoints/step-00000012.tmp-2147483646"
"$CREW" train "$M" "${RUN[@]}" --max-steps 8 --resume "$TMP/r" > /dev/null 2> "$TMP/stale.err"
[ "$(snapshot "$TMP/v1")" = "$before" ] && ok || fail "a resume removed files through a stale temporary's link: $(ls -A "$TMP/v1") ($(cat "$TMP/stale.err"))"
[ -L "$TMP/r/checkpoints/step-00000012.tmp-2147483646" ] && ok || fail "the link itself was removed"

# ---------------------------------------------------------------- links where crew keeps its files
"$CREW" train "$M" "${RUN[@]}" --max-steps 8 --run-dir "$TMP/base" 2> /dev/null || fail "the base run"
# linked NAME TARGET: a copy of the base run whose NAME is moved to TARGET (outside it) and linked
# there; the resume is refused naming NAME, and TARGET is unchanged.
linked() {
  local name=$1 target=$2 r=$TMP/run-${1//\//-}
  rm -rf "$r" "$target"; cp -r "$TMP/base" "$r"
  mkdir -p "$(dirname "$target")"; mv "$r/$name" "$target"; ln -s "$target" "$r/$name"
  local before; before=$(snapshot "$(dirname "$target")")
  expect_exit 2 "$name is a symbolic link (to $target)" -- "$CREW" train "$M" "${RUN[@]}" --max-steps 8 --resume "$r"
  [ "$(snapshot "$(dirname "$target")")" = "$before" ] && ok || fail "a refused resume changed what $name links to"
  [ -z "$(ls "$r/checkpoints" 2> /dev/null | grep refused)" ] && ok || fail "$name: a checkpoint was set aside"
}
linked metrics.jsonl "$TMP/out1/metrics.jsonl"
linked tb "$TMP/out2/tb"
linked checkpoints "$TMP/out3/checkpoints"
linked checkpoints/step-00000008 "$TMP/out4/step-00000008"
linked checkpoints/step-00000008/state.json "$TMP/out5/state.json"
linked weights.safetensors "$TMP/out6/weights.safetensors"
linked config.json "$TMP/out7/config.json"
# A checkpoint's file that is a link to a system file is never read (nor called damaged).
cp -r "$TMP/base" "$TMP/sys"; rm "$TMP/sys/checkpoints/step-00000008/model.safetensors"
ln -s /etc/passwd "$TMP/sys/checkpoints/step-00000008/model.safetensors"
expect_exit 2 "model.safetensors is a symbolic link (to /etc/passwd)" -- "$CREW" train "$M" "${RUN[@]}" --max-steps 8 --resume "$TMP/sys"
# --replace removes the links, never what they point to, and starts anew.
cp -r "$TMP/base" "$TMP/rep"; mkdir "$TMP/out8"; mv "$TMP/rep/metrics.jsonl" "$TMP/rep/tb" "$TMP/out8/"
ln -s "$TMP/out8/metrics.jsonl" "$TMP/rep/metrics.jsonl"; ln -s "$TMP/out8/tb" "$TMP/rep/tb"
before=$(snapshot "$TMP/out8")
"$CREW" train "$M" "${RUN[@]}" --max-steps 8 --run-dir "$TMP/rep" --replace 2> "$TMP/rep.err" || fail "--replace over links: $(cat "$TMP/rep.err")"
[ "$(snapshot "$TMP/out8")" = "$before" ] && [ ! -L "$TMP/rep/metrics.jsonl" ] && [ -f "$TMP/rep/metrics.jsonl" ] && ok \
  || fail "--replace wrote through, or kept, a link"

# ---------------------------------------------------------------- a run directory that is a link
mkdir "$TMP/real"; ln -s "$TMP/real" "$TMP/alias"
"$CREW" train "$M" "${RUN[@]}" --max-steps 4 --run-dir "$TMP/alias" 2> "$TMP/alias.err" || fail "a run into a linked directory"
grep -q "note: run directory $TMP/alias is a symbolic link: the run is written into $TMP/real" "$TMP/alias.err" \
  && [ -f "$TMP/real/weights.safetensors" ] && ok || fail "a --run-dir link was followed without a word: $(cat "$TMP/alias.err")"
"$CREW" train "$M" "${RUN[@]}" --max-steps 4 --resume "$TMP/alias" 2> "$TMP/alias.err" && grep -q "note: run directory" "$TMP/alias.err" \
  && ok || fail "a --resume link: $(cat "$TMP/alias.err")"
ln -s "$TMP/nowhere" "$TMP/dangling"
expect_exit 2 "is a symbolic link to $TMP/nowhere, which does not exist" -- "$CREW" train "$M" "${RUN[@]}" --max-steps 4 --run-dir "$TMP/dangling"
[ ! -e "$TMP/nowhere" ] && ok || fail "a dangling --run-dir link got its directory made"

# ---------------------------------------------------------------- a dataset's files as links
cp -r "$D" "$TMP/ds"; mkdir "$TMP/elsewhere"
mv "$TMP/ds/manifest.json" "$TMP/ds/train_x.npy" "$TMP/elsewhere/"
ln -s "$TMP/elsewhere/manifest.json" "$TMP/ds/manifest.json"; ln -s "$TMP/elsewhere/train_x.npy" "$TMP/ds/train_x.npy"
mv "$TMP/ds/test_y.npy" "$TMP/ds/labels-kept-here.npy"; ln -s labels-kept-here.npy "$TMP/ds/test_y.npy" # within: silent
"$CREW" train "$M" --data "$TMP/ds" --devices cpu:1 --max-steps 2 --quiet --run-dir "$TMP/ds-run" 2> "$TMP/ds.err" \
  || fail "a dataset of links: $(cat "$TMP/ds.err")"
grep -q "note: $TMP/ds/manifest.json is a symbolic link to $TMP/elsewhere/manifest.json, outside $TMP/ds: read from there" "$TMP/ds.err" \
  && grep -q "note: $TMP/ds/train_x.npy is a symbolic link to $TMP/elsewhere/train_x.npy" "$TMP/ds.err" && ok \
  || fail "a dataset's files linked from outside were read without a word: $(cat "$TMP/ds.err")"
[ "$(grep -c "manifest.json is a symbolic link" "$TMP/ds.err")" = 1 ] && ! grep -q "test_y.npy" "$TMP/ds.err" && ok \
  || fail "the dataset's notes: $(cat "$TMP/ds.err")"
"$CREW" eval "$M" --weights "$TMP/ds-run/weights.safetensors" --data "$TMP/ds" > /dev/null 2> "$TMP/ds-eval.err"
grep -q "crew eval: note: $TMP/ds/manifest.json is a symbolic link" "$TMP/ds-eval.err" && ok || fail "crew eval: $(cat "$TMP/ds-eval.err")"

report
