#!/usr/bin/env bash
# cli_pipeline.sh — crew train and verify with --pipeline, end to end on Fashion-MNIST:
# - a 2-stage pipeline (either schedule, any split) ends with the weights of data parallelism on
#   the same global batch and micro-batches, bit for bit, and prints its plan and its bubble;
# - crew verify --pipeline K passes for K = 2, 3 and 4, both schedules, with and without
#   data-parallel replicas of the pipeline;
# - a pipelined run stopped by SIGINT resumes on another layout (data parallel, or another K),
#   and a data-parallel one as a pipeline, still ending with the same weights: the checkpoints are
#   the whole model's;
# - a model too large for its devices (--device-memory) trains on the pipeline the planner finds,
#   each stage's measured device memory within 10% of its plan, on 2 and 4 stages;
# - bad flags are one clear line and exit status 2.
. "$(dirname "$0")/lib_cli.sh"
need_fashion

MODEL=examples/fashion_mlp.json # flatten, dense, relu, dense, relu, dense: 6 layers
COMMON=(--data "$DATA" --max-steps 24 --batch-per-device 16 --global-batch 64 --seed 3 --quiet)
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:4 --run-dir "$TMP/dp" 2> /dev/null || fail "data-parallel reference"
REF="$TMP/dp/weights.safetensors"
for sch in 1f1b gpipe; do
  "$CREW" train $MODEL "${COMMON[@]}" --devices cpu:2 --pipeline 2 --schedule $sch --run-dir "$TMP/pp-$sch" \
    2> "$TMP/pp-$sch.err" || fail "pipeline, $sch: $(cat "$TMP/pp-$sch.err")"
  cmp -s "$REF" "$TMP/pp-$sch/weights.safetensors" && ok || fail "pipeline, $sch: weights differ from data parallelism"
  grep -q "pipeline of 2 stages, .* 4 micro-batches per step: the stages computed .*the ideal bubble is 20%" \
    "$TMP/pp-$sch.err" && ok || fail "pipeline, $sch: no bubble line: $(cat "$TMP/pp-$sch.err")"
done
"$CREW" train $MODEL "${COMMON[@]}" --devices cpu:6 --stages 0-1,2-3,4-5 --run-dir "$TMP/pp3" 2> /dev/null \
  || fail "pipeline of 3 named stages x 2 replicas"
cmp -s "$REF" "$TMP/pp3/weights.safetensors" && ok || fail "3 named stages x 2 replicas: weights differ"

# The plan says what runs where.
"$CREW" train $MODEL --data "$DATA" --max-steps 2 --batch-per-device 16 --devices cpu:4 --pipeline 2 --micro-batches 3 \
  --run-dir "$TMP/plan" > "$TMP/plan.out" 2>&1 || fail "pipeline plan run"
grep -q "global batch 96" "$TMP/plan.out" && grep -q "pipeline: 2 stages x 2 replicas = 4 devices, 1F1B schedule, 3 micro-batches per step (ideal bubble 25%)" "$TMP/plan.out" \
  && grep -q "stage 0: layers 0-[0-9], stage 1: layers [0-9]-5" "$TMP/plan.out" && ok || fail "the pipeline plan: $(cat "$TMP/plan.out")"

# The proof, every K and schedule, with and without replicas of the pipeline (under a sanitizer,
# several times slower, K = 2 and 3: test_pipeline runs every case there too).
KS="2 3 4"; DS="1 2"; LONG=1500
if [ "${CREW_SANITIZED:-0}" = 1 ]; then KS="2 3"; DS="1"; LONG=300; fi
for k in $KS; do
  for sch in 1f1b gpipe; do
    for d in $DS; do
      "$CREW" verify $MODEL --data "$DATA" --devices cpu:$((k * d)) --pipeline $k --schedule $sch --steps 4 \
        --batch-per-device 8 > "$TMP/verify.out" 2>&1 && grep -q "^PASS" "$TMP/verify.out" \
        && grep -q "pipeline stages" "$TMP/verify.out" && ok \
        || fail "verify --pipeline $k --schedule $sch on $((k * d)) devices: $(tail -n 5 "$TMP/verify.out")"
    done
  done
