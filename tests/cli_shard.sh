#!/usr/bin/env bash
# cli_shard.sh — sharding through the CLI (--shard optimizer|gradients|parameters: ZeRO-1, 2 and 3):
# - the MLP and the CNN at every level on 2 and 4 replicas (threads) end with weights bitwise equal
#   to one replica accumulating the same micro-batches; with accumulation too;
# - gpt_tiny (a tied token table, clipping by the global norm, 6 units) at ZeRO-2 and ZeRO-3 on 2 and
#   4 replicas (ZeRO-3 with its collectives on the replicas' threads: the tied table a unit like
#   the others, the lm_head's part of its gradient computed late), with its collectives overlapping
#   compute (--shard-overlap on: the table's unit kept through the step), on cpu-remote (a GPU's
#   staged path) and across 2 MPI processes (with the MLP; when this crew has MPI), equals the
#   unsharded run;
# - gpt_tiny on 4 replicas with --shard parameters: replica 0's measured device peak is the plan's
#   within 1%, and holds a quarter of the parameters, gradients and optimizer state and one unit's
#   parameters, whose buffer takes its gradient, beside the activations;
# - crew plan names ZeRO-3 where data parallelism does not fit and ZeRO-3 does, and crew train
#   --device-memory runs that verdict;
# (a run stopped at one level resuming at another: tests/test_shard.c)
# - bad --shard values: one line, exit 2.
. "$(dirname "$0")/lib_cli.sh"
need_fashion

same() { cmp -s "$1/weights.safetensors" "$2/weights.safetensors"; }

# --- the MLP and the CNN, every level, against one replica accumulating
for model in fashion_mlp fashion_cnn; do
  COMMON=(--data "$DATA" --max-steps 6 --batch-per-device 8 --global-batch 64 --drift-check-every 2 --quiet)
  "$CREW" train "examples/$model.json" "${COMMON[@]}" --devices cpu:1 --run-dir "$TMP/$model-one" > /dev/null \
    || fail "$model on one replica"
  for n in 2 4; do
    for level in optimizer gradients parameters; do
      "$CREW" train "examples/$model.json" "${COMMON[@]}" --devices cpu:$n --shard $level --run-dir "$TMP/$model-$n-$level" \
        > "$TMP/out" 2>&1 || fail "$model on $n replicas, --shard $level: $(tail -n 3 "$TMP/out")"
      same "$TMP/$model-one" "$TMP/$model-$n-$level" && ok \
        || fail "$model: $n replicas sharding $level differ from one replica accumulating"
    done
  done
done

# --- gpt_tiny on a small corpus: ZeRO-2 and 3 against the unsharded run
awk 'BEGIN { split("the cat sat on the mat|a dog ran in the park|birds sing in the morning|rain falls on the roof", p, "|");
             for (i = 0; i < 1400; i++) printf "%d %s.\n", i % 97, p[i % 4 + 1] }' > "$TMP/corpus.txt"
"$CREW" prep text "$TMP/corpus.txt" --seq-len 128 --out "$TMP/text" > "$TMP/out" 2>&1 || fail "prep text: $(cat "$TMP/out")"
GPT=examples/gpt_tiny.json
G=(--data "$TMP/text" --max-steps 3 --batch-per-device 4 --quiet)
for n in 2 4; do
  "$CREW" train $GPT "${G[@]}" --devices cpu:$n --global-batch 32 --json --run-dir "$TMP/gpt-$n" > "$TMP/gpt-$n.json" \
    2> "$TMP/err" || fail "gpt_tiny on $n replicas: $(cat "$TMP/err")"
  for level in gradients parameters; do
    "$CREW" train $GPT "${G[@]}" --devices cpu:$n --global-batch 32 --shard $level --shard-overlap off --json \
      --run-dir "$TMP/gpt-$n-$level" \
      > "$TMP/gpt-$n-$level.json" 2> "$TMP/err" || fail "gpt_tiny on $n replicas, --shard $level: $(cat "$TMP/err")"
    same "$TMP/gpt-$n" "$TMP/gpt-$n-$level" && ok || fail "gpt_tiny: $n replicas sharding $level differ from unsharded"
    # the evaluation too (ZeRO-3's replicas each evaluate their share, gathering each unit)
    [ "$(json_field "$TMP/gpt-$n.json" test_loss)" = "$(json_field "$TMP/gpt-$n-$level.json" test_loss)" ] && ok \
      || fail "gpt_tiny: $n replicas sharding $level evaluate to another test loss"
  done
done
same "$TMP/gpt-2" "$TMP/gpt-4" && ok || fail "gpt_tiny: 2 and 4 replicas differ"
# the units' collectives on the communication thread, overlapping compute: the same bits
"$CREW" train $GPT "${G[@]}" --devices cpu:4 --global-batch 32 --shard parameters --shard-overlap on --run-dir "$TMP/gpt-4-ov" \
  > /dev/null 2> "$TMP/err" || fail "gpt_tiny, --shard-overlap on: $(cat "$TMP/err")"
same "$TMP/gpt-4" "$TMP/gpt-4-ov" && ok || fail "gpt_tiny: ZeRO-3 with its collectives overlapping compute differs"
"$CREW" train $GPT "${G[@]}" --devices cpu-remote:2 --global-batch 32 --shard parameters --shard-overlap on --run-dir "$TMP/gpt-remote" \
  > /dev/null 2> "$TMP/err" || fail "gpt_tiny on cpu-remote:2, --shard parameters: $(cat "$TMP/err")"
same "$TMP/gpt-2" "$TMP/gpt-remote" && ok || fail "gpt_tiny: ZeRO-3 on cpu-remote differs from the CPU's unsharded run"

