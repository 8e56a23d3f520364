"""The compiled CPU kernels (sanlab.model.native, csrc/): built, loaded, and equal to their
reference formulas in fp64, on both product paths (portable fp32; AMX tiles where the CPU
has them), for every layout the model hands them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from test_train_loop import TINY

from sanlab.model import kernels, native
from sanlab.model.layers import segment_positions

pytestmark = pytest.mark.skipif(not native.available(), reason=f"compiled kernels: {native.unavailable_reason()}")

MODES = [pytest.param(1, id="portable"),
         pytest.param(0, id="amx", marks=pytest.mark.skipif(not native.available() or not native.library()
                                                             .sanlab_amx_available(), reason="no AMX here"))]
# relative error against fp64, per path: fp32 FMAs (measured 1e-7 to 5e-7) and AMX's split
# bf16 products (measured 4e-6 to 1e-5); bf16 alone would be ~3e-3
TOL = {1: 2e-6, 0: 5e-5}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    b = b.detach()
    return float((a.detach().double() - b).norm() / b.norm())


def _documents(B: int, T: int, seed: int) -> torch.Tensor:
    """(B, T) segment ids: random runs, as packed rows hold them (ids rising along a row)."""
    g = torch.Generator().manual_seed(seed)
    seg = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        if T > 3:
            for c in torch.randint(1, T, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist():
                seg[b, c:] += 1
    return seg


def _starts(seg: torch.Tensor) -> torch.Tensor:
    return (torch.arange(seg.shape[1]) - segment_positions(seg)).to(torch.int32).contiguous()


def _reference(q, k, v, seg, dout):  # noqa: ANN001, ANN202
    """Output and (dq, dk, dv) in fp64 by autograd through the plain formula with the dense mask."""
    T = q.shape[2]
    allowed = ((seg[:, :, None] == seg[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril())[:, None]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = kernels.attention_reference(*leaves, allowed).double()
    out.backward(dout.double())
    return out.detach(), [t.grad for t in leaves]


SHAPES = [  # B, H, Hkv, T, D
    (2, 4, 2, 37, 32),   # T not a multiple of any block
    (2, 8, 4, 256, 32),  # the benchmark's heads and head dim
    (1, 4, 1, 100, 64),  # 4 query heads on one kv head
    (3, 2, 2, 130, 16),  # no GQA, D below a panel
    (2, 4, 2, 64, 48),   # D not a multiple of 32
    (1, 2, 1, 300, 128),
    (1, 2, 1, 1, 8),     # one token
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,H,Hkv,T,D", SHAPES)
def test_fused_attention_matches_the_formula(B, H, Hkv, T, D, mode):
    """Output and all three gradients against fp64 autograd through `attention_reference`,
    with documents packed in the rows and v a strided slice (as the QKV product hands it)."""
    torch.manual_seed(T + D)
    seg = _documents(B, T, seed=T)
    q = torch.randn(B, T, H, D).transpose(1, 2)  # (B, H, T, D) with the heads interleaved in memory
    k = torch.randn(B, Hkv, T, D)
    v = torch.randn(B, T, 3 * Hkv, D)[:, :, Hkv:2 * Hkv].transpose(1, 2)
    dout = torch.randn(B, H, T, D)
    ref, ref_grads = _reference(q, k, v, seg, dout)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, out32, lse = kernels.fused_attention(*leaves, _starts(seg), mode)
    out.backward(dout)
    assert out.dtype == out32.dtype == lse.dtype == torch.float32 and lse.shape == (B, H, T)
    assert out.transpose(1, 2).is_contiguous()  # (B, T, H, D) in memory: merging heads is a view
    assert torch.equal(out, out32)
    assert _rel(out, ref) < TOL[mode]
    for got, want in zip((t.grad for t in leaves), ref_grads):
        if want.norm() > 0:
            assert _rel(got, want) < TOL[mode]
        else:  # T = 1: q and k get no gradient (dP − δ cancels: to rounding on AMX)
            assert got.abs().max() < 10 * TOL[mode]


@pytest.mark.parametrize("mode", MODES)
def test_fused_attention_takes_bf16_inputs_exactly(mode):
    """bf16 v and dout (autocast's) widen exactly: the result equals the fp64 formula on the
    same bf16 values to fp32 accuracy, and the gradients come back in each input's dtype."""
    torch.manual_seed(0)
    B, H, Hkv, T, D = 2, 4, 2, 90, 32
    seg = _documents(B, T, seed=3)
    q, k = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D)
    v, dout = torch.randn(B, Hkv, T, D).bfloat16(), torch.randn(B, H, T, D).bfloat16()
    ref, ref_grads = _reference(q, k, v.float(), seg, dout.float())
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = kernels._fused(*leaves, _context(seg, starts=True))
    assert out.dtype == torch.bfloat16
    y, raw, _ = kernels.fused_attention(*leaves, _starts(seg), mode)
    assert y.dtype == torch.bfloat16 and torch.equal(y, raw.bfloat16())
    assert _rel(raw, ref) < TOL[mode]
    y.backward(dout)
    for got, want, leaf in zip((t.grad for t in leaves), ref_grads, leaves):
        assert got.dtype == leaf.dtype
        assert _rel(got, want) < (TOL[mode] if leaf.dtype == torch.float32 else 8e-3)  # (dv rounded to bf16)


