"""The benchmark suite: six peers side by side on the workloads the adaptive runtime must win.

``python -m neuron_lab.bench [--quick] [--json FILE] [--plot FILE.png] [--only W1,W2]``.
Modules: ``harness`` (timing rules, the per-peer driver), ``budget`` (the core budget every
peer runs on: one core pinned, or all cores; CPU seconds of the process and its helpers),
``peers`` (CPU eager, neuron eager,
neuron adaptive, torch.compile, neuron compiled, torch._lazy), one module per workload group
(``micro``: W1, W1T, W2; ``training``: W3, W4, W6; ``notebook``: W5; ``compiling``: W7, the
step time while compiles run), ``models`` (the MLP, tiny
GPT and Transformers Llama),
``report`` (table, JSON, plot). Methodology is written in each module's header; results and
how to reproduce them are in ``docs/benchmarks.md``.
"""
from .compiling import W7
from .micro import W1, W1T, W2
from .notebook import W5
from .training import W3, W4, W6

WORKLOADS = {w.key: w for w in (W1, W1T, W2, W3, W4, W5, W6, W7)}

__all__ = ["WORKLOADS"]
