#!/usr/bin/env bash
# scripts/gpu-check.sh — the GPU checks of the CUDA backend in one go, for a machine with an NVIDIA
# GPU and the CUDA toolkit (a few minutes on an H200; nothing here runs where there is no GPU).
#
#   scripts/gpu-check.sh [OUT_DIR]        (OUT_DIR: logs and the table, default ./gpu-check)
#
# On the lent H200 (no Debian packages, no network, a 10-minute call, a few files back): run
# scripts/gpu-bundle.sh here first, then on the machine, carrying .gpu-bundle,
#   GPU_CHECK_PACK=$OUT scripts/gpu-check.sh /tmp/gpu-check
# which builds against the bundle's packages (cuDNN and NCCL from PyTorch's where the toolkit has
# none), prepares Fashion-MNIST from it and returns table.md and logs.tgz (docs/GPU.md).
#
# It builds crew for this GPU (build-gpu/, CMAKE_CUDA_ARCHITECTURES=native), then runs, the
# issue's checks first, each with its log in OUT_DIR and one line in the table at the end; a check
# whose estimate no longer fits GPU_CHECK_BUDGET_S [540] is reported skipped. GPU_CHECK_BUNDLE=1
# builds against .gpu-bundle even where the machine has the packages, GPU_CHECK_CUDA_ARCH [native]
# names the architecture where there is no GPU to ask, and GPU_CHECK_KIND=cpu-remote runs every
# check on the CPU's stand-in for a GPU: how the script itself is tried where there is no GPU:
#   ops        test_backend_ops cuda: every backend op against the references the CPU passes
#   conv auto  --conv auto (the default) on cuda:1: each convolution timed both ways once, the
#              choice per layer shape printed and cached (the training runs below take it)
#   repeat     two 200-step runs of the CNN on cuda:1 end with bitwise-equal weights
#   replicas   2 replicas on the GPU (cuda:2: round-robin on one GPU) = cuda:1 accumulating 2
#              micro-batches, bitwise (the ordered all-reduce through host copies)
#   zero-3     the same 2 replicas with --shard parameters (units gathered, gradients
#              reduce-scattered, the clipping norm's state handed from shard to shard) = cuda:1
#              accumulating 2, bitwise
#   verify     crew verify on cuda:2 (fp32, later --precision bf16): PASS; and --against cpu, the
#              GPU's full-batch run held to the CPU's within verify's rounding bound
#   accuracy   the demo's CNN, 4 epochs on cuda:1: test accuracy >= 0.91
#   bench      tools/bench_gpu.py: crew against PyTorch eager and torch.compile on this GPU (needs
#              python3 with torch; its table in OUT_DIR/bench.md)
#   nccl       --comm nccl: on one GPU, a run that opens and closes NCCL ends with the staged path's
#              weights; with two GPUs or more, cuda:2 over NCCL = cuda:1 accumulating, bitwise
#   vs cpu     the same 200 steps on cuda:1 and on the CPU: the final training loss within 2%
#   bf16       --precision bf16 on cuda:1: the training loss within 2% of bf16 on the CPU
#   cudnn      --conv library on cuda:1: two runs bitwise equal, the training loss within 2% of
#              --conv im2col's
#   conv       bench_conv: each of the CNN's convolutions timed both ways, which was faster per shape
#   gpt        a small GPT in bf16 on cuda:1: --attention recompute ends with store's weights,
#              bitwise, and the training loss is within 2% of the CPU's
#   plan       crew plan --devices cuda:1 plans against the GPU's own memory
#   speed      samples/s of the CNN and the MLP on cuda:1 (300 steps)
#   bench gpt  GPT-2 124M in bf16 against PyTorch, on the King James Bible's bytes (data/kjv.txt
#              from make demo-gpt, or the bundle's; GPT=0 leaves it out)
# and prints the table (also OUT_DIR/table.md). Exit status 1 when a check failed.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
mkdir -p "$OUT"
B=build-gpu
ROWS=()
FAILED=0
row() { ROWS+=("| $1 | $2 | $3 |"); [ "$2" = FAIL ] && FAILED=1; echo "== $1: $2 ($3)"; }
# A lent machine's call runs 10 minutes at most: the checks run most important first, and one
# whose estimate no longer fits the budget gets a "skipped" row instead of a killed script.
BUDGET=${GPU_CHECK_BUDGET_S:-540}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0) > 5 ? BUDGET - ($(date +%s) - T0) : 5)); } # seconds, for timeout
fits() { # fits NAME SECONDS: 0 when SECONDS more still fit the budget, else a skipped row
  if [ $(($(date +%s) - T0 + $2)) -le "$BUDGET" ]; then return 0; fi
  row "$1" skipped "no time left: $(($(date +%s) - T0)) s of the ${BUDGET} s budget spent (GPU_CHECK_BUDGET_S)"
  return 1
}
# The table (OUT_DIR/table.md); with GPU_CHECK_PACK=DIR also copied there with the logs in
# logs.tgz (weights and checkpoints left out): a lent machine returns only a few files.
finish() {
  {
    echo "GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep '^CUDA:' "$OUT/version.txt" 2> /dev/null), $(($(date +%s) - T0)) s"
    echo
    echo "| check | result | figures |"
    echo "|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    [ -f "$OUT/bench.md" ] && { echo; cat "$OUT/bench.md"; }
  } | tee "$OUT/table.md"
  if [ -n "${GPU_CHECK_PACK:-}" ]; then
    mkdir -p "$GPU_CHECK_PACK"
    cp "$OUT/table.md" "$GPU_CHECK_PACK/"
    tar czf "$GPU_CHECK_PACK/logs.tgz" --exclude='*.safetensors' --exclude=checkpoints --exclude=tb --exclude=cache \
      -C "$OUT" . 2> /dev/null
  fi
  exit "$1"
}

