"""Custom kernels (issue 13, item 1): ``neuron_lab.kernel`` on top of ``torch.library.custom_op``.

The body computes on host buffers; on ``neuron`` the op takes the device's generic kernel, so
it runs at once in eager mode and is an ordinary (opaque) op of a region in adaptive mode, a
node of a fused program when the region compiles; under ``torch.compile`` it is one graph node.
Oracle: the same body on CPU tensors, and ``torch.nn.RMSNorm`` for the fused RMSNorm (float32
tolerance stated at each comparison: the kernel computes the same math in another order).
"""
import sys

import pytest
import torch
from torch import Tensor, nn

import neuron_lab
from neuron_lab.library import FusedRMSNorm, rms_norm
from neuron_lab.runtime import knobs

seen_devices: list = []


@neuron_lab.kernel("nl_test::scale_add", mutates_args=())
def scale_add(x: Tensor, y: Tensor, a: float) -> Tensor:
    seen_devices.append((x.device.type, y.device.type))
    return x * a + y


@scale_add.register_fake
def _(x, y, a):
    return torch.empty_like(x)


@neuron_lab.kernel("nl_test::bump_", mutates_args=("x",))
def bump_(x: Tensor, v: float) -> None:
    x.add_(v)


@bump_.register_fake
def _(x, v):
    return None


@neuron_lab.kernel("nl_test::broken", mutates_args=())
def broken(x: Tensor) -> Tensor:
    if x.shape[0] > 2:
        raise ValueError("rows must be <= 2")          # the line the note must name
    return x.clone()


@neuron_lab.kernel("nl_test::picky", mutates_args=())
def picky(x: Tensor) -> Tensor:
    if bool((x < 0).any()):
        raise ValueError("picky wants non-negative values")
    return x.sqrt()


@torch.library.custom_op("nl_test::cpu_only", mutates_args=(), device_types="cpu")
def cpu_only(x: Tensor) -> Tensor:
    return x.cos()


@cpu_only.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("nl_test::on_device", mutates_args=(), device_types="neuron")
def on_device(x: Tensor) -> Tensor:
    return torch.sin(x) * 2                            # standard: device ops on neuron tensors


def test_body_runs_on_host_buffers_and_equals_cpu(any_mode):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    ref = scale_add(x, y, 3.0)                         # the body on CPU: the reference
    for _ in range(3):                                 # adaptive: captured, then deferred
        seen_devices.clear()
        out = scale_add(x.to("neuron") * 1, y.to("neuron"), 3.0) + 1
        got = out.cpu()
    assert torch.equal(got, ref + 1)
    assert out.device.type == "neuron" and seen_devices == [("cpu", "cpu")]
    assert neuron_lab.executed_ops()["nl_test::scale_add"] == 3
    assert not [r for r in neuron_lab.fallback_ops() if r["op"] == "nl_test::scale_add"]


def test_declared_mutation_is_ordered_like_an_inplace_op(any_mode):
    x = torch.arange(6.0)
    for _ in range(3):
        a = x.to("neuron") * 1
        before = a + 0                                 # queued in adaptive mode: reads old a
        bump_(a, 10.0)
        after = a * 2
        b, c = before.cpu(), after.cpu()
    assert torch.equal(b, x) and torch.equal(c, (x + 10) * 2)


def test_cpu_only_custom_op_is_a_recorded_fallback(any_mode):
    x = torch.randn(8)
    out = cpu_only(x.to("neuron") + 1)                 # the fallback's line
    assert out.device.type == "neuron" and torch.equal(out.cpu(), torch.cos(x + 1))
    row, = [r for r in neuron_lab.fallback_ops() if r["op"] == "nl_test::cpu_only"]
    assert row["reason"].startswith("no neuron kernel") and row["count"] == 1
    assert row["locations"][0].endswith(f"test_custom_kernels.py:{_line_of('the fallback')}")


def test_standard_custom_op_for_neuron_works(any_mode):
    x = torch.randn(3, 3)
    assert torch.allclose(on_device(x.to("neuron")).cpu(), torch.sin(x) * 2, atol=0, rtol=0)


def _line_of(marker: str) -> int:
    src = open(__file__).read().splitlines()
    return next(i for i, line in enumerate(src, 1) if marker in line and "_line_of" not in line)


def test_an_error_names_the_kernel_its_line_and_the_callers_line(any_mode):
    x = torch.ones(3, 2, device="neuron")
    with pytest.raises(ValueError, match="rows must be <= 2") as e:
        broken(x)                                      # the caller's line
        x.cpu()
    notes = "\n".join(getattr(e.value, "__notes__", []))
    assert "custom kernel nl_test::broken" in notes
    assert f"test_custom_kernels.py:{_line_of('the line the note must name')}" in notes
    assert f"test_custom_kernels.py:{_line_of('the caller' + chr(39) + 's line')}" in notes


def test_an_error_in_a_deferred_call_names_the_line_that_issued_it():
    """Adaptive mode defers the learned region [mul, picky, add]; the kernel fails when the region
    runs (at the sync), and the error names the kernel and the line that issued the call."""
    neuron_lab.runtime.reset()
    with knobs.COMPILE.scoped(False), neuron_lab.mode("adaptive"):
        for v in (1.0, 2.0, 3.0, -1.0):
            x = torch.full((4,), v, device="neuron")
            y = picky(x * 1) + 1                       # issues the deferred call
            if v > 0:
                assert torch.equal(y.cpu(), torch.full((4,), v).sqrt() + 1)
        assert neuron_lab.runtime.stats()["ops_deferred"] > 0
        with pytest.raises(ValueError, match="non-negative") as e:
            y.cpu()
    notes = "\n".join(e.value.__notes__)
    assert "custom kernel nl_test::picky" in notes and "deferred" in notes
    assert f"test_custom_kernels.py:{_line_of('issues the deferred call')}" in notes
    neuron_lab.runtime.reset()


