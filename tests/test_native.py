"""The compiled CPU kernels (sanlab.model.native, csrc/): built, loaded, and equal to their
reference formulas in fp64, on both product paths (portable fp32; AMX tiles where the CPU
has them), for every layout the model hands them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from test_train_loop import TINY

from sanlab.model import kernels, native, norms
from sanlab.model.attention import dispatch, segment_positions
from sanlab.model.attention import explicit as explicit_kernel
from sanlab.model.attention import fused as fused_kernel

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


def _starts(seg: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Each row's first visible key: its document's start, or the window's if later."""
    idx = torch.arange(seg.shape[1])
    first = idx - segment_positions(seg)
    if window is not None:
        first = torch.maximum(first, idx - (window - 1))
    return first.to(torch.int32).contiguous()


def _allowed(seg: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """(B, 1, T, T): key j for query i when both are in one document, j ≤ i, and i − j < window."""
    T = seg.shape[1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    near = (i - j < window) if window is not None else torch.ones(T, T, dtype=torch.bool)
    return ((seg[:, :, None] == seg[:, None, :]) & (j <= i) & near)[:, None]


def _reference(q, k, v, seg, dout, window=None):  # noqa: ANN001, ANN202
    """Output and (dq, dk, dv) in fp64 by autograd through the plain formula with the dense mask."""
    allowed = _allowed(seg, window)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = explicit_kernel.attention_reference(*leaves, allowed).double()
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
    out, out32, lse = fused_kernel.fused_attention(*leaves, _starts(seg), mode)
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
@pytest.mark.parametrize("B,H,Hkv,T,D,window", [
    (2, 4, 2, 37, 32, 1),     # a token sees itself only
    (2, 4, 2, 37, 32, 7),     # windows inside a block, documents shorter and longer
    (1, 4, 1, 300, 64, 40),   # blocks of rows whose first keys move past the block's start
    (1, 2, 1, 300, 32, 129),  # a window that is not a multiple of any panel
    (2, 2, 2, 130, 16, 500),  # a window longer than the row: the document mask alone
])
def test_fused_attention_within_a_window_matches_the_formula(B, H, Hkv, T, D, window, mode):
    """Sliding-window attention on the fused kernel, given as each row's first key
    max(document start, i − window + 1): output and gradients against fp64 autograd through
    `attention_reference` with the windowed mask, documents packed in the rows."""
    torch.manual_seed(T + window)
    seg = _documents(B, T, seed=T + window)
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    dout = torch.randn(B, H, T, D)
    ref, ref_grads = _reference(q, k, v, seg, dout, window)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, _, _ = fused_kernel.fused_attention(*leaves, _starts(seg, window), mode)
    out.backward(dout)
    assert _rel(out, ref) < TOL[mode]
    for got, want in zip((t.grad for t in leaves), ref_grads):  # (window 1: q and k get no gradient)
        assert _rel(got, want) < TOL[mode] if want.norm() > 0 else got.abs().max() < 10 * TOL[mode]
    seg_q, qkv, gq, gk, cos, sin, dy = _qkv_case(B, H, Hkv, T, D, torch.float32, seed=window)
    ref, ref_grads = _qkv_reference(qkv, gq, gk, 1e-6, seg_q, H, Hkv, dy, window)  # the one-op QKV path too
    leaves = [t.clone().requires_grad_() for t in (qkv, gq, gk)]
    y = fused_kernel.qkv_attention(*leaves, cos, sin, _starts(seg_q, window), 1e-6, H, Hkv, mode)[0]
    y.backward(dy)
    assert _rel(y, ref) < TOL[mode]
    for got, want in zip((t.grad for t in leaves), ref_grads):
        assert _rel(got, want) < 2 * TOL[mode] if want.norm() > 0 else got.abs().max() < 10 * TOL[mode]


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
    out = fused_kernel.fused(*leaves, _context(seg, starts=True).row_starts)
    assert out.dtype == torch.bfloat16
    y, raw, _ = fused_kernel.fused_attention(*leaves, _starts(seg), mode)
    assert y.dtype == torch.bfloat16 and torch.equal(y, raw.bfloat16())
    assert _rel(raw, ref) < TOL[mode]
    y.backward(dout)
    for got, want, leaf in zip((t.grad for t in leaves), ref_grads, leaves):
        assert got.dtype == leaf.dtype
        assert _rel(got, want) < (TOL[mode] if leaf.dtype == torch.float32 else 8e-3)  # (dv rounded to bf16)


def _context(seg: torch.Tensor, starts: bool):  # noqa: ANN202
    from sanlab.config import ModelConfig
    from sanlab.model.attention import build_context

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
            out, out32, lse = fused_kernel.fused_attention(*leaves, _starts(seg), mode)
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
        ref = explicit_kernel.attention_reference(q, k, v, ctx.dense_mask)
        torch.testing.assert_close(dispatch.attend(q, k, v, ctx), ref, rtol=1e-5, atol=1e-6)


def test_fused_attention_counts_as_sdpa_in_the_flop_counter():
    from sanlab.accounting import _sdpa_flops, measure_forward_flops

    class Attn(torch.nn.Module):
        def forward(self, x):  # noqa: ANN001, ANN202
            return fused_kernel.fused_attention(x, x[:, :2], x[:, :2], torch.zeros(2, 16, dtype=torch.int32), 1)[0]

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
    assert norms._native_norm_rope_takes(x, gain, c, s)
    y = norms._NativeNormRoPE.apply(x, gain, 1e-6, c, s)
    dy = torch.randn(B, h, T, D).transpose(1, 2)  # the layout attention's gradient arrives in
    y.backward(dy)
    x64, g64 = x.detach().double().requires_grad_(), gain.detach().double().requires_grad_()
    ref = norms.norm_rope_reference(x64, g64, 1e-6, c.double(), s.double())
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
            norms._NativeNormRoPE.apply(x, gain, 1e-6, cos[..., :D // 2], sin[..., :D // 2]).sum().backward()
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
    missing = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, check=True,
                             env={**env, "SANLAB_KERNEL_CACHE": str(tmp_path / "third"), "CC": "/nowhere/cc"})
    assert "torch.Size([1, 8, 64])" in missing.stdout and "CC=/nowhere/cc is not a program" in missing.stdout
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


def _qkv_reference(qkv, gq, gk, eps, seg, H, Hkv, dy, window=None):  # noqa: ANN001, ANN202
    """SoftmaxAttention's path written out in fp64: split, per-head QK-norm then RoPE
    (`norm_rope_reference`, positions restarting per document), attention, heads merged."""
    from sanlab.model.layers import rope_tables

    B, T, W = qkv.shape
    D = W // (H + 2 * Hkv)
    leaves = [t.detach().double().requires_grad_() for t in (qkv, gq, gk)]
    x, g1, g2 = leaves
    cos, sin = rope_tables(segment_positions(seg), D, 10000.0)
    c, s = cos[..., :D // 2].double(), sin[..., :D // 2].double()
    q, k, v = x.split([H * D, Hkv * D, Hkv * D], dim=-1)
    q = norms.norm_rope_reference(q.reshape(B, T, H, D), g1, eps, c, s).transpose(1, 2)
    k = norms.norm_rope_reference(k.reshape(B, T, Hkv, D), g2, eps, c, s).transpose(1, 2)
    y = explicit_kernel.attention_reference(q, k, v.reshape(B, T, Hkv, D).transpose(1, 2),
                                            _allowed(seg, window)).double()
    y = y.transpose(1, 2).reshape(B, T, H * D)
    y.backward(dy.double())
    return y.detach(), [t.grad for t in leaves]


def _qkv_case(B, H, Hkv, T, D, dtype, seed=0):  # noqa: ANN001, ANN202
    from sanlab.model.layers import rope_tables

    g = torch.Generator().manual_seed(seed)
    seg = _documents(B, T, seed=seed + 7)
    qkv = torch.randn(B, T, (H + 2 * Hkv) * D, generator=g).to(dtype)
    gq, gk = 1 + 0.3 * torch.randn(D, generator=g), 1 + 0.3 * torch.randn(D, generator=g)
    cos, sin = rope_tables(segment_positions(seg), D, 10000.0)
    dy = torch.randn(B, T, H * D, generator=g).to(dtype)
    return seg, qkv, gq, gk, cos, sin, dy


QKV_SHAPES = [(2, 4, 2, 37, 32), (2, 8, 4, 150, 32), (1, 4, 1, 70, 64),
              (2, 2, 2, 33, 16),  # D one AVX-512 vector (the demo's heads): the rows' one-vector path
              (2, 4, 2, 45, 8),   # half a vector (the facts axis' heads)
              (1, 2, 1, 20, 4)]   # a quarter: the loops


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,H,Hkv,T,D", QKV_SHAPES)
def test_qkv_attention_matches_norm_rope_then_attention(B, H, Hkv, T, D, mode):
    """`qkv_attention` (QK-norm and RoPE inside the kernel) against the composite formula
    in fp64: the output and the gradients of the QKV product and of both gains."""
    seg, qkv, gq, gk, cos, sin, dy = _qkv_case(B, H, Hkv, T, D, torch.float32, seed=T)
    ref, (dqkv, dgq, dgk) = _qkv_reference(qkv, gq, gk, 1e-6, seg, H, Hkv, dy)
    leaves = [t.clone().requires_grad_() for t in (qkv, gq, gk)]
    y, out, lse, rq, rk = fused_kernel.qkv_attention(leaves[0], leaves[1], leaves[2], cos, sin, _starts(seg), 1e-6, H, Hkv,
                                                mode)
    assert y.shape == (B, T, H * D) and rq.shape == (B, T, H) and rk.shape == (B, T, Hkv)
    y.backward(dy)
    assert _rel(y, ref) < TOL[mode]
    for got, want in zip((t.grad for t in leaves), (dqkv, dgq, dgk)):
        assert _rel(got, want) < 2 * TOL[mode]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("D", [32, 16, 8])
def test_qkv_attention_in_bf16(D, mode):
    """Under autocast the QKV product is bf16: y and dQKV come back in bf16, as close to
    the fp64 formula (on the same bf16 inputs) as their bf16 rounding allows, the gains'
    gradients in fp32 at the kernel's own accuracy."""
    B, H, Hkv, T = 2, 4, 2, 80
    seg, qkv, gq, gk, cos, sin, dy = _qkv_case(B, H, Hkv, T, D, torch.bfloat16, seed=1)
    ref, (dqkv, dgq, dgk) = _qkv_reference(qkv.float(), gq, gk, 1e-6, seg, H, Hkv, dy.float())
    leaves = [t.clone().requires_grad_() for t in (qkv, gq, gk)]
    y, out, *_ = fused_kernel.qkv_attention(*leaves, cos, sin, _starts(seg), 1e-6, H, Hkv, mode)
    y.backward(dy)
    assert y.dtype == leaves[0].grad.dtype == torch.bfloat16
    assert _rel(out.transpose(1, 2).reshape(B, T, H * D), ref) < TOL[mode]
    assert _rel(y, ref) < 4e-3 and _rel(leaves[0].grad, dqkv) < 4e-3  # (bf16: 2⁻⁹ relative a value)
    assert _rel(leaves[1].grad, dgq) < 2 * TOL[mode] and _rel(leaves[2].grad, dgk) < 2 * TOL[mode]


def _zero_fills(fn) -> list[list[int]]:  # noqa: ANN001
    """The shapes of the tensors `fn` fills with a constant (zero gradients autograd makes)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [e.input_shapes[0] for e in prof.events() if e.name == "aten::fill_" and e.input_shapes]


def test_the_kernels_kept_outputs_get_no_zero_gradients():
    """The fused ops' kept outputs (out, lse, 1/RMS) are not differentiated: the backward
    is handed None for them, not a zero tensor autograd allocates and fills every step (the
    fp32 (B, H, T, D) `out` cost ~1 ms a layer of the demo SAN's member-step). A loss on y
    gets its gradients; one that reaches only a kept output gets none."""
    B, H, Hkv, T, D = 2, 4, 2, 40, 16
    seg, qkv, gq, gk, cos, sin, dy = _qkv_case(B, H, Hkv, T, D, torch.bfloat16, seed=3)
    leaves = [t.clone().requires_grad_() for t in (qkv, gq, gk)]
    y, out, lse, rq, rk = fused_kernel.qkv_attention(*leaves, cos, sin, _starts(seg), 1e-6, H, Hkv, 0)
    kept = [list(t.shape) for t in (out, lse, rq, rk)]
    fills = _zero_fills(lambda: y.backward(dy))
    assert not [f for f in fills if f in kept], fills
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in leaves)
    y, out, lse, *_ = fused_kernel.qkv_attention(*leaves, cos, sin, _starts(seg), 1e-6, H, Hkv, 0)
    assert torch.autograd.grad(lse.sum(), leaves, allow_unused=True) == (None, None, None)

    q = torch.randn(B, H, T, D).requires_grad_()
    k, v = (torch.randn(B, Hkv, T, D).requires_grad_() for _ in range(2))
    y, out, lse = fused_kernel.fused_attention(q, k, v, _starts(seg), 1)
    fills = _zero_fills(lambda: y.backward(torch.randn_like(y)))
    assert not [f for f in fills if f in ([list(out.shape), list(lse.shape)])], fills
    assert all(t.grad is not None for t in (q, k, v))
    y, out, lse = fused_kernel.fused_attention(q, k, v, _starts(seg), 1)
    assert torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True) == (None, None, None)


@pytest.mark.parametrize("mode", MODES)
def test_qkv_attention_does_not_depend_on_the_thread_count(mode):
    B, H, Hkv, T, D = 3, 4, 2, 120, 32
    seg, qkv, gq, gk, cos, sin, dy = _qkv_case(B, H, Hkv, T, D, torch.bfloat16, seed=2)
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            leaves = [t.clone().requires_grad_() for t in (qkv, gq, gk)]
            y = fused_kernel.qkv_attention(*leaves, cos, sin, _starts(seg), 1e-6, H, Hkv, mode)[0]
            y.backward(dy)
            results.append([y, *(t.grad for t in leaves)])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_the_model_trains_the_same_with_the_fused_kernels(bf16, monkeypatch):
    """A whole LM (softmax attention with QK-norm, so `qkv_attention`; and the compiled
    norms) against SDPA with the PyTorch kernels (none compiled): loss and every
    parameter's gradient, on packed rows. fp32: to fp32 rounding; bf16 autocast: no
    further from the fp32 result than SDPA's own bf16 run."""
    from sanlab.config import ModelConfig
    from sanlab.model.lm import LM

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96, ffn=True)
    tokens = torch.randint(0, 96, (2, 40))
    seg = torch.tensor([[0] * 15 + [1] * 25, [0] * 40])
    models = {b: LM(cfg.model_copy(update={"attn_backend": b})) for b in ("fused", "sdpa")}
    models["sdpa"].load_state_dict(models["fused"].state_dict())
    for m in models.values():
        with torch.no_grad():
            for name, p in m.named_parameters():
                if p.ndim < 2:
                    p.add_(0.3 * torch.sin(torch.arange(p.numel(), dtype=torch.float32)).reshape(p.shape))

    def run(backend: str, autocast: bool) -> tuple[float, dict[str, torch.Tensor]]:
        model = models[backend]
        model.zero_grad()
        with monkeypatch.context() as m:
            if backend == "sdpa":  # the PyTorch kernels throughout
                m.setattr(native, "available", lambda: False)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(tokens, seg, tokens.roll(-1, 1), torch.ones_like(tokens, dtype=torch.bool), 1e-4)[0]
            loss.backward()
        return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}

    from sanlab.accounting import measure_forward_flops

    # softmax attention takes the one-op path (QK-norm and RoPE inside), not norm_rope + attend
    assert set(measure_forward_flops(models["fused"], tokens, seg).by_op) == {"aten.mm", "sanlab.qkv_attention"}
    ref_loss, ref = run("sdpa", False)
    loss, grads = run("fused", bf16)
    g = torch.cat([grads[n].flatten() for n in sorted(grads)])
    g_ref = torch.cat([ref[n].flatten() for n in sorted(ref)])
    if not bf16:
        assert abs(loss - ref_loss) < 1e-5 and _rel(g, g_ref) < 1e-5
    else:
        sdpa_loss, sdpa = run("sdpa", True)
        g_sdpa = torch.cat([sdpa[n].flatten() for n in sorted(sdpa)])
        assert abs(loss - ref_loss) <= 1.25 * abs(sdpa_loss - ref_loss) + 1e-4
        assert _rel(g, g_ref) <= 1.25 * _rel(g_sdpa, g_ref), (_rel(g, g_ref), _rel(g_sdpa, g_ref))


def test_fp32_runs_keep_fp32_arithmetic_unless_told_otherwise(monkeypatch):
    """As PyTorch's fp32 matmuls: an fp32 computation gets the portable fp32 products
    unless `torch.set_float32_matmul_precision` allows less; a bf16 (autocast) one may use
    the split bf16 products. FUSED_AMX = False or SANLAB_AMX=0 turns those off."""
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert fused_kernel.fused_products(low_precision=False) == 1
        assert fused_kernel.fused_products(low_precision=True) == 0
        torch.set_float32_matmul_precision("high")
        assert fused_kernel.fused_products(low_precision=False) == 0
        monkeypatch.setenv("SANLAB_AMX", "0")
        assert fused_kernel.fused_products(low_precision=True) == 1
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_native_rms_norm_matches_the_formula(out_dtype):
    """The compiled RMS norm (a row width that is not a multiple of the vector: 96 + 5):
    output in the requested dtype, x's and the gain's gradients against fp64 autograd
    through `rms_norm_reference`; from a bf16 gradient as the next matmul hands it over."""
    torch.manual_seed(0)
    x = (3 * torch.randn(4, 37, 101)).requires_grad_()
    w = (0.3 * torch.randn(101)).requires_grad_()
    y = norms.rms_norm(x, 1 + w, 1e-6, out_dtype)
    assert type(y.grad_fn).__name__.startswith("_NativeRMSNorm") and y.dtype == out_dtype
    dy = torch.randn(y.shape).to(out_dtype)
    y.backward(dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = norms.rms_norm_reference(x64, 1 + w64, 1e-6)
    ref.backward(dy.double())
    assert _rel(y, ref) < (1e-6 if out_dtype == torch.float32 else 4e-3)
    assert _rel(x.grad, x64.grad) < 1e-6 and _rel(w.grad, w64.grad) < 1e-6


@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
def test_native_gated_residual_matches_the_formula(h_dtype):
    """x + σ(g)·h with the compiled backward: dx = dy, dh (in h's dtype), and the gate's
    gradient against fp64 autograd through `gated_residual_reference`."""
    torch.manual_seed(0)
    x = torch.randn(3, 29, 70, requires_grad=True)
    h = torch.randn(3, 29, 70).to(h_dtype).requires_grad_()
    g = torch.tensor(0.7, requires_grad=True)
    y = kernels.gated_residual(x, h, g)
    assert "Native" in type(y.grad_fn).__name__ and y.dtype == torch.float32
    dy = torch.randn_like(y)
    y.backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, h, g)]
    ref = kernels.gated_residual_reference(*leaves)
    ref.backward(dy.double())
    assert _rel(y, ref) < 1e-6
    # the compiled forward is the torch formula's addcmul bit for bit (one fused multiply-add)
    assert torch.equal(y, torch.addcmul(x, h, torch.sigmoid(g)))
    assert torch.equal(x.grad, dy) and h.grad.dtype == h_dtype
    assert _rel(h.grad, leaves[1].grad) < (1e-6 if h_dtype == torch.float32 else 4e-3)
    assert _rel(g.grad, leaves[2].grad) < 1e-5


def test_the_kernels_bf16_stores_round_as_torch_does_subnormals_included():
    """A kernel's bf16 output is torch's rounding of the fp32 value bit for bit (nearest
    even, ±inf, and subnormals kept: the AVX512-BF16 conversion reads a
    subnormal as zero, so vectors holding one take the integer rounding). Seen through the
    gated residual's bf16 gradient dh = σ·dy, one multiply in fp32."""
    torch.manual_seed(0)
    x = torch.randn(4, 16, 64, requires_grad=True)
    h = torch.randn(4, 16, 64).bfloat16().requires_grad_()
    g = torch.tensor(0.3, requires_grad=True)
    y = kernels.gated_residual(x, h, g)
    assert "Native" in type(y.grad_fn).__name__
    dy = torch.randn_like(y)
    dy[0] *= 1e-38                               # a whole row block of subnormal products
    dy[1, :, :8] = 3e-39                         # some lanes of a vector subnormal, the rest normal
    dy[2, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    dy[3] *= 1e30                                # near bf16's largest, and past it (rounds to inf)
    y.backward(dy)
    expect = (dy * torch.sigmoid(g.detach())).bfloat16()
    assert h.grad.dtype == torch.bfloat16
    nan = expect.isnan()
    assert torch.equal(h.grad.isnan(), nan) and nan.sum() == 1  # (a NaN's payload is the multiply's)
    got, want = h.grad.view(torch.int16)[~nan], expect.view(torch.int16)[~nan]
    assert torch.equal(got, want), (got != want).sum()
    assert (expect.float().abs() < 1.1754944e-38).logical_and(expect != 0).sum() > 100  # subnormals were stored


@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
def test_native_gated_residual_gives_each_group_its_own_gate(h_dtype):
    """Members: x + σ_m·h over all members in one call, member m's values with its own σ
    (groups of 29·70 values: not a whole number of vectors, so groups start mid-vector and
    a chunk of the threads' split holds several), each equal to addcmul with its σ."""
    torch.manual_seed(1)
    x, h = torch.randn(5, 29, 70), torch.randn(5, 29, 70).to(h_dtype)
    sig = torch.rand(5)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y = kernels.native_gated_residual(x, h, sig)
            for m in range(5):
                assert torch.equal(y[m], torch.addcmul(x[m], h[m], sig[m])), (n, m)
    finally:
        torch.set_num_threads(threads)


# torch's exp in its vector code is SLEEF's u10 with fused multiply-adds on these: there the
# compiled SiLU ⊙ up gives torch's bits (csrc/swiglu.c); elsewhere its formula's rounding
_SLEEF_EXP = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _silu_gate_pair(gu: torch.Tensor, dy: torch.Tensor):  # noqa: ANN202
    """(y, d gate_up) through the compiled kernel and through `_SiLUGate`'s torch formulas."""
    out = []
    for fn in (kernels.silu_gate, kernels._SiLUGate.apply):
        leaf = gu.clone().requires_grad_()
        y = fn(leaf)
        y.backward(dy)
        out.append((y, leaf.grad))
    assert type(out[0][0].grad_fn).__name__ == "_NativeSiLUGateBackward"
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_silu_gate_is_the_torch_formulas(dtype):
    """SiLU(gate) ⊙ up and its backward by the compiled kernel: torch's bits where torch's
    exp is SLEEF's (x86 with AVX2 or AVX-512), for widths with whole vector blocks, with a
    scalar tail (torch's libm expf) and with only a tail; values from small to past exp's
    range (±104); both within the formula's rounding of fp64 autograd everywhere."""
    g = torch.Generator().manual_seed(0)
    for F in (1, 7, 16, 37, 64, 100, 256):
        gu = torch.randn(3, 5, 2 * F, generator=g) * torch.tensor([0.1, 4.0, 40.0])[:, None, None]
        gu.view(-1)[:4] = torch.tensor([120.0, -120.0, 0.0, -0.0])
        gu, dy = gu.to(dtype), torch.randn(3, 5, F, generator=g).to(dtype)
        (y, grad), (y_ref, grad_ref) = _silu_gate_pair(gu, dy)
        assert y.dtype == grad.dtype == dtype
        if _SLEEF_EXP:
            assert torch.equal(y, y_ref), (F, (y != y_ref).sum())
            assert torch.equal(grad, grad_ref), (F, (grad != grad_ref).sum())
        leaf = gu.detach().double().requires_grad_()
        ref = kernels.silu_gate_reference(leaf)
        ref.backward(dy.double())
        tol = 1e-6 if dtype == torch.float32 else 8e-3
        assert _rel(y, ref) < tol and _rel(grad, leaf.grad) < tol, F


def test_native_silu_gate_takes_every_bf16_gate_as_torch_silu():
    """The bf16 path reads SiLU(g), σ(g) and the slope from tables built when the library
    loads: every one of the 65,536 bf16 gates (±inf, NaN, subnormals included) gives
    F.silu's value bit for bit, and its gradients torch's silu_backward of the same gate."""
    if not _SLEEF_EXP:
        pytest.skip("torch's exp is not SLEEF's here")
    gate = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(-1, 256)
    gu = torch.cat([gate, torch.ones_like(gate)], dim=-1)
    dy = torch.full(gate.shape, 0.75, dtype=torch.bfloat16)
    (y, grad), _ = _silu_gate_pair(gu, dy)
    F_silu = torch.nn.functional.silu(gate)
    exact = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(y, F_silu, **exact)
    torch.testing.assert_close(grad[:, :256], torch.ops.aten.silu_backward(dy, gate), **exact)
    torch.testing.assert_close(grad[:, 256:], dy * F_silu, **exact)
    assert y.isnan().sum() == gate.isnan().sum() + 1  # (−inf's too: −inf / (1 + inf))


def test_native_silu_gate_with_a_gradient_of_another_dtype_promotes_as_torch():
    """A gradient in fp32 for bf16 activations takes the torch formulas (their promotion)."""
    gu, dy = torch.randn(4, 2 * 32).bfloat16(), torch.randn(4, 32)
    (y, grad), (y_ref, grad_ref) = _silu_gate_pair(gu, dy)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=0)


def test_native_norms_do_not_depend_on_the_thread_count():
    torch.manual_seed(0)
    x, w = torch.randn(5, 300, 64), torch.randn(64)
    h, g, dy = torch.randn(5, 300, 64).bfloat16(), torch.tensor(0.2), torch.randn(5, 300, 64)
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            leaves = [t.clone().requires_grad_() for t in (x, w, h, g)]
            y = norms.rms_norm(leaves[0], leaves[1], 1e-6, torch.bfloat16)
            (y.float() * dy).sum().backward()
            kernels.gated_residual(leaves[0].detach(), leaves[2], leaves[3]).backward(dy)
            results.append([y, *(t.grad for t in leaves)])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["random", "unit", "cancelling"])
def test_fused_attention_is_at_least_as_accurate_as_sdpa_under_autocast(case, mode):
    """The explicit kernel's precision cases (test_model.py) for the fused kernel: bf16
    inputs under autocast, output and gradients against fp64, each within SDPA's error
    ("cancelling": V one vector plus 1% noise, so dS = P ⊙ (dP − δ) cancels; dQ and dK
    must stay within 5%, where SDPA's are ~30% off)."""
    from test_model import attention_errors_under_autocast

    fused_kernel.FUSED_AMX = mode == 0
    try:
        errs = attention_errors_under_autocast(case, ("fused", "sdpa"))
    finally:
        fused_kernel.FUSED_AMX = True
    fused, sdpa = errs["fused"], errs["sdpa"]
    assert all(e <= 1.25 * s for e, s in zip(fused, sdpa)), (fused, sdpa)
    if case == "cancelling":
        assert fused[1] < 0.05 and fused[2] < 0.05, fused


def test_capturing_the_pattern_leaves_the_fused_model_unchanged():
    """With a pattern hook attached, softmax attention materialises A through the explicit
    kernel instead of `qkv_attention`: the logits agree to fp32 rounding, and the captured
    rows are distributions that never cross a document."""
    from sanlab.config import ModelConfig
    from sanlab.model.hooks import capture
    from sanlab.model.lm import LM

    torch.manual_seed(0)
    model = LM(ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96))
    tokens = torch.randint(0, 96, (2, 30))
    seg = torch.tensor([[0] * 12 + [1] * 18, [0] * 30])
    fused = model(tokens, seg)
    with capture(model, ["blocks.*.attn.pattern"]) as got:
        hooked = model(tokens, seg)
    torch.testing.assert_close(fused, hooked, rtol=1e-5, atol=1e-5)
    pattern = got["blocks.1.attn.pattern"]
    assert pattern.shape == (2, 4, 30, 30)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 4, 30))
    assert pattern[0, :, 12:, :12].abs().max() == 0


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"], ids=["avx2", "sse2"])
def test_the_kernels_built_for_other_x86_cpus(march, tmp_path, monkeypatch):
    """The same sources built for an AVX2 CPU and for plain x86-64 (narrower vectors, other
    panel sizes: a buffer sized for AVX-512's once overflowed only there) and run on this
    one: the portable kernels against fp64 for the shapes that exercise every edge."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 targets")
    target = tmp_path / f"kernels-{march}.so"
    error = native.compile_library(native.compiler(), (f"-march={march}", "-fopenmp"), target)
    assert error is None, error
    monkeypatch.setattr(native, "_lib", native.load(target))
    assert native.library().sanlab_amx_available() == 0  # (no AMX in such a build)
    for shape in [(2, 8, 4, 256, 32), (2, 4, 2, 37, 32), (1, 4, 1, 100, 64), (3, 2, 2, 130, 16), (1, 2, 1, 300, 128)]:
        test_fused_attention_matches_the_formula(*shape, mode=1)
    for shape in QKV_SHAPES:
        test_qkv_attention_matches_norm_rope_then_attention(*shape, mode=1)
    for D in (16, 8):  # (AVX2: 8 floats a vector, so D = 8 and 4 take the one-vector path)
        test_qkv_attention_in_bf16(D, mode=1)
    test_native_norm_rope_matches_the_formula(torch.bfloat16)
    test_native_rms_norm_matches_the_formula(torch.bfloat16)
    test_native_gated_residual_matches_the_formula(torch.bfloat16)
    for dtype in (torch.float32, torch.bfloat16):  # (the exp's fused steps by fmaf on plain x86-64: the same bits)
        test_native_silu_gate_is_the_torch_formulas(dtype)
    test_native_silu_gate_takes_every_bf16_gate_as_torch_silu()


# --------------------------------------------------------------------------- the C interface (csrc/sanlab.h)

_C_TYPES = {"int32_t": "c_int", "int64_t": "c_long", "float": "c_float"}


def _header_structs() -> dict[str, list[tuple[str, str]]]:
    """csrc/sanlab.h's structs, in order: name -> [(field, C type)], a pointer typed "void *"."""
    import re

    text = re.sub(r"/\*.*?\*/", "", native.HEADER.read_text(), flags=re.S)
    structs = {}
    for body, name in re.findall(r"typedef struct \{(.*?)\} (\w+);", text, flags=re.S):
        fields = []
        for line in filter(None, (ln.strip() for ln in body.splitlines())):
            m = re.fullmatch(r"(?:const )?(\w+) (\*?)(\w+);", line)
            assert m, f"sanlab.h: one field a line, `type name;` ({line!r})"
            fields.append((m.group(3), "void *" if m.group(2) else m.group(1)))
        structs[name] = fields
    return structs


