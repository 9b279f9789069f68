# lib_cli.sh — helpers for the shell tests of the crew command line (sourced, not run).
# Each test prints "N passed, N failed" at the end, like the C tests.
set -u
CREW=${1:-${CREW_BIN:-build/crew}}
passed=0
failed=0
TMP=$(mktemp -d /tmp/crew-cli-XXXXXX)
# crew train keeps its measured GEMM peak in $XDG_CACHE_HOME/crew/peaks: the tests keep theirs here,
# never in the home directory of whoever runs them.
export XDG_CACHE_HOME="$TMP/cache"
trap 'rm -rf "$TMP"' EXIT

ok()   { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }

# expect_exit STATUS NEEDLE -- command...: the command exits with STATUS, and its stderr is one
# line containing NEEDLE.
expect_exit() {
  local want=$1 needle=$2; shift 3
  "$@" > "$TMP/out" 2> "$TMP/err"
  local got=$?
  local lines; lines=$(wc -l < "$TMP/err")
  if [ "$got" -ne "$want" ]; then fail "$* exited $got, wanted $want: $(head -c 300 "$TMP/err")"; return; fi
  if [ "$want" -ne 0 ] && [ "$lines" -ne 1 ]; then fail "$* wrote $lines lines to stderr, wanted one: $(cat "$TMP/err")"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "$*: stderr lacks '$needle': $(cat "$TMP/err")"; return; fi
  ok
}

# json_field FILE KEY: the value of KEY in the last line of FILE (a flat JSON object).
json_field() { tail -n 1 "$1" | sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" | tr -d '"'; }

# A prepared Fashion-MNIST in $DATA (skips the calling test with status 0 when the package is absent).
need_fashion() {
  DATA="$TMP/fashion"
  if [ ! -d /usr/share/datasets/fashion-mnist ]; then echo "skipped: dataset-fashion-mnist is not installed"; echo "0 passed, 0 failed"; exit 0; fi
  "$CREW" prep fashion-mnist --out "$DATA" > /dev/null || { echo "crew prep failed"; exit 1; }
}

# seeded_bytes SEED N: N pseudo-random bytes from SEED, the same on every run: a test's data must
# not change from one run to the next (images from /dev/urandom once made crew verify's rounding
# check in cli_optimizers.sh fail on the data alone, 3.55e-5 against its floor of 3.33e-5, under
# CI's ASan build; 70 runs on other random data passed). Perl's srand/rand is its own drand48, the
# same on every machine.
seeded_bytes() {
  perl -e 'srand($ARGV[0]); print pack("C*", map { int(rand(256)) } 1 .. $ARGV[1])' "$1" "$2"
}

# tiny_images OUT N: crew prep idx of N pseudo-random 12x12 one-channel images (seeded_bytes, seed
# N) with labels 0-9 in turn (N a multiple of 10) into OUT: runs of a few milliseconds a step,
# where crops and flips mean something.
tiny_images() {
  local out=$1 n=$2 hex be
  hex=$(printf '%08x' "$2")
  be="\\x${hex:0:2}\\x${hex:2:2}\\x${hex:4:2}\\x${hex:6:2}"
  printf "\\x00\\x00\\x08\\x03$be\\x00\\x00\\x00\\x0c\\x00\\x00\\x00\\x0c" > "$TMP/tiny-img"
  seeded_bytes "$n" $((n * 144)) >> "$TMP/tiny-img"
  printf "\\x00\\x00\\x08\\x01$be" > "$TMP/tiny-lab"
  for _ in $(seq $((n / 10))); do printf '\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09'; done >> "$TMP/tiny-lab"
  "$CREW" prep idx "$TMP/tiny-img" "$TMP/tiny-lab" --out "$out" > /dev/null || { echo "crew prep failed"; exit 1; }
}

report() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; }
