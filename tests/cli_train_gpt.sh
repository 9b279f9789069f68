#!/usr/bin/env bash
# cli_train_gpt.sh — a GPT end to end through the CLI: crew prep text, crew train on the tokens
# (data-parallel, and on cpu-remote, a GPU's path), bits per byte in the output and metrics, crew sample (repeatable per seed),
# crew verify at N = 2 and 4, --attention recompute equal to store, and the bad inputs of a language
# model's run, each one line and exit 2.
. "$(dirname "$0")/lib_cli.sh"

# A corpus with structure to learn: numbered lines of a few repeated phrases (40 KB).
awk 'BEGIN { split("the cat sat on the mat|a dog ran in the park|birds sing in the morning|rain falls on the roof", p, "|");
             for (i = 0; i < 1400; i++) printf "%d %s.\n", i % 97, p[i % 4 + 1] }' > "$TMP/corpus.txt"
"$CREW" prep text "$TMP/corpus.txt" --seq-len 32 --out "$TMP/text" > "$TMP/out" 2>&1 || fail "prep text: $(cat "$TMP/out")"

gpt() { # gpt FILE LAYERS HEADS WIDTH CONTEXT VOCAB
  cat > "$1" <<JSON
{"name": "gpt_test", "layers": [{"type": "gpt", "layers": $2, "heads": $3, "width": $4, "context": $5, "vocab": $6}],
 "optimizer": {"type": "adamw", "lr": 0.003, "base_batch": 16, "lr_scaling": "none", "weight_decay": 0.01, "clip_norm": 1.0,
               "schedule": {"type": "cosine", "warmup_steps": 10}},
 "training": {"epochs": 3, "batch_per_device": 8, "seed": 1}}
JSON
}
gpt "$TMP/g.json" 2 2 32 32 256

# --- training: the loss falls from ln 256 = 5.55 nats, and the output speaks in bits per byte
"$CREW" train "$TMP/g.json" --data "$TMP/text" --devices cpu:2 --run-dir "$TMP/run" --json > "$TMP/train" 2> "$TMP/err" \
  && ok || fail "gpt train: $(cat "$TMP/err")"
grep -q "bits per byte" "$TMP/train" && ok || fail "no bits per byte in: $(cat "$TMP/train")"
loss=$(json_field "$TMP/train" test_loss)
awk -v l="$loss" 'BEGIN { exit !(l > 0 && l < 2.5) }' && ok || fail "test loss $loss is not below 2.5 nats after 3 epochs"
grep -q '"type":"epoch".*"test_bits":' "$TMP/run/metrics.jsonl" && ok || fail "metrics.jsonl epochs lack test_bits"
grep -q '"type":"summary".*"test_bits":' "$TMP/run/metrics.jsonl" && ok || fail "metrics.jsonl summary lacks test_bits"
"$CREW" eval "$TMP/g.json" --weights "$TMP/run/weights.safetensors" --data "$TMP/text" > "$TMP/eval" 2>&1 \
  && grep -q "^test: " "$TMP/eval" && ok || fail "eval on the val split: $(cat "$TMP/eval")"

# --- a device the host cannot reach (cpu-remote: a GPU's path, its inputs double-buffered so that a
# copy overlaps the previous micro-batch's passes): the same bits as one CPU replica accumulating;
# the ids an embedding's backward pass reads must be its own micro-batch's
"$CREW" train "$TMP/g.json" --data "$TMP/text" --devices cpu-remote:2 --global-batch 32 --max-steps 4 --run-dir "$TMP/rr" \
  > /dev/null 2> "$TMP/err" || fail "gpt on cpu-remote:2: $(cat "$TMP/err")"
"$CREW" train "$TMP/g.json" --data "$TMP/text" --devices cpu:1 --global-batch 32 --max-steps 4 --run-dir "$TMP/r1" \
  > /dev/null 2> "$TMP/err" || fail "gpt on cpu:1: $(cat "$TMP/err")"
cmp -s "$TMP/rr/weights.safetensors" "$TMP/r1/weights.safetensors" && ok \
  || fail "gpt: cpu-remote:2 (2 micro-batches each, double-buffered inputs) and cpu:1 accumulating 4 differ"

