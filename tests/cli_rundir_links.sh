#!/usr/bin/env bash
# cli_rundir_links.sh — nothing outside a run directory is ever removed, or written through a
# symbolic link (docs/CHECKPOINTS.md, "Symbolic links"):
# - a dead writer's temporary checkpoint (checkpoints/step-*.tmp-<pid>) that is a link to another
#   directory: a resume removes nothing there.
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

report