def test_the_ctypes_structs_mirror_the_header():
    """native.py's ctypes structs are csrc/sanlab.h's, field by field (names, order, types),
    in the order `sanlab_abi_sizes` reports them; each entry point takes its struct."""
    import ctypes
    import re

    header = _header_structs()
    assert list(header) == ["sanlab_tensor", "sanlab_attn_args", "sanlab_norm_rope_args", "sanlab_rms_norm_args",
                            "sanlab_gated_residual_args", "sanlab_head_ce_args", "sanlab_silu_gate_args"]
    assert len(header) == len(native.STRUCTS)
    for (cname, cfields), struct in zip(header.items(), native.STRUCTS):
        assert [f for f, _ in cfields] == [f for f, _ in struct._fields_], cname
        for (field, ctype), (_, pytype) in zip(cfields, struct._fields_):
            if ctype == "void *":
                assert pytype is ctypes.c_void_p, (cname, field)
            elif ctype == "sanlab_tensor":
                assert pytype is native.Tensor, (cname, field)
            else:
                assert ctypes.sizeof(pytype) == ctypes.sizeof(getattr(ctypes, _C_TYPES[ctype])), (cname, field)
                assert (pytype is ctypes.c_float) == (ctype == "float"), (cname, field)
    text = native.HEADER.read_text()
    for name, struct in native.ENTRY_POINTS.items():
        arg = {s: c for s, c in zip(native.STRUCTS, header)}[struct]
        assert re.search(rf"^int {name}\(const {arg} \*a\);$", text, re.M), name
    assert int(re.search(r"#define SANLAB_ABI_VERSION (\d+)", text).group(1)) == native.ABI_VERSION
    assert "SANLAB_ABI_VERSION" in (native.CSRC / "library.c").read_text()  # the library reports the header's


