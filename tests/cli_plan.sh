#!/usr/bin/env bash
# cli_plan.sh — crew plan: the verdicts on the example models at several device memories, the
# JSON line, and bad usage (one line on stderr, exit status 2).
. "$(dirname "$0")/lib_cli.sh"

plan() { "$CREW" plan "$@" --json > "$TMP/out" 2> "$TMP/err"; }

plan examples/fashion_mlp.json && ok || fail "crew plan of the MLP: $(cat "$TMP/err")"
[ "$(json_field "$TMP/out" fits)" = true ] && ok || fail "the MLP does not fit this machine: $(tail -1 "$TMP/out")"
[ "$(json_field "$TMP/out" verdict_kind)" = data_parallel ] && ok || fail "MLP verdict: $(tail -1 "$TMP/out")"
grep -q '"bytes_per_device":[1-9]' "$TMP/out" && grep -q '"layers":\[{"index":0' "$TMP/out" && ok || fail "MLP JSON: $(tail -1 "$TMP/out")"
grep -q "^verdict: fits with data parallelism" "$TMP/out" && ok || fail "no verdict line: $(cat "$TMP/out")"

plan examples/fashion_cnn.json --device-memory 14M && ok || fail "crew plan of the CNN in 14M: $(cat "$TMP/err")"
[ "$(json_field "$TMP/out" verdict_kind)" = smaller_batch ] && grep -q -- "--batch-per-device 16 --global-batch 64" "$TMP/out" \
    && ok || fail "CNN in 14M: $(tail -2 "$TMP/out")"
plan examples/fashion_cnn.json --device-memory 8MiB && [ "$(json_field "$TMP/out" verdict_kind)" = model_parallel ] \
    && grep -q '"stage":1' "$TMP/out" && ok || fail "CNN in 8 MiB: $(tail -2 "$TMP/out")"
plan examples/fashion_cnn.json --device-memory 2M && [ "$(json_field "$TMP/out" verdict_kind)" = too_large ] \
    && [ "$(json_field "$TMP/out" fits)" = false ] && ok || fail "CNN in 2M: $(tail -2 "$TMP/out")"
plan examples/fashion_mlp.json --devices cpu:4 --device-memory 5M && \
    [ "$(json_field "$TMP/out" verdict_kind)" = optimizer_sharding ] && ok || fail "MLP on 4 x 5M: $(tail -2 "$TMP/out")"
# A share just under 100% reads as one (GPT-2 124M on 8 devices of 8 GB: 7.43 of 7.45 GiB), never
# "1e+02%" nor rounded up to a "100%" that would not fit.
plan examples/gpt2_124m.json --devices cpu:8 --device-memory 8GB && grep -q "7.43 GiB of the device's 7.45 GiB (99.7%)" "$TMP/out" \
    && ok || fail "GPT-2 124M in 8 GB: $(grep '^verdict' "$TMP/out")"
# GPT-2 124M at one sample a device on 4 devices of 2.5 GB: data parallelism (3.25 GiB) does not
# fit, ZeRO-3 does, with each unit's gradient over its gathered parameters (crew train
# --device-memory runs it: docs/PERFORMANCE.md, 2.00 GiB measured)
plan examples/gpt2_124m.json --devices cpu:4 --batch-per-device 1 --device-memory 2.5GB \
    && [ "$(json_field "$TMP/out" verdict_kind)" = parameter_sharding ] \
    && grep -q "with parameter sharding (ZeRO-3) across 4 replicas.* needs 2.00 GiB of 2.33 GiB" "$TMP/out" && ok \
    || fail "GPT-2 124M on 4 x 2.5 GB: $(grep '^verdict' "$TMP/out")"
