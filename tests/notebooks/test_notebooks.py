"""Every notebook in ``tutorials/`` and ``notebooks/`` runs top to bottom in a real kernel.

Each notebook is executed with nbclient in a fresh ipykernel started from *this* interpreter
(a throwaway kernelspec pointing at ``sys.executable``, so a stray user-level ``python3`` spec
cannot pick another Python). The working directory is the notebook's folder, as in JupyterLab.
A notebook has a wall-clock budget (``BUDGET_S``, default ``DEFAULT_BUDGET_S``); a cell that
raises fails the test with the notebook, the cell's index and its first line.

The tutorials' last cells assert what they teach (fused launches happened, fallbacks went from
non-empty to empty, ...), so a broken runtime fails here even when nothing crashes.

Outputs are stripped in git: ``test_outputs_stripped`` checks it. To strip after editing in
JupyterLab: ``python tests/notebooks/test_notebooks.py --strip tutorials/*.ipynb notebooks/*.ipynb``.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(ROOT.glob("tutorials/*.ipynb")) + sorted(ROOT.glob("notebooks/*.ipynb"))

DEFAULT_BUDGET_S = 150   # a hang guard sized for a busy 2-core machine; typical times in docs/tutorials.md
# Per-notebook wall-clock budgets (seconds), for the ones that need more than the default.
BUDGET_S: dict[str, int] = {
    "notebooks/benchmarks.ipynb": 240,
    "notebooks/eager_vs_adaptive.ipynb": 180,
    "tutorials/05_char_transformer.ipynb": 240,
}
# Notebooks waiting for a feature or a fix elsewhere: name -> reason (xfail, strict=False).
# Remove an entry as soon as what it waits for has landed.
PENDING: dict[str, str] = {}
# Notebooks too slow for the default run (``pytest -m slow``).
SLOW: set[str] = set()
# Extra environment for a notebook's kernel. The benchmark notebook runs the benchmark itself
# when no saved result exists; the default run keeps to three workloads (~1 min), the slow run
# (``test_benchmark_notebook_full``) runs all of ``--quick``.
BENCH_DEFAULT_ARGS = "--quick --only W1,W2,W5"
KERNEL_ENV: dict[str, dict[str, str]] = {
    "notebooks/benchmarks.ipynb": {"NEURON_LAB_BENCH_ARGS": BENCH_DEFAULT_ARGS},
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _params():
    for nb in NOTEBOOKS:
        name = _rel(nb)
        marks = []
        if name in PENDING:
            marks.append(pytest.mark.xfail(reason=PENDING[name], strict=False))
        if name in SLOW:
            marks.append(pytest.mark.slow)
        yield pytest.param(nb, id=name, marks=marks)


@pytest.fixture(scope="session")
def kernel_dir(tmp_path_factory) -> Path:
    """A kernelspec that launches ipykernel with the interpreter running the tests."""
    d = tmp_path_factory.mktemp("kernels")
    spec = d / "neuron-lab-test"
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "neuron_lab test kernel", "language": "python",
    }))
    return d


def test_found_notebooks():
    names = {_rel(p) for p in NOTEBOOKS}
    tutorials = sorted(n for n in names if n.startswith("tutorials/"))
    # numbered 01_, 02_, ... without gaps, at least the first seven (a new one takes the next number)
    assert len(tutorials) >= 7, tutorials
    assert [t.split("/")[1][:3] for t in tutorials] == \
        [f"{i:02d}_" for i in range(1, len(tutorials) + 1)], tutorials
    assert {"notebooks/benchmarks.ipynb", "notebooks/eager_vs_adaptive.ipynb"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_rel)
def test_outputs_stripped(path: Path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, (f"{_rel(path)}: cells {dirty} have outputs or execution counts; strip with "
                       f"`python tests/notebooks/test_notebooks.py --strip {_rel(path)}`")
    nbformat.validate(nb)


def _first_line(src: str) -> str:
    for line in src.splitlines():
        if line.strip():
            return line.strip()[:100]
    return "<empty>"


@pytest.mark.parametrize("path", list(_params()))
def test_notebook_runs(path: Path, kernel_dir: Path):
    run_notebook(path, kernel_dir)


@pytest.mark.slow
def test_benchmark_notebook_full(kernel_dir: Path):
    """The benchmark notebook over every workload of ``--quick`` (several minutes)."""
    run_notebook(ROOT / "notebooks/benchmarks.ipynb", kernel_dir,
                 env={"NEURON_LAB_BENCH_ARGS": "--quick"}, budget=900)


def run_notebook(path: Path, kernel_dir: Path, env: dict | None = None,
                 budget: int | None = None) -> float:
    """Execute ``path`` top to bottom in a fresh kernel; fail naming the cell. Returns seconds."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    name = _rel(path)
    budget = budget or BUDGET_S.get(name, DEFAULT_BUDGET_S)
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name="neuron-lab-test",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]),
                       transport="ipc", ip=str(kernel_dir / f"ipc-{path.stem}"))
    current: dict = {"index": None, "t": None}
    timings: list[tuple[int, float, str]] = []

    def on_start(cell, cell_index):
        current.update(index=cell_index, t=time.perf_counter())

    def on_done(cell, cell_index, **_):
        timings.append((cell_index, time.perf_counter() - current["t"], _first_line(cell.source)))

    client = nbclient.NotebookClient(
        nb, km=km, timeout=budget, startup_timeout=120,
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_start=on_start, on_cell_executed=on_done)
    env = {**os.environ, **KERNEL_ENV.get(name, {}), **(env or {})}
    t0 = time.perf_counter()
    try:
        client.execute(env=env, cleanup_kc=True)   # we own km: shut its kernel down afterwards
    except nbclient.exceptions.CellTimeoutError:
        i = current["index"]
        pytest.fail(f"{name}: cell {i} `{_first_line(nb.cells[i].source)}` exceeded the "
                    f"{budget}s budget", pytrace=False)
    except nbclient.exceptions.CellExecutionError as e:
        i = current["index"]
        src = _first_line(nb.cells[i].source) if i is not None else "?"
        tb = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
        pytest.fail(f"{name}: cell {i} `{src}` raised {e.ename}: {e.evalue}\n"
                    + "\n".join(tb[-25:]), pytrace=False)
    wall = time.perf_counter() - t0
    slowest = sorted(timings, key=lambda t: -t[1])[:3]
    print(f"{name}: {wall:.1f}s; slowest cells: "
          + "; ".join(f"#{i} {s:.1f}s `{src}`" for i, s, src in slowest))
    assert wall <= budget, f"{name}: took {wall:.0f}s, budget {budget}s"
    return wall


def strip(paths: list[str]) -> None:
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                c.outputs, c.execution_count = [], None
            c.metadata.pop("execution", None)
        nbformat.write(nb, p)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--strip"]:
        strip(sys.argv[2:])
    else:
        sys.exit(pytest.main([__file__, *sys.argv[1:]]))