# ---- build dependencies: the machine's, else those scripts/gpu-bundle.sh gathered (.gpu-bundle,
# carried): the lent H200 has CUDA, CMake and PyTorch but no Debian packages and no network.
CMAKE_DEPS=(-DCREW_MPI=OFF) # no check here runs across processes, and a half-found MPI must not fail the build
# The CPU side's GEMMs by OpenBLAS, which the bundle carries (oneDNN's 40 MB would not fit a call):
# the checks hold the GPU to the CPU backend, whose GEMM library is the build's choice either way.
CMAKE_DEPS+=(-DCREW_GEMM=openblas)
if [ -d .gpu-bundle/debs ] && { [ "${GPU_CHECK_BUNDLE:-}" = 1 ] || ! pkg-config --exists openblas libcjson libxxhash libpng 2> /dev/null; }; then
  DEPS=/tmp/crew-deps
  rm -rf "$DEPS" && mkdir -p "$DEPS"
  for f in .gpu-bundle/debs/*.deb; do
    if command -v dpkg > /dev/null; then dpkg -x "$f" "$DEPS"
    else (cd "$DEPS" && ar p "$OLDPWD/$f" "$(ar t "$OLDPWD/$f" | grep '^data\.tar')" | tar -x -f - --auto-compress 2> /dev/null \
          || ar p "$OLDPWD/$f" data.tar.xz | tar -xJ); fi
  done
  L=$DEPS/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH="$L:$L/openblas-pthread:$DEPS/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$L:$L/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export PKG_CONFIG_LIBDIR="$L/pkgconfig:$L/openblas-pthread/pkgconfig:$DEPS/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$DEPS" # the .pc files say /usr: prefixed with the unpacked root
  CMAKE_DEPS+=(-DCMAKE_PREFIX_PATH="$DEPS/usr")
  command -v pkg-config > /dev/null || CMAKE_DEPS+=(-DPKG_CONFIG_EXECUTABLE="$DEPS/usr/bin/pkgconf")
  echo "== build dependencies from .gpu-bundle, unpacked into $DEPS"
fi
# cuDNN and NCCL: beside the CUDA toolkit, else PyTorch's (its pip packages nvidia-cudnn-*, nvidia-nccl-*).
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_ROOT=$(dirname "$(dirname "$NVCC")")
extra_lib() { # extra_lib HEADER MODULE VAR: cmake flags for a library the toolkit lacks, from python's nvidia.MODULE
  [ -f "$CUDA_ROOT/include/$1" ] && return
  local d; d=$(python3 -c "import nvidia.$2 as m; print(list(m.__path__)[0])" 2> /dev/null) || return
  local lib; lib=$(ls "$d"/lib/lib"$2".so* 2> /dev/null | head -n 1)
  [ -f "$d/include/$1" ] && [ -n "$lib" ] || return
  CMAKE_DEPS+=(-D"$3"_INCLUDE="$d/include" -D"$3"_LIBRARY="$lib")
  export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== $2 from $d"
}
extra_lib cudnn.h cudnn CREW_CUDNN
extra_lib nccl.h nccl CREW_NCCL

{ nvidia-smi || true; } > "$OUT/nvidia-smi.txt" 2>&1
echo "== building into $B"
if ! { cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${GPU_CHECK_CUDA_ARCH:-native}" "${CMAKE_DEPS[@]}" \
       && cmake --build "$B" -j "$(nproc)" --target crew_cli test_backend_ops bench_conv; } > "$OUT/build.log" 2>&1; then
  tail -n 30 "$OUT/build.log"
  row build FAIL "$(grep -m1 -i 'error' "$OUT/build.log" | cut -c1-150)"
  finish 1
fi
CREW=$B/crew
"$CREW" --version > "$OUT/version.txt" 2>&1
# GPU_CHECK_KIND=cpu-remote runs the same script on the CPU's stand-in for a GPU (how the script
# itself is tried where there is no GPU); the rows then say what they say of that kind.
K=${GPU_CHECK_KIND:-cuda}
[ "$K" != cuda ] || grep -q '^CUDA: .*cuda:0' "$OUT/version.txt" || { cat "$OUT/version.txt"; row gpu FAIL "crew sees no GPU"; finish 1; }
row build pass "$(($(date +%s) - T0)) s; $(grep -m1 '^CUDA:' "$OUT/version.txt" | cut -c1-120)"

DATA=data/fashion-mnist
SRC=()
[ -d /usr/share/datasets/fashion-mnist ] || SRC=(--src .gpu-bundle/fashion-mnist)
[ -f "$DATA/manifest.json" ] || "$CREW" prep fashion-mnist "${SRC[@]}" --out "$DATA" > "$OUT/prep.log" 2>&1 \
  || { row data FAIL "no Fashion-MNIST: $(tail -n 1 "$OUT/prep.log") (scripts/gpu-bundle.sh carries it)"; finish 1; }

# ---- the ops
if "$B/tests/test_backend_ops" "$K" > "$OUT/ops-$K.log" 2>&1; then
  row "ops ($K)" pass "$(tail -n 1 "$OUT/ops-$K.log")"
else
  row "ops ($K)" FAIL "$(grep -c ': ' "$OUT/ops-$K.log") lines of failures; first: $(grep -m1 -v passed "$OUT/ops-$K.log" | cut -c1-120)"
fi

# ---- training checks, the issue's first. The figures' cache of this check alone, so that
# --conv auto measures here.
export XDG_CACHE_HOME="$OUT/cache"
rm -rf "$XDG_CACHE_HOME"
SHORT=(--data "$DATA" --max-steps 200 --batch-per-device 64 --seed 3 --quiet --json --checkpoint-every 100000)
CONV=() # --conv im2col for every run below when --conv auto failed, so that the other checks still run
train() { local dir=$1; shift; rm -rf "$OUT/$dir"; timeout "$(left)" "$CREW" train examples/fashion_cnn.json "${CONV[@]}" \
  "$@" --run-dir "$OUT/$dir" > "$OUT/$dir.out" 2> "$OUT/$dir.err"; }
loss() { sed -n 's/.*"train_loss":\([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }
near() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * b) }'; }
if fits "conv auto" 30; then
  rm -rf "$OUT/conv-auto"
  "$CREW" train examples/fashion_cnn.json --data "$DATA" --devices $K:1 --max-steps 2 --run-dir "$OUT/conv-auto" \
    > "$OUT/conv-auto.out" 2>&1
  if grep -q 'convolutions (--conv auto): cuDNN against im2col' "$OUT/conv-auto.out"; then
    row "conv auto" measured "$(grep -c ': cuDNN\( (cached)\)\?$' "$OUT/conv-auto.out") of $(grep -c ' im2col [0-9.]* ms, cuDNN' "$OUT/conv-auto.out") layers by cuDNN: conv-auto.out"
  else
    row "conv auto" FAIL "no per-layer choice printed: $(tail -n 1 "$OUT/conv-auto.out"); the runs below take --conv im2col"
    CONV=(--conv im2col)
  fi
fi
if fits repeat 60; then
  train gpu-a "${SHORT[@]}" --devices $K:1 --global-batch 128 && train gpu-b "${SHORT[@]}" --devices $K:1 --global-batch 128
  if cmp -s "$OUT/gpu-a/weights.safetensors" "$OUT/gpu-b/weights.safetensors"; then
    row repeat pass "two runs on $K:1, bitwise-equal weights"
  else
    row repeat FAIL "weights differ between two runs ($(tail -n 1 "$OUT/gpu-a.err"))"
  fi
fi
if fits replicas 40; then
  train gpu-two "${SHORT[@]}" --devices $K:2 --global-batch 128
  if cmp -s "$OUT/gpu-a/weights.safetensors" "$OUT/gpu-two/weights.safetensors"; then
    row replicas pass "$K:2 = $K:1 accumulating 2 micro-batches, bitwise"
  else
    row replicas FAIL "$K:2 and $K:1 x 2 micro-batches differ ($(tail -n 1 "$OUT/gpu-two.err"))"
  fi
fi
if fits zero-3 40; then
  train gpu-zero3 "${SHORT[@]}" --devices $K:2 --global-batch 128 --shard parameters
  if cmp -s "$OUT/gpu-a/weights.safetensors" "$OUT/gpu-zero3/weights.safetensors"; then
    row zero-3 pass "$K:2 --shard parameters = $K:1 accumulating 2 micro-batches, bitwise (clipping included)"
  else
    row zero-3 FAIL "$K:2 --shard parameters and $K:1 x 2 micro-batches differ ($(tail -n 1 "$OUT/gpu-zero3.err"))"
  fi
fi
verify() {
  timeout "$(left)" "$CREW" verify examples/fashion_cnn.json "${CONV[@]}" --data "$DATA" --devices $K:2 --steps 6 \
    --precision "$1" --against cpu > "$OUT/verify-$1.out" 2>&1
  if tail -n 1 "$OUT/verify-$1.out" | grep -q PASS; then
    row "verify $1" pass "crew verify on $K:2 --against cpu: $(grep -A2 '^1 replica full batch on cpu' "$OUT/verify-$1.out" | tail -n 1 | cut -c3-120)"
  else
    row "verify $1" FAIL "$(tail -n 2 "$OUT/verify-$1.out" | tr '\n' ' ' | cut -c1-150)"
  fi
}
fits "verify fp32" 90 && verify fp32
if fits accuracy 120; then
  train demo --data "$DATA" --devices $K:1 --quiet --json --checkpoint-every 100000
  acc=$(sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' "$OUT/demo.out" | tail -n 1)
  if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.91) }'; then
    row accuracy pass "the demo's CNN on $K:1: test accuracy $acc ($(sed -n 's/.*"wall_s":\([0-9.]*\).*/\1/p' "$OUT/demo.out" | tail -n 1) s)"
  else
    row accuracy FAIL "the demo's CNN on $K:1: test accuracy '$acc' ($(tail -n 1 "$OUT/demo.err"))"
  fi
