#!/usr/bin/env bash
# Run the test suite (the fast, representative default; `scripts/test.sh -m slow` for sweeps).
# Test files run in parallel, one worker per CPU (pytest-xdist; each file stays on one worker, so
# its module fixtures start once); NEURON_LAB_TEST_WORKERS=0 runs everything in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEURON_LAB_VENV:-.venv}
WORKERS=${NEURON_LAB_TEST_WORKERS:-auto}
if [ "$WORKERS" = "0" ]; then
  exec "$VENV/bin/python" -m pytest "$@"
fi
exec "$VENV/bin/python" -m pytest -n "$WORKERS" --dist loadfile "$@"