def test_the_loaded_library_reports_the_interface_and_a_changed_expectation_is_refused(monkeypatch):
    """The library built here matches: version and struct sizes. Expecting another version
    (or other struct sizes) turns the same library into a one-line refusal."""
    lib = native.library()
    assert native.abi_mismatch(lib) is None and lib.sanlab_abi_version() == native.ABI_VERSION
    monkeypatch.setattr(native, "ABI_VERSION", native.ABI_VERSION + 1)
    assert native.abi_mismatch(lib) == f"ABI {native.ABI_VERSION - 1}, expected {native.ABI_VERSION}"
    monkeypatch.undo()

    class Wider(native.ctypes.Structure):
        _fields_ = [*native.Tensor._fields_, ("extra", native.ctypes.c_int64)]

    monkeypatch.setattr(native, "STRUCTS", (Wider, *native.STRUCTS[1:]))
    assert native.abi_mismatch(lib).startswith("struct sizes [40, ")


@pytest.fixture(scope="module")
def other_abi_library(tmp_path_factory):
    """The kernels built from these sources with the header's ABI version plus one."""
    import shutil

    d = tmp_path_factory.mktemp("other-abi")
    csrc = d / "csrc"
    shutil.copytree(native.CSRC, csrc)
    header = csrc / "sanlab.h"
    v = native.ABI_VERSION
    header.write_text(header.read_text().replace(f"#define SANLAB_ABI_VERSION {v}\n", f"#define SANLAB_ABI_VERSION {v + 1}\n"))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(native, "CSRC", csrc)
        target = d / "other.so"
        assert native.compile_library(native.compiler(), native.FLAG_SETS[0], target) is None
    return target


