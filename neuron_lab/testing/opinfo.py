"""The OpInfo sweep: PyTorch's op database as the oracle for the ``neuron`` device.

For every op variant in ``torch.testing._internal.common_methods_invocations.op_db``: its float32
sample inputs run on CPU and on ``neuron`` (in ``eager`` or ``adaptive`` mode), outputs compared
with ``torch.testing.assert_close`` (exact in eager mode: same host kernels); where the op
supports autograd, the gradients of a sum of the float outputs are compared too. Ops whose
outputs are random are skipped with that reason (not counted as passes).

    python -m neuron_lab.testing.opinfo            # representative subset (what CI runs)
    python -m neuron_lab.testing.opinfo --full --report docs/opinfo.md --json opinfo.json
"""
from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

import neuron_lab

SUBSET = (
    "abs add addmm amax argmax atan2 baddbmm bmm cat clamp cos cumsum div exp expand flip "
    "gather gelu index_select layer_norm le lerp log_softmax logsumexp masked_fill matmul max "
    "mean mm mul nn.functional.conv2d nn.functional.cross_entropy nn.functional.embedding "
    "nn.functional.linear nn.functional.relu nn.functional.silu nn.functional.softmax "
    "nn.functional.mse_loss nn.functional.max_pool2d nn.functional.pad permute pow prod "
    "reciprocal repeat reshape rsqrt scatter_add sigmoid sin softmax sort split sqrt squeeze "
    "stack std sub sum t tanh topk transpose tril unsqueeze var view where"
).split()
MAX_SAMPLES = 4


def _to(x, dev):
    return tree_map(lambda t: t.detach().to(dev).requires_grad_(t.requires_grad)
                    if isinstance(t, torch.Tensor) else t, x)


def _run(op, sample, dev, grad):
    inp, args, kw = _to((sample.input, sample.args, sample.kwargs), dev)
    out = op(inp, *args, **kw)
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    grads = []
    if grad:
        leaves = [t for t in tree_flatten((inp, args, kw))[0]
                  if isinstance(t, torch.Tensor) and t.requires_grad]
        diff = [t for t in outs if t.requires_grad and t.is_floating_point()]
        if leaves and diff:
            g = torch.autograd.grad(sum(t.sum() for t in diff), leaves, allow_unused=True)
            grads = [x for x in g if x is not None]
    neuron_lab.sync()
    return [t.detach().cpu() for t in outs], [t.cpu() for t in grads]


def _compare(expected: list, got: list, exact: bool) -> str:
    """'' if ``got`` matches ``expected`` (bitwise when ``exact``), else the first reason."""
    try:
        for a, b in zip(expected, got, strict=True):
            torch.testing.assert_close(b, a, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6,
                                       equal_nan=True)
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0][:160]
    return ""


def check(op, mode: str = "eager") -> dict:
    """One op variant: {'name', 'forward': pass|fail|skip, 'backward': ..., 'reason'}."""
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    res = {"name": name, "forward": "skip", "backward": "skip", "reason": ""}
    if torch.float32 not in op.supported_dtypes("cpu"):
        res["reason"] = "no float32 support on CPU"
        return res
    if getattr(op, "is_factory_function", False) or "rand" in op.name or "dropout" in op.name \
            or op.name in ("bernoulli", "multinomial", "normal", "uniform", "empty",
                           "empty_like", "new_empty", "empty_strided"):
        res["reason"] = "random or uninitialised output"
        return res
    grad = bool(op.supports_autograd)
    exact = mode == "eager"
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=grad))[:MAX_SAMPLES]
    except Exception as e:  # noqa: BLE001
        res["reason"] = f"sample generation: {type(e).__name__}"
        return res
    fwd_ok = bwd_ok = True
    with neuron_lab.mode(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in samples:
            try:
                c_out, c_grad = _run(op, s, "cpu", grad)
            except Exception:  # noqa: BLE001 - the CPU reference itself rejects this sample
                continue
            try:
                n_out, n_grad = _run(op, s, "neuron", grad)
            except Exception as e:  # noqa: BLE001
                fwd_ok, res["reason"] = False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                break
            why = _compare(c_out, n_out, exact)
            if why:
                fwd_ok, res["reason"] = False, f"mismatch: {why}"
                break
            why = _compare(c_grad, n_grad, exact)
            if why:
                bwd_ok = False
                res["reason"] = res["reason"] or f"grad: {why}"
    res["forward"] = "pass" if fwd_ok else "fail"
    res["backward"] = ("pass" if bwd_ok and fwd_ok else "fail") if grad else "skip"
    return res


def ops(full: bool):
    from torch.testing._internal.common_methods_invocations import op_db
    return [o for o in op_db if full or o.name in SUBSET]


def sweep(full: bool = False, mode: str = "eager") -> list[dict]:
    return [check(o, mode) for o in ops(full)]


def rates(results: list[dict]) -> dict:
    out = {}
    for k in ("forward", "backward"):
        ran = [r for r in results if r[k] != "skip"]
        out[k] = {"pass": sum(r[k] == "pass" for r in ran), "total": len(ran),
                  "rate": sum(r[k] == "pass" for r in ran) / len(ran) if ran else 0.0}
    return out


def report(results: list[dict], mode: str, seconds: float) -> str:
    r = rates(results)
    lines = [f"# OpInfo sweep ({mode} mode, float32, torch {torch.__version__})", "",
             f"- forward: {r['forward']['pass']}/{r['forward']['total']} op variants pass "
             f"({r['forward']['rate']:.1%})",
             f"- backward: {r['backward']['pass']}/{r['backward']['total']} "
             f"({r['backward']['rate']:.1%})",
             f"- skipped: {sum(x['forward'] == 'skip' for x in results)}; {seconds:.0f} s", "",
             "Full sweep: `python -m neuron_lab.testing.opinfo --full --report docs/opinfo.md`; "
             "the test suite runs the representative subset (`neuron_lab.testing.opinfo.SUBSET`).",
             "", "## Failures", "", "| op | forward | backward | reason |", "|---|---|---|---|"]
    lines += [f"| {x['name']} | {x['forward']} | {x['backward']} | {x['reason'].replace('|', '/')} |"
              for x in results if "fail" in (x["forward"], x["backward"])]
    lines += ["", "## Skipped", ""] + [f"- {x['name']}: {x['reason']}" for x in results
                                        if x["forward"] == "skip"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="every op in op_db (slow)")
    p.add_argument("--mode", choices=("eager", "adaptive"), default="eager")
    p.add_argument("--report", help="write a markdown report here")
    p.add_argument("--json", help="write per-op results here")
    a = p.parse_args(argv)
    t0 = time.time()
    results = sweep(a.full, a.mode)
    text = report(results, a.mode, time.time() - t0)
    if a.report:
        open(a.report, "w").write(text)
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)
    print(text.split("## Failures")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
