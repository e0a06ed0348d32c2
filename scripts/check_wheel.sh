#!/usr/bin/env bash
# Check the wheel as a user gets it: build it (`pip wheel .`, an isolated build that compiles the
# C++ against the torch pinned in pyproject.toml), install it into a fresh virtual environment
# beside the pinned CPU torch, then, with no C++ compiler on PATH, import it, use the device and
# run the first tutorial. Nothing may be compiled after the install. Usage:
#   bash scripts/check_wheel.sh [WHEEL]     # WHEEL: an already built one (skips `pip wheel`)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
WHEEL=${1:-}
if [ -z "$WHEEL" ]; then
  t0=$SECONDS
  "$PY" -m pip wheel -q --no-deps -w "$WORK/dist" .
  WHEEL=$(ls "$WORK"/dist/neuron_lab-*.whl)
  echo "check_wheel: built $(basename "$WHEEL") in $((SECONDS - t0)) s"
fi
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/python" -m pip install -q "torch==${NEURON_LAB_TORCH:-2.13.0}"
"$V/python" -m pip install -q "$WHEEL" nbclient nbformat
# PATH without a compiler: only the venv's own scripts (python, jupyter) and a few base tools
mkdir "$WORK/bin" "$WORK/home"
for tool in env cat ls rm mkdir find sh; do ln -s "$(command -v $tool)" "$WORK/bin/$tool"; done
export PATH="$V:$WORK/bin"
for cc in g++ gcc c++ cc clang++; do
  if command -v "$cc" >/dev/null 2>&1; then echo "check_wheel: $cc is still on PATH" >&2; exit 1; fi
done
export HOME="$WORK/home"
python - <<'PY'
import importlib.metadata as md
import os
import torch                                  # autoloads neuron_lab
import neuron_lab
from neuron_lab.device import native
x = torch.randn(64, 64, device="neuron")
y = (x @ x).relu().sum()
assert y.device.type == "neuron" and torch.isfinite(y.cpu())
assert native.build_info()["torch"] == torch.__version__
files = [str(f) for f in md.files("neuron_lab") if f.suffix in (".cpp", ".h")]
assert not files, f"the wheel ships C++ sources: {files}"
sos = sorted(str(f) for f in md.files("neuron_lab") if f.suffix == ".so")
print("check_wheel: import and the device work;", ", ".join(sos))
PY
python - tutorials/01_getting_started.ipynb <<'PY'
import sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3").execute()
print(f"check_wheel: {sys.argv[1]} ran ({len(nb.cells)} cells)")
PY
if [ -n "$(find "$HOME" -name '*.so' 2>/dev/null)" ]; then
  echo "check_wheel: something was compiled under HOME:" >&2; find "$HOME" -name '*.so' >&2; exit 1
fi
echo "check_wheel: ok"