fi

# ---- against PyTorch on the same GPU (recorded, not judged). With GPT=1, or the King James
# Bible's bytes at hand (data/kjv.txt from make demo-gpt, or .gpu-bundle/kjv.txt.gz), GPT-2 124M in
# bf16 too, after the rest, time allowing.
if [ "$K" != cuda ]; then
  row bench skipped "PyTorch on the GPU: only with GPU_CHECK_KIND=cuda"
elif ! python3 -c 'import torch, numpy' 2> /dev/null; then
  row bench skipped "no python3 with torch and numpy here (pip install torch numpy)"
elif fits bench 240; then
  if timeout "$(left)" python3 tools/bench_gpu.py --crew "$CREW" --data "$DATA" --markdown > "$OUT/bench.md" 2> "$OUT/bench.err"; then
    row bench measured "$(grep -c '| crew |' "$OUT/bench.md") models against torch eager and compile: bench.md"
  else
    row bench FAIL "$(tail -n 1 "$OUT/bench.err")"
  fi
fi

# ---- the rest of the GPU path
if fits nccl 40; then
  GPUS=$([ "$K" = cuda ] && grep -o 'cuda:[0-9]* ' "$OUT/version.txt" | wc -l || echo 1)
  if [ "$GPUS" -ge 2 ]; then
    train gpu-nccl "${SHORT[@]}" --devices $K:2 --global-batch 128 --comm nccl
    what="$K:2 over NCCL = $K:1 accumulating 2 micro-batches, bitwise"
  else
    train gpu-nccl "${SHORT[@]}" --devices $K:1 --global-batch 128 --comm nccl
    what="one GPU: NCCL opened and closed, the weights of the run without it (two GPUs test its sums)"
  fi
  if cmp -s "$OUT/gpu-a/weights.safetensors" "$OUT/gpu-nccl/weights.safetensors"; then
    row nccl pass "$what"
  else
    row nccl FAIL "$what: not so ($(tail -n 1 "$OUT/gpu-nccl.err"))"
  fi
