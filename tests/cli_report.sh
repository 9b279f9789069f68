#!/usr/bin/env bash
# cli_report.sh — crew report RUN_DIR: usage and bad input (one line, exit 2), a report from a
# synthetic two-replica run, reports of a torn last line and of a resumed run's file, and, when
# Chromium is installed, that a real browser renders it:
# the DOM holds the five charts with their shapes drawn, no script error is logged, and a
# screenshot is a picture rather than a blank page. (Chromium: apt-get install -y chromium.)
. "$(dirname "$0")/lib_cli.sh"

# A run of 200 steps on 2 replicas; replica 1 computes 30% slower over steps 101-150.
RUN="$TMP/run"
mkdir -p "$RUN"
awk 'BEGIN {
  print "{\"type\":\"run\",\"time\":1764504000.1,\"crew_version\":\"0.1.0\",\"devices\":2,\"batch_per_device\":64,\"accumulation\":1,\"global_batch\":128,\"steps_per_epoch\":100,\"total_steps\":200,\"epochs\":2,\"base_lr\":0.001,\"scaled_lr\":0.001,\"warmup_steps\":20}"
  for (s = 1; s <= 200; s++) {
    slow = (s > 100 && s <= 150) ? 1.3 : 1.0
    printf "{\"type\":\"step\",\"step\":%d,\"epoch\":%d,\"loss\":%.4f,\"lr\":0.001,\"global_batch\":128,\"step_s\":%.4f,\"replicas\":[", s, int((s - 1) / 100), 2.0 / (1 + 0.02 * s), 0.08 + 0.01 * (s % 7) / 7
    for (r = 0; r < 2; r++) printf "%s{\"rank\":%d,\"data_s\":0.002,\"forward_s\":%.4f,\"backward_s\":%.4f,\"comm_exposed_s\":0.004,\"comm_hidden_s\":0.002,\"optimizer_s\":0.003}", (r ? "," : ""), r, 0.02 * (r ? slow : 1), 0.045 * (r ? slow : 1)
    print "]}"
    if (s == 150) print "{\"type\":\"event\",\"step\":150,\"kind\":\"straggler\",\"rank\":1,\"value\":1.3,\"message\":\"replica 1 was 30% slower than the median of the others over steps 101-150\"}"
    if (s % 100 == 0) printf "{\"type\":\"epoch\",\"epoch\":%d,\"steps\":100,\"train_loss\":0.5,\"train_accuracy\":0.8,\"test_loss\":0.4,\"test_accuracy\":0.86,\"wall_s\":8,\"samples_per_s\":1600}\n", s / 100 - 1
  }
  print "{\"type\":\"summary\",\"steps\":200,\"epochs\":2,\"wall_s\":16.2,\"samples_per_s\":1580,\"test_accuracy\":0.86,\"test_loss\":0.4,\"data_fraction\":0.03,\"compute_fraction\":0.81,\"comm_exposed_fraction\":0.05,\"optimizer_fraction\":0.04,\"bottleneck\":\"compute-bound: forward and backward took 81% of each step\"}"
}' > "$RUN/metrics.jsonl"

# Usage and bad input
"$CREW" report --help | grep -q "usage: crew report" && ok || fail "crew report --help"
"$CREW" --help | grep -q "report" && ok || fail "crew --help lists report"
expect_exit 2 "missing RUN_DIR" -- "$CREW" report
expect_exit 2 "unknown option" -- "$CREW" report "$RUN" --frobnicate
expect_exit 2 "needs a value" -- "$CREW" report "$RUN" --out
expect_exit 2 "no-such-run/metrics.jsonl" -- "$CREW" report "$TMP/no-such-run"
mkdir -p "$TMP/bad"
{ head -n 3 "$RUN/metrics.jsonl"; echo '{"type":"step","step":4,'; } > "$TMP/bad/metrics.jsonl"
expect_exit 2 "metrics.jsonl line 4" -- "$CREW" report "$TMP/bad"
[ ! -e "$TMP/bad/report.html" ] && ok || fail "a failed report left report.html behind"
expect_exit 2 "no-such-dir" -- "$CREW" report "$RUN" --out "$TMP/no-such-dir/r.html"

