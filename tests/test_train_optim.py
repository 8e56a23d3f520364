"""Parameter routing and both optimizer sides against the torch reference optimizers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sanlab.config import ModelConfig, OptimConfig
from sanlab.model.lm import LM
from sanlab.train.optim import Muon, build_optimizers, clip_grad_norm, route


def tiny_lm(ffn: bool = True) -> LM:
    torch.manual_seed(0)
    return LM(ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn=ffn))


def fake_grads(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


@pytest.mark.parametrize("ffn", [False, True])
def test_routing_is_a_partition_following_the_contract(ffn: bool) -> None:
    model = tiny_lm(ffn)
    groups = route(model)
    names = {g: {n for n, _ in members} for g, members in groups.items()}
    assert sum(len(v) for v in names.values()) == len(list(model.parameters()))
    assert names["embedding"] == {"embed.weight"}
    hidden = {"wq", "wk", "wv", "wo"} | ({"w_gate", "w_up", "w_down"} if ffn else set())
    assert names["matrix"] == {n for n, p in model.named_parameters() if p.ndim == 2} - {"embed.weight"}
    assert {n.split(".")[-2] for n in names["matrix"]} == hidden
    assert all(n.endswith(("norm.weight", "_gate")) for n in names["gain_or_gate"])
    assert names["frozen"] == set()


def test_frozen_parameters_are_routed_but_not_optimized() -> None:
    model = tiny_lm()
    model.blocks[0].attn.wq.weight.requires_grad_(False)
    groups = route(model)
    assert [n for n, _ in groups["frozen"]] == ["blocks.0.attn.wq.weight"]
    optimized = {id(p) for p in build_optimizers(model, OptimConfig()).params()}
    assert id(model.blocks[0].attn.wq.weight) not in optimized


def _reference(model: nn.Module, cfg: OptimConfig, fused: bool | None = True) -> list[torch.optim.Optimizer]:
    """The torch optimizers built by hand from the SPEC §1.3 recipe (AdamW's fused kernel,
    as the trainer uses; `fused=None` for torch's default per-tensor loop)."""
    mats = [p for n, p in model.named_parameters() if p.ndim == 2 and n != "embed.weight"]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2 or n == "embed.weight"]
    if cfg.name == "muon":
        return [
            torch.optim.Muon(mats, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                             nesterov=True, ns_coefficients=tuple(cfg.ns_coefficients),
                             ns_steps=cfg.ns_steps, adjust_lr_fn=cfg.muon_adjust_lr),
            torch.optim.AdamW(rest, lr=cfg.adam_lr, betas=(0.9, 0.95), eps=cfg.eps, weight_decay=0.0, fused=fused),
        ]
    return [torch.optim.AdamW([{"params": mats, "weight_decay": cfg.weight_decay},
                               {"params": rest, "weight_decay": 0.0}],
                              lr=cfg.lr, betas=(0.9, 0.95), eps=cfg.eps, fused=fused)]


def _step_both(cfg: OptimConfig, fused: bool | None, steps: int) -> tuple[nn.Module, nn.Module]:
    """Two identical models after `steps` steps on the same fake gradients: one with our
    optimizers, one with the hand-built torch reference (`fused` for its AdamW)."""
    ours, ref = tiny_lm(), tiny_lm()
    opt, ref_opts = build_optimizers(ours, cfg), _reference(ref, cfg, fused=fused)
    for step in range(steps):
        fake_grads(ours, step)
        fake_grads(ref, step)
        opt.step()
        for o in ref_opts:
            o.step()
    return ours, ref


@pytest.mark.parametrize("cfg", [
    OptimConfig(name="muon", ns_precision="bf16"),
    OptimConfig(name="muon", ns_precision="bf16", muon_adjust_lr="match_rms_adamw", ns_coefficients=(3.0, -3.2, 1.2)),
    OptimConfig(name="adamw", lr=6e-4),
], ids=["muon", "muon-variant", "adamw"])
def test_optimizers_match_the_torch_reference(cfg: OptimConfig) -> None:
    ours, ref = _step_both(cfg, fused=True, steps=4)
    for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
        assert torch.equal(a, b), name
    assert not torch.equal(ours.embed.weight, tiny_lm().embed.weight)  # it did move


def test_fused_adamw_is_the_default_update_rule() -> None:
    """The fused AdamW kernel the trainer uses gives torch's default AdamW's parameters to
    rounding, over several steps of both arms."""
    for cfg in (OptimConfig(name="adamw", lr=6e-4), OptimConfig(name="muon", ns_precision="bf16")):
        assert all(g.get("fused") for o in build_optimizers(tiny_lm(), cfg).optimizers
                   if isinstance(o, torch.optim.AdamW) for g in o.param_groups)
        ours, ref = _step_both(cfg, fused=None, steps=6)
        for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def _newton_schulz(g: torch.Tensor, coeffs: tuple[float, float, float], steps: int) -> torch.Tensor:
    """Muon's quintic orthogonalisation, written out from the paper's recipe."""
    a, b, c = coeffs
    x = g.bfloat16()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).float()