fi
fits "verify bf16" 90 && verify bf16
THREADS=$(nproc) # the CPU references on every core: their sums' order does not matter to a 2% check
if fits "vs cpu" 60; then
  train cpu-a "${SHORT[@]}" --devices cpu:1 --threads-per-device "$THREADS" --global-batch 128
  lg=$(loss "$OUT/gpu-a.out"); lc=$(loss "$OUT/cpu-a.out")
  if near "$lg" "$lc"; then
    row "vs cpu" pass "training loss after 200 steps: $K $lg, cpu $lc"
  else
    row "vs cpu" FAIL "training loss after 200 steps: $K '$lg', cpu '$lc'"
  fi
fi
if fits bf16 90; then
  train gpu-bf16 "${SHORT[@]}" --devices $K:1 --global-batch 128 --precision bf16
  train cpu-bf16 "${SHORT[@]}" --devices cpu:1 --threads-per-device "$THREADS" --global-batch 128 --precision bf16
  lg=$(loss "$OUT/gpu-bf16.out"); lc=$(loss "$OUT/cpu-bf16.out")
  if near "$lg" "$lc"; then
    row bf16 pass "training loss after 200 steps in bf16: $K $lg, cpu $lc"
  else
    row bf16 FAIL "training loss after 200 steps in bf16: $K '$lg', cpu '$lc' ($(tail -n 1 "$OUT/gpu-bf16.err"))"
  fi