# The verdict keeps the asked global batch; sharding (data parallelism) wins unless it takes more
# devices than asked for and than a pipeline: a 4-layer 1024-wide MLP at batch 64 in 28 MB needs
# 3 pipeline stages (ZeRO-3 would take 4 replicas of 16); in 34 MB ZeRO-3 over 2 replicas of 32
# ties with 2 stages, and data parallelism wins the tie, with the pipeline's bubble said; in 40 MB
# the optimizer state alone sharded over 2 replicas does (the lightest level that fits).
printf '{"input_shape": [784], "layers": [{"type": "dense", "units": 1024, "activation": "relu"},
  {"type": "dense", "units": 1024, "activation": "relu"}, {"type": "dense", "units": 1024, "activation": "relu"},
  {"type": "dense", "units": 10}], "optimizer": {"type": "adamw"}, "training": {"batch_per_device": 64}}' > "$TMP/mlp4.json"
plan "$TMP/mlp4.json" --device-memory 28MB && [ "$(json_field "$TMP/out" verdict_kind)" = model_parallel ] \
    && grep -q "over 3 pipeline stages.*keep the global batch of 64" "$TMP/out" && ok || fail "MLP4 in 28MB: $(tail -2 "$TMP/out")"
plan "$TMP/mlp4.json" --device-memory 34MB && [ "$(json_field "$TMP/out" verdict_kind)" = parameter_sharding ] \
    && grep -q '"shard":"parameters"' "$TMP/out" \
    && grep -q "parameter sharding (ZeRO-3) across 2 replicas.*1.5x the traffic.*a pipeline of 2 stages would idle 50%" "$TMP/out" \
    && ok || fail "MLP4 in 34MB: $(tail -2 "$TMP/out")"
plan "$TMP/mlp4.json" --device-memory 40MB && [ "$(json_field "$TMP/out" verdict_kind)" = optimizer_sharding ] \
    && grep -q "across 2 replicas.*keeps the global batch of 64" "$TMP/out" && ok || fail "MLP4 in 40MB: $(tail -2 "$TMP/out")"
plan examples/fashion_mlp.json --devices cpu:2 --global-batch 1024 && grep -q '"global_batch":1024,"accumulation":4,' "$TMP/out" \
    && ok || fail "MLP with accumulation: $(tail -1 "$TMP/out")"
# "--devices cpu" counts the cores this process may use (its affinity), not the machine's.
if command -v taskset > /dev/null; then
    taskset -c 0 "$CREW" plan examples/fashion_mlp.json --devices cpu --json > "$TMP/out" 2> "$TMP/err" \
        && grep -q "^memory plan for examples/fashion_mlp.json: 1 replica," "$TMP/out" \
        && ok || fail "--devices cpu under taskset -c 0: $(head -1 "$TMP/out") $(cat "$TMP/err")"
fi

expect_exit 2 "--device-memory" -- "$CREW" plan examples/fashion_mlp.json --device-memory 12X
expect_exit 2 "--device-memory" -- "$CREW" plan examples/fashion_mlp.json --device-memory -5G
expect_exit 2 "missing MODEL.json" -- "$CREW" plan
# --data: the host line counts the training and test splits' samples; a dataset whose test split
# cannot be opened is counted by its training split alone, and the plan says so (crew train would
# refuse it) instead of a smaller host line without a word
tiny_images "$TMP/data" 40
printf '{"input_shape": [12, 12, 1], "layers": [{"type": "flatten"}, {"type": "dense", "units": 10}]}' > "$TMP/tiny.json"
plan "$TMP/tiny.json" --data "$TMP/data" && ! grep -q "note:" "$TMP/err" && ok || fail "plan --data: $(cat "$TMP/err")"
rm "$TMP/data/test_x.npy"
plan "$TMP/tiny.json" --data "$TMP/data" && grep -q "test_x.npy.*counts the training split's samples alone" "$TMP/err" \
    && ok || fail "plan --data without its test split: $(cat "$TMP/err")"

expect_exit 2 "no-such.json" -- "$CREW" plan "$TMP/no-such.json"
expect_exit 2 "not a multiple" -- "$CREW" plan examples/fashion_mlp.json --global-batch 100
expect_exit 2 "unknown option" -- "$CREW" plan examples/fashion_mlp.json --frobnicate
expect_exit 2 "unknown device kind 'gpu'" -- "$CREW" plan examples/fashion_mlp.json --devices gpu:2
report