done

# SIGINT stops a pipelined run with a checkpoint of the whole model; it resumes on any layout.
resume_on() { # $1: name; $2: the first run's device flags; the rest: the resumed run's
  local name=$1 first=$2 pid polls=0
  shift 2
  rm -rf "$TMP/$name"
  # shellcheck disable=SC2086 # $first is a list of flags
  "$CREW" train $MODEL "${COMMON[@]}" --max-steps $LONG $first --checkpoint-every 100000 \
    --run-dir "$TMP/$name" > /dev/null 2> "$TMP/$name.err" &
  pid=$!
  until [ "$(grep -c '"type":"step"' "$TMP/$name/metrics.jsonl" 2> /dev/null)" -ge 3 ] 2> /dev/null || ! kill -0 $pid 2> /dev/null ||
    [ $polls -ge 60000 ]; do
    polls=$((polls + 1))
    sleep 0.01
  done
  kill -INT $pid
  wait $pid
  local rc=$?
  [ $rc -eq 1 ] && ls "$TMP/$name/checkpoints"/step-* > /dev/null 2>&1 && ok ||
    { fail "$name: SIGINT: exit $rc, checkpoints: $(ls "$TMP/$name/checkpoints" 2>&1)"; return; }
  "$CREW" train $MODEL "${COMMON[@]}" --max-steps $LONG "$@" --resume "$TMP/$name" > /dev/null 2> "$TMP/$name.err" ||
    { fail "$name: resume: $(cat "$TMP/$name.err")"; return; }
}
"$CREW" train $MODEL "${COMMON[@]}" --max-steps $LONG --devices cpu:4 --run-dir "$TMP/long" 2> /dev/null || fail "the long reference"
resume_on dp "--devices cpu:4 --pipeline 2" --devices cpu:2
cmp -s "$TMP/long/weights.safetensors" "$TMP/dp/weights.safetensors" && ok || fail "pipeline resumed as 2 replicas: weights differ"
resume_on k3 "--devices cpu:4 --pipeline 2" --devices cpu:3 --pipeline 3
cmp -s "$TMP/long/weights.safetensors" "$TMP/k3/weights.safetensors" && ok || fail "pipeline resumed on 3 stages: weights differ"
resume_on topipe "--devices cpu:4" --devices cpu:4 --pipeline 4
cmp -s "$TMP/long/weights.safetensors" "$TMP/topipe/weights.safetensors" && ok || fail "data parallelism resumed as 4 stages: weights differ"

# A model that does not fit: examples/fashion_wide_mlp.json needs 62 MiB as one replica; in
# 48 MB devices, sharding ruled out (--shard none; ZeRO-2 would fit), the planner says it needs a pipeline, crew train --device-memory runs the split it
# finds, and every stage's measured device memory is within 10% of its plan (on 2 and 4 stages).
WIDE=examples/fashion_wide_mlp.json
"$CREW" plan $WIDE --device-memory 48MB --shard none --json > "$TMP/wide-plan.out" && \
  [ "$(json_field "$TMP/wide-plan.out" verdict_kind)" = model_parallel ] && ok || fail "wide MLP plan: $(tail -n 1 "$TMP/wide-plan.out")"
within_plan() { # $1: output of crew train; every "stage S (...): device memory ... planned ... (+P%)" within 10%
  local n; n=$(grep -c '^stage [0-9]* (layers .*): device memory .* at its peak, planned .* ([+-][0-9.]*%)$' "$1")
  [ "$n" -ge 2 ] && ! sed -n 's/^stage .*(\([+-][0-9.]*\)%)$/\1/p' "$1" | awk '{ if ($1 > 10 || $1 < -10) bad = 1 } END { exit !bad }' \
    && ok || fail "stage memory against the plan ($2): $(grep '^stage' "$1")"
}
"$CREW" train $WIDE --data "$DATA" --devices cpu:2 --device-memory 48MB --shard none --max-steps 6 --run-dir "$TMP/wide2" \
  > "$TMP/wide2.out" 2>&1 || fail "wide MLP with --device-memory 48MB: $(tail -n 3 "$TMP/wide2.out")"
