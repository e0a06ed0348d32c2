#!/usr/bin/env bash
# Set up a development environment from the repo's own files: a venv in .venv with the pinned
# CPU build of torch, neuron_lab (editable: its C++ extensions and JupyterLab extension built
# here) and test extras, and Debian's chromium for the browser tests. Idempotent; safe to re-run
# (after editing a .cpp, re-running it recompiles only what changed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${NEURON_LAB_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# Pin the CPU build first: an unpinned torch could pull a multi-GB CUDA wheel.
"$VENV/bin/python" -m pip install -q "torch==${NEURON_LAB_TORCH:-2.13.0}"
# `pip install -e .` also builds the JupyterLab side panel (extension/, via hatch-jupyter-builder:
# npm install + `jupyter-builder build`) and installs it into $VENV/share/jupyter/labextensions.
# That needs Node.js >= 20 and npm, at build time only.
if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null) \
      || { echo "setup: could not install nodejs/npm, needed to build extension/" >&2; exit 1; }
  else
    echo "setup: Node.js and npm are needed to build extension/ (the JupyterLab panel)" >&2; exit 1
  fi
fi
# The package build compiles neuron_lab/*/csrc, and inductor's CPU kernels need a C++ compiler.
if ! command -v g++ >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null) \
      || { echo "setup: could not install g++, needed to build neuron_lab/device/csrc" >&2; exit 1; }
  else
    echo "setup: g++ is needed to build neuron_lab/device/csrc" >&2; exit 1
  fi
fi
# Build against the torch installed above (--no-build-isolation): the C++ extensions link against
# libtorch, whose ABI changes between minor releases. The build's own requirements come from
# pyproject.toml's [build-system] (less torch, installed above), plus `editables`, which hatchling
# asks for when it builds an editable install.
"$VENV/bin/python" - <<'PY' > "$VENV/build-requirements.txt"
import tomllib
reqs = tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]
print("\n".join([r for r in reqs if not r.startswith("torch")] + ["editables"]))
PY
"$VENV/bin/python" -m pip install -q -r "$VENV/build-requirements.txt"
"$VENV/bin/python" -m pip install -q --no-build-isolation -e ".[test]"
"$VENV/bin/python" -c "import neuron_lab" \
  || { echo "setup: neuron_lab does not import (see the error above)" >&2; exit 1; }
"$VENV/bin/jupyter" labextension list 2>&1 | grep -q "neuron-lab-panel.*enabled.*OK" \
  || { echo "setup: the neuron-lab-panel JupyterLab extension is not installed" >&2; exit 1; }
if [ "${NEURON_LAB_SKIP_BROWSER:-0}" != "1" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: could not install chromium; browser tests will be skipped" >&2
  else
    echo "setup: chromium not found and not root; browser tests will be skipped" >&2
  fi
fi
echo "setup: done ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