fi
# cuDNN's convolutions everywhere (--conv library): repeatable, and near the im2col path
if fits cudnn 60; then
  train gpu-dnn-a "${SHORT[@]}" --devices $K:1 --global-batch 128 --conv library
  train gpu-dnn-b "${SHORT[@]}" --devices $K:1 --global-batch 128 --conv library
  train gpu-i2c "${SHORT[@]}" --devices $K:1 --global-batch 128 --conv im2col
  ld=$(loss "$OUT/gpu-dnn-a.out"); lg=$(loss "$OUT/gpu-i2c.out")
  if cmp -s "$OUT/gpu-dnn-a/weights.safetensors" "$OUT/gpu-dnn-b/weights.safetensors" && near "$ld" "$lg"; then
    row cudnn pass "two runs bitwise equal; training loss after 200 steps: cudnn $ld, im2col $lg"
  else
    row cudnn FAIL "cudnn '$ld' vs im2col '$lg', or two cudnn runs differ ($(tail -n 1 "$OUT/gpu-dnn-a.err"))"
  fi
fi
if fits conv 20; then
  if "$B/bench/bench_conv" examples/fashion_cnn.json --kind "$K" --batch 64 > "$OUT/conv.txt" 2>&1; then
    row conv measured "$(grep -c ' library$' "$OUT/conv.txt") of $(grep -c '^conv' "$OUT/conv.txt") shapes faster by cuDNN: conv.txt"
  else
    row conv FAIL "$(tail -n 1 "$OUT/conv.txt")"
  fi
fi
# a small GPT in bf16 (its GEMM-only activations and attention probabilities in bfloat16): the
# probabilities recomputed in backward give the kept ones' weights, bitwise; the loss near the CPU's
if fits gpt 90; then
  awk 'BEGIN { split("the cat sat on the mat|a dog ran in the park|birds sing in the morning", p, "|");
               for (i = 0; i < 4000; i++) printf "%d %s.\n", i % 97, p[i % 3 + 1] }' > "$OUT/corpus.txt"
  "$CREW" prep text "$OUT/corpus.txt" --seq-len 128 --out "$OUT/text" > "$OUT/prep-text.log" 2>&1
  cat > "$OUT/gpt.json" <<JSON
{"layers": [{"type": "gpt", "layers": 2, "heads": 4, "width": 128, "context": 128, "vocab": 256}],
 "optimizer": {"type": "adamw", "lr": 0.001}, "training": {"batch_per_device": 16, "seed": 1}}