def _context(seg: torch.Tensor, starts: bool):  # noqa: ANN202
    from sanlab.config import ModelConfig
    from sanlab.model.layers import build_context

    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, attn_backend="fused")
    return build_context(cfg, seg, seg)


@pytest.mark.parametrize("mode", MODES)
def test_fused_attention_does_not_depend_on_the_thread_count(mode):
    """Each task writes its own outputs and every sum has a fixed order: one thread and two
    give the same bits (what resume's bit-exactness relies on)."""
    torch.manual_seed(0)
    B, H, Hkv, T, D = 3, 4, 2, 150, 32
    seg = _documents(B, T, seed=5)
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    dout = torch.randn(B, H, T, D)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out, out32, lse = kernels.fused_attention(*leaves, _starts(seg), mode)
            out.backward(dout)
            results.append([out, out32, lse, *(t.grad for t in leaves)])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_attend_routes_to_the_fused_kernel_only_where_its_mask_is_exact():
    """The fused kernel reads each row's document as one interval of keys. Ids that recur
    after another id (possible in a hand-made batch, never in packed rows) are not
    intervals: `row_starts` is None and attend uses the explicit kernel, which agrees with
    the dense mask."""
    torch.manual_seed(0)
    runs = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2]])
    recurring = torch.tensor([[0, 0, 1, 1, 0, 0, 2, 2]])
    assert _context(runs, True).row_starts.tolist() == [[0, 0, 2, 2, 2, 5, 5, 5]]
    assert _context(recurring, True).row_starts is None
    q, k, v = torch.randn(1, 4, 8, 8), torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8)
    for seg in (runs, recurring):
        ctx = _context(seg, True)
        ref = kernels.attention_reference(q, k, v, ctx.dense_mask)
        torch.testing.assert_close(kernels.attend(q, k, v, ctx), ref, rtol=1e-5, atol=1e-6)


