#!/usr/bin/env bash
# Run the test suite (the fast, representative default; `scripts/test.sh -m slow` for sweeps).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEURON_LAB_VENV:-.venv}
exec "$VENV/bin/python" -m pytest "$@"
