#!/usr/bin/env bash
# cli_errors.sh — bad input and bad usage: one clear line on stderr and exit status 2, never a
# crash or a half-written file.
. "$(dirname "$0")/lib_cli.sh"

# A tiny valid dataset to pair with bad model files: IDX files made here.
printf '\x00\x00\x08\x03\x00\x00\x00\x10\x00\x00\x00\x1c\x00\x00\x00\x1c' > "$TMP/img"
seeded_bytes 16 $((16 * 784)) >> "$TMP/img"
printf '\x00\x00\x08\x01\x00\x00\x00\x10' > "$TMP/lab"
printf '\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x00\x01\x02\x03\x04\x05' >> "$TMP/lab"
"$CREW" prep idx "$TMP/img" "$TMP/lab" --out "$TMP/data" > /dev/null 2>&1 || fail "prep idx of a valid pair"
D="$TMP/data"

# Model files
echo '{"input_shape": [28, 28, 1], "layers": [' > "$TMP/malformed.json"
expect_exit 2 "malformed.json" -- "$CREW" train "$TMP/malformed.json" --data "$D"
echo '{"input_shape": [28, 28, 1], "layers": [{"type": "flatten"}, {"type": "lstm", "units": 4}]}' > "$TMP/unknown.json"
expect_exit 2 "layer 1" -- "$CREW" train "$TMP/unknown.json" --data "$D"
echo '{"input_shape": [28, 28, 1], "layers": [{"type": "dense", "units": "ten"}]}' > "$TMP/type.json"
expect_exit 2 "units" -- "$CREW" train "$TMP/type.json" --data "$D"
echo '{"input_shape": [28, 28, 1], "lerning_rate": 1, "layers": [{"type": "flatten"}]}' > "$TMP/key.json"
expect_exit 2 "lerning_rate" -- "$CREW" train "$TMP/key.json" --data "$D"
echo '{"input_shape": [4, 4, 1], "layers": [{"type": "conv2d", "filters": 2, "kernel_size": 5}]}' > "$TMP/shape.json"
expect_exit 2 "layer 0" -- "$CREW" train "$TMP/shape.json" --data "$D"
expect_exit 2 "no-such.json" -- "$CREW" train "$TMP/no-such.json" --data "$D"

# Data
cp -r "$D" "$TMP/trunc"
head -c 1000 "$D/train_x.npy" > "$TMP/trunc/train_x.npy"
expect_exit 2 "train_x.npy" -- "$CREW" train examples/fashion_mlp.json --data "$TMP/trunc"
head -c 100 "$TMP/img" > "$TMP/img-trunc"
expect_exit 2 "img-trunc" -- "$CREW" prep idx "$TMP/img-trunc" "$TMP/lab" --out "$TMP/out-trunc"
[ ! -e "$TMP/out-trunc" ] && ok || fail "a failed prep left $TMP/out-trunc behind"
printf 'not gzip at all' | gzip > "$TMP/bad.gz"; head -c 20 "$TMP/bad.gz" > "$TMP/corrupt.gz"
expect_exit 2 "corrupt.gz" -- "$CREW" prep idx "$TMP/corrupt.gz" "$TMP/lab" --out "$TMP/out-gz"
expect_exit 2 "no-such-dir" -- "$CREW" train examples/fashion_mlp.json --data "$TMP/no-such-dir"

# Weights
"$CREW" train examples/fashion_mlp.json --data "$D" --max-steps 1 --batch-per-device 8 --devices cpu:1 \
    --run-dir "$TMP/run" --quiet > /dev/null 2>&1 || fail "training 1 step on the small dataset"
W="$TMP/run/weights.safetensors"
head -c 5000 "$W" > "$TMP/trunc.safetensors"
expect_exit 2 "trunc.safetensors" -- "$CREW" eval examples/fashion_mlp.json --weights "$TMP/trunc.safetensors" --data "$D"
expect_exit 2 "trunc.safetensors" -- "$CREW" train examples/fashion_mlp.json --init-weights "$TMP/trunc.safetensors" --data "$D"
cp "$W" "$TMP/flip.safetensors"; printf 'X' | dd of="$TMP/flip.safetensors" bs=1 seek=12 conv=notrunc 2>/dev/null
expect_exit 2 "flip.safetensors" -- "$CREW" eval examples/fashion_mlp.json --weights "$TMP/flip.safetensors" --data "$D"
expect_exit 2 "conv2d.kernel" -- "$CREW" eval examples/fashion_cnn.json --weights "$W" --data "$D"