grep -q "layout (--device-memory): a pipeline of 2 stages x 1 replica, .* of 45.8 MiB: the model needs model parallelism" \
  "$TMP/wide2.out" && ok || fail "the layout line: $(grep -i layout "$TMP/wide2.out")"
within_plan "$TMP/wide2.out" "2 stages"
"$CREW" train $WIDE --data "$DATA" --devices cpu:4 --pipeline 4 --max-steps 6 --run-dir "$TMP/wide4" \
  > "$TMP/wide4.out" 2>&1 || fail "wide MLP on 4 stages: $(tail -n 3 "$TMP/wide4.out")"
within_plan "$TMP/wide4.out" "4 stages"
# The CNN, whose convolutions' columns are scratch: its micro-batches in flight (views) share their
# stage's; the stages' memory is the plan's, and the weights one device's accumulating
"$CREW" train examples/fashion_cnn.json --data "$DATA" --devices cpu:2 --pipeline 2 --global-batch 64 \
  --batch-per-device 16 --max-steps 3 --run-dir "$TMP/cnn2" > "$TMP/cnn2.out" 2>&1 || fail "CNN on 2 stages: $(tail -n 3 "$TMP/cnn2.out")"
within_plan "$TMP/cnn2.out" "the CNN on 2 stages"
"$CREW" train examples/fashion_cnn.json --data "$DATA" --devices cpu:1 --global-batch 64 --batch-per-device 16 \
  --max-steps 3 --run-dir "$TMP/cnn1" > /dev/null 2>&1 || fail "CNN on cpu:1"
cmp -s "$TMP/cnn2/weights.safetensors" "$TMP/cnn1/weights.safetensors" && ok \
  || fail "the CNN on 2 stages and on one device accumulating 4 micro-batches differ"
"$CREW" train $WIDE --data "$DATA" --devices cpu:2 --device-memory 1GB --max-steps 2 --run-dir "$TMP/wide-dp" \
  > "$TMP/wide-dp.out" 2>&1 && grep -q "layout (--device-memory): data parallel: the model fits" "$TMP/wide-dp.out" && ok \
  || fail "a model that fits stays data parallel: $(grep -i layout "$TMP/wide-dp.out")"

# Bad flags: one line, exit 2.
expect_exit 2 "3 devices cannot hold replicas of 2 pipeline stages" -- \
  "$CREW" train $MODEL --data "$DATA" --devices cpu:3 --pipeline 2
expect_exit 2 "give --pipeline K" -- "$CREW" train $MODEL --data "$DATA" --schedule gpipe
expect_exit 2 "--schedule takes one of 1f1b, gpipe" -- "$CREW" train $MODEL --data "$DATA" --pipeline 2 --schedule zigzag
expect_exit 2 "stage 1 must start at layer 2" -- \
  "$CREW" train $MODEL --data "$DATA" --devices cpu:2 --stages 0-1,3-5 --max-steps 1 --run-dir "$TMP/bad"
expect_exit 2 "names 2 stages, --pipeline asks for 3" -- \
  "$CREW" train $MODEL --data "$DATA" --devices cpu:3 --pipeline 3 --stages 0-1,2-5 --max-steps 1 --run-dir "$TMP/bad"
expect_exit 2 "the model has 6 layers" -- \
  "$CREW" train $MODEL --data "$DATA" --devices cpu:8 --pipeline 8 --max-steps 1 --run-dir "$TMP/bad"
[ ! -e "$TMP/bad" ] && ok || fail "a refused pipeline left a run directory behind"
printf '{"layers": [{"type": "gpt", "layers": 1, "heads": 2, "width": 16, "context": 8, "vocab": 256}]}' > "$TMP/gpt.json"
awk 'BEGIN { for (i = 0; i < 200; i++) print "the cat sat on the mat." }' > "$TMP/corpus.txt"
"$CREW" prep text "$TMP/corpus.txt" --seq-len 8 --out "$TMP/text" > /dev/null || fail "prep text"
expect_exit 2 "tied layers must be in one stage" -- \
  "$CREW" train "$TMP/gpt.json" --data "$TMP/text" --devices cpu:2 --pipeline 2 --max-steps 1 --run-dir "$TMP/bad"
report
