#!/usr/bin/env bash
# cli_goodput.sh — a run's gradient noise scale carried into the advisor: crew train measures it
# (the summary line, metrics.jsonl), crew plan --from and crew scale --from read it from the run
# directory and count it (the statistical efficiency E(M) = (B + M0) / (B + M) of each global
# batch, the time to the run's progress, where adding devices stops paying), and bad run
# directories get one line and exit status 2. The figures themselves are the run's: the test holds
# the arithmetic between them, not their values.
. "$(dirname "$0")/lib_cli.sh"
need_fashion
M=examples/fashion_mlp.json

# Two replicas of 128: each replica's gradient is the small batch, the all-reduced one the big.
"$CREW" train $M --data "$DATA" --devices cpu:2 --batch-per-device 128 --epochs 1 --run-dir "$TMP/run" \
    > "$TMP/train" 2>&1 && ok || fail "crew train: $(tail -3 "$TMP/train")"
grep -q "^gradient noise scale B_simple = [0-9.e+]* samples (smoothed over about the last 100 steps; [0-9]* measured, one in 4); the global batch of 256 is" \
    "$TMP/train" && ok || fail "summary: $(grep noise "$TMP/train")"
# the run's figure: the last step line that measured one
B=$(grep -o '"noise_scale":[0-9.e+-]*' "$TMP/run/metrics.jsonl" | tail -n 1 | cut -d: -f2)
[ -n "$B" ] && awk -v b="$B" 'BEGIN { exit !(b > 0) }' && ok || fail "no noise_scale in metrics.jsonl"

# crew plan --from: the planned global batch of 1024 against the run's 256
"$CREW" plan $M --devices cpu:2 --global-batch 1024 --from "$TMP/run" --json > "$TMP/plan" 2> "$TMP/err" \
    && ok || fail "crew plan --from: $(cat "$TMP/err")"
grep -q "^batch against the gradient noise scale of $TMP/run: B = .* measured at a global batch of 256" "$TMP/plan" \
    && ok || fail "plan text: $(grep -A2 '^batch against' "$TMP/plan")"
tail -n 1 "$TMP/plan" | grep -o '"noise":{[^}]*}' | tr ',' '\n' | tr -d '{}"' | sed 's/^noise://' > "$TMP/noise"
awk -F: -v b="$B" '
  { v[$1] = $2 }
  END { e = (b + 256) / (b + 1024)
        exit !((v["noise_scale"] - b) ^ 2 < 1e-10 * b * b && v["noise_batch"] == 256 &&
               (v["statistical_efficiency"] - e) ^ 2 < 1e-10 &&
               (v["steps_ratio"] - 0.25 / e) ^ 2 < 1e-10) }' "$TMP/noise" \
    && ok || fail "plan noise JSON (B $B): $(cat "$TMP/noise")"
"$CREW" plan $M --json | tail -n 1 | grep -q '"noise":null}$' && ok || fail "plan without --from: noise not null"

# crew scale --from: every projected point's E(M), goodput and time to the result follow from B
"$CREW" scale $M --data "$DATA" --devices cpu:1,2 --batch-per-device 128 --steps 3 --warmup 1 --repeats 1 \
    --epochs 2 --project 1,2,4,8,16 --from "$TMP/run" --json > "$TMP/scale" 2> "$TMP/err" \
    && ok || fail "crew scale --from: $(cat "$TMP/err")"
last=$(tail -n 1 "$TMP/scale")
echo "$last" | grep -q "\"noise_batch\":256,\"noise_source\":\"run $TMP/run\"" && ok || fail "noise source: $last"
echo "$last" | grep -o '"projection":\[[^]]*\]' | grep -o '{[^}]*}' | tr -d '{}"' | awk -F'[,:]' -v b="$B" '
  { for (i = 1; i < NF; i += 2) v[$i] = $(i + 1)
    e = (b + 256) / (b + v["global_batch"])
    if ((v["statistical_efficiency"] - e) ^ 2 > 1e-10 || (v["goodput"] - v["samples_per_s"] * e) ^ 2 > 1e-8 * v["goodput"] ^ 2 ||
        (v["to_target_s"] - v["epochs_s"] / e) ^ 2 > 1e-8 * v["to_target_s"] ^ 2) bad++
    n++ }
  END { exit !(n == 5 && bad == 0) }' && ok || fail "projection's progress figures (B $B): $last"
pays=$(json_field "$TMP/scale" pays_until_devices)
soonest=$(json_field "$TMP/scale" goodput_devices)
[ "${pays:-0}" -ge 1 ] && [ "$pays" -le 16 ] && [ "${soonest:-0}" -ge 1 ] && ok || fail "pays until '$pays', soonest '$soonest'"
grep -q "^gradient noise scale: B = .* measured at a global batch of 256 (run $TMP/run: its last measurement" "$TMP/scale" \
    && ok || fail "scale's noise line: $(grep '^gradient noise' "$TMP/scale")"
grep -q "E(M) goodput to result" "$TMP/scale" && grep -q "^time to the result: counting the gradient noise scale" "$TMP/scale" \
    && ok || fail "scale's progress columns or verdict: $(cat "$TMP/scale")"

# Runs that hold none, and run directories that are not runs: one line, exit status 2.
"$CREW" train $M --data "$DATA" --devices cpu:1 --epochs 1 --max-steps 5 --run-dir "$TMP/one" > /dev/null 2>&1 \
    && ok || fail "crew train on one replica"
expect_exit 2 "holds no gradient noise scale" -- "$CREW" plan $M --from "$TMP/one"
expect_exit 2 "holds no gradient noise scale" -- "$CREW" scale $M --data "$DATA" --from "$TMP/one"
expect_exit 2 "cannot open" -- "$CREW" plan $M --from "$TMP/no-such-run"
mkdir -p "$TMP/bad" && { echo '{"step":'; cat "$TMP/run/metrics.jsonl"; } > "$TMP/bad/metrics.jsonl"
expect_exit 2 "metrics.jsonl line 1: not valid JSON" -- "$CREW" scale $M --data "$DATA" --from "$TMP/bad"
report