def test_a_library_of_another_abi_version_is_a_one_line_error(other_abi_library, tmp_path):
    """Loading a build of another ABI version, or a library without the interface (an
    older build had no sanlab_abi_sizes), is NativeUnavailable in one line; nothing in it
    is called but its identity."""
    with pytest.raises(native.NativeUnavailable) as e:
        native.load(other_abi_library)
    msg = str(e.value)
    assert "\n" not in msg and f"ABI {native.ABI_VERSION + 1}, expected {native.ABI_VERSION}" in msg
    src = tmp_path / "old.c"
    src.write_text("int sanlab_abi_version(void) { return 2; }\n")
    old = tmp_path / "old.so"
    subprocess.run([native.compiler(), "-shared", "-fPIC", "-o", str(old), str(src)], check=True)
    with pytest.raises(native.NativeUnavailable, match=r"not a build of this interface") as e:
        native.load(old)
    assert "\n" not in str(e.value)


def test_a_stale_cached_build_is_rebuilt_and_one_that_cannot_match_is_refused(other_abi_library, tmp_path,
                                                                            monkeypatch):
    """A cache file under the current key that reports another ABI (copied in from another
    build, say) is compiled again and replaced; the model gets the kernels. Where the
    rebuild cannot match either (these sources against another expectation), the kernels
    are unavailable with a one-line reason, the model falls back, and no file is left over."""
    import shutil

    monkeypatch.setenv("SANLAB_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_error", None)
    target, _ = next(native._candidates(native.compiler()))
    shutil.copy(other_abi_library, target)
    lib = native.library()
    assert lib.sanlab_abi_version() == native.ABI_VERSION and native.abi_mismatch(lib) is None
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # replaced in place
    probe = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).sanlab_abi_version())"
    now = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True, check=True)
    assert int(now.stdout) == native.ABI_VERSION

    # a rebuild that still reports another ABI: refused in one line, the model still runs
    monkeypatch.setenv("SANLAB_KERNEL_CACHE", str(tmp_path / "cache2"))
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_error", None)
    target, _ = next(native._candidates(native.compiler()))
    shutil.copy(other_abi_library, target)
    monkeypatch.setattr(native, "compile_library", lambda cc, flags, out: shutil.copy(other_abi_library, out) and None)
    assert not native.available()
    reason = native.unavailable_reason()
    assert "\n" not in reason and f"ABI {native.ABI_VERSION + 1}, expected {native.ABI_VERSION}" in reason
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # the failed rebuild removed
    from sanlab.config import ModelConfig
    from sanlab.model.lm import LM

    model = LM(ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64))
    assert torch.isfinite(model(torch.zeros(1, 8, dtype=torch.long))).all()


