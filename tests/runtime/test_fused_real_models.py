"""Regions of real models compile and run fused: each case here made a region of a Transformers
model (the zoo, ``python -m neuron_lab.testing.compat --fused``) fail its compile or its fused
run, so it fell back to per-op for good (results stayed right, the speed was lost).

The KV cache (Llama with grouped-query attention, GPT-2, T5).

``DynamicCache.update`` concatenates an empty cache with the new keys, which arrive transposed
(``k_proj(x).view(B, T, H, D).transpose(1, 2)``). Eager's ``cat`` returns a contiguous tensor;
inductor returned one with the key's strides. The pending tensor had eager's strides, so the next
region's program, compiled with a contiguous example, failed its input guard at a later launch
("expected ... stride 8==96") and the backward region fell back to per-op for good.
``torch.tensor([])`` in the same method is a boundary op: the flush, and the compile it starts,
ran inside the device kernel, where FakeTensorMode refused to start ("you set no_dispatch()").
The cause of the layout: inductor decomposes a ``cat`` of one non-empty tensor into ``clone()``,
which keeps the input's strides; ``compiler.cat_of_one`` writes it as a contiguous clone, and
``fused`` copies any output a program still lays out unlike eager (``layout.misplaced``).
"""
import torch

from neuron_lab import runtime
from neuron_lab.device import tensor_data
from neuron_lab.runtime import knobs, layout
from neuron_lab.runtime.record import OutMeta


def _cache_update(x, w):
    k = torch.tanh((x @ w) * 0.5 + 1.0).view(4, 12, 2, 8).transpose(1, 2)   # strides (192, 8, 16, 1)
    empty = torch.tensor([], device=x.device)   # a boundary op: the flush runs inside its kernel
    return torch.cat([empty, k * 2.0], dim=-2)


