"""Members: runs trained as one batched model equal their solo runs, stay apart when one
diverges, and resume exactly after SIGKILL / stop with exit 4 on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from sanlab.config import Config, load_config
from sanlab.errors import EXIT_INTERRUPTED, ConfigError
from sanlab.model.members import bmm_linear, build_members
from sanlab.train import members as members_mod
from sanlab.train.members import TOLERANCE, newton_schulz, train_members
from sanlab.train.optim import Muon
from sanlab.train.trainer import train
from test_train_loop import metrics

# d32, 2 layers, 8 steps of 8 rows of 32 tokens: about a second a group
SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1", "model.vocab_size=320",
         "data.seq_len=32", "train.batch_rows=8", "train.eval_rows=16", "train.log_every=1000", "train.steps=8",
         "train.eval_every=4", "train.threads=1"]
# A sweep of LRs and two seeds; the third member also runs its own WSD schedule.
POINTS = [["optim.lr=0.01", "train.seed=1"], ["optim.lr=0.04", "train.seed=2"],
          ["optim.lr=0.02", "train.seed=1", "optim.decay_frac=0.5", "optim.warmup_frac=0.25"]]
# Stated tolerance of a member against its solo run (relative; the module docstring of
# sanlab.train.members derives it). Measured on this CPU: 0 in both precisions.
RTOL = {"fp32": 1e-5, "bf16": 1e-3}


def test_the_stated_tolerance_is_the_one_the_tests_hold_members_to() -> None:
    # scripts/members_curves.py judges its runs by sanlab.train.members.TOLERANCE
    assert TOLERANCE == RTOL


def configs(data: Path, *extra: str, points: list[list[str]] = POINTS) -> list[Config]:
    return [load_config(None, [f"data.dir={data}", *SMALL, *extra, *p]) for p in points]


def curve(run: Path) -> list[tuple]:
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"], r.get("val_loss")) for r in metrics(run)]


def assert_close_curves(a: list[tuple], b: list[tuple], rtol: float) -> None:
    assert [r[0] for r in a] == [r[0] for r in b] and [r[3] for r in a] == [r[3] for r in b]  # steps, LRs exactly
    for x, y in zip(a, b):
        for u, v in zip(x[1:], y[1:]):
            assert (u is None) == (v is None)
            if u is not None:
                assert abs(u - v) <= rtol * abs(v), (x, y)


def assert_close_checkpoints(a: Path, b: Path, rtol: float) -> None:
    for name in ("model.safetensors", "optim.safetensors"):
        ta, tb = load_file(str(a / name)), load_file(str(b / name))
        assert ta.keys() == tb.keys()
        for k in ta:
            torch.testing.assert_close(ta[k], tb[k], rtol=rtol, atol=rtol * float(tb[k].abs().max()) + 1e-12)
    sa, sb = (json.loads((p / "state.json").read_text()) for p in (a, b))
    assert sa["optim"] == sb["optim"] and sa["loader"] == sb["loader"] and sa["step"] == sb["step"]
    assert sa["config"] == sb["config"]


@pytest.mark.parametrize("arm,optim,precision", [
    ("model.ffn=false", "optim.name=muon", "fp32"), ("model.ffn=true", "optim.name=muon", "fp32"),
    ("model.ffn=false", "optim.name=adamw", "fp32"), ("model.ffn=true", "optim.name=adamw", "fp32"),
    ("model.ffn=false", "optim.name=muon", "bf16"), ("model.ffn=true", "optim.name=adamw", "bf16"),
])
def test_a_member_equals_its_solo_run(train_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      arm: str, optim: str, precision: str) -> None:
    if precision == "bf16" and not torch.backends.mkldnn.is_available():
        pytest.skip("no bf16 matmuls")
    monkeypatch.chdir(tmp_path)
    cfgs = configs(train_data_dir, arm, optim, f"train.precision={precision}")
    metas = train_members(cfgs, [f"m{i}" for i in range(3)])
    assert [m["status"] for m in metas] == ["completed"] * 3
    assert [m["members"]["batch"] for m in metas] == [3] * 3
    for i, cfg in enumerate(cfgs):
        solo = train(cfg, f"s{i}")
        assert_close_curves(curve(Path(f"m{i}")), curve(Path(f"s{i}")), RTOL[precision])
        assert_close_checkpoints(Path(f"m{i}/checkpoints/latest"), Path(f"s{i}/checkpoints/latest"), RTOL[precision])
        assert sorted(os.listdir(f"m{i}/checkpoints")) == sorted(os.listdir(f"s{i}/checkpoints"))
        member = metas[i]
        assert member["final"]["val_loss"] == pytest.approx(solo["final"]["val_loss"], rel=RTOL[precision])
        assert member["status"] == solo["status"] and member["plan"] == solo["plan"]
        assert json.loads(Path(f"m{i}/config.json").read_text()) == json.loads(Path(f"s{i}/config.json").read_text())


def members_vs_solo(cfgs: list[Config], *, checkpoints: bool = True) -> list[dict]:
    """Train `cfgs` as members (m0, m1, …, in the cwd), then each solo (s0, …): each member's
    curve, status, checkpoint dir listing and (`checkpoints`) latest checkpoint equal its solo
    run's, in fp32 within the stated tolerance. The members' metas."""
    metas = train_members(cfgs, [f"m{i}" for i in range(len(cfgs))])
    for i, cfg in enumerate(cfgs):
        solo = train(cfg, f"s{i}")
        assert_close_curves(curve(Path(f"m{i}")), curve(Path(f"s{i}")), RTOL["fp32"])
        assert metas[i]["status"] == solo["status"]
        assert sorted(os.listdir(f"m{i}/checkpoints")) == sorted(os.listdir(f"s{i}/checkpoints"))
        if checkpoints:
            assert_close_checkpoints(Path(f"m{i}/checkpoints/latest"), Path(f"s{i}/checkpoints/latest"), RTOL["fp32"])
    return metas


# Per member, what a group lets differ beyond LR, seed and schedule (weight decay, the clip,
# milestones), and model and plan settings the tests above do not reach.
PER_MEMBER = {
    "weight decay and clip": (["optim.name=muon"], [
        ["optim.lr=0.02", "train.seed=1", "optim.weight_decay=0.0", "optim.grad_clip=0"],
        ["optim.lr=0.02", "train.seed=2", "optim.weight_decay=0.5", "optim.grad_clip=0.05"]]),
    "milestones": ([], [["train.seed=1", "train.milestones=[0,1]"], ["train.seed=2", "train.milestones=[0,0.5,1]"]]),
    "micro-batches": (["optim.name=adamw", "train.micro_batch_rows=2"], POINTS),
    "rezero residual": (["model.residual=rezero"], POINTS),
    "rms norm": (["model.norm=rms"], POINTS),
}


@pytest.mark.parametrize("case", PER_MEMBER)
def test_every_per_member_setting_is_the_members_own(train_data_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    monkeypatch.chdir(tmp_path)
    extra, points = PER_MEMBER[case]
    metas = members_vs_solo(configs(train_data_dir, *extra, "train.precision=fp32", "train.steps=4", points=points))
    assert [m["status"] for m in metas] == ["completed"] * len(points)


def test_a_members_train_time_is_the_sum_of_its_own_step_times(train_data_dir: Path, tmp_path: Path) -> None:
    """As the solo trainer defines it: `train_time_s` sums the step times its metrics rows
    give (tokens a step / tokens_per_s), so tokens_per_s is the member's, not the group's."""
    metas = train_members(configs(train_data_dir, "train.steps=4"), [tmp_path / f"m{i}" for i in range(3)])
    for i, m in enumerate(metas):
        steps = sum(m["plan"]["tokens_per_step"] / r["tokens_per_s"] for r in metrics(tmp_path / f"m{i}"))
        assert m["train_time_s"] == pytest.approx(steps, rel=1e-6)


def test_the_batch_in_meta_counts_the_runs_that_trained(train_data_dir: Path, tmp_path: Path) -> None:
    cfgs = configs(train_data_dir, "train.steps=4")
    train_members(cfgs[:1], [tmp_path / "m0"])  # finished before the group starts: it does not train again
    metas = train_members(cfgs, [tmp_path / f"m{i}" for i in range(3)], resume=True)
    assert metas[1]["members"] == {"batch": 2, "index": 0, "runs": ["m1", "m2"]}  # (the run dirs by name)
    assert metas[2]["members"]["index"] == 1


@pytest.mark.parametrize("backend,precision,compiled", [
    ("sdpa", "fp32", True), ("sdpa", "bf16", True), ("explicit", "fp32", True),
    ("sdpa", "fp32", False), ("sdpa", "bf16", False), ("explicit", "bf16", False),
])
def test_a_member_equals_its_solo_run_on_the_other_attention_backends(
        train_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, precision: str,
        compiled: bool) -> None:
    """The path a GPU takes (and a CPU without the compiled kernels, `compiled` False):
    QK-norm/RoPE per member, one attention call over the members folded into the batch."""
    if precision == "bf16" and not torch.backends.mkldnn.is_available():
        pytest.skip("no bf16 matmuls")
    if not compiled:
        from sanlab.model import native

        monkeypatch.setattr(native, "available", lambda: False)
        monkeypatch.setattr(native, "ready", lambda x: False)
    monkeypatch.chdir(tmp_path)
    calls = []
    import sanlab.model.members as members_mod

    real_attend = members_mod.attend

    def attend(q, k, v, ctx):  # noqa: ANN001, ANN202
        calls.append(q.shape[0])
        return real_attend(q, k, v, ctx)

    monkeypatch.setattr(members_mod, "attend", attend)
    cfgs = configs(train_data_dir, "model.ffn=false", "optim.name=muon", f"model.attn_backend={backend}",
                   f"train.precision={precision}", "train.steps=4", "train.eval_every=2")
    metas = train_members(cfgs, [f"m{i}" for i in range(3)])
    assert [m["status"] for m in metas] == ["completed"] * 3
    assert calls and set(calls) == {3 * 8}  # every layer's call: the 3 members' 8 rows at once
    for i, cfg in enumerate(cfgs):
        train(cfg, f"s{i}")
        assert_close_curves(curve(Path(f"m{i}")), curve(Path(f"s{i}")), RTOL[precision])
        assert_close_checkpoints(Path(f"m{i}/checkpoints/latest"), Path(f"s{i}/checkpoints/latest"), RTOL[precision])


def test_the_members_norm_rope_is_each_members_solo_function() -> None:
    """`_MemberNormRoPE` (no compiled kernels, or a GPU) against the solo `_NormRoPE` on each
    member's rows with its gain: outputs and gradients (x's and the gain's) bit for bit."""
    from sanlab.model.members import _MemberNormRoPE
    from sanlab.model.norms import _NormRoPE

    g = torch.Generator().manual_seed(0)
    M, B, T, h, D = 3, 2, 8, 4, 16
    x = torch.randn(M, B, T, h, D, generator=g).bfloat16().requires_grad_()
    gain = (1 + 0.1 * torch.randn(M, D, generator=g)).requires_grad_()
    ang = torch.randn(M * B, T, 1, D // 2, generator=g)
    c, s = ang.cos(), ang.sin()
    dy = torch.randn(M * B, h, T, D, generator=g)
    out = _MemberNormRoPE.apply(x, gain, 1e-6, c, s).transpose(2, 3).reshape(M * B, h, T, D)
    out.backward(dy)
    for m in range(M):
        xm, gm = x.detach()[m].clone().requires_grad_(), gain.detach()[m].clone().requires_grad_()
        rows = slice(m * B, (m + 1) * B)
        om = _NormRoPE.apply(xm, gm, 1e-6, c[rows], s[rows]).transpose(1, 2)
        om.backward(dy[rows])
        assert torch.equal(out[rows], om)
        assert torch.equal(x.grad[m], xm.grad) and torch.equal(gain.grad[m], gm.grad)


def test_newton_schulz_on_a_stack_is_per_member() -> None:
    """Muon's iterations on the members' stacked (M, a, b) update equal each member's own,
    and equal torch.optim.Muon's step on one matrix (what the solo optimizer runs)."""
    g = torch.Generator().manual_seed(0)
    for shape in ((3, 16, 48), (3, 48, 16)):
        x = torch.randn(*shape, generator=g)
        stacked = newton_schulz(x, 3.4445, -4.7750, 2.0315, 5, torch.bfloat16)
        for m in range(shape[0]):
            alone = newton_schulz(x[m:m + 1], 3.4445, -4.7750, 2.0315, 5, torch.bfloat16)
            assert torch.equal(stacked[m], alone[0])
            p = torch.nn.Parameter(torch.zeros(shape[1:]))
            p.grad = x[m].clone()
            Muon([p], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False).step()
            step = torch.tensor(-max(1.0, shape[1] / shape[2]) ** 0.5)  # the shape-adjusted LR, in fp32
            assert torch.equal(p.detach(), alone[0].float() * step)


@pytest.mark.parametrize("threads", [1, 2])
def test_bmm_linear_has_f_linears_gradients_bit_for_bit(threads: int) -> None:
    """Under bf16 autocast each member's output and both gradients of `bmm_linear` equal
    `F.linear`'s on the member's slice with `torch.equal`, at the demo's QKV product
    (2048 rows, 64 -> 128), at 1 and 2 threads: there autograd through bmm(x, wᵀ) rounded
    1–4 values of each weight gradient the other way at 1 thread (members drifted from
    their solo runs), and a batched dyᵀ x did at 2."""
    g = torch.Generator().manual_seed(0)
    M, N, k, n = 2, 2048, 64, 128
    x = torch.randn(M, 16, N // 16, k, generator=g)
    w = 0.02 * torch.randn(M, n, k, generator=g)
    dy = (1e-4 * torch.randn(M, 16, N // 16, n, generator=g)).bfloat16()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = bmm_linear(xb, wb)
        y.backward(dy)
        for m in range(M):
            xs, ws = x[m].clone().requires_grad_(), w[m].clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                ys = F.linear(xs, ws)
            ys.backward(dy[m])
            assert y.dtype == ys.dtype == torch.bfloat16 and wb.grad.dtype == torch.float32
            assert torch.equal(y[m], ys)
            assert torch.equal(xb.grad[m], xs.grad)
            assert torch.equal(wb.grad[m], ws.grad)
    finally:
        torch.set_num_threads(before)


def test_members_model_gradients_are_each_members_own() -> None:
    """The batched model's loss and gradients for each member equal the solo model's (one
    member's gradient never reaches another's weights)."""
    from sanlab.config import ModelConfig
    from sanlab.model.lm import LM

    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, ffn=True)
    model = build_members(cfg, [3, 4])
    tok = torch.randint(0, 64, (2, 2, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tok, dtype=torch.bool)
    mask[1] = False  # member 1 gets no tokens: it must get no gradient, member 0 its own
    loss, _ = model(tok, None, tok, mask)
    loss.sum().backward()
    torch.manual_seed(3)
    solo = LM(cfg)
    solo_loss, _ = solo(tok[0], None, tok[0], mask[0])
    solo_loss.backward()
    assert float(loss[0].detach()) == float(solo_loss.detach())
    for n, p in solo.named_parameters():
        assert torch.equal(model.by_name[n].grad[0], p.grad), n
        assert not model.by_name[n].grad[1].any(), n


def test_the_head_reads_each_member_through_one_node() -> None:
    """The head takes each member's hidden states and table through one unbind: indexing
    x[m] made each member's backward fill a zero (M, B, T, d) tensor and autograd add the
    M of them (with the table's (M, V, d), ~5% of the demo SAN's member-step). The graph
    has no per-member select, and the gradients are still each member's own (above)."""
    from sanlab.config import ModelConfig

    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64)
    model = build_members(cfg, [0, 1, 2])
    tok = torch.randint(0, 64, (3, 2, 16), generator=torch.Generator().manual_seed(0))
    loss, _ = model(tok, None, tok, torch.ones_like(tok, dtype=torch.bool))
    names, todo, seen = [], [loss.sum().grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(node.name())
        todo.extend(f for f, _ in node.next_functions)
    assert "SelectBackward0" not in names and names.count("UnbindBackward0") == 2, sorted(set(names))


def test_a_diverging_member_does_not_disturb_the_others(train_data_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Member 0 diverges: the others' curves and checkpoints (AdamW's step counts included)
    are their solo runs'."""
    monkeypatch.chdir(tmp_path)
    points = [["optim.lr=1e4", "train.seed=1"], ["optim.lr=1e-3", "train.seed=1"], ["optim.lr=2e-3", "train.seed=2"]]
    cfgs = configs(train_data_dir, "optim.name=adamw", "train.precision=fp32", "train.steps=12", points=points)
    metas = train_members(cfgs, ["m0", "m1", "m2"])
    assert [m["status"] for m in metas] == ["diverged", "completed", "completed"]
    for i, cfg in enumerate(cfgs):
        solo = train(cfg, f"s{i}")
        assert curve(Path(f"m{i}")) == curve(Path(f"s{i}"))  # the diverged one included: same step, same record
        assert metas[i]["status"] == solo["status"] and metas[i]["final"] == solo["final"]
        if i:
            assert_close_checkpoints(Path(f"m{i}/checkpoints/latest"), Path(f"s{i}/checkpoints/latest"), 0.0)
    assert metas[0]["final"]["steps"] < 12 and metrics(Path("m0"))[-1]["diverged"] is True


def test_a_loss_spike_stops_a_member_as_it_stops_its_solo_run(train_data_dir: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    metas = members_vs_solo(configs(train_data_dir, "train.precision=fp32", "train.steps=14", "train.spike_factor=0.5"),
                            checkpoints=False)
    assert [m["status"] for m in metas] == ["diverged"] * 3


def test_groups_that_cannot_train_as_members_are_refused(train_data_dir: Path, tmp_path: Path) -> None:
    a, b = configs(train_data_dir, points=[[], ["model.d_model=64"]])
    with pytest.raises(ConfigError, match="model configs differ"):
        train_members([a, b], [tmp_path / "a", tmp_path / "b"])
    c = configs(train_data_dir, "model.mixer=mixit", points=[[]])
    with pytest.raises(ConfigError, match="cannot train as members"):
        train_members(c, [tmp_path / "c"])
    sandwich = configs(train_data_dir, "model.sandwich_norm=true", points=[[]])  # (MemberLM has no post-norms)
    with pytest.raises(ConfigError, match="cannot train as members of one model: model.sandwich_norm=true"):
        train_members(sandwich, [tmp_path / "c"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


# --------------------------------------------------------------------------- exact resume

RESUME = ["train.steps=60", "train.checkpoint_every=4", "train.eval_every=7", "train.precision=fp32"]


@pytest.fixture(scope="module")
def uninterrupted(train_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[list[tuple]]:
    root = tmp_path_factory.mktemp("members-ref")
    outs = [root / f"m{i}" for i in range(3)]
    train_members(configs(train_data_dir, *RESUME), outs)
    return [curve(o) for o in outs]


def start(data: Path, root: Path) -> subprocess.Popen:
    spec = {"runs": [{"config": json.loads(c.model_dump_json()), "out": f"m{i}"}
                     for i, c in enumerate(configs(data, *RESUME))]}
    (root / "spec.json").write_text(json.dumps(spec))
    return subprocess.Popen([sys.executable, "-m", "sanlab.train.members", "spec.json"], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_step(proc: subprocess.Popen, run: Path, step: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            lines = (run / "metrics.jsonl").read_text().splitlines()
            if lines and json.loads(lines[-1])["step"] >= step:
                return
        except (OSError, json.JSONDecodeError):
            pass
        time.sleep(0.002)
    raise AssertionError("the members did not get going")


def resume(data: Path, root: Path) -> None:
    metas = train_members(configs(data, *RESUME), [root / f"m{i}" for i in range(3)], resume=True)
    assert [m["status"] for m in metas] == ["completed"] * 3


def test_sigkill_then_resume_is_bit_identical(train_data_dir: Path, tmp_path: Path,
                                              uninterrupted: list[list[tuple]]) -> None:
    proc = start(train_data_dir, tmp_path)
    wait_for_step(proc, tmp_path / "m2", 10)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    resume(train_data_dir, tmp_path)
    assert [curve(tmp_path / f"m{i}") for i in range(3)] == uninterrupted


def test_a_kill_between_the_members_checkpoints_resumes_bit_identical(
        train_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        uninterrupted: list[list[tuple]]) -> None:
    """Killed after member 0 wrote its step-12 checkpoint and before the others did: the
    group resumes at step 8 and member 0 waits there until the group reaches 12."""
    real = members_mod.checkpoint.save
    saved: list[tuple[str, int]] = []

    def save(dest: Path, model, optims, state) -> None:  # noqa: ANN001
        if state["step"] == 12 and dest.parent.parent.name == "m1":
            raise KeyboardInterrupt  # the process dies here
        saved.append((dest.parent.parent.name, state["step"]))
        real(dest, model, optims, state)

    monkeypatch.setattr(members_mod.checkpoint, "save", save)
    with pytest.raises(KeyboardInterrupt):
        train_members(configs(train_data_dir, *RESUME), [tmp_path / f"m{i}" for i in range(3)])
    assert ("m0", 12) in saved and ("m2", 12) not in saved
    monkeypatch.setattr(members_mod.checkpoint, "save", real)
    before = [json.loads((tmp_path / f"m{i}" / "meta.json").read_text()) for i in range(3)]
    resume(train_data_dir, tmp_path)
    assert [curve(tmp_path / f"m{i}") for i in range(3)] == uninterrupted
    for i in range(3):  # a resumed member's meta keeps its history, as a resumed solo run's does
        after = json.loads((tmp_path / f"m{i}" / "meta.json").read_text())
        assert after["resumes"] == 1 and (after["init"], after["started_at"]) == (before[i]["init"],
                                                                                  before[i]["started_at"])


def kill_between_checkpoints(data: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The group killed after m0 wrote its step-12 checkpoint and before m1 did (as above)."""
    real = members_mod.checkpoint.save

    def save(dest: Path, model, optims, state) -> None:  # noqa: ANN001
        if state["step"] == 12 and dest.parent.parent.name == "m1":
            raise KeyboardInterrupt
        real(dest, model, optims, state)

    with monkeypatch.context() as m:
        m.setattr(members_mod.checkpoint, "save", save)
        with pytest.raises(KeyboardInterrupt):
            train_members(configs(data, *RESUME), [root / f"m{i}" for i in range(3)])


def test_a_stop_while_a_member_waits_leaves_the_waiting_member_where_it_was(
        train_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        uninterrupted: list[list[tuple]]) -> None:
    """Resumed at step 8 with m0 waiting at 12, the group is stopped (SIGTERM) in step 10: m1
    and m2 save at 10; m0 has not stepped and keeps its step-12 checkpoint. All three are
    interrupted, and the next resume still ends on the uninterrupted curves."""
    kill_between_checkpoints(train_data_dir, tmp_path, monkeypatch)
    real = members_mod.lr_multiplier
    sent: list[int] = []

    def lr_multiplier(cfg, step: int, total: int) -> float:  # noqa: ANN001
        if step == 9 and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGTERM)  # (StopSignal's handler: a stop request)
        return real(cfg, step, total)

    with monkeypatch.context() as m:
        m.setattr(members_mod, "lr_multiplier", lr_multiplier)
        metas = train_members(configs(train_data_dir, *RESUME), [tmp_path / f"m{i}" for i in range(3)], resume=True)
    assert sent and [m["status"] for m in metas] == ["interrupted"] * 3
    steps = [json.loads((tmp_path / f"m{i}" / "checkpoints/latest/state.json").read_text())["step"] for i in range(3)]
    assert steps == [12, 10, 10]
    resume(train_data_dir, tmp_path)
    assert [curve(tmp_path / f"m{i}") for i in range(3)] == uninterrupted


def test_a_kill_before_a_members_own_milestone_copy_is_completed_on_resume(
        train_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """m1's milestones (0, 50%, 100%) are not m0's (0, 100%). Killed after m1 wrote its step-4
    `latest` and before copying it to milestone-050, the resume makes that copy from m1's own
    milestones, so m1 ends with its solo run's checkpoints."""
    monkeypatch.chdir(tmp_path)
    cfgs = configs(train_data_dir, "train.precision=fp32", "train.steps=8",
                   points=[["train.seed=1", "train.milestones=[0,1]"], ["train.seed=2", "train.milestones=[0,0.5,1]"]])
    real = members_mod.checkpoint.copy

    def copy(src: Path, dest: Path) -> None:
        if dest.name == "milestone-050" and dest.parent.parent.name == "m1":
            raise KeyboardInterrupt
        real(src, dest)

    with monkeypatch.context() as m:
        m.setattr(members_mod.checkpoint, "copy", copy)
        with pytest.raises(KeyboardInterrupt):
            train_members(cfgs, ["m0", "m1"])
    assert "milestone-050" not in os.listdir("m1/checkpoints")
    assert json.loads(Path("m1/checkpoints/latest/state.json").read_text())["step"] == 4
    assert [m["status"] for m in train_members(cfgs, ["m0", "m1"], resume=True)] == ["completed"] * 2
    train(cfgs[1], "s1")
    assert sorted(os.listdir("m1/checkpoints")) == sorted(os.listdir("s1/checkpoints"))
    assert_close_checkpoints(Path("m1/checkpoints/milestone-050"), Path("s1/checkpoints/milestone-050"), 0.0)


def test_a_killed_group_resumes_through_the_studys_train_group(
        train_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        uninterrupted: list[list[tuple]]) -> None:
    """`sanlab study run` reruns a killed group through `train_group`, which resumes it."""
    from sanlab.study.groups import train_group

    kill_between_checkpoints(train_data_dir, tmp_path, monkeypatch)
    (tmp_path / "jobs").mkdir()
    jobs = [{"run_id": f"m{i}", "run_dir": str(tmp_path / f"m{i}"), "config": json.loads(c.model_dump_json()),
             "jobs_dir": str(tmp_path / "jobs")} for i, c in enumerate(configs(train_data_dir, *RESUME))]
    assert [o["status"] for o in train_group(jobs)] == ["completed"] * 3
    assert [curve(tmp_path / f"m{i}") for i in range(3)] == uninterrupted


def test_sigterm_saves_every_member_and_exits_4(train_data_dir: Path, tmp_path: Path,
                                                 uninterrupted: list[list[tuple]]) -> None:
    proc = start(train_data_dir, tmp_path)
    wait_for_step(proc, tmp_path / "m2", 5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == EXIT_INTERRUPTED
    steps = set()
    for i in range(3):
        meta = json.loads((tmp_path / f"m{i}" / "meta.json").read_text())
        state = json.loads((tmp_path / f"m{i}" / "checkpoints" / "latest" / "state.json").read_text())
        assert meta["status"] == "interrupted" and state["step"] == meta["final"]["steps"]
        steps.add(state["step"])
    assert len(steps) == 1 and 5 <= steps.pop() < 60
    resume(train_data_dir, tmp_path)
    assert [curve(tmp_path / f"m{i}") for i in range(3)] == uninterrupted


def _members_curves():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "members_curves.py"
    spec = importlib.util.spec_from_file_location("members_curves", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_members_curves_judges_the_largest_relative_difference() -> None:
    from sanlab.report.data import Curve

    mc = _members_curves()
    a = Curve(tokens=[10, 20], loss=[4.0, 2.0], val_tokens=[20], val_loss=[3.0])
    assert mc.largest_relative_difference(a, a) == 0.0
    b = Curve(tokens=[10, 20], loss=[4.0, 2.002], val_tokens=[20], val_loss=[3.0])
    assert mc.largest_relative_difference(b, a) == pytest.approx(0.001)  # |2.002 - 2| / 2
    c = Curve(tokens=[10, 20], loss=[4.0, 2.0], val_tokens=[20], val_loss=[3.3])
    assert mc.largest_relative_difference(c, a) == pytest.approx(0.1)
    d = Curve(tokens=[10, 30], loss=[4.0, 2.0], val_tokens=[20], val_loss=[3.0])
    assert mc.largest_relative_difference(d, a) == float("inf")  # not the same points


def test_members_curves_runs_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    mc = _members_curves()
    monkeypatch.chdir(tmp_path)
    assert mc.main(["--out", "curves", "--tokens", "6K", "--data-tokens", "60K", "--precision", "fp32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.rsplit(None, 1)[0]: float(line.rsplit(None, 1)[1]) for line in lines[1:7]}
    assert sorted(rows) == sorted(f"{arm} LR {lr}" for arm in ("san", "standard") for lr in mc.LRS)
    assert max(rows.values()) <= TOLERANCE["fp32"]
    assert lines[-1] == "curves/members-vs-solo.png" and Path(lines[-1]).stat().st_size > 10_000
    member, solo = Path("curves/san-lr0.08-member"), Path("curves/san-lr0.08-solo")
    assert json.loads((member / "meta.json").read_text())["members"]["batch"] == 3
    assert "members" not in json.loads((solo / "meta.json").read_text())
    assert [r[0] for r in curve(member)] == [r[0] for r in curve(solo)] == [1, 2, 3]


def test_members_curves_fails_a_member_off_its_solo_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mc = _members_curves()
    monkeypatch.chdir(tmp_path)
    real = mc.train_members

    def off(cfgs, outs, **kw):  # the members train at an LR 1% off their solo runs'
        return real([c.model_copy(update={"optim": c.optim.model_copy(update={"lr": c.optim.lr * 1.01})})
                     for c in cfgs], outs, **kw)

    monkeypatch.setattr(mc, "train_members", off)
    assert mc.main(["--out", "curves", "--tokens", "6K", "--data-tokens", "60K", "--precision", "fp32"]) == 1


@pytest.mark.parametrize("args,says", [(["--tokens", "abc"], "train.tokens=abc"),
                                       (["--out", "file/curves"], "file"),
                                       (["--figure", "file/f.png"], "--figure's directory"),
                                       (["--figure", "."], "is a directory")])
def test_members_curves_refuses_bad_input_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture, args: list[str],
                                                      says: str) -> None:
    mc = _members_curves()
    monkeypatch.chdir(tmp_path)
    Path("file").write_text("not a directory")
    assert mc.main(["--out", "curves", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("members_curves: error:") and says in err
    assert sorted(os.listdir(".")) == ["file"]  # nothing written