JSON
  gpt() { local dir=$1; shift; rm -rf "$OUT/$dir"; timeout "$(left)" "$CREW" train "$OUT/gpt.json" --data "$OUT/text" \
    --max-steps 100 --precision bf16 --quiet --json --checkpoint-every 100000 "$@" --run-dir "$OUT/$dir" \
    > "$OUT/$dir.out" 2> "$OUT/$dir.err"; }
  gpt gpt-store --devices $K:1
  gpt gpt-recompute --devices $K:1 --attention recompute
  gpt gpt-cpu --devices cpu:1 --threads-per-device "$(nproc)"
  lg=$(loss "$OUT/gpt-store.out"); lc=$(loss "$OUT/gpt-cpu.out")
  if cmp -s "$OUT/gpt-store/weights.safetensors" "$OUT/gpt-recompute/weights.safetensors" && near "$lg" "$lc"; then
    row gpt pass "bf16 GPT: --attention recompute = store, bitwise; training loss after 100 steps: $K $lg, cpu $lc"
  else
    row gpt FAIL "bf16 GPT: recompute vs store, or loss $K '$lg' vs cpu '$lc' ($(tail -n 1 "$OUT/gpt-store.err"))"
  fi
fi
# the planner plans against the GPU's own memory
if fits plan 10; then
  "$CREW" plan examples/fashion_cnn.json --devices $K:1 > "$OUT/plan.out" 2>&1
  if grep -q '^device memory: .* per device' "$OUT/plan.out"; then
    row plan pass "$(grep -m1 '^device memory' "$OUT/plan.out")"
  else
    row plan FAIL "$(grep -m1 '^device memory' "$OUT/plan.out" || tail -n 1 "$OUT/plan.out")"
  fi
fi
# speed (recorded, not judged)
for m in fashion_cnn fashion_mlp; do
  fits "speed $m" 30 || continue
  rm -rf "$OUT/speed-$m"
  "$CREW" train examples/$m.json --data "$DATA" --devices $K:1 --max-steps 300 --quiet --json \
    --checkpoint-every 100000 --run-dir "$OUT/speed-$m" > "$OUT/speed-$m.out" 2> "$OUT/speed-$m.err"
  sps=$(sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p' "$OUT/speed-$m.out" | tail -n 1)
  gf=$(sed -n 's/.*"gflops":\([0-9.]*\).*/\1/p' "$OUT/speed-$m.out" | tail -n 1)
  row "speed $m" "$([ -n "$sps" ] && echo measured || echo FAIL)" "${sps:-?} samples/s, ${gf:-?} GFLOP/s on $K:1 (300 steps)"
done
# GPT-2 124M in bf16 against PyTorch (issue 15's GPU figure)
KJV=data/kjv.txt
[ -f "$KJV" ] || { [ -f .gpu-bundle/kjv.txt.gz ] && gunzip -c .gpu-bundle/kjv.txt.gz > /tmp/kjv.txt && KJV=/tmp/kjv.txt; }
if [ "$K" = cuda ] && [ "${GPT:-1}" = 1 ] && [ -f "$KJV" ] && python3 -c 'import torch' 2> /dev/null && fits "bench gpt" 150; then
  [ -f data/kjv-1024/manifest.json ] || "$CREW" prep text "$KJV" --seq-len 1024 --out data/kjv-1024 > /dev/null 2>&1
  if timeout "$(left)" python3 tools/bench_gpu.py --crew "$CREW" --models none --gpt --gpt-data data/kjv-1024 --gpt-steps 10 \
       --gpt-warmup 3 --markdown > "$OUT/bench-gpt.md" 2> "$OUT/bench-gpt.err"; then
    row "bench gpt" measured "GPT-2 124M, bf16, against torch eager and compile: bench-gpt.md"
    { echo; cat "$OUT/bench-gpt.md"; } >> "$OUT/bench.md"
  else
    row "bench gpt" FAIL "$(tail -n 1 "$OUT/bench-gpt.err")"
  fi
fi

finish $FAILED
