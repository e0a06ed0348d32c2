"""The OpInfo sweep: PyTorch's op database as the oracle for the ``neuron`` device.

For every op variant (entry) of ``torch.testing._internal.common_methods_invocations.op_db``:
its float32 samples run on CPU and on ``neuron`` (``samples.pairs``), and the neuron run must
agree with the CPU run (``compare``): outputs bitwise in eager mode, observable metadata and
aliasing; gradients against a fixed cotangent where the op supports autograd; the in-place
variant where there is one. An entry passes a column when every sample passes it.

Not counted as passes (``skip`` with the reason): ops whose output is random (they draw from the
host generator, a comparison would test the seed, not the op), ops whose output is uninitialised
memory, and entries without float32 support on CPU or without a sample CPU accepts.

    python -m neuron_lab.testing.opinfo                    # representative subset (what CI runs)
    python -m neuron_lab.testing.opinfo --full --mode both --report docs/opinfo.md \
        --json reports/opinfo.json
    python -m neuron_lab.testing.opinfo --mode adaptive --ops add,mm,cat
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import torch

import neuron_lab

from ..device import tracking
from . import compare, samples
from .compare import Mismatch, first_line

# ~80 entries covering every kind of op the device must handle: elementwise, broadcasting,
# reductions, views and aliasing, indexing, scatter/gather, matmuls, convolutions, pooling,
# norms, losses, sorting, data-dependent shapes, factories, linalg, in-place variants.
SUBSET = frozenset("""
    abs add addcmul addmm amax argmax argsort as_strided atan2 baddbmm bmm cat chunk clamp clone
    contiguous cos cumsum diag_embed diagonal diagonal_scatter div eq exp expand flatten flip
    full gather index_add index_copy index_fill index_put index_select kthvalue layer_norm lerp
    linalg.solve linspace log_softmax logsumexp masked_fill masked_select matmul max maximum mean
    mm mul narrow nn.functional.avg_pool2d nn.functional.batch_norm nn.functional.conv2d
    nn.functional.cross_entropy nn.functional.embedding nn.functional.gelu
    nn.functional.group_norm nn.functional.linear nn.functional.max_pool2d
    nn.functional.mse_loss nn.functional.pad nn.functional.relu nn.functional.silu
    nn.functional.softmax nn.functional.interpolate nonzero permute pow prod repeat reshape
    rsqrt scatter scatter_add select_scatter sigmoid softmax sort split sqrt squeeze stack std
    sub sum t tanh tensor_split topk transpose tril unbind unique unsqueeze var view where
""".split())

RANDOM = frozenset("""
    bernoulli cauchy exponential geometric log_normal multinomial normal uniform rand_like randint
    randint_like randn randn_like pca_lowrank svd_lowrank nn.functional.alpha_dropout
    nn.functional.dropout nn.functional.dropout2d nn.functional.dropout3d
    nn.functional.feature_alpha_dropout nn.functional.fractional_max_pool2d
    nn.functional.fractional_max_pool3d nn.functional.rrelu
