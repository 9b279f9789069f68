#!/usr/bin/env bash
# cli_scale.sh — crew scale: a short run at 1 and 2 replicas on a small made-up dataset (its
# JSON line holds the trials, the recommendation and the reason), and bad usage. It holds the
# answer to its shape, never to its figures (they are this machine's speed at that moment, which
# other work changes): how good the advisor's predictions are is bench/bench_advisor.c's question.
. "$(dirname "$0")/lib_cli.sh"

# 640 pseudo-random 28x28 images of 10 classes (the same on every run), as IDX files.
printf '\x00\x00\x08\x03\x00\x00\x02\x80\x00\x00\x00\x1c\x00\x00\x00\x1c' > "$TMP/img"
seeded_bytes 640 $((640 * 784)) >> "$TMP/img"
printf '\x00\x00\x08\x01\x00\x00\x02\x80' > "$TMP/lab"
for i in $(seq 64); do printf '\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09'; done >> "$TMP/lab"
"$CREW" prep idx "$TMP/img" "$TMP/lab" --out "$TMP/data" > /dev/null 2>&1 || fail "prep idx"
D="$TMP/data"

"$CREW" scale examples/fashion_mlp.json --data "$D" --devices cpu:1,2 --batch-per-device 16 --steps 4 --warmup 1 \
    --repeats 2 --epochs 3 --link 25Gbit --latency 20us --worth-it 1s --price 3/h --json > "$TMP/out" 2> "$TMP/err" \
    && ok || fail "crew scale: $(cat "$TMP/err")"
last=$(tail -n 1 "$TMP/out")
echo "$last" | grep -q '"trials":\[{"devices":1,' && echo "$last" | grep -q '{"devices":2,"global_batch":32' \
    && ok || fail "trials: $last"
echo "$last" | grep -q '"efficiency":1,' && ok || fail "the 1-replica trial's efficiency is not 1: $last"
# The layouts of every core: one replica per core first, then fewer with more BLAS threads, then
# one replica per core sharded, at one global batch; the text names the fastest.
cores=$(nproc)
if [ "$cores" -ge 2 ]; then
  echo "$last" | grep -q "\"layouts\":\[{\"replicas\":$cores,\"threads_per_device\":1,\"shard_optimizer\":0,\"batch_per_device\":16,\"samples_per_s\":[0-9]" \
    && echo "$last" | grep -q "{\"replicas\":1,\"threads_per_device\":$cores,\"shard_optimizer\":0,\"batch_per_device\":$((16 * cores))," \
    && echo "$last" | grep -q "{\"replicas\":$cores,\"threads_per_device\":1,\"shard_optimizer\":1,\"batch_per_device\":16," \
    && grep -q "^layouts of the $cores cores at a global batch of $((16 * cores))" "$TMP/out" \
    && [ "$(grep -c '  fastest$' "$TMP/out")" = 1 ] && ok || fail "layouts: $(grep -A3 '^layouts' "$TMP/out")"
fi
rec=$(echo "$last" | sed -n 's/.*"recommended_devices":\([0-9]*\).*/\1/p')
[ -n "$rec" ] && [ "$rec" -ge 1 ] && ok || fail "recommended_devices: $last"
echo "$last" | grep -q '"reason":"[a-z]' && ok || fail "reason: $last"
echo "$last" | grep -q '"link_projection":\[{"devices":1' && ok || fail "link projection: $last"
grep -q "^recommendation" "$TMP/out" && ok || fail "no recommendation line: $(cat "$TMP/out")"
# Time and money: each projected point's device-hours (devices x time) and, with --price, its cost.
echo "$last" | grep -o '"projection":\[{[^}]*}' | awk -F'[,:]' '
  { for (i = 1; i < NF; i++) { if ($i ~ /"devices"/) d = $(i+1); if ($i ~ /"device_hours"/) h = $(i+1);
                              if ($i ~ /"cost"/) c = $(i+1); if ($i ~ /"epochs_s"/) e = $(i+1) } }
  END { exit !(h > 0 && (h - d * e / 3600) ^ 2 < 1e-8 * h * h && (c - 3 * h) ^ 2 < 1e-8 * c * c) }' \
  && ok || fail "device-hours and cost of the first projected point: $(echo "$last" | grep -o '"projection":\[{[^}]*}')"
grep -q "dev-hours *cost" "$TMP/out" && ok || fail "no dev-hours and cost columns: $(grep -m1 devices "$TMP/out")"

expect_exit 2 "--devices" -- "$CREW" scale examples/fashion_mlp.json --data "$D" --devices cpu:2,1
expect_exit 2 "unknown device kind 'gpu'" -- "$CREW" scale examples/fashion_mlp.json --data "$D" --devices gpu:1
# Another kind: cpu-remote, the guarded CPU backend without host_alias (a GPU's case), so the link
# measured is the staged one through host copies, as a run of two replicas would cross it.
"$CREW" scale examples/fashion_mlp.json --data "$D" --devices cpu-remote:1 --batch-per-device 16 --steps 3 --warmup 1 \
    --repeats 1 > "$TMP/remote" 2> "$TMP/err" && ok || fail "crew scale on cpu-remote: $(cat "$TMP/err")"
grep -q "^  host copies between cpu-remote:0 and cpu-remote:[01]: alpha = .*(host copies between .*, measured: " "$TMP/remote" \
  && ok || fail "the staged link is not in the cost model: $(grep -A4 '^cost model' "$TMP/remote")"
expect_exit 2 "--link" -- "$CREW" scale examples/fashion_mlp.json --data "$D" --link 25furlongs
expect_exit 2 "--latency" -- "$CREW" scale examples/fashion_mlp.json --data "$D" --latency soon
expect_exit 2 "--worth-it" -- "$CREW" scale examples/fashion_mlp.json --data "$D" --worth-it -1h
expect_exit 2 "--price" -- "$CREW" scale examples/fashion_mlp.json --data "$D" --price 3/fortnight
expect_exit 2 "--price" -- "$CREW" scale examples/fashion_mlp.json --data "$D" --price -1
expect_exit 2 "missing --data" -- "$CREW" scale examples/fashion_mlp.json
expect_exit 2 "no-such-dir" -- "$CREW" scale examples/fashion_mlp.json --data "$TMP/no-such-dir"
expect_exit 2 "fewer than one global batch" -- "$CREW" scale examples/fashion_mlp.json --data "$D" --batch-per-device 512
report
