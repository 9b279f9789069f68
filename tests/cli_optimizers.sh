#!/usr/bin/env bash
# cli_optimizers.sh — the layer-wise optimizers (LAMB, LARS) end to end, on small generated images:
# - crew verify passes with each, at N = 2 and 4, and with --shard-optimizer (each tensor's trust
#   ratio is over the whole tensor, which a shard does not hold alone);
# - crew plan counts LAMB's two slots of state and LARS's one;
# - a LAMB run stopped by SIGINT resumes to the weights of the run never stopped (its moments and
#   update count come back from the checkpoint), bit for bit.
. "$(dirname "$0")/lib_cli.sh"

tiny_images "$TMP/data" 480
model() { # FILE OPTIMIZER_JSON
  cat > "$1" <<JSON
{"input_shape": [12, 12, 1], "layers": [
  {"type": "conv2d", "filters": 4, "kernel_size": 3, "activation": "relu"},
  {"type": "flatten"}, {"type": "dense", "units": 16, "activation": "relu"}, {"type": "dense", "units": 10}],
 "optimizer": $2}
JSON
}
model "$TMP/lamb.json" '{"type": "lamb", "lr": 0.01, "weight_decay": 0.01}'
model "$TMP/lars.json" '{"type": "lars", "lr": 1.0, "weight_decay": 0.0005, "clip_norm": 1.0}'

# ---------------------------------------------------------------- verify
for opt in lamb lars; do
  for n in 2 4; do
    for shard in "" --shard-optimizer; do
      "$CREW" verify "$TMP/$opt.json" --data "$TMP/data" --devices cpu:$n --steps 8 --batch-per-device 8 $shard \
        --json > "$TMP/v.out" 2> "$TMP/v.err"
      [ "$(json_field "$TMP/v.out" pass)" = true ] && ok || fail "verify $opt cpu:$n $shard: $(tail -n 3 "$TMP/v.out") $(cat "$TMP/v.err")"
    done
  done
done

# ---------------------------------------------------------------- plan
"$CREW" plan "$TMP/lamb.json" --devices cpu:2 > "$TMP/plan.out" 2>&1 && grep -q "LAMB" "$TMP/plan.out" && ok \
  || fail "crew plan does not name LAMB: $(cat "$TMP/plan.out")"
lamb_state=$("$CREW" plan "$TMP/lamb.json" --devices cpu:2 --json | sed -n 's/.*"breakdown":{[^}]*"optimizer":\([0-9]*\).*/\1/p')
lars_state=$("$CREW" plan "$TMP/lars.json" --devices cpu:2 --json | sed -n 's/.*"breakdown":{[^}]*"optimizer":\([0-9]*\).*/\1/p')
[ -n "$lamb_state" ] && [ "$lamb_state" -gt 0 ] && [ "$lamb_state" = "$((2 * lars_state))" ] && ok \
  || fail "optimizer state: LAMB $lamb_state bytes, LARS $lars_state (two slots against one)"

# ---------------------------------------------------------------- stopped and resumed
run=("$CREW" train "$TMP/lamb.json" --data "$TMP/data" --devices cpu:2 --batch-per-device 8 --epochs 40 --seed 4 --quiet)
"${run[@]}" --run-dir "$TMP/whole" > /dev/null 2>&1 || fail "LAMB run"
"${run[@]}" --run-dir "$TMP/stopped" > "$TMP/stop.out" 2> "$TMP/stop.err" &
pid=$!
# on the run's own progress: once metrics.jsonl holds its 20th step
for _ in $(seq 1200); do
  [ "$(grep -c '"type":"step"' "$TMP/stopped/metrics.jsonl" 2>/dev/null)" -ge 20 ] 2>/dev/null && break
  sleep 0.05
done
kill -INT $pid
wait $pid
[ $? -eq 1 ] && grep -q "resume with" "$TMP/stop.err" && ok || fail "SIGINT: $(cat "$TMP/stop.err")"
"${run[@]}" --resume "$TMP/stopped" > /dev/null 2> "$TMP/resume.err" || fail "resume: $(cat "$TMP/resume.err")"
cmp -s "$TMP/whole/weights.safetensors" "$TMP/stopped/weights.safetensors" && ok \
  || fail "the resumed LAMB run ended with other weights than the run never stopped"
report
