#!/usr/bin/env bash
# scripts/gpu-check.sh — the GPU checks of the CUDA backend in one go, for a machine with an NVIDIA
# GPU and the CUDA toolkit (a few minutes on an H200; nothing here runs where there is no GPU).
#
#   scripts/gpu-check.sh [OUT_DIR]        (OUT_DIR: logs and the table, default ./gpu-check)
#
# It builds crew for this GPU (build-gpu/, CMAKE_CUDA_ARCHITECTURES=native), then runs, each with
# its log in OUT_DIR and one line in the table at the end:
#   ops        test_backend_ops cuda: every backend op against the references the CPU passes
#   cpu ops    the same on the CPU, as the baseline of this machine
#   conv auto  --conv auto (the default) on cuda:1: each convolution timed both ways once, the
#              choice per layer shape printed and cached (the training runs below take it)
#   repeat     two 200-step runs of the CNN on cuda:1 end with bitwise-equal weights
#   replicas   2 replicas on the GPU (cuda:2: round-robin on one GPU) = cuda:1 accumulating 2
#              micro-batches, bitwise (the ordered all-reduce through host copies)
#   nccl       --comm nccl: on one GPU, a run that opens and closes NCCL ends with the staged path's
#              weights; with two GPUs or more, cuda:2 over NCCL = cuda:1 accumulating, bitwise
#   verify     crew verify on cuda:2 (fp32, and --precision bf16): PASS; and --against cpu, the GPU's
#              full-batch run held to the CPU's within verify's rounding bound
#   bf16       --precision bf16 on cuda:1: the training loss within 2% of bf16 on the CPU
#   cudnn      --conv library on cuda:1: two runs bitwise equal, the training loss within 2% of
#              --conv im2col's
#   conv       bench_conv: each of the CNN's convolutions timed both ways, which was faster per shape
#   vs cpu     the same 200 steps on cuda:1 and cpu:1: the final training loss within 2%
#   accuracy   the demo's CNN, 4 epochs on cuda:1: test accuracy >= 0.91
#   plan       crew plan --devices cuda:1 plans against the GPU's own memory
#   speed      samples/s of the CNN and the MLP on cuda:1 (300 steps), the peak GEMM rate
#   bench      tools/bench_gpu.py: crew against PyTorch eager and torch.compile on this GPU (needs
#              python3 with torch; its table in OUT_DIR/bench.md); with GPT=1 also GPT-2 124M in bf16
#              on the King James Bible's bytes (data/kjv.txt, from make demo-gpt)
# and prints the table (also OUT_DIR/table.md). Exit status 1 when a check failed.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
mkdir -p "$OUT"
B=build-gpu
ROWS=()
FAILED=0
row() { ROWS+=("| $1 | $2 | $3 |"); [ "$2" = FAIL ] && FAILED=1; echo "== $1: $2 ($3)"; }

{ nvidia-smi || true; } > "$OUT/nvidia-smi.txt" 2>&1
echo "== building into $B"
if ! { cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=native \
       && cmake --build "$B" -j "$(nproc)" --target crew_cli test_backend_ops bench_conv; } > "$OUT/build.log" 2>&1; then
  tail -n 30 "$OUT/build.log"
  echo "the build failed: $OUT/build.log"
  exit 1
fi
CREW=$B/crew
"$CREW" --version > "$OUT/version.txt" 2>&1
grep -q '^CUDA: .*cuda:0' "$OUT/version.txt" || { cat "$OUT/version.txt"; echo "crew sees no GPU"; exit 1; }

DATA=data/fashion-mnist
[ -f "$DATA/manifest.json" ] || "$CREW" prep fashion-mnist --out "$DATA" > "$OUT/prep.log" 2>&1 \
  || { echo "no Fashion-MNIST: $OUT/prep.log (apt-get install dataset-fashion-mnist)"; exit 1; }

# ---- the ops
if "$B/tests/test_backend_ops" cuda > "$OUT/ops-cuda.log" 2>&1; then
  row "ops (cuda)" pass "$(tail -n 1 "$OUT/ops-cuda.log")"
else
  row "ops (cuda)" FAIL "$(grep -c ': ' "$OUT/ops-cuda.log") lines of failures; first: $(grep -m1 -v passed "$OUT/ops-cuda.log" | cut -c1-120)"
fi
"$B/tests/test_backend_ops" cpu > "$OUT/ops-cpu.log" 2>&1 && row "ops (cpu)" pass "$(tail -n 1 "$OUT/ops-cpu.log")" \
  || row "ops (cpu)" FAIL "$(tail -n 1 "$OUT/ops-cpu.log")"

# ---- training checks. The figures' cache of this check alone, so that --conv auto measures here.
export XDG_CACHE_HOME="$OUT/cache"
rm -rf "$XDG_CACHE_HOME"
SHORT=(--data "$DATA" --max-steps 200 --batch-per-device 64 --seed 3 --quiet --json --checkpoint-every 100000)
train() { local dir=$1; shift; rm -rf "$OUT/$dir"; "$CREW" train examples/fashion_cnn.json "$@" --run-dir "$OUT/$dir" \
  > "$OUT/$dir.out" 2> "$OUT/$dir.err"; }
