#!/usr/bin/env bash
# cli_conv.sh — --conv, the way each convolution layer computes, end to end on cpu-remote, whose
# direct sums stand in for a GPU's convolution library (cuDNN) so that every path runs on the CPU:
# - --conv library runs the layers by the library where it runs their shape (a layer with
#   TensorFlow's uneven 'same' padding falls back to im2col), with other bits than im2col's, and
#   2 replicas still equal 1 replica accumulating 2 micro-batches, bit for bit;
# - a list gives one way per layer; the plan says which; two runs give the same weights, and so
#   does a 2-stage pipeline;
# - checkpoints keep the ways; a resume takes them, ends with the bits of the run it continues,
#   and refuses another --conv;
# - --conv auto is im2col on a kind whose library is not offered for speed (cpu-remote's, the CPU
#   has none); --conv library on the CPU, a list of the wrong length and a bad way are one line and
#   exit 2;
# - crew verify passes with the library's convolutions, and bench_conv times both ways per layer.
. "$(dirname "$0")/lib_cli.sh"
need_fashion
BENCH_CONV=${BENCH_CONV:-$(dirname "$CREW")/bench/bench_conv}

# Three convolutions, small enough that the stand-in's direct sums stay quick: the second has a
# 2x2 window with 'same' padding, one more row and column of zeros after than before, which a
# library padding both sides alike (cuDNN, the stand-in) does not run.
cat > "$TMP/cnn.json" <<'JSON'
{"name": "conv_ways", "input_shape": [28, 28, 1],
 "layers": [
  {"type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same", "activation": "relu"},
  {"type": "max_pool2d", "pool_size": 2},
  {"type": "conv2d", "filters": 6, "kernel_size": 2, "padding": "same", "activation": "relu"},
  {"type": "conv2d", "filters": 6, "kernel_size": 3, "padding": "valid", "activation": "relu"},
  {"type": "flatten"},
  {"type": "dense", "units": 10}],
 "optimizer": {"type": "adamw", "lr": 0.003},
 "training": {"batch_per_device": 16, "seed": 3}}
JSON
train() { "$CREW" train "$TMP/cnn.json" --data "$DATA" --max-steps 12 --json "$@"; }
train --devices cpu-remote:1 --global-batch 32 --conv im2col --run-dir "$TMP/im2col" > "$TMP/im2col.out" 2>&1 \
  || fail "--conv im2col: $(tail -n 3 "$TMP/im2col.out")"
train --devices cpu-remote:1 --global-batch 32 --conv library --run-dir "$TMP/lib1" > "$TMP/lib1.out" 2>&1 \
  || fail "--conv library: $(tail -n 3 "$TMP/lib1.out")"
train --devices cpu-remote:2 --conv cudnn --run-dir "$TMP/lib2" --checkpoint-every 6 > "$TMP/lib2.out" 2>&1 \
  || fail "--conv cudnn on cpu-remote:2: $(tail -n 3 "$TMP/lib2.out")"
grep -q "convolutions (--conv library): 3 of 3 layers by direct sums" "$TMP/lib1.out" && ok \
  || fail "the plan does not say which layers use the library: $(grep convolutions "$TMP/lib1.out")"
grep -q "convolutions (--conv" "$TMP/im2col.out" && fail "an im2col plan names a library" || ok
cmp -s "$TMP/lib1/weights.safetensors" "$TMP/im2col/weights.safetensors" \
  && fail "--conv library and --conv im2col gave the same weights: the library never ran" || ok
cmp -s "$TMP/lib2/weights.safetensors" "$TMP/lib1/weights.safetensors" && ok \
  || fail "--conv library: cpu-remote:2 and cpu-remote:1 accumulating 2 micro-batches differ"
l1=$(json_field "$TMP/lib1.out" test_loss); li=$(json_field "$TMP/im2col.out" test_loss)
awk -v a="$l1" -v b="$li" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.01 * b) }' && ok \
  || fail "the library's test loss $l1 is not within 1% of im2col's $li"

# One way per layer; the same weights run after run.
train --devices cpu-remote:1 --global-batch 32 --conv im2col,library,library --run-dir "$TMP/mix1" > "$TMP/mix1.out" 2>&1 \
  || fail "--conv as a list: $(tail -n 3 "$TMP/mix1.out")"
train --devices cpu-remote:1 --global-batch 32 --conv im2col,library,library --run-dir "$TMP/mix2" > /dev/null 2>&1 \
  || fail "--conv as a list, again"