def test_muon_side_is_the_written_out_algorithm() -> None:
    """Momentum 0.95 + Nesterov + NS(3.4445, -4.7750, 2.0315) × 5 + decoupled decay 0.01."""
    cfg = OptimConfig()
    model = tiny_lm(ffn=False)
    w = model.blocks[0].attn.wq.weight
    w0 = w.detach().clone()
    opt = build_optimizers(model, cfg)
    buf = torch.zeros_like(w0)
    expected = w0.clone()
    for step in range(3):
        fake_grads(model, step)
        g = w.grad.clone()
        opt.step()
        buf = cfg.momentum * buf + g
        update = _newton_schulz(g + cfg.momentum * buf, cfg.ns_coefficients, cfg.ns_steps)
        scale = math.sqrt(max(1.0, w0.shape[0] / w0.shape[1]))
        expected = expected * (1 - cfg.lr * cfg.weight_decay) - cfg.lr * scale * update
    torch.testing.assert_close(w.detach(), expected, atol=2e-3, rtol=0)  # bf16 iterations


# Stacks of a shape, a lone shape, tall and wide (the iteration runs on the wide side).
_MUON_SHAPES = [(16, 16), (8, 16), (16, 16), (24, 8), (8, 16), (8, 24), (24, 8), (16, 16)]


def _muon_pair(**kw: object) -> tuple[list[nn.Parameter], list[nn.Parameter], torch.optim.Optimizer, Muon]:
    torch.manual_seed(0)
    theirs = [nn.Parameter(torch.randn(*s) * 0.1) for s in _MUON_SHAPES]
    ours = [nn.Parameter(p.detach().clone()) for p in theirs]
    return theirs, ours, torch.optim.Muon(theirs, **kw), Muon(ours, **kw)


def _muon_steps(theirs: list, ours: list, ref: torch.optim.Optimizer, opt: Muon, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        for i, (a, b) in enumerate(zip(theirs, ours)):
            grad = torch.randn(a.shape, generator=g)
            a.grad, b.grad = grad.clone(), (None if i == 5 and step == 1 else grad.clone())  # one skips a step
            if b.grad is None:
                a.grad = None
        ref.step()
        opt.step()


@pytest.mark.parametrize("kw", [
    dict(lr=0.02, weight_decay=0.01),
    dict(lr=0.05, weight_decay=0.0, nesterov=False, momentum=0.9),
    dict(lr=0.01, weight_decay=0.1, adjust_lr_fn="match_rms_adamw", ns_coefficients=(3.0, -3.2, 1.2), ns_steps=3),
], ids=["default", "no-nesterov", "variant"])
def test_batched_muon_is_torch_muon_bit_for_bit(kw: dict) -> None:
    """Muon updates each shape's matrices as one stack; every parameter and momentum
    buffer equals torch.optim.Muon's exactly, for tall, wide and square matrices, lone
    and stacked shapes, a matrix without a gradient for a step, and any hyperparameters."""
    theirs, ours, ref, opt = _muon_pair(**kw)
    _muon_steps(theirs, ours, ref, opt, range(4))
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert torch.equal(a, b), (i, _MUON_SHAPES[i])
        assert torch.equal(ref.state[a]["momentum_buffer"], opt.state[b]["momentum_buffer"]), i
    assert not torch.equal(theirs[0], _muon_pair(**kw)[0][0])  # it did move


def test_batched_muon_state_moves_to_and_from_torch_muon() -> None:
    """A checkpoint of either optimizer resumes in the other: same state layout."""
    theirs, ours, ref, opt = _muon_pair(lr=0.02, weight_decay=0.01)
    _muon_steps(theirs, ours, ref, opt, range(2))
    swapped_ref, swapped_opt = Muon(theirs, lr=0.02, weight_decay=0.01), torch.optim.Muon(ours, lr=0.02, weight_decay=0.01)
    swapped_ref.load_state_dict(ref.state_dict())
    swapped_opt.load_state_dict(opt.state_dict())
    _muon_steps(theirs, ours, swapped_ref, swapped_opt, range(2, 4))
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours))


def _fp32_zeropower(grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int,
                    eps: float) -> torch.Tensor:
    """torch.optim.Muon's Newton–Schulz iterations with the input cast to fp32, not bf16."""
    a, b, c = ns_coefficients
    x = grad.float()
    x = x.T if grad.size(0) > grad.size(1) else x
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if grad.size(0) > grad.size(1) else x


