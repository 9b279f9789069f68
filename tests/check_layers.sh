# check_layers.sh — checks every #include of src/ and tools/crew/ against the layer table of
# docs/ARCHITECTURE.md, and that host_alias stays in src/backend and src/comm.
# Usage: bash tests/check_layers.sh [SOURCE_DIR]   (default: the repository holding this script)
# Prints one line per violation and "N passed, N failed" like the other shell tests: each checked
# file is one pass or one failure, and so is the self-test that proves the check catches anything.
set -u
ROOT=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
TMP=$(mktemp -d /tmp/crew-layers-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# check_root DIR: prints the violations under DIR, sorted by file and line, and sets n_checked
# (files checked), n_bad (those that failed) and n_other (other failures: no table, host_alias in
# a file that is not C, such as a Python tool).
check_root() {
  (
    cd "$1" || exit 1
    local files
    mapfile -t files < <(find src -type f \( -name '*.c' -o -name '*.h' \) | sort
                         find tools/crew -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' \) | sort)
    # grep -r, not the awk below, so that a file in any language is covered.
    grep -rnwI host_alias src tools | grep -vE '^src/(backend|comm)/' > "$TMP/alias"
    # Plain POSIX awk: Debian's awk is mawk.
    CLI_FILES=$(ls tools/crew) awk -v counts="$TMP/counts" '
      # "" for the CLI; for src/<folder>/... (any depth) the folder.
      function folder_of(path,  p) { split(path, p, "/"); return p[1] == "tools" ? "" : p[2] }
      BEGIN {
        n = split(ENVIRON["CLI_FILES"], h, "\n"); for (i = 1; i <= n; i++) cli[h[i]] = 1
        for (i = 3; i < ARGC; i++) { checked[ARGV[i]] = 1; n_checked++ }
      }
      # The table: "| folder | a, b |" rows between the markers; "—" (or nothing) means none.
      FILENAME == ARGV[1] {
        if ($0 ~ /<!-- layers:begin -->/) { in_table = 1; next }
        if ($0 ~ /<!-- layers:end -->/) in_table = 0
        if (!in_table || $0 !~ /^\|/) next
        split($0, col, "|"); folder = col[2]; list = col[3]
        gsub(/[ \t]/, "", folder); gsub(/[ \t]/, "", list)
        if (folder == "folder" || folder ~ /^-+$/) next
        if (list == "—" || list == "-") list = ""
        known[folder] = 1; rows++
        n = split(list, a, ","); for (i = 1; i <= n; i++) may[folder, a[i]] = 1
        gsub(/,/, ", ", list)
        rule[folder] = list == "" ? " may include nothing outside itself" : " may include " list " only"
        next
      }
      FILENAME == ARGV[2] {
        f = $0; sub(/:.*/, "", f); bad[f] = 1
        line = $0; sub(/^[^:]*:/, "", line); sub(/:.*/, "", line)
        print f ":" line ": uses host_alias, which only src/backend and src/comm may use"
        next
      }
      FNR == 1 { folder = folder_of(FILENAME) }
      /^[ \t]*#[ \t]*include[ \t]*"/ {
        inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
        if (inc == "crew.h") next
        top = inc; slash = sub(/\/.*/, "", top)
        if (folder == "") {
          # The CLI goes through crew.h alone; -I paths would let "core/..." or "status.h" slip in.
          if (slash || !(inc in cli)) {
            bad[FILENAME] = 1
            print FILENAME ":" FNR ": includes \"" inc "\": the CLI may include only crew.h and its own headers"
          }
        } else if (slash && top != folder && (folder in known) && !((folder, top) in may)) {
          bad[FILENAME] = 1
          print FILENAME ":" FNR ": includes \"" inc "\": " folder rule[folder]
        }
      }
      END {
        # Here rather than per line, so that an empty file counts too.
        for (f in checked) if ((folder = folder_of(f)) != "" && !(folder in known)) {
          bad[f] = 1
          if (!(folder in unknown)) print "src/" folder " is not in the layer table of " ARGV[1]
          unknown[folder] = 1
        }
        if (rows == 0) { print ARGV[1] ": no layer table between <!-- layers:begin --> and <!-- layers:end -->"; n_other++ }
        for (f in bad) if (f in checked) n_bad++; else n_other++
        print n_checked + 0, n_bad + 0, n_other + 0 > counts
      }' docs/ARCHITECTURE.md "$TMP/alias" "${files[@]}"
  ) | sort -t: -k1,1 -k2,2n
  read -r n_checked n_bad n_other < "$TMP/counts" || { n_checked=0 n_bad=0 n_other=1; }
}

# The self-test: a copy with an upward include in core and host_alias in train must fail on both.
self_test() {
  local copy=$TMP/copy core_c train_c
  mkdir -p "$copy/docs" "$copy/tools" && cp -r "$ROOT/src" "$copy/" &&
    cp -r "$ROOT/tools/crew" "$copy/tools/" && cp "$ROOT/docs/ARCHITECTURE.md" "$copy/docs/" || return 1
  core_c=$(cd "$copy" && ls src/core/*.c | head -n 1)
  train_c=$(cd "$copy" && ls src/train/*.c | head -n 1)
  [ -n "$core_c" ] && [ -n "$train_c" ] || return 1
  printf '\n#include "train/train.h"\n' >> "$copy/$core_c"
  printf '\nstatic void *planted(crew_backend b) { return (void *)b.ops->host_alias; }\n' >> "$copy/$train_c"
  rm -f "$TMP/counts"
  check_root "$copy" > "$TMP/self.out"
  grep -qxF "$core_c:$(wc -l < "$copy/$core_c"): includes \"train/train.h\": core may include nothing outside itself" "$TMP/self.out" &&
    grep -qxF "$train_c:$(wc -l < "$copy/$train_c"): uses host_alias, which only src/backend and src/comm may use" "$TMP/self.out"
}

passed=0
failed=0
if self_test; then passed=1; else failed=1; echo "FAIL: self-test: a planted upward include and host_alias use were not both reported" >&2; fi
rm -f "$TMP/counts"
check_root "$ROOT"
passed=$((passed + n_checked - n_bad))
failed=$((failed + n_bad + n_other))
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