# --- --attention recompute: the blocks compute their probabilities again in backward, the same bits
# as keeping them, in fp32 and bf16, on cpu-remote's path too; the plan counts one buffer of them for
# the two blocks instead of two ([8, 2, 32, 32] floats: 65536 bytes less, 32768 in bf16)
for prec in fp32 bf16; do
  for att in store recompute; do
    "$CREW" train "$TMP/g.json" --data "$TMP/text" --devices cpu-remote:2 --max-steps 4 --precision $prec \
      --attention $att --run-dir "$TMP/att-$prec-$att" > "$TMP/att-$prec-$att.out" 2> "$TMP/err" \
      || fail "gpt --precision $prec --attention $att: $(cat "$TMP/err")"
  done
  cmp -s "$TMP/att-$prec-store/weights.safetensors" "$TMP/att-$prec-recompute/weights.safetensors" && ok \
    || fail "gpt --precision $prec: --attention recompute and store end with different weights"
  "$CREW" plan "$TMP/g.json" --precision $prec --json > "$TMP/ps" 2>&1 || fail "plan --precision $prec"
  "$CREW" plan "$TMP/g.json" --precision $prec --attention recompute --json > "$TMP/pr" 2>&1 || fail "plan --attention recompute"
  want=65536; [ $prec = bf16 ] && want=32768
  [ $(( $(json_field "$TMP/ps" workspace) - $(json_field "$TMP/pr" workspace) )) -eq $want ] && ok \
    || fail "--attention recompute (--precision $prec) should save $want bytes: $(json_field "$TMP/ps" workspace) vs $(json_field "$TMP/pr" workspace)"
done
grep -q "attention probabilities recomputed in backward" "$TMP/att-fp32-recompute.out" && ok \
  || fail "the plan does not say the attention is recomputed"
[ "$(json_field "$TMP/pr" attention)" = recompute ] && ok || fail "crew plan's JSON does not say recompute"
# in a device between the two figures, the planner advises recomputing (the same bits), and crew
# train --device-memory follows it
bs=$(json_field "$TMP/ps" bytes_per_device); br=$(json_field "$TMP/pr" bytes_per_device)
mid=$(( (bs + br) / 2 ))
"$CREW" plan "$TMP/g.json" --precision bf16 --device-memory $mid --json > "$TMP/pm" 2>&1 || fail "plan --device-memory $mid"
grep -q "^verdict: with --attention recompute (the same bits), fits with data parallelism" "$TMP/pm" \
  && [ "$(json_field "$TMP/pm" attention)" = recompute ] && ok || fail "the planner does not advise recomputing: $(grep verdict "$TMP/pm")"
"$CREW" train "$TMP/g.json" --data "$TMP/text" --devices cpu:1 --precision bf16 --device-memory $mid --max-steps 2 \
  --run-dir "$TMP/att-auto" > "$TMP/att-auto.out" 2>&1 || fail "train --device-memory $mid: $(tail -n 3 "$TMP/att-auto.out")"
grep -q "attention probabilities recomputed in backward" "$TMP/att-auto.out" && ok \
  || fail "train --device-memory does not take the advised recompute: $(grep -i layout "$TMP/att-auto.out")"
expect_exit 2 "--attention takes one of store, recompute, got 'flash'" -- \
  "$CREW" train "$TMP/g.json" --data "$TMP/text" --attention flash