grep -q "2 of 3 layers by direct sums .*('ill')" "$TMP/mix1.out" && ok || fail "the plan of a list: $(grep convolutions "$TMP/mix1.out")"
cmp -s "$TMP/mix1/weights.safetensors" "$TMP/mix2/weights.safetensors" && ok || fail "two runs of one list differ"
cmp -s "$TMP/mix1/weights.safetensors" "$TMP/lib1/weights.safetensors" && fail "'ill' and 'lll' gave the same weights" || ok
# A pipeline's stages find their layers' ways by the layers' place in the whole model.
train --devices cpu-remote:2 --pipeline 2 --stages 0-3,4-8 --global-batch 32 --conv im2col,library,library \
  --run-dir "$TMP/pipe" > "$TMP/pipe.out" 2>&1 || fail "--conv as a list in a pipeline: $(tail -n 3 "$TMP/pipe.out")"
cmp -s "$TMP/pipe/weights.safetensors" "$TMP/mix1/weights.safetensors" && ok \
  || fail "a 2-stage pipeline with ways 'ill' and one device accumulating differ"

# Checkpoints keep the ways; a resume takes them and ends with the bits of the whole run.
state="$TMP/lib2/checkpoints/step-00000006/state.json"
grep -q '"conv":[[:space:]]*"library"' "$state" && grep -q '"conv_choice":[[:space:]]*"lll"' "$state" && ok \
  || fail "the checkpoint does not keep the ways: $(grep -o '"conv[^,]*' "$state" | tr '\n' ' ')"
rm -rf "$TMP/lib2/checkpoints/step-00000012"
cp "$TMP/lib2/weights.safetensors" "$TMP/lib2-whole.safetensors"
"$CREW" train "$TMP/cnn.json" --data "$DATA" --devices cpu-remote:2 --resume "$TMP/lib2" > "$TMP/resume.out" 2>&1 \
  || fail "resume: $(tail -n 3 "$TMP/resume.out")"
cmp -s "$TMP/lib2/weights.safetensors" "$TMP/lib2-whole.safetensors" && ok \
  || fail "a resumed --conv library run ends with other weights than the run in one go"
expect_exit 2 "cannot resume with --conv im2col: the run in $TMP/lib2 has --conv library (ways 'lll')" -- \
  "$CREW" train "$TMP/cnn.json" --data "$DATA" --devices cpu-remote:2 --resume "$TMP/lib2" --conv im2col

# auto: cpu-remote's stand-in is never chosen for speed, the CPU has no library.
train --devices cpu-remote:1 --global-batch 32 --run-dir "$TMP/auto" > /dev/null 2>&1 || fail "--conv auto on cpu-remote"
cmp -s "$TMP/auto/weights.safetensors" "$TMP/im2col/weights.safetensors" && ok \
  || fail "--conv auto on cpu-remote did not compute im2col's bits"
expect_exit 2 "--conv library on cpu: its devices have no convolution library" -- \
  "$CREW" train "$TMP/cnn.json" --data "$DATA" --conv library --run-dir "$TMP/x1"
expect_exit 2 "expected one way per convolution layer of the model ('l': the device's library, 'i': im2col + GEMM), 3 of them" -- \
  "$CREW" train "$TMP/cnn.json" --data "$DATA" --devices cpu-remote:1 --conv im2col,library --run-dir "$TMP/x2"
expect_exit 2 "--conv takes auto, im2col, library (cudnn) or one of im2col|library per convolution layer" -- \
  "$CREW" train "$TMP/cnn.json" --data "$DATA" --conv winograd
expect_exit 2 "--conv takes auto, im2col, library (cudnn)" -- \
  "$CREW" train "$TMP/cnn.json" --data "$DATA" --conv im2col,,library
[ ! -e "$TMP/x1" ] && [ ! -e "$TMP/x2" ] && ok || fail "a refused --conv left a run directory"

# verify: N replicas by the library equal one replica accumulating; the full batch within bounds.
"$CREW" verify "$TMP/cnn.json" --data "$DATA" --devices cpu-remote:2 --steps 3 --conv library > "$TMP/v" 2>&1
tail -n 1 "$TMP/v" | grep -q PASS && ok || fail "verify --conv library on cpu-remote:2: $(tail -n 5 "$TMP/v")"

# bench_conv: both ways, one line per layer; the uneven layer has no library figure.
if [ -x "$BENCH_CONV" ]; then
  "$BENCH_CONV" "$TMP/cnn.json" --kind cpu-remote --batch 8 > "$TMP/bench" 2>&1 || fail "bench_conv: $(cat "$TMP/bench")"
  [ "$(grep -c '^conv2d' "$TMP/bench")" = 3 ] && grep -q '^conv2d_1 .* - .*im2col$' "$TMP/bench" \
    && tail -n 1 "$TMP/bench" | grep -q '"library":"direct sums' && ok || fail "bench_conv said: $(cat "$TMP/bench")"
fi
report
