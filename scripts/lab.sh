#!/usr/bin/env bash
# Set up (idempotent) and open JupyterLab with the neuron_lab side panel on the tutorials.
set -euo pipefail
cd "$(dirname "$0")/.."
NEURON_LAB_SKIP_BROWSER=1 bash scripts/setup.sh
VENV=${NEURON_LAB_VENV:-.venv}
ROOT_FLAG=()
[ "$(id -u)" = "0" ] && ROOT_FLAG=(--allow-root)   # containers and VMs often run as root
exec "$VENV/bin/jupyter" lab --notebook-dir=. "${ROOT_FLAG[@]}" tutorials/01_getting_started.ipynb "$@"