# --- sampling: the prompt comes back first, then exactly N bytes; a seed repeats, another differs
W="$TMP/run/weights.safetensors"
"$CREW" sample "$TMP/g.json" --weights "$W" --prompt "12 the" --tokens 40 --seed 3 > "$TMP/s1" 2> "$TMP/err" && ok || fail "sample: $(cat "$TMP/err")"
"$CREW" sample "$TMP/g.json" --weights "$W" --prompt "12 the" --tokens 40 --seed 3 > "$TMP/s2" 2>&1
"$CREW" sample "$TMP/g.json" --weights "$W" --prompt "12 the" --tokens 40 --seed 4 > "$TMP/s3" 2>&1
cmp -s "$TMP/s1" "$TMP/s2" && ok || fail "the same seed gave different text"
cmp -s "$TMP/s1" "$TMP/s3" && fail "seeds 3 and 4 gave the same 40 bytes" || ok
[ "$(head -c 6 "$TMP/s1")" = "12 the" ] && ok || fail "sample does not start with its prompt: $(cat "$TMP/s1")"
[ "$(wc -c < "$TMP/s1")" -eq 47 ] && ok || fail "sample printed $(wc -c < "$TMP/s1") bytes, wanted 6 + 40 + newline"
"$CREW" sample "$TMP/g.json" --weights "$W" --prompt "the cat" --tokens 16 --temperature 0 > "$TMP/greedy" 2>&1
grep -q "sat" "$TMP/greedy" && ok || fail "greedy decoding after 'the cat' did not learn 'sat': $(cat "$TMP/greedy")"

# --- verify: N replicas of a GPT equal one replica accumulating, bit for bit; gpt_tiny itself too
# (its context of 128 re-cuts the data's windows of 32), except in the sanitizers' slow builds
models="$TMP/g.json"
[ "${CREW_SANITIZED:-0}" = 1 ] || models="$models ${CREW_SOURCE_DIR:-.}/examples/gpt_tiny.json"
for model in $models; do
  for n in 2 4; do
    "$CREW" verify "$model" --data "$TMP/text" --devices cpu:$n --steps 6 --batch-per-device 2 > "$TMP/v" 2>&1
    tail -n 1 "$TMP/v" | grep -q PASS && grep -q "bitwise equal" "$TMP/v" && ok ||
      fail "verify $(basename "$model") cpu:$n: $(tail -n 5 "$TMP/v")"
  done
done

# --- bad input: one line on stderr, exit 2
gpt "$TMP/heads.json" 1 3 32 32 256
expect_exit 2 "not divisible by its 3 heads" -- "$CREW" train "$TMP/heads.json" --data "$TMP/text"
gpt "$TMP/long.json" 1 2 32 65536 256
expect_exit 2 "needs shards of at least 65537 tokens" -- "$CREW" train "$TMP/long.json" --data "$TMP/text"
gpt "$TMP/small_vocab.json" 1 2 32 32 64
expect_exit 2 "tokens in its vocabulary but the model outputs only 64 logits" -- "$CREW" train "$TMP/small_vocab.json" --data "$TMP/text"
cp -r "$TMP/text" "$TMP/bad-token"
printf '\001\001' | dd of="$TMP/bad-token/train_000000.bin" bs=1 seek=1030 conv=notrunc status=none # token 3 := 257
expect_exit 2 "token 257 at index 3 is outside the vocabulary [0, 256)" -- "$CREW" train "$TMP/g.json" --data "$TMP/bad-token"
cp -r "$TMP/text" "$TMP/bad-magic"
printf 'XXXX' | dd of="$TMP/bad-magic/train_000000.bin" bs=1 conv=notrunc status=none
expect_exit 2 "not an llm.c token shard" -- "$CREW" train "$TMP/g.json" --data "$TMP/bad-magic"
cp -r "$TMP/text" "$TMP/short"
head -c 600 "$TMP/text/val_000000.bin" > "$TMP/short/val_000000.bin"
expect_exit 2 "shorter than the 1024-byte header" -- "$CREW" train "$TMP/g.json" --data "$TMP/short"
printf '{"input_shape": [4], "layers": [{"type": "dense", "units": 3}]}' > "$TMP/dense.json"
expect_exit 2 "it trains a language model (a gpt block)" -- "$CREW" train "$TMP/dense.json" --data "$TMP/text"
expect_exit 2 "not a language model" -- "$CREW" sample "$TMP/dense.json" --weights "$W" --prompt "x"
expect_exit 2 "missing --prompt" -- "$CREW" sample "$TMP/g.json" --weights "$W" --prompt ""
printf '{"layers": [{"type": "gpt", "layers": 1, "heads": 2, "width": 8, "context": 4, "vocab": 8}, {"type": "flatten"}]}' > "$TMP/two.json"
expect_exit 2 "must be the only entry" -- "$CREW" train "$TMP/two.json" --data "$TMP/text"
report