def test_opcheck_on_the_device():
    """PyTorch's own checker: schema, fake (meta) implementation, autograd registration and
    AOT dispatch of the RMSNorm kernel, called with neuron tensors."""
    x, w = torch.randn(3, 8, device="neuron"), torch.randn(8, device="neuron")
    res = torch.library.opcheck(torch.ops.neuron_lab.rms_norm_fwd.default, (x, w, 1e-6))
    assert set(res.values()) == {"SUCCESS"}, res


def test_a_compiled_region_runs_the_kernel_as_an_opaque_node():
    """Adaptive mode, compiling: the region [mul, scale_add, bump_, cpu_only, add] becomes one
    fused program that calls the kernels' host bodies between inductor's fused parts."""
    neuron_lab.runtime.reset()
    x, y = torch.randn(16, 16), torch.randn(16, 16)
    ref = cpu_only(scale_add(x * 2, y, 0.5) + 1) + 3
    with knobs.SYNC_COMPILE.scoped(True), knobs.TRIALS.scoped(0), neuron_lab.mode("adaptive"):
        nx, ny = x.to("neuron"), y.to("neuron")
        for _ in range(5):
            z = scale_add(nx * 2, ny, 0.5)
            bump_(z, 1.0)
            out = (cpu_only(z) + 3).cpu()
            assert torch.allclose(out, ref, rtol=1e-6, atol=1e-6)
        stats = neuron_lab.runtime.stats()
        assert stats["launches_fused"] >= 1 and stats["compiles_failed"] == 0, stats
    neuron_lab.runtime.reset()


def test_under_torch_compile_the_kernel_is_one_graph_node():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    x, w = torch.randn(4, 8, device="neuron"), torch.randn(8, device="neuron")
    fn = torch.compile(lambda a, b: rms_norm(a * 2, b, 1e-6) + 1, backend=backend, fullgraph=True)
    out = fn(x, w)
    assert torch.allclose(out.cpu(), rms_norm(x.cpu() * 2, w.cpu(), 1e-6) + 1, rtol=1e-6, atol=1e-6)
    assert graphs and torch.ops.neuron_lab.rms_norm_fwd.default in graphs[0]


# --- a fused RMSNorm with autograd, trained ----------------------------------------------------

class TinyLM(nn.Module):
    def __init__(self, norm: type) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.up = nn.Linear(16, 32)
        self.norm = norm(32, eps=1e-5)
        self.head = nn.Linear(32, 32)

    def forward(self, idx):
        return self.head(torch.nn.functional.gelu(self.norm(self.up(self.emb(idx)))))


def _train(model, device, steps=6, compile_backend=None):
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 32, (4, 9), generator=g) for _ in range(steps)]
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fwd = torch.compile(model, backend=compile_backend) if compile_backend else model
    losses = []
    for batch in data:
        batch = batch.to(device)
        logits = fwd(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 32), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _reference():
    torch.manual_seed(0)
    ref = TinyLM(nn.RMSNorm)
    init = {k: v.clone() for k, v in ref.state_dict().items()}
    return init, _train(ref, "cpu")


@pytest.mark.parametrize("mode,backend", [
    pytest.param("eager", None, id="eager"),
    pytest.param("adaptive", None, id="adaptive"),
    pytest.param("eager", "aot_eager", id="compiled-aot_eager"),
    pytest.param("adaptive", "neuron", id="compiled-neuron"),
])
def test_fused_rmsnorm_trains_like_torch_rmsnorm(mode, backend):
    """A small LM with ``FusedRMSNorm`` on neuron and with ``nn.RMSNorm`` on CPU, same init and
    data, 6 AdamW steps: losses and final weights agree to float32 rounding (rtol 1e-4: the kernel
    sums in another order, and AdamW divides by sqrt(v), which amplifies last-bit differences)."""
    init, (ref_losses, ref_state) = _reference()
    model = TinyLM(FusedRMSNorm)
    model.load_state_dict(init)                         # nn.RMSNorm's state_dict loads as is
    torch._dynamo.reset()
    with knobs.COMPILE.scoped(False), neuron_lab.mode(mode):
        losses, state = _train(model, "neuron", compile_backend=backend)
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    for k, v in ref_state.items():
        assert torch.allclose(state[k], v, rtol=1e-4, atol=1e-5), k
    if backend is None:
        ops = neuron_lab.executed_ops()
        assert ops.get("neuron_lab::rms_norm_fwd", 0) >= 6 and ops.get("neuron_lab::rms_norm_bwd", 0) >= 6


def test_module_checks_its_shape():
    with pytest.raises(ValueError, match="last dimension only"):
        FusedRMSNorm((4, 8))
    with pytest.raises(ValueError, match="does not match the last dimension"):
        rms_norm(torch.ones(2, 4), torch.ones(5))
    assert "eps=1e-05" in repr(FusedRMSNorm(8, eps=1e-5))
