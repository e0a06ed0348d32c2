"""``import torch`` alone registers ``neuron`` (the ``torch.backends`` entry point), and
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off. Each case runs in a fresh interpreter.

The installed package's metadata may predate the entry point (an editable install is only
re-read when reinstalled), so the mechanism is tested with a throwaway distribution on
``PYTHONPATH`` declaring the same entry point as pyproject.toml; the installed metadata is
checked separately and skipped, with the reason, when it lacks the entry point.
"""
import os
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import neuron_lab

ROOT = Path(neuron_lab.__file__).resolve().parent.parent
PROBE = ("import sys, torch\n"
         "x = torch.ones(3, device='neuron') * 2\n"
         "print(x.device, x.sum().item(), 'neuron_lab' in sys.modules)\n")


def _declared() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["entry-points"]["torch.backends"]["neuron_lab"]


def _run(code: str, *, autoload: str | None, extra_path: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    if autoload is not None:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = autoload
    env["PYTHONPATH"] = os.pathsep.join(
        [str(p) for p in (extra_path, ROOT) if p] + env.get("PYTHONPATH", "").split(os.pathsep))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT))


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """A distribution whose only content is the entry point pyproject.toml declares."""
    root = tmp_path_factory.mktemp("autoload")
    info = root / "neuron_lab_autoload_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: neuron_lab_autoload_probe\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(f"[torch.backends]\nneuron_lab = {_declared()}\n")
    return root


def test_declared_entry_point_is_the_registration_function():
    import importlib
    module, _, attr = _declared().partition(":")
    assert not module.startswith("neuron_lab.")    # outside the package: see test_native_load
    hook = getattr(importlib.import_module(module), attr)
    hook()                        # idempotent in a process that already registered
    neuron_lab._autoload()


def test_import_torch_alone_registers_neuron(dist):
    r = _run(PROBE, autoload=None, extra_path=dist)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["neuron:0", "6.0", "True"]


def test_import_neuron_lab_first_still_works(dist):
    """``import neuron_lab`` imports torch, whose autoload calls the entry point on the
    half-imported package: that must neither fail nor register twice."""
    r = _run("import neuron_lab, torch\n" + PROBE, autoload=None, extra_path=dist)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["neuron:0", "6.0", "True"]


def test_autoload_off_leaves_neuron_unknown(dist):
    r = _run(PROBE, autoload="0", extra_path=dist)
    assert r.returncode != 0
    assert "neuron" in r.stderr and "Expected one of" in r.stderr
    r = _run("import sys, torch; print('neuron_lab' in sys.modules)", autoload="0",
             extra_path=dist)
    assert r.stdout.strip() == "False", r.stderr


def test_installed_metadata_autoloads():
    eps = [e for e in entry_points(group="torch.backends") if e.value == _declared()]
    if not eps:
        pytest.skip("the installed neuron_lab metadata has no torch.backends entry point yet "
                    "(reinstall: pip install -e . --no-deps)")
    r = _run(PROBE, autoload=None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["neuron:0", "6.0", "True"]
