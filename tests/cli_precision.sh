#!/usr/bin/env bash
# cli_precision.sh — crew train and verify with --precision bf16 (GEMM operands rounded to
# bfloat16, float32 sums; emulated on the CPU):
# - the plan says so; 2 replicas equal 1 replica accumulating 2 micro-batches, bit for bit, as in
#   fp32; the weights differ from fp32's, the test loss stays near fp32's;
# - its checkpoints keep the precision, and resuming with another --precision is refused;
# - crew verify --precision bf16 passes for the MLP and for a small GPT (attention's products too,
#   its probabilities kept in bfloat16);
# - a GPT block's GEMM-only activations and attention probabilities in bfloat16: crew plan
#   --precision bf16 counts half their bytes, a training run's measured device memory is the
#   plan's (within 1%), and its test loss is near fp32's;
# - an unknown precision is one line and exit 2.
. "$(dirname "$0")/lib_cli.sh"
need_fashion

run() { "$CREW" train examples/fashion_mlp.json --data "$DATA" --max-steps 40 --batch-per-device 32 --seed 7 --json "$@"; }
run --devices cpu:2 --precision bf16 --run-dir "$TMP/bf2" --checkpoint-every 20 > "$TMP/bf2.out" \
  || fail "train --precision bf16 on cpu:2: $(tail -n 3 "$TMP/bf2.out")"
run --devices cpu:1 --global-batch 64 --precision bf16 --run-dir "$TMP/bf1" > "$TMP/bf1.out" || fail "bf16 on cpu:1"
run --devices cpu:1 --global-batch 64 --run-dir "$TMP/fp1" > "$TMP/fp1.out" || fail "fp32 on cpu:1"
grep -q "precision bf16: GEMM operands rounded to bfloat16" "$TMP/bf2.out" && ok || fail "the plan does not say bf16"
grep -q "precision bf16" "$TMP/fp1.out" && fail "an fp32 plan says bf16" || ok
cmp -s "$TMP/bf2/weights.safetensors" "$TMP/bf1/weights.safetensors" && ok \
  || fail "bf16: cpu:2 and cpu:1 accumulating 2 micro-batches end with different weights"
cmp -s "$TMP/bf1/weights.safetensors" "$TMP/fp1/weights.safetensors" && fail "bf16 and fp32 gave the same weights" || ok
lb=$(json_field "$TMP/bf1.out" test_loss); lf=$(json_field "$TMP/fp1.out" test_loss)
awk -v b="$lb" -v f="$lf" 'BEGIN { d = b - f; if (d < 0) d = -d; exit !(b > 0 && d <= 0.05 * f) }' && ok \
  || fail "bf16's test loss $lb is not within 5% of fp32's $lf"
grep -q '"precision":[[:space:]]*"bf16"' "$TMP/bf2/checkpoints/step-00000020/state.json" && ok \
  || fail "the checkpoint does not keep the precision"
expect_exit 2 "cannot resume with --precision fp32: the run in $TMP/bf2 has bf16" -- \
  "$CREW" train examples/fashion_mlp.json --data "$DATA" --resume "$TMP/bf2" --precision fp32
expect_exit 2 "--precision takes one of fp32, bf16, got 'fp16'" -- \
  "$CREW" train examples/fashion_mlp.json --data "$DATA" --precision fp16

# verify: N replicas in bf16 equal one replica accumulating, bit for bit, and the first step's
# differences stay within float32 summation's bound (the rounding of operands does not depend on
# the split)
"$CREW" verify examples/fashion_mlp.json --data "$DATA" --devices cpu:2 --steps 4 --precision bf16 > "$TMP/v" 2>&1
tail -n 1 "$TMP/v" | grep -q PASS && ok || fail "verify --precision bf16 (MLP): $(tail -n 5 "$TMP/v")"
awk 'BEGIN { for (i = 0; i < 600; i++) printf "%d the cat sat on the mat.\n", i % 37 }' > "$TMP/corpus.txt"
"$CREW" prep text "$TMP/corpus.txt" --seq-len 16 --out "$TMP/text" > /dev/null 2>&1 || fail "prep text"
cat > "$TMP/g.json" <<JSON
{"layers": [{"type": "gpt", "layers": 1, "heads": 2, "width": 16, "context": 16, "vocab": 256}],
 "optimizer": {"type": "adamw", "lr": 0.003}, "training": {"batch_per_device": 4, "seed": 1}}
JSON
"$CREW" verify "$TMP/g.json" --data "$TMP/text" --devices cpu:2 --steps 4 --precision bf16 > "$TMP/vg" 2>&1
tail -n 1 "$TMP/vg" | grep -q PASS && ok || fail "verify --precision bf16 (GPT): $(tail -n 5 "$TMP/vg")"

# bf16 keeps the block's GEMM-only activations in bfloat16, 2 bytes a value instead of 4: ln_1, the
# attention output and ln_2 [4 x 16, 16] each, the GELU's output [4 x 16, 64] and the
# probabilities [batch 4, heads 2, T 16, T 16]: 2 x (3 x 1024 + 4096 + 2048) bytes fewer.
"$CREW" plan "$TMP/g.json" --json > "$TMP/p32" 2>&1 || fail "plan (fp32): $(tail -n 3 "$TMP/p32")"
"$CREW" plan "$TMP/g.json" --precision bf16 --json > "$TMP/p16" 2>&1 || fail "plan --precision bf16: $(tail -n 3 "$TMP/p16")"
w32=$(json_field "$TMP/p32" workspace); w16=$(json_field "$TMP/p16" workspace)
[ -n "$w32" ] && [ -n "$w16" ] && [ $((w32 - w16)) -eq $((2 * (3 * 1024 + 4096 + 2048))) ] && ok \
  || fail "bf16 should keep 18432 bytes less workspace: fp32 $w32, bf16 $w16"
[ "$(json_field "$TMP/p16" precision)" = bf16 ] && ok || fail "the plan's JSON does not say bf16"
gpt() { "$CREW" train "$TMP/g.json" --data "$TMP/text" --max-steps 30 --json "$@"; }
gpt --devices cpu:2 --shard-optimizer --precision bf16 --run-dir "$TMP/gt" > "$TMP/gt.out" 2>&1 \
  || fail "train a GPT --precision bf16: $(tail -n 3 "$TMP/gt.out")"
sed -n 's/^device memory: .* planned .* (\([-+][0-9.]*\)%); optimizer state .*$/\1/p' "$TMP/gt.out" \
  | awk '{ n++; if ($1 < -1 || $1 > 1) bad = 1 } END { exit !(n == 1 && !bad) }' && ok \
  || fail "a bf16 GPT's device memory against the plan: $(grep '^device memory' "$TMP/gt.out")"
gpt --devices cpu:2 --shard-optimizer --run-dir "$TMP/gt32" > "$TMP/gt32.out" 2>&1 || fail "train a GPT in fp32"
lb=$(json_field "$TMP/gt.out" test_loss); lf=$(json_field "$TMP/gt32.out" test_loss)
awk -v b="$lb" -v f="$lf" 'BEGIN { d = b - f; if (d < 0) d = -d; exit !(b > 0 && d <= 0.05 * f) }' && ok \
  || fail "a GPT's bf16 test loss $lb is not within 5% of fp32's $lf"
grep -q "attention probabilities" "$TMP/gt.out" && ok || fail "the plan does not say the probabilities are bfloat16"
report