def test_fp32_newton_schulz_is_torch_muon_with_fp32_iterations(monkeypatch: pytest.MonkeyPatch) -> None:
    """ns_dtype=fp32 (optim.ns_precision=fp32, `auto` on CPUs without native bf16) is
    torch's update with the iterations in fp32: equal to fp32 rounding, and not the bf16
    update."""
    import torch.optim._muon as torch_muon

    kw = dict(lr=0.02, weight_decay=0.01)
    bf16_ref, bf16_params, bf16_torch, bf16_opt = _muon_pair(**kw)
    _muon_steps(bf16_ref, bf16_params, bf16_torch, bf16_opt, range(4))  # torch's own bf16, for contrast
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", _fp32_zeropower)
    theirs, ours, _, _ = _muon_pair(**kw)
    ref, opt = torch.optim.Muon(theirs, **kw), Muon(ours, ns_dtype=torch.float32, **kw)
    _muon_steps(theirs, ours, ref, opt, range(4))
    for i, (a, b, c) in enumerate(zip(theirs, ours, bf16_params)):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=str(i))
        assert (b - c).abs().max() > 1e-5, i  # bf16 iterations give a visibly different update


def test_muon_refuses_other_iteration_dtypes() -> None:
    with pytest.raises(ValueError, match="ns_dtype"):
        Muon([nn.Parameter(torch.zeros(4, 4))], ns_dtype=torch.float16)


@pytest.mark.parametrize("native", [True, False])
def test_auto_precisions_follow_the_cpu(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """`auto` for autocast and for Newton–Schulz resolves to bf16 on a CPU with bf16
    dot-product instructions and to fp32 without; explicit choices are kept, and an
    explicit bf16 on a CPU that emulates it gets a one-line note."""
    from sanlab.config import Config
    from sanlab.train import host, trainer

    monkeypatch.setattr(host, "cpu_has_native_bf16", lambda: native)
    want = "bf16" if native else "fp32"
    cfg = trainer.resolve(Config.model_validate({"train": {"device": "cpu"}}))
    assert (cfg.train.precision, cfg.optim.ns_precision) == (want, want)
    assert trainer.emulated_bf16_note(cfg) is None
    kept = trainer.resolve(Config.model_validate(
        {"train": {"device": "cpu", "precision": "bf16"}, "optim": {"ns_precision": "fp32"}}))
    assert (kept.train.precision, kept.optim.ns_precision) == ("bf16", "fp32")
    note = trainer.emulated_bf16_note(kept)
    assert (note is None) == native
    if note:
        assert "\n" not in note and "train.precision=bf16" in note and "ns_precision" not in note
    m = build_optimizers(tiny_lm(), OptimConfig(ns_precision="auto")).optimizers[0]
    assert isinstance(m, Muon) and m.ns_dtype == (torch.bfloat16 if native else torch.float32)


def test_schedule_scales_every_group_from_its_peak() -> None:
    opt = build_optimizers(tiny_lm(), OptimConfig(lr=0.02, adam_lr=3e-4))
    opt.set_lr(0.5)
    assert sorted(g["lr"] for g in opt.param_groups()) == pytest.approx([1.5e-4, 0.01])
    opt.set_lr(1.0)
    assert sorted(g["lr"] for g in opt.param_groups()) == pytest.approx([3e-4, 0.02])


def test_global_grad_norm_clip() -> None:
    model = tiny_lm()
    fake_grads(model, 0)
    params = list(model.parameters())
    norm = torch.sqrt(sum((p.grad**2).sum() for p in params)).item()
    assert clip_grad_norm(params, 1.0) == pytest.approx(norm, rel=1e-5)
    clipped = torch.sqrt(sum((p.grad**2).sum() for p in params)).item()
    assert clipped == pytest.approx(1.0, rel=1e-4)
    assert clip_grad_norm(params, 0.0) == pytest.approx(clipped, rel=1e-5)  # 0 = report only


def test_a_module_without_declared_roles_is_routed_by_name_and_shape() -> None:
    """The fallback for modules that declare no roles (not LM): `embed.weight` is the
    embedding, other 2-D parameters are matrices, the rest gains or gates."""

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.proj = nn.Linear(4, 4, bias=False)
            self.gain = nn.Parameter(torch.ones(4))

    names = {g: {n for n, _ in members} for g, members in route(Plain()).items()}
    assert names["embedding"] == {"embed.weight"}
    assert names["matrix"] == {"proj.weight"}
    assert names["gain_or_gate"] == {"gain"}
