"""benchmarks/bench_swiglu.py times like with like: its two sides train the same models on the
same rows, and it tells when their bits differ."""

from __future__ import annotations

import pytest

from sanlab.model import native

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled kernels")

TINY = dict(d=32, layers=2, heads=2, kv_heads=1, vocab=64, seq_len=16, batch=2, docs=2, partners=("iso_param",))


def test_the_benchmark_compares_the_same_models_and_reports_their_bits(load_benchmark, monkeypatch, capsys):
    bs = load_benchmark("bench_swiglu")
    monkeypatch.setitem(bs.bm.SHAPES, "tiny", TINY)
    assert bs.main(["--shapes", "tiny", "--members", "2", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("tiny:")]
    assert [r.split()[1] for r in rows] == ["layer", "iso_param"] and all(r.endswith("same") for r in rows)


def test_a_kernel_that_differs_from_torch_fails_the_benchmark(load_benchmark, monkeypatch, capsys):
    """Where torch's exp is SLEEF's the kernel must give its bits: a kernel off by a factor
    (planted here in the Python wrapper) is reported and exits 1."""
    import torch

    from sanlab.model import kernels

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("torch's exp is not SLEEF's here: the bits may differ")
    bs = load_benchmark("bench_swiglu")
    monkeypatch.setitem(bs.bm.SHAPES, "tiny", TINY)
    native_apply = kernels._NativeSiLUGate.apply
    monkeypatch.setattr(kernels._NativeSiLUGate, "apply", lambda gu: native_apply(gu) * 1.01)
    monkeypatch.setattr(kernels, "silu_gate", lambda gu: native_apply(gu) * 1.01)
    from sanlab.model import members

    model_silu_gate = members.silu_gate
    assert bs.main(["--shapes", "tiny", "--members", "2", "--rounds", "1"]) == 1
    assert "DIFFER" in capsys.readouterr().out
    assert members.silu_gate is model_silu_gate  # (the benchmark leaves the model as it found it)


def test_an_unknown_shape_or_an_empty_count_is_one_line(load_benchmark):
    bs = load_benchmark("bench_swiglu")
    with pytest.raises(SystemExit, match="unknown shape"):
        bs.main(["--shapes", "nope"])
    for bad in (["--rounds", "0"], ["--members", "0"]):
        with pytest.raises(SystemExit, match="must be at least 1"):
            bs.main(["--shapes", "facts", *bad])


def test_without_the_compiled_kernels_it_says_so_and_lets_make_bench_go_on(load_benchmark, monkeypatch, capsys):
    bs = load_benchmark("bench_swiglu")
    monkeypatch.setattr(native, "available", lambda: False)
    monkeypatch.setattr(native, "unavailable_reason", lambda: "no C compiler on the PATH")
    assert bs.main(["--shapes", "demo"]) == 0
    assert "skipped, the compiled kernels are unavailable: no C compiler" in capsys.readouterr().out