# --- across 2 MPI processes (the MPI communicator's ordered all-reduce and broadcasts): the MLP
# and gpt_tiny at ZeRO-2 and 3 equal the unsharded run (the CNN: cli_mpi.sh)
if "$CREW" --version | grep -q '^MPI: Open MPI\|^MPI: MPICH' && command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Open MPI leaks its own start-up allocations: no leak detection under ASan (tests/CMakeLists.txt)
  MPIRUN=(env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout -k 5 300 mpirun --oversubscribe --bind-to none)
  for level in gradients parameters; do
    "${MPIRUN[@]}" -np 2 "$CREW" train $GPT "${G[@]}" --devices cpu:1 --global-batch 32 --shard $level \
      --shard-overlap off --run-dir "$TMP/gpt-mpi-$level" > "$TMP/out" 2>&1 \
      || fail "gpt_tiny, 2 processes, --shard $level: $(tail -n 3 "$TMP/out")"
    same "$TMP/gpt-2" "$TMP/gpt-mpi-$level" && ok || fail "gpt_tiny: 2 processes sharding $level differ from unsharded"
    "${MPIRUN[@]}" -np 2 "$CREW" train examples/fashion_mlp.json --data "$DATA" --max-steps 6 --batch-per-device 8 \
      --global-batch 64 --quiet --shard $level --run-dir "$TMP/mlp-mpi-$level" > "$TMP/out" 2>&1 \
      || fail "the MLP, 2 processes, --shard $level: $(tail -n 3 "$TMP/out")"
    same "$TMP/fashion_mlp-one" "$TMP/mlp-mpi-$level" && ok || fail "the MLP: 2 processes sharding $level differ"
  done
fi

# --- ZeRO-3's memory on 4 replicas: the plan's within 1%, and what it holds
"$CREW" train $GPT --data "$TMP/text" --max-steps 2 --devices cpu:4 --shard parameters --shard-overlap off \
  --run-dir "$TMP/gpt-mem" \
  > "$TMP/mem.out" 2>&1 || fail "gpt_tiny memory run: $(tail -n 3 "$TMP/mem.out")"
line=$(grep "^device memory: .* at its peak on replica 0, planned .* ([+-][0-9.]*%)" "$TMP/mem.out")
off=$(echo "$line" | sed -n 's/.*(\([+-][0-9.]*\)%).*/\1/p')
awk -v o="$off" 'BEGIN { exit !(o != "" && o <= 1 && o >= -1) }' && ok || fail "ZeRO-3 peak against the plan: $line"
"$CREW" plan $GPT --devices cpu:4 --json > "$TMP/plain.json" 2>&1 || fail "crew plan of gpt_tiny"
"$CREW" plan $GPT --devices cpu:4 --shard parameters --json > "$TMP/z3.json" 2>&1 || fail "crew plan of gpt_tiny, ZeRO-3"
python3 - "$TMP/plain.json" "$TMP/z3.json" <<'PY' && ok || fail "ZeRO-3's plan holds more than its shards and units"
import json, sys
plain, z3 = (json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:])
b, s = plain["breakdown"], z3["breakdown"]
weights = b["parameters"] + b["gradients"] + b["optimizer"]
block = max(l["params"] for l in plain["layers"]) * 4          # the widest unit: a transformer block
held = s["parameters"] + s["gradients"] + s["optimizer"]
# a quarter of everything, and one gathered unit's parameters, whose buffer then takes its gradient:
# the widest unit's (the tied token table takes its turn there too; 64-byte rounding aside)
bound = weights / 4 + block + 1024
assert held <= bound, (held, bound)
assert z3["bytes_per_device"] - held == plain["bytes_per_device"] - weights   # the activations are the same
PY

# --- the planner chooses the lightest level that fits (gpt_tiny at one sample a device, whose
# weights then outweigh its activations), and crew train --device-memory runs ZeRO-3's verdict
P=(--devices cpu:4 --batch-per-device 1 --json)
for want in "12MiB parameter_sharding ZeRO-3" "14MiB gradient_sharding ZeRO-2" "16MiB optimizer_sharding ZeRO-1"; do
  set -- $want
  "$CREW" plan $GPT "${P[@]}" --device-memory $1 > "$TMP/choice.json" 2>&1
  [ "$(json_field "$TMP/choice.json" verdict_kind)" = $2 ] && grep -q "($3) across 4 replicas" "$TMP/choice.json" && ok \
    || fail "gpt_tiny in $1: $(grep '^verdict' "$TMP/choice.json")"
done
"$CREW" train $GPT --data "$TMP/text" --max-steps 2 --devices cpu:4 --batch-per-device 1 --device-memory 12MiB \
  --run-dir "$TMP/gpt-choice" > "$TMP/choice.out" 2>&1 || fail "gpt_tiny --device-memory 12MiB: $(tail -n 3 "$TMP/choice.out")"
grep -q "layout (--device-memory): data parallel with parameters, gradients and optimizer state sharded across the 4 replicas" \
  "$TMP/choice.out" && grep -q -- "--shard parameters (ZeRO-3): each of the 4 replicas keeps 1/4" "$TMP/choice.out" && ok \
  || fail "the layout line: $(grep -i 'layout\|shard' "$TMP/choice.out")"

# --- bad values
expect_exit 2 "--shard" -- "$CREW" train examples/fashion_mlp.json --data "$DATA" --shard everything
expect_exit 2 "--shard-unit-mb" -- "$CREW" train examples/fashion_mlp.json --data "$DATA" --shard parameters --shard-unit-mb 0
expect_exit 2 "--shard" -- "$CREW" plan examples/fashion_mlp.json --shard half
expect_exit 2 "--shard-overlap" -- "$CREW" train examples/fashion_mlp.json --data "$DATA" --shard parameters --shard-overlap maybe
report