def test_fused_outputs_keep_eagers_layout_and_feed_the_next_region():
    g = torch.Generator().manual_seed(0)
    x_cpu, w_cpu = torch.randn(48, 16, generator=g), torch.randn(16, 16, generator=g)
    x, w = x_cpu.to("neuron"), w_cpu.to("neuron")
    ref = _cache_update(x_cpu, w_cpu)
    assert ref.is_contiguous()
    with knobs.TRIALS.scoped(0):
        for _ in range(8):
            c = _cache_update(x, w)
            s = (c * c).sum(-1)                             # a region reading c
            h = tensor_data.host(c)
            assert c.stride() == ref.stride() and h.stride() == ref.stride()
            torch.testing.assert_close(c.cpu(), ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(c.flatten().cpu(), ref.flatten(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(s.cpu(), (ref * ref).sum(-1), rtol=1e-5, atol=1e-5)
    st = runtime.stats()
    assert st["compiles_failed"] == 0, runtime.regions()
    fused = {r["first_ops"][0]: r["fused_launches"] for r in runtime.regions()}
    assert fused["aten::mm"] >= 4 and fused["aten::mul.Tensor"] >= 4, runtime.regions()


def _no_failed_region():
    bad = [r for r in runtime.regions() if r["status"] == "failed"]
    assert not bad, bad
    assert runtime.stats()["launches_fused"] >= 1, runtime.stats()


def test_an_expanded_input_compiles():
    """A region input with stride 0 (BERT's broadcast position/token-type ids, Mistral's
    expanded mask): its compile example is written once per broadcast row."""
    row = torch.linspace(-1, 1, 16)
    x = row.to("neuron").expand(8, 16)
    ref = ((row.expand(8, 16) * 2 + 1).tanh() * 3).sum(1)
    with knobs.TRIALS.scoped(0):
        for _ in range(6):
            torch.testing.assert_close(((x * 2 + 1).tanh() * 3).sum(1).cpu(), ref)
    _no_failed_region()


def test_a_convolutions_backward_compiles():
    """ViT's patch embedding: ``convolution_backward`` returns None for the input's gradient."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 4, stride=4)
    img = torch.randn(2, 3, 16, 16)
    ref = conv(img).square().mean()
    ref.backward()
    dev = torch.nn.Conv2d(3, 8, 4, stride=4).to("neuron")
    dev.load_state_dict(conv.state_dict())
    x = img.to("neuron")
    with knobs.TRIALS.scoped(0):
        for _ in range(5):
            dev.zero_grad()
            loss = dev(x).square().mean()
            loss.backward()
            torch.testing.assert_close(loss.cpu(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dev.weight.grad.cpu(), conv.weight.grad, rtol=1e-4, atol=1e-6)
    _no_failed_region()


def test_a_float32_grouped_mm_compiles():
    """Mixtral's and Qwen2-MoE's experts: ``_grouped_mm``'s meta kernel wants bfloat16, CPU's
    computes float32; the program calls it as an extern kernel (``runtime.extern_ops``)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(12, 8, generator=g), torch.randn(3, 8, 4, generator=g)
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    ref = torch.nn.functional.silu(torch._grouped_mm(a * 0.5, b, offs) + 1).sum(0)
    da, db, do = a.to("neuron"), b.to("neuron"), offs.to("neuron")
    with knobs.TRIALS.scoped(0):
        for _ in range(5):
            out = torch.nn.functional.silu(torch._grouped_mm(da * 0.5, db, do) + 1).sum(0)
            torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    _no_failed_region()


def test_misplaced_finds_outputs_laid_out_unlike_eager():
    contiguous = OutMeta((4, 2, 12, 8), (192, 96, 8, 1), 0, torch.float32)
    keys = torch.empty(4, 12, 2, 8).transpose(1, 2)             # strides (192, 8, 16, 1)
    ones = torch.empty(4, 1, 12, 8)                              # size-1 dim: any stride
    meta_ones = OutMeta((4, 1, 12, 8), (96, 1, 8, 1), 0, torch.float32)
    outputs = ((0, 0), (1, 0), (2, 0))
    metas = [(contiguous,), (meta_ones,), (contiguous,)]
    found = layout.misplaced(outputs, metas, (keys, ones, keys.contiguous()))
    assert found == ((0, contiguous),)


def test_strided_copy_writes_any_layout_eager_makes():
    h = torch.arange(24.).view(2, 3, 4)
    out = layout.strided_copy(h, (2, 3, 4), (1, 8, 2), 5)        # permuted, with an offset
    assert out.stride() == (1, 8, 2) and out.storage_offset() == 5 and torch.equal(out, h)
    row = torch.arange(4.).expand(3, 4)
    out = layout.strided_copy(row, (3, 4), (0, 1), 0)            # broadcast: written once
    assert out.stride() == (0, 1) and torch.equal(out, row)
    assert layout.strided_copy(torch.arange(3.), (3, 2), (1, 1), 0) is None   # overlapping


def test_an_output_a_program_lays_out_otherwise_gets_eagers_layout(monkeypatch):
    """Whatever a program returns, the launch hands out eager's layout: here every 2-d output
    comes back column-major (values unchanged); the launch copies them (``fused.relaid``)."""
    from neuron_lab.runtime import programs

    real = programs.compile_program

    def column_major(gm, examples, *a, **kw):
        program = real(gm, examples, *a, **kw)

        def run(*inputs):
            return tuple(o.t().contiguous().t() if o.dim() == 2 else o for o in program(*inputs))
        return run
    monkeypatch.setattr(programs, "compile_program", column_major)
    x_cpu = torch.linspace(-1, 1, 48).view(6, 8)
    x = x_cpu.to("neuron")
    ref = torch.tanh(x_cpu * 2 + 1) * 3
    with knobs.TRIALS.scoped(0):
        for _ in range(5):
            y = torch.tanh(x * 2 + 1) * 3
            assert tensor_data.host(y).stride() == (8, 1)
            torch.testing.assert_close(y.cpu(), ref)
            torch.testing.assert_close(y.view(-1).cpu(), ref.view(-1))
    _no_failed_region()
    (r,) = [r for r in runtime.current().engine.cache.regions() if r.program is not None]
    assert r.relayout[1] and r.summary()["relaid_outputs"] == len(r.relayout[1]) >= 1