""".split())
UNINITIALISED = frozenset("empty empty_like empty_permuted empty_strided new_empty "
                          "new_empty_strided resize_ resize_as_".split())
COLUMNS = ("forward", "backward", "inplace")


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def skip_reason(op, dtype: torch.dtype = torch.float32) -> str:
    if op.name in RANDOM:
        return "random output (runs on the host generator; not compared)"
    if op.name in UNINITIALISED:
        return "uninitialised output"
    if dtype not in op.supported_dtypes("cpu"):
        return f"no {str(dtype).replace('torch.', '')} support on CPU"
    return ""


def _fallbacks() -> dict:
    """{"op (reason)": count} of the host fallbacks so far (dtype rules; RNG ops are skipped)."""
    return {f"{r['op']} ({r['reason']})": r["count"] for r in tracking.fallback_ops()}


def check(op, mode: str = "eager", limit: int | None = None,
          dtype: torch.dtype = torch.float32) -> dict:
    """One op_db entry: {name, forward, backward, inplace (pass|fail|skip), reasons, ...}."""
    res = {"name": entry_name(op), "reason": "", "reasons": {}, "notes": [], "samples": 0,
           "moved": 0, "fallbacks": [], "seconds": 0.0}
    res.update({c: "skip" for c in COLUMNS})
    why = skip_reason(op, dtype)
    if why:
        res["reason"] = why
        return res
    t0 = time.perf_counter()
    grad = bool(op.supports_autograd) and (dtype.is_floating_point or dtype.is_complex)
    exact = mode == "eager"
    inplace = op.inplace_variant
    status = {"forward": "pass", "backward": "pass" if grad else "skip",
              "inplace": "skip"}
    reasons: dict[str, str] = {}

    def note(msg: str) -> None:
        if msg and msg not in res["notes"]:
            res["notes"].append(msg)

    def fail(col: str, msg: str) -> None:
        status[col] = "fail"
        reasons.setdefault(col, msg)

    fallbacks: set = set()
    with neuron_lab.mode(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            pairs = list(samples.pairs(op, dtype, grad, limit))
        except Exception as e:  # noqa: BLE001
            res["reason"] = f"sample generation on CPU: {type(e).__name__}: {first_line(e)}"
            return res
        for cpu_p, dev_p, how in pairs:
            try:
                c = compare.run(op, cpu_p, cpu_p[3], grad)
            except Exception:  # noqa: BLE001 - CPU rejects it: not a valid sample
                continue
            res["samples"] += 1
            if how != "generated":
                res["moved"] += 1
                res.setdefault("moved_why", how)
            rerun = lambda p=cpu_p: compare.run(op, samples.move(p[:3], "cpu") + p[3:], p[3], grad)  # noqa: E731,E501
            before = _fallbacks()
            try:
                d = compare.run(op, dev_p, dev_p[3], grad)
                neuron_lab.sync()
                after = _fallbacks()
                fallbacks.update(k for k in after if after[k] > before.get(k, 0))
                note(compare.agree(c, d, exact, rerun, device=samples.expected_device(dev_p)))
            except Mismatch as e:
                fail("forward", f"mismatch: {e}")
                break
            except Exception as e:  # noqa: BLE001
                fail("forward", f"{type(e).__name__}: {first_line(e)}")
                break
            if grad:
                try:
                    note(compare.agree(c, d, exact, rerun, grads=True))
                except Mismatch as e:
                    fail("backward", str(e))
            if inplace is not None and status["inplace"] != "fail":
                _check_inplace(inplace, cpu_p, dev_p, exact, status, fail)
    if not res["samples"]:
        res["reason"] = "no sample that CPU accepts"
        return res
    if status["forward"] == "fail" and grad:
        status["backward"] = "fail"
        reasons.setdefault("backward", "forward failed")
    res.update(status)
    res["reasons"] = reasons
    res["reason"] = next((reasons[c] for c in COLUMNS if c in reasons), "")
    res["fallbacks"] = sorted(fallbacks)
    res["seconds"] = round(time.perf_counter() - t0, 3)
    return res


def _check_inplace(fn, cpu_p, dev_p, exact: bool, status: dict, fail) -> None:
    try:
        c = compare.run_inplace(fn, cpu_p)
    except Exception:  # noqa: BLE001 - e.g. a broadcasting input CPU refuses in place
        return
    status["inplace"] = "pass"
    try:
        d = compare.run_inplace(fn, dev_p)
        neuron_lab.sync()
        compare.agree(c, d, exact, lambda: compare.run_inplace(fn, samples.move(cpu_p, "cpu")),
                      device=None)
    except Mismatch as e:
        fail("inplace", f"in-place: {e}")
    except Exception as e:  # noqa: BLE001
        fail("inplace", f"in-place: {type(e).__name__}: {first_line(e)}")


def ops(full: bool = False, names=None) -> list:
    from torch.testing._internal.common_methods_invocations import op_db
    if names:
        want = set(names)
        return [o for o in op_db if o.name in want or entry_name(o) in want]
    return [o for o in op_db if full or o.name in SUBSET]


def sweep(full: bool = False, mode: str = "eager", names=None, limit: int | None = None,
          progress=None, dtype: torch.dtype = torch.float32) -> list[dict]:
    from ..runtime import knobs
    out = []
    with knobs.COMPILE.scoped(knobs.COMPILE.get() and mode == "adaptive"):
        for o in ops(full, names):
            out.append(check(o, mode, limit, dtype))
            if progress:
                progress(out[-1])
    return out


def rates(results: list[dict]) -> dict:
    out = {}
    for k in COLUMNS:
        ran = [r for r in results if r[k] != "skip"]
        n = sum(r[k] == "pass" for r in ran)
        out[k] = {"pass": n, "total": len(ran), "rate": n / len(ran) if ran else 0.0}
    out["skipped"] = sum(r["forward"] == "skip" for r in results)
    out["entries"] = len(results)
    return out


def main(argv=None) -> int:
    from . import opinfo_report
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="every entry of op_db (~700; minutes)")
    p.add_argument("--mode", choices=("eager", "adaptive", "both"), default="eager",
                   help="runtime mode (eager: compared bitwise; adaptive: assert_close)")
    p.add_argument("--ops", help="comma-separated op names or entry names (name.variant)")
    p.add_argument("--limit", type=int, help="at most this many samples per entry")
    p.add_argument("--dtype", default="float32",
                   help="sample dtype (float32, the issue's; bfloat16, complex64... find more)")
    p.add_argument("--compile", action="store_true",
                   help="adaptive mode: let the runtime compile fused programs (off by default: "
                        "the sweep checks op semantics; fused programs are tested in tests/runtime)")
    p.add_argument("--report", help="write the markdown report here")
    p.add_argument("--json", help="write per-entry results here ({mode: [...]})")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per entry")
    a = p.parse_args(argv)
    from ..runtime import knobs
    t0 = time.time()
    show = (lambda r: print(f"{r['forward']:4} {r['backward']:4} {r['inplace']:4} "
                            f"{r['name']} {r['reason'][:100]}", flush=True)) if a.verbose else None
    names = a.ops.split(",") if a.ops else None
    by_mode = {}
    with knobs.COMPILE.scoped(a.compile):
        for mode in (("eager", "adaptive") if a.mode == "both" else (a.mode,)):
            t1 = time.time()
            by_mode[mode] = sweep(a.full, mode, names, a.limit, show, getattr(torch, a.dtype))
            print(opinfo_report.summary(by_mode[mode], mode, time.time() - t1), flush=True)
    text = opinfo_report.markdown(by_mode, time.time() - t0, full=a.full, dtype=a.dtype)
    for path, data in ((a.report, text), (a.json, json.dumps(by_mode, indent=1))):
        if path:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                f.write(data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