# Flags
expect_exit 2 "--epochs" -- "$CREW" train examples/fashion_mlp.json --data "$D" --epochs 0
expect_exit 2 "--batch-per-device" -- "$CREW" train examples/fashion_mlp.json --data "$D" --batch-per-device -3
expect_exit 2 "--lr" -- "$CREW" train examples/fashion_mlp.json --data "$D" --lr abc
expect_exit 2 "unknown device kind 'gpu': this build of crew has cpu" -- "$CREW" train examples/fashion_mlp.json --data "$D" --devices gpu:1
expect_exit 2 "--devices cpu:N" -- "$CREW" train examples/fashion_mlp.json --data "$D" --devices cpu:0
expect_exit 2 "unknown option" -- "$CREW" train examples/fashion_mlp.json --data "$D" --frobnicate
expect_exit 2 "--conv library on cpu: its devices have no convolution library" -- \
  "$CREW" train examples/fashion_cnn.json --data "$D" --conv cudnn --batch-per-device 2
expect_exit 2 "--comm nccl on cpu:2: its device kind has no NCCL" -- \
  "$CREW" train examples/fashion_mlp.json --data "$D" --devices cpu:2 --comm nccl --batch-per-device 2
expect_exit 2 "needs a value" -- "$CREW" train examples/fashion_mlp.json --data
# Each kind of entry in crew train's flag table, in both the "--flag value" and "--flag=value" forms
expect_exit 2 "--max-steps must be in [1, 4611686018427387903], got 0" -- "$CREW" train examples/fashion_mlp.json --data "$D" --max-steps=0
expect_exit 2 "--seed needs an integer, got ''" -- "$CREW" train examples/fashion_mlp.json --data "$D" --seed=
expect_exit 2 "--bucket-mb must be in [1e-06, 1e+06], got 0" -- "$CREW" train examples/fashion_mlp.json --data "$D" --bucket-mb 0
expect_exit 2 "--lr-scaling takes one of none, linear, sqrt, got 'cubic'" -- "$CREW" train examples/fashion_mlp.json --data "$D" --lr-scaling cubic
expect_exit 2 "--on-nan needs a value" -- "$CREW" train examples/fashion_mlp.json --data "$D" --on-nan
expect_exit 2 "unknown option '--json=1'" -- "$CREW" train examples/fashion_mlp.json --data "$D" --json=1
expect_exit 2 "--augment crop=P needs an integer, got 'x'" -- "$CREW" train examples/fashion_mlp.json --data "$D" --augment=crop=x
expect_exit 2 "--checkpoint-every must be in [0.001, 1e+09], got 0" -- "$CREW" train examples/fashion_mlp.json --data "$D" --checkpoint-every 0s
expect_exit 2 "unexpected argument 'extra'" -- "$CREW" train examples/fashion_mlp.json extra --data "$D"
expect_exit 2 "missing --data DIR" -- "$CREW" train examples/fashion_mlp.json --devices gpu:1
expect_exit 2 "unknown verb" -- "$CREW" fly
expect_exit 2 "not a multiple" -- "$CREW" train examples/fashion_mlp.json --data "$D" --devices cpu:2 --batch-per-device 4 --global-batch 10
expect_exit 2 "fewer than one global batch" -- "$CREW" train examples/fashion_mlp.json --data "$D" --batch-per-device 64

# The other verbs' flag tables: a custom entry of each, and the checks that come after parsing
M=examples/fashion_mlp.json
expect_exit 2 "--batch must be in [1, 1048576], got 0" -- "$CREW" eval $M --weights "$W" --data "$D" --batch=0
expect_exit 2 "--augment takes crop=P, flip or none (comma-separated), got 'spin'" -- "$CREW" bench-data "$D" --augment spin
expect_exit 2 "--tolerance must be in [1e-12, 1], got 2" -- "$CREW" verify $M --data "$D" --tolerance 2
expect_exit 2 "missing --data DIR" -- "$CREW" verify $M --devices gpu
expect_exit 2 "unknown device kind 'gpu'" -- "$CREW" plan $M --devices=gpu
expect_exit 2 "--device-memory takes a size such as 512M, 8G or 24GiB, got '5X'" -- "$CREW" plan $M --device-memory 5X
expect_exit 2 "--devices takes KIND:1,2,... (cpu:1,2), got 'gpu'" -- "$CREW" scale $M --data "$D" --devices gpu
expect_exit 2 "--project takes ascending counts" -- "$CREW" scale $M --data "$D" --project 4,2
expect_exit 2 "--latency takes a time such as 5us or 0.2ms, got '11s'" -- "$CREW" scale $M --data "$D" --latency=11s
expect_exit 2 "--worth-it needs a value" -- "$CREW" scale $M --data "$D" --worth-it
expect_exit 2 "--out needs a file name" -- "$CREW" report "$TMP/run" --out=

# Help works for every verb
for verb in prep train eval verify bench-data report plan scale; do
  "$CREW" $verb --help | grep -q "usage: crew $verb" && ok || fail "crew $verb --help"
done
"$CREW" --help | grep -q "verbs:" && ok || fail "crew --help"
report