def test_fused_attention_counts_as_sdpa_in_the_flop_counter():
    from sanlab.accounting import _sdpa_flops, measure_forward_flops

    class Attn(torch.nn.Module):
        def forward(self, x):  # noqa: ANN001, ANN202
            return kernels.fused_attention(x, x[:, :2], x[:, :2], torch.zeros(2, 16, dtype=torch.int32), 1)[0]

    x = torch.randn(2, 4, 16, 8)
    measured = measure_forward_flops(Attn(), x)
    assert measured.total == _sdpa_flops((2, 4, 16, 8), (2, 2, 16, 8), (2, 2, 16, 8)) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_norm_rope_matches_the_formula(dtype):
    """The compiled QK-norm + RoPE, values and gradients (x and the gain), from a strided
    slice of a QKV product, against fp64 autograd through `norm_rope_reference`; x's
    gradient comes back in x's dtype."""
    from sanlab.model.layers import rope_tables

    torch.manual_seed(0)
    B, T, h, D = 2, 37, 4, 32
    qkv = torch.randn(B, T, 8 * D).to(dtype)
    x = qkv[..., D:5 * D].view(B, T, h, D).detach().requires_grad_()
    gain = (1 + 0.3 * torch.randn(D)).requires_grad_()
    cos, sin = rope_tables(segment_positions(_documents(B, T, seed=1)), D, 10000.0)
    c, s = cos[..., :D // 2], sin[..., :D // 2]
    assert kernels._native_norm_rope_takes(x, gain, c, s)
    y = kernels._NativeNormRoPE.apply(x, gain, 1e-6, c, s)
    dy = torch.randn(B, h, T, D).transpose(1, 2)  # the layout attention's gradient arrives in
    y.backward(dy)
    x64, g64 = x.detach().double().requires_grad_(), gain.detach().double().requires_grad_()
    ref = kernels.norm_rope_reference(x64, g64, 1e-6, c.double(), s.double())
    ref.backward(dy.double())
    assert y.dtype == torch.float32 and y.shape == (B, T, h, D)
    assert _rel(y, ref) < 1e-6
    assert x.grad.dtype == dtype
    assert _rel(x.grad, x64.grad) < (1e-6 if dtype == torch.float32 else 4e-3)  # (bf16: its rounding)
    assert _rel(gain.grad, g64.grad) < 1e-6


def test_native_norm_rope_gain_gradient_does_not_depend_on_the_thread_count():
    from sanlab.model.layers import rope_tables

    torch.manual_seed(0)
    B, T, h, D = 3, 200, 4, 32
    x = torch.randn(B, T, h, D)
    cos, sin = rope_tables(torch.arange(T).expand(B, T), D, 10000.0)
    grads = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            gain = torch.ones(D, requires_grad=True)
            kernels._NativeNormRoPE.apply(x, gain, 1e-6, cos[..., :D // 2], sin[..., :D // 2]).sum().backward()
            grads.append(gain.grad)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(grads[0], grads[1])


def test_the_build_is_cached_and_a_broken_compiler_is_one_line(tmp_path, monkeypatch):
    """A fresh cache dir gets one library per source, compiler and CPU; the next process
    loads it without compiling. A compiler that fails gives NativeUnavailable naming it,
    and auto falls back (the model still runs)."""
    env = {"SANLAB_KERNEL_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    code = ("import torch; from sanlab.model import native; native.library(); "
            "print(sorted(p.name for p in native.cache_dir().iterdir()))")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    built = list((tmp_path / "cache").glob("sanlab-kernels-*.so"))
    assert len(built) == 1 and built[0].name in first.stdout
    mtime = built[0].stat().st_mtime_ns
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert built[0].stat().st_mtime_ns == mtime  # loaded, not rebuilt

    run = ("import torch; from sanlab.model import native; from sanlab.config import ModelConfig; "
           "from sanlab.model.lm import LM; m = LM(ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, "
           "vocab_size=64)); print(m(torch.zeros(1, 8, dtype=torch.long)).shape); print(native.unavailable_reason())")
    broken = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, check=True,
                            env={**env, "SANLAB_KERNEL_CACHE": str(tmp_path / "other"), "CC": "false"})
    assert "torch.Size([1, 8, 64])" in broken.stdout
    assert "could not build the kernels" in broken.stdout and "false" in broken.stdout
    off = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, check=True,
                         env={**env, "SANLAB_NATIVE": "0"})
    assert "turned off by SANLAB_NATIVE=0" in off.stdout


def test_a_fused_request_without_the_kernels_is_a_one_line_error(tmp_path, train_data_dir):
    """`model.attn_backend=fused` where the kernels cannot be built: exit 2, one line."""
    proc = subprocess.run([sys.executable, "-m", "sanlab", "train", "--out", str(tmp_path / "run"),
                           f"data.dir={train_data_dir}", "model.attn_backend=fused", *TINY, "train.steps=2"],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "SANLAB_NATIVE": "0",
                                                               "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "model.attn_backend=fused" in lines[0] and "SANLAB_NATIVE=0" in lines[0], proc.stderr


def test_a_run_records_its_attention_kernel(train_data_dir, tmp_path):
    """meta.json says which attention kernel trained the run (and where its products ran)."""
    import json

    from sanlab.cli import main

    out = tmp_path / "run"
    assert main(["train", f"data.dir={train_data_dir}", *TINY, "train.steps=2", "--out", str(out)]) == 0
    device = json.loads((out / "meta.json").read_text())["device"]
    amx = native.library().sanlab_amx_available() and device["precision"] == "bf16"
    assert device["attention"] == ("fused/amx" if amx else "fused/portable")