# A run still writing (or killed): its torn last line, without a newline, is left out, and said.
mkdir -p "$TMP/torn"
{ head -n 3 "$RUN/metrics.jsonl"; printf '%s' '{"type":"step","step":3,"lo'; } > "$TMP/torn/metrics.jsonl"
"$CREW" report "$TMP/torn" > /dev/null 2> "$TMP/err" && ok || fail "crew report of a torn last line: $(cat "$TMP/err")"
grep -q "The last line of metrics.jsonl is incomplete (27 bytes)" "$TMP/torn/report.html" && ok ||
  fail "the report does not say that it left a torn last line out"
# What a resumed run of an earlier build left: a run line appended to the killed run's torn line,
# steps 2-3 logged twice. One report, each step once.
mkdir -p "$TMP/legacy"
{ head -n 4 "$RUN/metrics.jsonl"; printf '%s' '{"type":"step","step":4,"lo'; head -n 1 "$RUN/metrics.jsonl"
  sed -n 3,20p "$RUN/metrics.jsonl"; } > "$TMP/legacy/metrics.jsonl"
"$CREW" report "$TMP/legacy" > /dev/null 2> "$TMP/err" && ok || fail "crew report of a resumed run's file: $(cat "$TMP/err")"
grep -q "restarted from step 1: steps 2-3 were logged twice" "$TMP/legacy/report.html" && ok ||
  fail "the report does not say which steps were run again"
grep -q "A torn line (at line 5) was left out" "$TMP/legacy/report.html" && ok || fail "the report does not count the torn line"

# A good run: the default place, then --out
"$CREW" report "$RUN" > "$TMP/out" 2> "$TMP/err" || fail "crew report of a good run: $(cat "$TMP/err")"
grep -qF "report: $RUN/report.html" "$TMP/out" && ok || fail "crew report did not say where the report went: $(cat "$TMP/out")"
HTML="$RUN/report.html"
[ "$(grep -c '<svg class="chart"' "$HTML")" -eq 5 ] && ok || fail "report.html lacks the five charts"
grep -q "replica 1 was 30% slower" "$HTML" && ok || fail "report.html lacks the straggler event"
# Self-contained: nothing to fetch, no script.
if grep -Eq '<script|<link|<img|<iframe|@import|src=|href=' "$HTML" ||
   grep -Eo 'https?://[^" )]*' "$HTML" | grep -qv '^http://www.w3.org/2000/svg$'; then
  fail "report.html refers to something outside itself"
else
  ok
fi
"$CREW" report "$RUN" --out "$TMP/elsewhere.html" > /dev/null || fail "crew report --out"
cmp -s "$HTML" "$TMP/elsewhere.html" && ok || fail "--out wrote a different report"
ls "$RUN" "$TMP" | grep -q 'tmp-' && fail "a temporary file was left behind" || ok

# In a browser
if ! command -v chromium > /dev/null; then
  echo "skipped: chromium not installed (the browser checks; apt-get install -y chromium)"
  report
  exit $?
fi
CHROME=(timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run
        --user-data-dir="$TMP/chrome" --enable-logging=stderr --v=0)
"${CHROME[@]}" --dump-dom "file://$HTML" > "$TMP/dom.html" 2> "$TMP/chrome.err" || fail "chromium --dump-dom failed: $(tail -3 "$TMP/chrome.err")"
[ "$(grep -o '<svg class="chart"' "$TMP/dom.html" | wc -l)" -eq 5 ] && ok || fail "the DOM lacks the five charts"
paths=$(grep -o '<path' "$TMP/dom.html" | wc -l)
rects=$(grep -o '<rect' "$TMP/dom.html" | wc -l)
[ "$paths" -gt 10 ] && [ "$rects" -gt 100 ] && ok || fail "the DOM holds $paths paths and $rects rects, too few to be the charts"
grep -q 'id="heatmap"' "$TMP/dom.html" && grep -q 'straggler event' "$TMP/dom.html" && ok || fail "the DOM lacks the heat map"
if grep -E "Uncaught|SyntaxError|CONSOLE" "$TMP/chrome.err"; then fail "the browser logged a script error"; else ok; fi

"${CHROME[@]}" --window-size=1280,2200 --screenshot="$TMP/shot.png" "file://$HTML" > /dev/null 2> "$TMP/shot.err" ||
  fail "chromium --screenshot failed: $(tail -3 "$TMP/shot.err")"
# A blank page compresses to a few kB; one with five charts is far larger.
size=$(stat -c %s "$TMP/shot.png" 2> /dev/null || echo 0)
[ "$size" -gt 60000 ] && ok || fail "the screenshot is $size bytes: a blank page?"
[ "$(head -c 8 "$TMP/shot.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] && ok || fail "the screenshot is not a PNG"
report
