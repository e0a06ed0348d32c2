"""The JupyterLab panel's own tests, run from pytest so one `pytest` covers both test levels.

``npm test`` in extension/ type-checks src/ and test/ and runs the vitest unit tests (comm
model, state, tracker, rendering). Skipped cleanly where Node.js is missing; where it is, a
failing JS test fails here. ``node_modules`` comes from ``pip install -e .`` (the build hook runs
``npm install``); a checkout without it gets one ``npm install`` first.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parents[2] / "extension"
NPM = shutil.which("npm")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

needs_node = pytest.mark.skipif(NPM is None or shutil.which("node") is None,
                                reason="Node.js/npm not installed")


@needs_node
def test_extension_unit_tests_pass():
    if not (EXT / "node_modules" / ".bin" / "vitest").exists():
        subprocess.run([NPM, "install", "--no-audit", "--no-fund"], cwd=EXT, check=True,
                       capture_output=True, timeout=600)
    out = subprocess.run([NPM, "test", "--", "--reporter=dot"], cwd=EXT, capture_output=True,
                         text=True, timeout=600, env={**_env(), "CI": "true", "FORCE_COLOR": "0"})
    text = ANSI.sub("", out.stdout + out.stderr)
    assert out.returncode == 0, text[-6000:]
    m = re.search(r"Tests\s+(\d+) passed", text)
    assert m and int(m.group(1)) >= 30, text[-3000:]


def test_labextension_is_installed_and_enabled():
    """What `pip install -e .` must leave behind: `jupyter labextension list` says enabled, OK."""
    out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                         capture_output=True, text=True, timeout=120)
    lines = [ANSI.sub("", line) for line in (out.stdout + out.stderr).splitlines()]
    ours = [line for line in lines if "neuron-lab-panel" in line]
    assert ours, "\n".join(lines)
    assert "enabled" in ours[0] and "OK" in ours[0] and "(python, neuron_lab)" in ours[0], ours


def _env() -> dict:
    import os
    # the npm scripts call `jupyter-builder`/`tsc` from this interpreter's environment first
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