rm -rf "$OUT/conv-auto"
"$CREW" train examples/fashion_cnn.json --data "$DATA" --devices cuda:1 --max-steps 2 --run-dir "$OUT/conv-auto" \
  > "$OUT/conv-auto.out" 2>&1
if grep -q 'convolutions (--conv auto): cuDNN against im2col' "$OUT/conv-auto.out"; then
  row "conv auto" measured "$(grep -c ': cuDNN\( (cached)\)\?$' "$OUT/conv-auto.out") of $(grep -c ' im2col [0-9.]* ms, cuDNN' "$OUT/conv-auto.out") layers by cuDNN: $OUT/conv-auto.out"
else
  row "conv auto" FAIL "no per-layer choice printed: $(tail -n 1 "$OUT/conv-auto.out")"
fi
train gpu-a "${SHORT[@]}" --devices cuda:1 --global-batch 128 && train gpu-b "${SHORT[@]}" --devices cuda:1 --global-batch 128
if cmp -s "$OUT/gpu-a/weights.safetensors" "$OUT/gpu-b/weights.safetensors"; then
  row repeat pass "two runs on cuda:1, bitwise-equal weights"
else
  row repeat FAIL "weights differ between two runs ($(tail -n 1 "$OUT/gpu-a.err"))"
fi
train gpu-two "${SHORT[@]}" --devices cuda:2 --global-batch 128
if cmp -s "$OUT/gpu-a/weights.safetensors" "$OUT/gpu-two/weights.safetensors"; then
  row replicas pass "cuda:2 = cuda:1 accumulating 2 micro-batches, bitwise"
else
  row replicas FAIL "cuda:2 and cuda:1 x 2 micro-batches differ ($(tail -n 1 "$OUT/gpu-two.err"))"
fi
GPUS=$(grep -o 'cuda:[0-9]* ' "$OUT/version.txt" | wc -l)
if [ "$GPUS" -ge 2 ]; then
  train gpu-nccl "${SHORT[@]}" --devices cuda:2 --global-batch 128 --comm nccl
  what="cuda:2 over NCCL = cuda:1 accumulating 2 micro-batches, bitwise"
else
  train gpu-nccl "${SHORT[@]}" --devices cuda:1 --global-batch 128 --comm nccl
  what="one GPU: NCCL opened and closed, the weights of the run without it (two GPUs test its sums)"
fi
if cmp -s "$OUT/gpu-a/weights.safetensors" "$OUT/gpu-nccl/weights.safetensors"; then
  row nccl pass "$what"
else
  row nccl FAIL "$what: not so ($(tail -n 1 "$OUT/gpu-nccl.err"))"
fi
for prec in fp32 bf16; do
  "$CREW" verify examples/fashion_cnn.json --data "$DATA" --devices cuda:2 --steps 6 --precision $prec --against cpu \
    > "$OUT/verify-$prec.out" 2>&1
  if tail -n 1 "$OUT/verify-$prec.out" | grep -q PASS; then
    row "verify $prec" pass "crew verify on cuda:2 --against cpu: $(grep -A2 '^1 replica full batch on cpu' "$OUT/verify-$prec.out" | tail -n 1 | cut -c3-120)"
  else
    row "verify $prec" FAIL "$(tail -n 2 "$OUT/verify-$prec.out" | tr '\n' ' ' | cut -c1-150)"
  fi
done
train cpu-a "${SHORT[@]}" --devices cpu:1 --global-batch 128
loss() { sed -n 's/.*"train_loss":\([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }
train gpu-bf16 "${SHORT[@]}" --devices cuda:1 --global-batch 128 --precision bf16
train cpu-bf16 "${SHORT[@]}" --devices cpu:1 --global-batch 128 --precision bf16
lg=$(loss "$OUT/gpu-bf16.out"); lc=$(loss "$OUT/cpu-bf16.out")
if [ -n "$lg" ] && [ -n "$lc" ] && awk -v g="$lg" -v c="$lc" 'BEGIN { d = g - c; if (d < 0) d = -d; exit !(d <= 0.02 * c) }'; then
  row bf16 pass "training loss after 200 steps in bf16: cuda $lg, cpu $lc"
else
  row bf16 FAIL "training loss after 200 steps in bf16: cuda '$lg', cpu '$lc' ($(tail -n 1 "$OUT/gpu-bf16.err"))"
fi
lg=$(loss "$OUT/gpu-a.out"); lc=$(loss "$OUT/cpu-a.out")
if [ -n "$lg" ] && [ -n "$lc" ] && awk -v g="$lg" -v c="$lc" 'BEGIN { d = g - c; if (d < 0) d = -d; exit !(d <= 0.02 * c) }'; then
  row "vs cpu" pass "training loss after 200 steps: cuda $lg, cpu $lc"
else
  row "vs cpu" FAIL "training loss after 200 steps: cuda '$lg', cpu '$lc'"
fi
train demo --data "$DATA" --devices cuda:1 --quiet --json --checkpoint-every 100000
acc=$(sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' "$OUT/demo.out" | tail -n 1)
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.91) }'; then
  row accuracy pass "the demo's CNN on cuda:1: test accuracy $acc"
