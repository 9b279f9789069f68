#!/usr/bin/env bash
# The Python package's test suite, as `make test` runs it: a virtual environment in build/venv
# (made once) with python/requirements-test.txt, the package installed into it from this checkout
# by pip (`pip install .`: scikit-build-core builds libcrew.so and the CLI with the project's CMake,
# incrementally in build/python), then pytest on python/tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CREW_VENV:-build/venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" || { echo "crew: $PY -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
fi
stamp="$VENV/.requirements"
if ! cmp -s python/requirements-test.txt "$stamp"; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r python/requirements-test.txt
  cp python/requirements-test.txt "$stamp"
fi
"$VENV/bin/python" -m pip install -q --no-build-isolation -C build-dir=build/python .
cd python/tests
CREW_SOURCE_DIR="$(cd ../.. && pwd)" "../../$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
