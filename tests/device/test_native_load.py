"""A neuron_lab whose compiled extension cannot load never breaks ``import torch``: the autoload
hook warns once, naming the cause and the fix, and ``import torch`` goes on without ``neuron``;
``import neuron_lab`` raises an ImportError saying the same. Each case runs a fresh interpreter
on a copy of the package made broken in one way (built for another torch, or never built).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import neuron_lab
from neuron_lab.device import native

ROOT = Path(neuron_lab.__file__).resolve().parent.parent
AUTOLOAD = "import warnings, torch\nprint('torch ok', hasattr(torch, 'neuron'))\n"


def _copy(tmp: Path) -> Path:
    """The package and its autoload module, laid out as installed, under ``tmp``."""
    shutil.copytree(ROOT / "neuron_lab", tmp / "neuron_lab",
                    ignore=shutil.ignore_patterns("__pycache__", "csrc", "labextension"))
    shutil.copy(ROOT / "_neuron_lab_autoload.py", tmp)
    info = tmp / "neuron_lab-0.dist-info"          # declares the same entry point
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: neuron_lab\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[torch.backends]\nneuron_lab = _neuron_lab_autoload:autoload\n")
    return tmp


def _run(code: str, path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["PYTHONPATH"] = str(path)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=180, cwd=str(path))


def _broken_for_another_torch(pkg: Path) -> None:
    info = json.loads((pkg / "neuron_lab" / "_native_build.json").read_text())
    info["torch"] = "2.9.0"
    (pkg / "neuron_lab" / "_native_build.json").write_text(json.dumps(info))


def _never_built(pkg: Path) -> None:
    for so in (pkg / "neuron_lab").rglob("*.so"):
        so.unlink()


@pytest.mark.parametrize("breakage,cause", [
    (_broken_for_another_torch, "was built for torch 2.9.0"),
    (_never_built, "cannot be loaded"),
])
def test_import_torch_survives_a_broken_native_library(tmp_path, breakage, cause):
    pkg = _copy(tmp_path)
    breakage(pkg)
    r = _run(AUTOLOAD, pkg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "torch ok False"
    warnings = [line for line in r.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1, r.stderr
    assert cause in warnings[0] and "pip install --no-build-isolation" in warnings[0]

    r = _run("import neuron_lab", pkg)
    assert r.returncode == 1
    assert "NativeLibraryError" in r.stderr and cause in r.stderr, r.stderr
    assert "pip install --no-build-isolation" in r.stderr


def test_a_working_copy_loads(tmp_path):
    """The copy itself is sound: unbroken, it autoloads the device."""
    pkg = _copy(tmp_path)
    r = _run("import torch; print((torch.ones(2, device='neuron') * 3).sum().item())", pkg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "6.0"


def test_the_build_records_this_torch():
    import torch
    info = native.build_info()
    assert info is not None and info["torch"] == torch.__version__
    assert info["modules"] == [native.DEVICE_MODULE, "neuron_lab.runtime._runtime_ext"]