else
  row accuracy FAIL "the demo's CNN on cuda:1: test accuracy '$acc' ($(tail -n 1 "$OUT/demo.err"))"
fi

# ---- cuDNN's convolutions everywhere (--conv library): repeatable, and near the im2col path
train gpu-dnn-a "${SHORT[@]}" --devices cuda:1 --global-batch 128 --conv library
train gpu-dnn-b "${SHORT[@]}" --devices cuda:1 --global-batch 128 --conv library
train gpu-i2c "${SHORT[@]}" --devices cuda:1 --global-batch 128 --conv im2col
ld=$(loss "$OUT/gpu-dnn-a.out"); lg=$(loss "$OUT/gpu-i2c.out")
if cmp -s "$OUT/gpu-dnn-a/weights.safetensors" "$OUT/gpu-dnn-b/weights.safetensors" && [ -n "$ld" ] && [ -n "$lg" ] &&
   awk -v a="$ld" -v b="$lg" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * b) }'; then
  row cudnn pass "two runs bitwise equal; training loss after 200 steps: cudnn $ld, im2col $lg"
else
  row cudnn FAIL "cudnn '$ld' vs im2col '$lg', or two cudnn runs differ ($(tail -n 1 "$OUT/gpu-dnn-a.err"))"
fi

if "$B/bench/bench_conv" examples/fashion_cnn.json --kind cuda --batch 64 > "$OUT/conv.txt" 2>&1; then
  row conv measured "$(grep -c ' library$' "$OUT/conv.txt") of $(grep -c '^conv' "$OUT/conv.txt") shapes faster by cuDNN: $OUT/conv.txt"
else
  row conv FAIL "$(tail -n 1 "$OUT/conv.txt")"
fi

# ---- the planner plans against the GPU's own memory
"$CREW" plan examples/fashion_cnn.json --devices cuda:1 > "$OUT/plan.out" 2>&1
if grep -q '^device memory: .* per device' "$OUT/plan.out"; then
  row plan pass "$(grep -m1 '^device memory' "$OUT/plan.out")"
else
  row plan FAIL "$(grep -m1 '^device memory' "$OUT/plan.out" || tail -n 1 "$OUT/plan.out")"
fi

# ---- speed (recorded, not judged)
for m in fashion_cnn fashion_mlp; do
  rm -rf "$OUT/speed-$m"
  "$CREW" train examples/$m.json --data "$DATA" --devices cuda:1 --max-steps 300 --quiet --json \
    --checkpoint-every 100000 --run-dir "$OUT/speed-$m" > "$OUT/speed-$m.out" 2> "$OUT/speed-$m.err"
  sps=$(sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p' "$OUT/speed-$m.out" | tail -n 1)
  gf=$(sed -n 's/.*"gflops":\([0-9.]*\).*/\1/p' "$OUT/speed-$m.out" | tail -n 1)
  row "speed $m" "$([ -n "$sps" ] && echo measured || echo FAIL)" "${sps:-?} samples/s, ${gf:-?} GFLOP/s on cuda:1 (300 steps)"
done

# ---- against PyTorch on the same GPU (recorded, not judged)
if python3 -c 'import torch, numpy' 2> /dev/null; then
  GPT_ARGS=()
  if [ "${GPT:-0}" = 1 ] && [ -f data/kjv.txt ]; then
    [ -f data/kjv-1024/manifest.json ] || "$CREW" prep text data/kjv.txt --seq-len 1024 --out data/kjv-1024 > /dev/null
    GPT_ARGS=(--gpt --gpt-data data/kjv-1024)
  fi
  if python3 tools/bench_gpu.py --crew "$CREW" --data "$DATA" --markdown "${GPT_ARGS[@]}" > "$OUT/bench.md" 2> "$OUT/bench.err"; then
    row bench measured "$(grep -c '| crew |' "$OUT/bench.md") models against torch eager and compile: $OUT/bench.md"
  else
    row bench FAIL "$(tail -n 1 "$OUT/bench.err")"
  fi
else
  row bench skipped "no python3 with torch and numpy here (pip install torch numpy)"
fi

{
  echo "GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep '^CUDA:' "$OUT/version.txt")"
  echo
  echo "| check | result | figures |"
  echo "|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  [ -f "$OUT/bench.md" ] && { echo; cat "$OUT/bench.md"; }
} | tee "$OUT/table.md"
exit $FAILED