def test_the_cache_key_names_the_instruction_set(monkeypatch):
    """A build for another instruction set (a cache shared with another CPU) has another
    key, so it is never loaded here: the ISA the flags target is part of the key."""
    cc = native.compiler()
    here = [p for p, _ in native._candidates(cc)]
    assert native.isa(cc, native.FLAG_SETS[0])  # (gcc and clang both list their predefined ISA macros)
    monkeypatch.setattr(native, "isa", lambda cc, flags: "__SOME_OTHER_CPU__")
    other = [p for p, _ in native._candidates(cc)]
    assert len(here) == len(other) == len(native.FLAG_SETS) and not set(here) & set(other)


_VEXP_CHECK = r"""
#include "common.h"
#include <stdio.h>

/* the integer-exponent scaling the AVX-512 build replaces with VSCALEFPS */
static inline vf vexp_integer(vf x)
{
    const vi under = x < -87.33654475f;
    const vf magic = vsplat(12582912.0f + 127.0f);
    const vf t = x * 1.44269504088896341f + magic;
    const vf n = t - magic;
    vf r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const vi e = ((vi)t - (vi)vsplat(12582912.0f)) << 23;
    return (vf)((vi)(p * (vf)e) & ~under);
}

int main(void)
{
    long differ = 0, n = 0;
    float xs[VL];
    /* every 13th float in [-104, 88] (where exp leaves fp32's range below and above), then the
       edges (all of them were checked once: the same bits) */
    const float specials[] = {-INFINITY, NAN, -NAN, -87.33654475f, -87.3365f, -87.34f, -0.0f, 0.0f, 88.0f, -103.97f};
    uint32_t u = 0x80000000u;
    for (int done = 0; !done;) {
        for (int i = 0; i < VL; i++) {
            float f;
            memcpy(&f, &u, 4);
            if (f < -104.0f || isnan(f)) { /* past -104 on the negative side: the positive floats up to 88 */
                u = 0u;
                memcpy(&f, &u, 4);
            }
            if (f > 88.0f) { f = specials[i % 10]; done = 1; }
            xs[i] = f;
            u += 13;
        }
        vf x, a, b;
        memcpy(&x, xs, sizeof x);
        a = vexp(x);
        b = vexp_integer(x);
        for (int i = 0; i < VL; i++) {
            uint32_t ua, ub;
            memcpy(&ua, &a[i], 4);
            memcpy(&ub, &b[i], 4);
            differ += ua != ub && !(isnan(a[i]) && isnan(b[i]));
            n++;
        }
    }
    printf("%ld %ld\n", differ, n);
    return 0;
}
"""


def test_the_vector_exp_equals_its_integer_exponent_form(tmp_path):
    """AVX-512 builds scale exp's polynomial by 2^n with VSCALEFPS (its mask zeroing the
    lanes below −87.3, −inf's included), other builds through the integer exponent: the two
    give the same bits for the floats in [−104, 88], NaN and ±0, so the kernels' results
    do not depend on which one a CPU gets."""
    import subprocess

    cc = native.compiler()
    if cc is None:
        pytest.skip("no C compiler on the PATH")
    src, exe = tmp_path / "vexp.c", tmp_path / "vexp"
    src.write_text(_VEXP_CHECK)
    build = subprocess.run([cc, "-O2", "-std=gnu11", "-march=native", f"-I{native.CSRC}", "-o", str(exe), str(src), "-lm"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    differ, n = map(int, subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split())
    assert n > 150_000_000 and differ == 0, (differ, n)
