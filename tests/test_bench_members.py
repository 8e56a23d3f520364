"""benchmarks/bench_members.py times like with like: its members and its solo runs are the
same runs (same init, data, LRs and clip), so one step leaves them with the same weights."""

from __future__ import annotations

import pytest
import torch

from sanlab.errors import ConfigError


def test_members_and_solo_steppers_train_the_same_runs(load_benchmark, monkeypatch):
    bm = load_benchmark("bench_members")
    monkeypatch.setitem(bm.SHAPES, "tiny", dict(d=32, layers=2, heads=2, kv_heads=1, vocab=64, seq_len=16, batch=2,
                                                docs=2, ffn=True, partners=()))
    cfg = bm.arm_configs("tiny")["standard"]
    solo, members = bm.Solo(cfg, "tiny", 3, False), bm.Members(cfg, "tiny", 3, False)
    solo.step()
    members.step()
    for m, (model, _) in enumerate(solo.runs):
        for n, p in model.named_parameters():
            assert torch.equal(members.model.by_name[n][m], p.detach()), (m, n)


def test_the_partner_rows_are_the_partners(load_benchmark):
    """Each partner arm's row times that arm's matched config (the demo's: SAN 5L d64 against
    iso-param 1 standard layer, iso-FLOP 2, iso-depth 5), not the reference's or a neighbour's."""
    bm = load_benchmark("bench_members")
    arms = bm.arm_configs("demo")
    assert {a: (c.n_layers, c.state_mixer) for a, c in arms.items()} == {
        "san": (5, "none"), "iso_param": (1, "swiglu"), "iso_flop": (2, "swiglu"), "iso_depth": (5, "swiglu")}


def test_a_failed_timing_process_ends_the_benchmark_instead_of_hanging():
    """A child that dies (here: a shape it does not know) would leave its partner waiting at
    the start barrier and the parent at the queue forever; the parent notices and exits. Run
    in its own process with a deadline, so a hang fails the test instead of hanging it."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    code = ("import bench_members as bm; job = dict(shape='no-such-shape', arm='san', bf16=False, steps=1, M=1, "
            "threads=1, kinds=['solo']); bm.run_job([job, dict(job)])")
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=bench, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError("run_job still waiting 90 s after its timing processes failed") from None
    assert r.returncode == 1
    assert "bench_members: a timing process ended without its result (exit code 1)" in r.stderr


def test_member_counts_are_checked_before_anything_runs(load_benchmark):
    import pytest

    bm = load_benchmark("bench_members")
    assert bm.member_counts("1,2,16") == [1, 2, 16]
    assert bm.member_counts("0") == []
    for bad in ("-2", "two", "4,-1", "1.5"):
        with pytest.raises(ConfigError, match="argument --members: .* member counts are integers >= 1"):
            bm.main(["--members", bad])


def test_the_device_mode_times_solo_against_members_in_one_process(load_benchmark, monkeypatch, capsys):
    """`--device` (a GPU's comparison; `cpu` its dry run): one row per mode and member count,
    `solo` the reference (1.00x), each the same runs as the steppers above."""
    bm = load_benchmark("bench_members")
    monkeypatch.setitem(bm.SHAPES, "tiny", dict(d=32, layers=2, heads=2, kv_heads=1, vocab=64, seq_len=16, batch=2,
                                                docs=2, partners=()))
    peaks = []  # the peak's precision is the run's (in bf16 an AVX2 CPU's peak is emulated: ~90x "% peak")
    monkeypatch.setattr(bm, "matmul_peak", lambda threads, precision="bf16": peaks.append(precision) or 1e12)
    assert bm.main(["--device", "cpu", "--shapes", "tiny", "--members", "1,3", "--steps", "2", "--warmup", "1",
                    "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert peaks == ["fp32"] and "; fp32 matmul peak 1.00 TFLOP/s" in out.splitlines()[0]
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["3"])]
    assert [(r[0], r[1]) for r in rows] == [("1", "solo"), ("1", "members"), ("3", "solo"), ("3", "members")]
    for r in rows:
        total, per = (float(x.replace(",", "")) for x in r[2:4])
        assert total > 0 and per == pytest.approx(total / int(r[0]), rel=1e-3, abs=1)
        if r[1] == "solo":
            assert r[4] == "1.00x"


def test_device_mode_without_cuda_says_so(load_benchmark):
    bm = load_benchmark("bench_members")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="--device cuda: no CUDA device"):
        bm.main(["--device", "cuda"])


def test_the_scaling_figure_draws_what_was_measured(load_benchmark, monkeypatch, tmp_path, capsys):
    """--figure: tokens/s against M per mode, and each mode over the runner, from the same
    numbers the table prints (measure stubbed: the drawing is what is tested here)."""
    bm = load_benchmark("bench_members")
    fake = {1: {"solo": 100.0, "members": 90.0, "runner": 100.0},
            2: {"solo": 100.0, "runner": 160.0, "members": 120.0, "members x2": 200.0},
            4: {"solo": 100.0, "runner": 180.0, "members": 150.0, "members x2": 270.0}}
    monkeypatch.setattr(bm, "run_peak", lambda precision="bf16": 1e12)
    monkeypatch.setattr(bm, "measure", lambda shape, arm, M, a: {k: {"tps": v, "rss": 1.0} for k, v in fake[M].items()})
    drawn = {}
    real = bm.draw_scaling
    monkeypatch.setattr(bm, "draw_scaling", lambda results, path: drawn.setdefault("fig", real(results, path)))
    monkeypatch.chdir(tmp_path)
    assert bm.main(["--shapes", "facts", "--members", "1,2,4", "--partner-members", "0", "--figure", "s.png"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "s.png" and (tmp_path / "s.png").stat().st_size > 10_000
    top, bottom = drawn["fig"].axes  # one panel: tokens/s above, the ratios below
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in top.lines}
    assert lines["members x2"] == ([2, 4], [200.0, 270.0]) and lines["runner"] == ([1, 2, 4], [100.0, 160.0, 180.0])
    ratios = {ln.get_label(): list(ln.get_ydata()) for ln in bottom.lines}
    assert ratios["members"] == pytest.approx([0.9, 0.75, 150 / 180])
    assert ratios["the 3× target"] == [3.0, 3.0]


def test_bad_device_or_figure_is_refused_before_any_timing(load_benchmark, monkeypatch):
    bm = load_benchmark("bench_members")
    monkeypatch.setattr(bm, "run_peak", lambda *_: (_ for _ in ()).throw(AssertionError("timed")))
    with pytest.raises(ConfigError, match="--device: expected cpu, cuda or cuda:N, got 'tpu'"):
        bm.main(["--device", "tpu"])
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        bm.main(["--figure", f"{__file__}/s.png"])
    with pytest.raises(ConfigError, match="--figure .: is a directory, not a file"):
        bm.main(["--figure", "."])
    with pytest.raises(ConfigError, match="over the .* bytes this filesystem allows"):
        bm.main(["--figure", "x" * 300 + ".png"])
    with pytest.raises(ConfigError, match="not --device's"):
        bm.main(["--figure", "s.png", "--device", "cpu"])
    with pytest.raises(ConfigError, match="two or more member counts"):
        bm.main(["--figure", "s.png", "--members", "8", "--partner-members", "8"])
    with pytest.raises(ConfigError, match="--shapes: unknown shape 'nope'"):  # before the known ones are timed
        bm.main(["--shapes", "demo,nope"])
