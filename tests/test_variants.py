"""Every registered sequence mixer and state mixer, from the registries: accounting = module,
forward/backward in fp32 and bf16 autocast, causality, document masking, hooks, init,
roles; then the variants' own formulas (Taylor, MixiT, non-approximate) and the freezes."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pytest
import torch

from sanlab.accounting import count_flops, count_module_params, count_params, measure_forward_flops
from sanlab.cli import main
from sanlab.config import ModelConfig, OptimConfig
from sanlab.errors import EXIT_USAGE, ConfigError
from sanlab.model import mixers
from sanlab.model.hooks import capture, hook_names
from sanlab.model.mixers._stream import StreamQK, fixed_stream
from sanlab.model.mixers.approximate import taylor_attention, taylor_weights
from sanlab.model.mixers.fixed_seq_qk import UNSET
from sanlab.model.mixers.mixit import mixit_draw, mixit_matrices
from sanlab.model.mixers.softmax import SoftmaxAttention, SoftmaxSpec
from sanlab.model.lm import LM
from sanlab.train import checkpoint
from sanlab.train.optim import build_optimizers, route

MIXERS = sorted(mixers.MIXERS)
STATES = ["none", *sorted(mixers.STATE_MIXERS)]
# Options some mixers need at this tiny size (MixiT's matrices cover the test rows; Taylor's
# blocks are smaller than the rows, so the running sums are exercised).
OPTIONS = {"mixit": {"seq_len": 24}, "approximate": {"chunk": 5}, "fixed_seq_qk": {"sequence": "random", "seq_len": 24}}
SWITCHES = list(itertools.product(("gated", "rezero", "standard", "none"), ("zcrms", "rms"), (False, True),
                                  (False, True)))
LAYOUTS = ("uniform", "hybrid")


def tiny(mixer: str = "softmax", state: str = "none", layout: str | list[str] = "uniform", **kw) -> ModelConfig:
    base = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, d_ff=48, mixer=mixer,
                state_mixer=state, layout=layout, mixer_options=OPTIONS.get(mixer, {}))
    base.update(kw)
    return ModelConfig(**base)


def randomise(model: LM, seed: int = 0) -> None:
    """Move gates and gains off their init (so every parameter gets a gradient and the
    comparisons below exercise them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim < 2:
                p.add_(0.3 * torch.randn(p.shape, generator=g))


def test_registries_hold_the_variants() -> None:
    assert set(MIXERS) >= {"softmax", "mlp", "approximate", "non_approximate", "rnd_emb_qk", "fixed_seq_qk",
                           "static_emb_qk", "mixit"}
    assert "swiglu" in STATES


def test_init_roles_and_accounting_are_the_recorded_ones() -> None:
    """Every mixer's init (each parameter and buffer, bit for bit, from one seed), roles and
    parameter and FLOP counts equal tests/data/mixer_fingerprints.json (recorded before the
    mixers became specs and modules; rewrite it only for a change meant to move them)."""
    import json

    from mixer_fingerprints import FILE, all_fingerprints

    recorded, now = json.loads(FILE.read_text()), all_fingerprints()
    assert set(now) == set(recorded)
    for name in recorded:
        for key in recorded[name]:
            assert now[name][key] == recorded[name][key], f"{name}: {key}"


def test_specs_config_and_accounting_need_no_torch() -> None:
    """The registry, every mixer's spec, config validation, accounting and labels load and
    run with torch blocked: each file's part above its first `import torch` is torch-free."""
    import json
    import subprocess
    import sys

    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' or name.startswith('torch.'):\n"
            "            raise ImportError('torch is blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import json\n"
            "from sanlab.accounting import count_flops, count_params\n"
            "from sanlab.config import Config, apply_overrides\n"
            "from sanlab.errors import ConfigError\n"
            "from sanlab.matching import model_label\n"
            "from sanlab.model import mixers\n"
            "out = {}\n"
            "for name in mixers.MIXERS:\n"
            "    cfg = apply_overrides(Config, {}, [f'model.mixer={name}', 'model.layout=hybrid', 'model.ffn=true'])\n"
            "    out[name] = [count_params(cfg.model).total, count_flops(cfg.model, 64).train, model_label(cfg.model)]\n"
            "try:\n"
            "    apply_overrides(Config, {}, ['model.mixer=mixit', 'model.mixer_options.nope=1'])\n"
            "except ConfigError as e:\n"
            "    out['error'] = str(e)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "mixer_options (mixer mixit): nope: unknown key" in out.pop("error")
    assert set(out) == set(MIXERS)
    for name, (params, flops, label) in out.items():
        cfg = ModelConfig(mixer=name, layout="hybrid", ffn=True)
        assert [params, flops] == [count_params(cfg).total, count_flops(cfg, 64).train], name


# --------------------------------------------------------------------------- accounting = module


@pytest.mark.parametrize("mixer,state", list(itertools.product(MIXERS, STATES)))
def test_formula_matches_module_params(mixer: str, state: str) -> None:
    """Every mixer × state mixer (or none) × residual / norm / QK-norm / sandwich, uniform and
    hybrid: the declared parameter terms equal the built module's, name by name, and every
    parameter has a declared role that routes it."""
    for (residual, norm, qk_norm, sandwich), layout in itertools.product(SWITCHES, LAYOUTS):
        cfg = tiny(mixer, state, layout, residual=residual, norm=norm, qk_norm=qk_norm, sandwich_norm=sandwich)
        model = LM(cfg)
        formula, module = count_params(cfg), count_module_params(model)
        assert formula.breakdown == module.breakdown, (cfg.layer_mixers, residual, norm, qk_norm, sandwich)
        assert (formula.total, formula.non_embedding) == (module.total, module.non_embedding)
        roles = model.param_roles()
        assert set(roles) == {n for n, _ in model.named_parameters()}
        route(model)


def _fixed_pass_flops(cfg: ModelConfig, T: int) -> int:
    """RndEmbQK / FixedSeqQK run the blocks once more on one fixed row (not in the per-token terms)."""
    if not any(issubclass(mixers.mixer_class(m), StreamQK) for m in cfg.layer_mixers):
        return 0
    f = count_flops(cfg, T)
    return T * (f.forward - f.head)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_flops_match_flop_counter(mixer: str, state: str, layout: str) -> None:
    """FlopCounterMode over a packed batch equals the declared terms: the projections (aten.mm)
    term for term, and the total (every pairwise product counted as the kernels compute it)."""
    cfg = tiny(mixer, state, layout)
    B, T = 2, 16
    tokens = torch.randint(0, cfg.vocab_size, (B, T))
    segments = (torch.arange(T) >= 6).long().expand(B, T)
    measured = measure_forward_flops(LM(cfg), tokens, segments)
    f = count_flops(cfg, T)
    extra = _fixed_pass_flops(cfg, T)
    proj = f.attn_proj + f.ffn + f.head
    extra_proj = T * (f.attn_proj + f.ffn) if extra else 0
    assert measured.by_op.get("aten.mm", 0) == B * T * proj + extra_proj
    # (per-token terms are whole FLOPs: a term that averages over the row, like Taylor's
    # running sums, is rounded down, by less than one FLOP per token and layer)
    assert 0 <= measured.total - (B * T * f.forward + extra) < B * T * cfg.n_layers


def test_match_prints_every_term_for_a_variant_and_a_hybrid(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["match", "--preset", "tiny", "mixer=approximate", "layout=hybrid", "--breakdown",
                 "--targets", "params"]) == 0
    out = capsys.readouterr().out
    for needle in ("attn_block", "attn_state", "attn q·kᵀ", "attn.wq.weight", "hyb-approx-10L d256"):
        assert needle in out
    assert main(["match", "--preset", "tiny", "mixer=mixit", "--json", "--targets", "params"]) == 0
    import json

    arms = json.loads(capsys.readouterr().out)
    ref = ModelConfig(**arms[0]["config"])
    assert arms[0]["params_non_embedding"] == count_params(ref).non_embedding
    assert "attn.wq.weight" not in arms[0]["params_breakdown"] and arms[0]["flops"]["attn_scores"] == 0
    assert arms[1]["layer_mixers"] == ["mixit"] * arms[1]["n_layers"]  # the partner keeps the variant


# --------------------------------------------------------------------------- behaviour of every mixer


@pytest.mark.parametrize("mixer", MIXERS)
def test_forward_backward_fp32_and_bf16(mixer: str) -> None:
    torch.manual_seed(0)
    model = LM(tiny(mixer, "swiglu", n_layers=3))
    randomise(model)
    tokens = torch.randint(0, 64, (2, 20))
    segments = (torch.arange(20) >= 7).long().expand(2, 20)
    targets, mask = torch.roll(tokens, -1, 1), torch.ones(2, 20, dtype=torch.bool)
    losses = {}
    for amp in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss, ce = model(tokens, segments, targets, mask)
        loss.backward()
        assert torch.isfinite(loss)
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name
        losses[amp] = float(ce)
    assert losses[True] == pytest.approx(losses[False], abs=0.05)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_causality(mixer: str, layout: str) -> None:
    """Changing a future token never changes an earlier output."""
    torch.manual_seed(0)
    model = LM(tiny(mixer, "swiglu", layout, n_layers=3)).eval()
    randomise(model)
    tokens = torch.randint(0, 64, (1, 18))
    changed = tokens.clone()
    changed[0, 11] = (tokens[0, 11] + 1) % 64
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :11], b[:, :11], rtol=0, atol=1e-5)
    assert (a[:, 11:] - b[:, 11:]).abs().max() > 1e-4


@pytest.mark.parametrize("mixer", MIXERS)
def test_document_mask_is_exact(mixer: str) -> None:
    """A packed row gives each document exactly the logits it gets alone."""
    torch.manual_seed(0)
    model = LM(tiny(mixer, "swiglu", "hybrid", n_layers=3)).double().eval()
    randomise(model)
    lengths = [7, 11, 4]
    docs = [torch.randint(0, 64, (1, n)) for n in lengths]
    packed = torch.cat(docs, dim=1)
    segments = torch.cat([torch.full((1, n), i) for i, n in enumerate(lengths)], dim=1)
    with torch.no_grad():
        together = model(packed, segments)
        alone = torch.cat([model(d) for d in docs], dim=1)
    torch.testing.assert_close(together, alone)


@pytest.mark.parametrize("mixer", MIXERS)
def test_hooks_and_patterns(mixer: str) -> None:
    """`blocks.{i}.attn.pattern` exists exactly where the mixer has a pattern; it is (B, H, T, T),
    causal, zero across documents, rows summing to 1; capturing it does not change the output."""
    torch.manual_seed(0)
    cfg = tiny(mixer, layout="hybrid", n_layers=2)
    model = LM(cfg).eval()
    randomise(model)
    names = hook_names(model)
    has = mixers.MIXERS[mixer].has_pattern
    assert ("blocks.1.attn.pattern" in names) == has
    assert "blocks.0.attn.pattern" in names  # the hybrid's softmax layer
    tokens = torch.randint(0, 64, (2, 12))
    seg = (torch.arange(12) >= 5).long().expand(2, 12)
    with torch.no_grad():
        plain = model(tokens, seg)
        with capture(model, ["blocks.*.attn.pattern", "blocks.*.resid_post"]) as acts:
            hooked = model(tokens, seg)
    torch.testing.assert_close(plain, hooked, rtol=1e-4, atol=1e-4)
    assert ("blocks.1.attn.pattern" in acts) == has
    for name, A in acts.items():
        if not name.endswith("pattern"):
            continue
        assert A.shape == (2, 4, 12, 12)
        allowed = (seg[:, :, None] == seg[:, None, :]) & torch.ones(12, 12, dtype=torch.bool).tril()
        assert (A.masked_select(~allowed[:, None].expand_as(A)) == 0).all()
        torch.testing.assert_close(A.sum(-1), torch.ones(2, 4, 12), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mixer", MIXERS)
def test_init_is_owned_by_the_modules(mixer: str) -> None:
    """reset_parameters re-draws every matrix with SPEC §1.1's stds, resets gains and gates,
    and never touches buffers (fixed random state)."""
    torch.manual_seed(3)
    cfg = tiny(mixer, "swiglu", n_layers=4, d_model=64, vocab_size=256)
    model = LM(cfg)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)
        for b in model.buffers():
            b.add_(1)
    moved = {k: v.clone() for k, v in model.named_buffers()}
    model.reset_parameters()
    for k, v in model.named_buffers():
        assert torch.equal(v, moved[k]) and not torch.equal(v, buffers[k]), k
    out_std = 0.02 / (2 * cfg.n_layers) ** 0.5
    for name, p in model.named_parameters():
        if p.ndim == 2:
            expected = out_std if name.endswith(("wo.weight", "w_down.weight")) else 0.02
            assert 0.8 * expected < float(p.detach().std()) < 1.2 * expected, name
        else:
            assert (p == 0).all(), name  # ZCN gains and gates start at 0


# --------------------------------------------------------------------------- the variants' formulas


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
def test_taylor_linear_time_equals_quadratic_formula(chunk: int) -> None:
    torch.manual_seed(0)
    B, H, T, D = 2, 3, 17, 4
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    seg = torch.tensor([[0] * 6 + [1] * 11, [0] * 2 + [1] * 3 + [2] * 9 + [3] * 3])
    allowed = ((seg[:, :, None] == seg[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril())[:, None]
    A = taylor_weights(q, k, allowed)
    s = q @ k.transpose(-1, -2) / D**0.5  # the formula written out once more
    w = (1 + s + s * s / 2) * allowed
    torch.testing.assert_close(A, w / w.sum(-1, keepdim=True))
    torch.testing.assert_close(taylor_attention(q, k, v, seg, chunk), A @ v)


def test_taylor_training_path_forms_no_square() -> None:
    """Without a pattern hook no (…, T, T) tensor is formed: only block-sized squares."""
    torch.manual_seed(0)
    model = LM(tiny("approximate", mixer_options={"chunk": 4}))
    T = 16
    seen = []

    class Watch(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dim() >= 2:
                seen.append(tuple(out.shape))
            return out

    with Watch():
        model(torch.randint(0, 64, (1, T)), torch.zeros(1, T, dtype=torch.long), torch.zeros(1, T, dtype=torch.long))
    taylor = [s for s in seen if s[-2:] == (T, T)]
    assert not taylor and any(s[-2:] == (4, 4) for s in seen)


def test_mixit_matrices_follow_spec2() -> None:
    H, T, D = 4, 20, 8
    A = mixit_matrices(H, T, D, seed=5)
    assert A.shape == (H, T, T)
    assert (A.triu(1) == 0).all()  # strictly causal: nothing above the diagonal
    torch.testing.assert_close(A.sum(-1), torch.ones(H, T))  # rows sum to 1
    noise = (A - torch.eye(T))[1:]
    support = torch.ones(T, T).tril()
    torch.testing.assert_close((noise * support).sum(-1) / support.sum(-1), torch.zeros(H - 1, T),
                               atol=1e-6, rtol=0)  # centred rows
    sink = 0.5 * torch.eye(T)
    sink[:, 0] += 0.5
    torch.testing.assert_close(A[0], sink)
    assert torch.equal(A, mixit_matrices(H, T, D, seed=5))  # reproducible from the seed
    assert not torch.equal(A[1:], mixit_matrices(H, T, D, seed=6)[1:])
    # per-head scale between 1/√(T·d_h) and 1/√T
    std = torch.stack([(A[h] - torch.eye(T))[support.bool()].std() for h in range(1, H)])
    assert ((std > 0.5 / (T * D) ** 0.5) & (std < 1.5 / T**0.5)).all()


def test_mixit_draw_is_the_same_for_any_longer_draw() -> None:
    """The draw for T is the top-left block of the draw for any longer T, so the matrices of a
    document of L tokens do not depend on the `seq_len` the module was built for."""
    u, C = mixit_draw(4, 20, seed=5)
    u2, C2 = mixit_draw(4, 53, seed=5)
    assert torch.equal(u, u2) and torch.equal(C, C2[:, :20, :20])
    built = [LM(tiny("mixit", mixer_options={"seq_len": n})).blocks[1].attn for n in (20, 37)]
    assert torch.equal(built[0].noise, built[1].noise[:, :20, :20])
    assert torch.equal(built[0].sequence_weights(20), built[1].sequence_weights(20))


def _sigma_spec(u: float, T: int, d_h: int) -> float:
    """SPEC §2's σ_h = 1/√(T·d_h) + U·(1/√T − 1/√(T·d_h)), written out once more."""
    return 1 / math.sqrt(T * d_h) + u * (1 / math.sqrt(T) - 1 / math.sqrt(T * d_h))


LENGTHS = (20, 37, 128)  # a packed row of three documents (the probes' documents are 20–40 tokens)


def _packed_patterns(sigma_length: str | None, seq_len: int = 128) -> tuple[LM, dict[str, torch.Tensor]]:
    """The patterns of a 4-layer MixiT (8 heads, d_h 8) on one row packing LENGTHS;
    `sigma_length=None` leaves the option at its default."""
    opts = {"seq_len": seq_len} | ({"sigma_length": sigma_length} if sigma_length else {})
    cfg = tiny("mixit", n_layers=4, d_model=64, n_heads=8, n_kv_heads=4, mixer_options=opts)
    model = LM(cfg).double().eval()
    T = sum(LENGTHS)
    tokens = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(0))
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(LENGTHS)])[None]
    with torch.no_grad(), capture(model, ["blocks.*.attn.pattern"]) as acts:
        model(tokens, seg)
    return model, acts


def _energy_ratios(model: LM, acts: dict[str, torch.Tensor], T_of: dict[int, int] | None = None) -> dict[int, float]:
    """Per document length L: the energy Σ_j (A − I)² of the document's last row, over SPEC §2's
    expectation σ_h(T)²·(L − 1) (row L−1 holds L centred normals: Σ (z_j − z̄)² has mean L − 1),
    averaged over the noise heads 1…7 of the 4 layers; T = L unless `T_of` says otherwise.
    Also checks each energy exactly against the draw (σ_h(T)² · Σ_j C²)."""
    d_h, out, start = model.cfg.head_dim, {}, 0
    for L in LENGTHS:
        T = (T_of or {}).get(L, L)
        ratios = []
        for i, block in enumerate(model.blocks):
            A = acts[f"blocks.{i}.attn.pattern"][0]  # (H, T_row, T_row)
            row = A[:, start + L - 1, start : start + L] - torch.eye(L, dtype=A.dtype)[-1]  # (H, L)
            for h in range(1, model.cfg.n_heads):
                sigma = _sigma_spec(float(block.attn.sigma_u[h]), T, d_h)
                energy = float((row[h] ** 2).sum())
                exact = sigma**2 * float((block.attn.noise[h, L - 1, :L] ** 2).sum())
                assert energy == pytest.approx(exact, rel=1e-5), (L, i, h)
                ratios.append(energy / (sigma**2 * (L - 1)))
            torch.testing.assert_close(A[:, start + L - 1].sum(-1), torch.ones(model.cfg.n_heads, dtype=A.dtype))
        out[L] = sum(ratios) / len(ratios)
        start += L
    return out


def test_mixit_mixes_each_document_at_its_own_length() -> None:
    """SPEC §2: σ_h is set by the length of the sequence mixed, for packed documents the
    document's own length. The last row of a 20-, 37- and 128-token document inside one
    packed row carries the energy σ_h(L)²·(L−1): measured over 28 heads within ±25% (built
    for the row or for seq_len instead, the 20-token document would show ~1/6 of it)."""
    model, acts = _packed_patterns(None)  # the default
    ratios = _energy_ratios(model, acts)
    for L, r in ratios.items():
        assert 0.75 < r < 1.25, (L, r)
    # the whole block of each document is SPEC §2's matrix for L tokens (the sink head too)
    start = 0
    for L in LENGTHS:
        for i in range(4):
            expected = mixit_matrices(8, L, 8, i).double()  # seed 0: 0·1,000,003 + i
            got = acts[f"blocks.{i}.attn.pattern"][0, :, start : start + L, start : start + L]
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
        start += L


def test_mixit_row_and_prefix_constructions() -> None:
    """`sigma_length="row"` builds every row for T = seq_len (the construction that made the
    mixing ~7× weaker on short documents); "prefix" builds row p for T = p + 1."""
    model, acts = _packed_patterns("row", seq_len=256)
    ratios = _energy_ratios(model, acts, T_of={L: 256 for L in LENGTHS})
    assert all(0.75 < r < 1.25 for r in ratios.values()), ratios
    # prefix: every row p of every document at σ_h(p + 1)
    model, acts = _packed_patterns("prefix")
    start = 0
    for L in LENGTHS:
        for i, block in enumerate(model.blocks):
            A = acts[f"blocks.{i}.attn.pattern"][0, :, start : start + L, start : start + L]
            for p in (1, L // 2, L - 1):
                for h in range(1, 8):
                    sigma = _sigma_spec(float(block.attn.sigma_u[h]), p + 1, 8)
                    expected = sigma**2 * float((block.attn.noise[h, p, : p + 1] ** 2).sum())
                    assert float(((A[h, p, : p + 1] - torch.eye(p + 1, dtype=A.dtype)[-1]) ** 2).sum()) == \
                        pytest.approx(expected, rel=1e-5)
        start += L


def test_each_mixit_layer_draws_its_own_matrices() -> None:
    """Layer i's matrices are `mixit_matrices(…, seed·1,000,003 + i)`: no two layers share them."""
    seed, L = 3, 24
    model = LM(tiny("mixit", n_layers=3, mixer_options={"seq_len": L, "seed": seed})).eval()
    tokens = torch.randint(0, 64, (1, L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture(model, ["blocks.*.attn.pattern"]) as acts:
        model(tokens)
    pats = [acts[f"blocks.{i}.attn.pattern"][0] for i in range(3)]
    for i, A in enumerate(pats):
        torch.testing.assert_close(A, mixit_matrices(4, L, 8, seed * 1_000_003 + i), rtol=0, atol=1e-6)
    for i, j in itertools.combinations(range(3), 2):
        assert (pats[i][1:] - pats[j][1:]).abs().max() > 1e-3, (i, j)


def _steps(model: LM, n: int = 3, seed: int = 0) -> None:
    opts = build_optimizers(model, OptimConfig(lr=0.05, adam_lr=0.01))
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        tokens = torch.randint(0, 64, (2, 13), generator=g)
        loss, _ = model(tokens[:, :-1], None, tokens[:, 1:], torch.ones(2, 12, dtype=torch.bool))
        loss.backward()
        opts.step()
        opts.zero_grad()
    return opts


def test_mixit_state_survives_training_and_checkpoints(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LM(tiny("mixit"))
    mixer = model.blocks[1].attn
    fixed = {n: b.clone() for n, b in mixer.named_buffers()}
    assert set(fixed) == {"sigma_u", "noise"}
    assert not any(n.endswith(("noise", "sigma_u")) for n, _ in model.named_parameters())  # buffers, not parameters
    wv = mixer.wv.weight.clone()
    opts = _steps(model)
    for n, b in mixer.named_buffers():
        assert torch.equal(b, fixed[n]), n  # bit-identical after training steps
    assert not torch.equal(mixer.wv.weight, wv)  # V and O do train
    checkpoint.save(tmp_path / "c", model, opts, {"step": 3})
    other = LM(tiny("mixit"))
    for b in other.buffers():
        b.zero_()
    checkpoint.load(tmp_path / "c", other, build_optimizers(other, OptimConfig()), restore_rng=False)
    for n, b in other.blocks[1].attn.named_buffers():
        assert torch.equal(b, fixed[n]), n  # restored from the checkpoint


def test_non_approximate_is_its_formula() -> None:
    """A_ij = softmax_{j ≤ i}(q_j · k_j / √d_h) with q = SiLU(W_q u): the weights of a key do
    not depend on the query."""
    torch.manual_seed(0)
    cfg = tiny("non_approximate", n_layers=1)
    model = LM(cfg).double().eval()
    mixer = model.blocks[0].attn
    tokens = torch.randint(0, 64, (1, 9))
    with torch.no_grad(), capture(model, ["blocks.0.attn.pattern"]) as acts:
        model(tokens)
        u = model.blocks[0].attn_norm(model.embed(tokens) * model.embed_scale)
        q = torch.nn.functional.silu(mixer.wq(u)).view(1, 9, 4, 8)
        k = mixer.wk(u).view(1, 9, 2, 8).repeat_interleave(2, dim=2)
        s = (q * k).sum(-1).transpose(1, 2) / 8**0.5  # (1, H, T)
        scores = s[:, :, None, :].expand(1, 4, 9, 9).masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(),
                                                                 float("-inf"))
    torch.testing.assert_close(acts["blocks.0.attn.pattern"], torch.softmax(scores, -1))


def test_non_approximate_is_spec3_by_default() -> None:
    """SPEC §3 as written: y_i = W_o Σ_{j ≤ i, same document} softmax_j(q_j·k_j/√d_h) v_j with
    q = SiLU(W_q u), k = W_k u, v = W_v u and no QK-norm, whatever `model.qk_norm` says;
    computed here in float64 with explicit sums over a packed batch."""
    torch.manual_seed(0)
    cfg = tiny("non_approximate", n_layers=1)
    assert cfg.qk_norm  # the base architecture's QK-norm is on, and must not reach this mixer
    model = LM(cfg).double().eval()
    randomise(model)
    mixer = model.blocks[0].attn
    assert mixer.q_norm is None and mixer.k_norm is None
    assert not any("q_norm" in k or "k_norm" in k for k in count_params(cfg).breakdown)
    B, T, d, H, Hkv, D = 2, 12, 32, 4, 2, 8
    with torch.no_grad():
        mixer.wq.weight.mul_(20.0)  # large, unbounded scores (what a QK-norm would bound)
        mixer.wk.weight.mul_(20.0)
    u = torch.randn(B, T, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    seg = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    from sanlab.model.attention import build_context

    with torch.no_grad():
        y = mixer(u, build_context(cfg, torch.zeros(B, T, dtype=torch.long), seg))
        Wq, Wk, Wv, Wo = (getattr(mixer, w).weight for w in ("wq", "wk", "wv", "wo"))
        expected = torch.zeros(B, T, d, dtype=torch.float64)
        largest = 0.0
        for b in range(B):
            for i in range(T):
                heads = []
                for h in range(H):
                    g = h // (H // Hkv)  # the KV head of query head h
                    js = [j for j in range(i + 1) if seg[b, j] == seg[b, i]]
                    scores = []
                    for j in js:
                        q = torch.nn.functional.silu(Wq[h * D:(h + 1) * D] @ u[b, j])
                        k = Wk[g * D:(g + 1) * D] @ u[b, j]
                        scores.append(sum(float(q[t] * k[t]) for t in range(D)) / math.sqrt(D))
                    top, largest = max(scores), max(largest, *map(abs, scores))
                    w = [math.exp(s_ - top) for s_ in scores]
                    heads.append(sum((w_ / sum(w)) * (Wv[g * D:(g + 1) * D] @ u[b, j]) for w_, j in zip(w, js)))
                expected[b, i] = Wo @ torch.cat(heads)
    assert largest > 5  # the scores are not bounded
    torch.testing.assert_close(y, expected, rtol=1e-9, atol=1e-9)


def test_non_approximate_qk_norm_is_its_own_option() -> None:
    """`mixer_options.qk_norm=true` normalises SiLU(q) and k per head, with the q/k gains in
    the accounting and the module; `model.qk_norm` does not decide it."""
    for base_qk in (False, True):
        on = tiny("non_approximate", qk_norm=base_qk, mixer_options={"qk_norm": True})
        off = tiny("non_approximate", qk_norm=base_qk)
        for cfg, has in ((on, True), (off, False)):
            model = LM(cfg)
            assert count_params(cfg).breakdown == count_module_params(model).breakdown
            assert ("blocks.0.attn.q_norm.weight" in dict(model.named_parameters())) == has
    torch.manual_seed(0)
    model = LM(tiny("non_approximate", n_layers=1, mixer_options={"qk_norm": True})).double().eval()
    randomise(model)
    mixer = model.blocks[0].attn
    tokens = torch.randint(0, 64, (1, 9))
    with torch.no_grad(), capture(model, ["blocks.0.attn.pattern"]) as acts:
        model(tokens)
        u = model.blocks[0].attn_norm(model.embed(tokens) * model.embed_scale)
        q = mixer.q_norm(torch.nn.functional.silu(mixer.wq(u)).view(1, 9, 4, 8))
        k = mixer.k_norm(mixer.wk(u).view(1, 9, 2, 8)).repeat_interleave(2, dim=2)
        s = (q * k).sum(-1).transpose(1, 2) / 8**0.5  # (1, H, T)
        scores = s[:, :, None, :].expand(1, 4, 9, 9).masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(),
                                                                 float("-inf"))
    torch.testing.assert_close(acts["blocks.0.attn.pattern"], torch.softmax(scores, -1))


def test_mlp_mixer_matches_the_attention_parameter_count() -> None:
    cfg = tiny("mlp")
    attn = sum(v for k, v in count_params(tiny()).breakdown.items() if k.startswith("attn.w"))
    mlp = sum(v for k, v in count_params(cfg).breakdown.items() if k.startswith("attn.w"))
    assert mlp == attn  # 8:4-style GQA (here 4:2): 3d² either way
    assert LM(cfg).blocks[0].attn.w_gate.weight.shape == (32, 32)


def test_static_emb_qk_reads_the_embeddings() -> None:
    """Q/K do not depend on the hidden state: with the previous layers' output changed,
    a StaticEmbQK layer's pattern is the same."""
    torch.manual_seed(0)
    model = LM(tiny("static_emb_qk", layout=["softmax", "static_emb_qk"])).eval()
    randomise(model)
    tokens = torch.randint(0, 64, (1, 10))
    with torch.no_grad(), capture(model, ["blocks.1.attn.pattern"]) as a:
        model(tokens)
    with torch.no_grad():
        model.blocks[0].attn.wo.weight.mul_(5.0)
    with torch.no_grad(), capture(model, ["blocks.1.attn.pattern"]) as b:
        model(tokens)
    torch.testing.assert_close(a["blocks.1.attn.pattern"], b["blocks.1.attn.pattern"])


@pytest.mark.parametrize("mixer", ["rnd_emb_qk", "fixed_seq_qk"])
def test_stream_qk_patterns_are_input_independent(mixer: str) -> None:
    """RndEmbQK / FixedSeqQK: the pattern is the same for any input of the same length."""
    torch.manual_seed(0)
    model = LM(tiny(mixer)).eval()
    randomise(model)
    pats = []
    for seed in (0, 1):
        tokens = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad(), capture(model, ["blocks.*.attn.pattern"]) as acts:
            model(tokens)
        pats.append(acts)
    for name in pats[0]:
        torch.testing.assert_close(pats[0][name], pats[1][name])


def _mixer_calls(model: LM, tokens: torch.Tensor, seg: torch.Tensor) -> tuple[list, torch.Tensor]:
    """Run `model` and return every call of layer 0's mixer as (u, y) (the fixed pass of a
    stream-QK model calls it first, the real batch last) and the layer's pattern."""
    calls = []
    handle = model.blocks[0].attn.register_forward_hook(lambda m, args, out: calls.append((args[0], out)))
    try:
        with capture(model, ["blocks.0.attn.pattern"]) as acts:
            model(tokens, seg)
    finally:
        handle.remove()
    return calls, acts["blocks.0.attn.pattern"]


def _v_path(mixer: SoftmaxAttention, A: torch.Tensor, u: torch.Tensor, wv: torch.Tensor) -> torch.Tensor:
    """W_o(A · W_v u): the mixer's output for pattern A with V from u. (B, T, d)"""
    B, T, _ = u.shape
    H, Hkv, D = mixer.n_heads, mixer.n_kv_heads, mixer.head_dim
    v = (u @ wv.T).view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D)
    return (A @ v).transpose(1, 2).reshape(B, T, H * D) @ mixer.wo.weight.T


@pytest.mark.parametrize("mixer", ["rnd_emb_qk", "fixed_seq_qk", "static_emb_qk"])
def test_stream_qk_takes_v_from_the_real_hidden_state(mixer: str) -> None:
    """SPEC §3: Q and K from the fixed / static stream, V from the real hidden state. The
    layer's output is W_o(A · W_v u) with u its real normalised input; the gradient w.r.t.
    W_v is that formula's; and a different fixed stream changes A but not the V path."""
    torch.manual_seed(0)
    model = LM(tiny(mixer, n_layers=1, mixer_options=OPTIONS.get(mixer, {}))).double()
    randomise(model)
    m = model.blocks[0].attn
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    seg = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    calls, A = _mixer_calls(model, tokens, seg)
    u, y = calls[-1]
    with torch.no_grad():
        real_u = model.blocks[0].attn_norm(model.embed(tokens) * model.embed_scale)
    torch.testing.assert_close(u, real_u)  # the real batch's call sees the real input
    torch.testing.assert_close(y, _v_path(m, A, real_u, m.wv.weight))
    R = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (grad,) = torch.autograd.grad((y * R).sum(), m.wv.weight)
    wv = m.wv.weight.detach().clone().requires_grad_(True)
    (formula,) = torch.autograd.grad((_v_path(m, A, real_u, wv) * R).sum(), wv)
    torch.testing.assert_close(grad, formula)
    if mixer == "static_emb_qk":
        return
    # another fixed stream: the pattern moves, the V path stays the real input's
    own = m.fixed_input

    def shifted(*args, **kw):  # noqa: ANN002, ANN003
        x = own(*args, **kw)
        return x * 3.0 + torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(4))

    m.fixed_input = shifted
    calls2, A2 = _mixer_calls(model, tokens, seg)
    assert (A2 - A).abs().max() > 1e-3
    torch.testing.assert_close(calls2[-1][0], real_u)
    torch.testing.assert_close(calls2[-1][1], _v_path(m, A2, real_u, m.wv.weight))


def test_fixed_seq_qk_stream_is_what_the_model_computes_for_its_sequence() -> None:
    """SPEC §3 FixedSeqQK: layer i's Q/K come from the hidden state the model computes at
    layer i for the fixed sequence, as a plain model (Q and K from each layer's own input)
    computes it; that sequence enters block 0 like every real token does, embedded and
    scaled by √d. The same weights in a softmax model, run on the fixed sequence, give each
    layer's recorded stream; beyond layer 0 (whose input is normalised, so a dropped scale
    hides there) the residual carries the scale through."""
    torch.manual_seed(0)
    cfg = tiny("fixed_seq_qk", n_layers=3)
    model = LM(cfg).double()
    randomise(model)
    plain = LM(tiny("softmax", n_layers=3)).double()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(k.endswith("attn.tokens") for k in unexpected)
    T = 16
    seq = model.blocks[0].attn.tokens[:T][None]
    inputs: dict[int, torch.Tensor] = {}
    handles = [b.attn.register_forward_hook(lambda m, args, out, i=i: inputs.__setitem__(i, args[0]))
               for i, b in enumerate(plain.blocks)]
    try:
        with torch.no_grad():
            plain(seq)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        stream = fixed_stream(model, T, seq.device)
    assert sorted(stream) == [0, 1, 2]
    for i in range(3):
        torch.testing.assert_close(stream[i], inputs[i], rtol=1e-12, atol=1e-12)


def test_fixed_seq_qk_without_data_has_no_sequence() -> None:
    """Built without data: accounting and building work, a forward pass is a clear error
    (never random ids in its place)."""
    cfg = tiny("fixed_seq_qk", mixer_options={"seq_len": 24})  # the default sequence="data"
    model = LM(cfg)
    assert count_params(cfg).breakdown == count_module_params(model).breakdown
    assert (model.blocks[0].attn.tokens == UNSET).all()
    with pytest.raises(ConfigError, match="fixed_seq_qk: no fixed sequence"):
        model(torch.randint(0, 64, (1, 8)))
    model.bind_data(lambda n: torch.arange(8, 8 + min(n, 10)), seq_len=10)  # a held-out split of 10 tokens
    assert model(torch.randint(0, 64, (1, 10))).shape == (1, 10, 64)
    with pytest.raises(ConfigError, match="rows of 12 tokens, but its fixed sequence holds 10"):
        model(torch.randint(0, 64, (1, 12)))


def test_fixed_seq_qk_takes_the_first_held_out_document(train_data_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`sanlab train` (relative paths, from the working directory) binds the fixed sequence
    to the held-out split of data.dir: its first document, then the next ones up to
    `seq_len` tokens; the checkpoint carries it to a model rebuilt from the run dir."""
    import os

    from safetensors.torch import load_file

    from sanlab.analysis.rundir import RunDir
    from sanlab.data.regions import BOS_ID, EOS_ID
    from sanlab.data.shards import unpack_documents

    monkeypatch.chdir(tmp_path)
    data = os.path.relpath(train_data_dir, tmp_path)
    argv = ["train", f"data.dir={data}", "data.seq_len=32", "train.steps=2", "train.eval_every=0",
            "model.d_model=32", "model.n_layers=2", "model.vocab_size=320", "model.mixer=fixed_seq_qk",
            "model.mixer_options.seq_len=64", "--out", "run"]
    assert main(argv) == 0
    docs = unpack_documents(train_data_dir, "val")
    stream = torch.from_numpy(__import__("numpy").concatenate(docs))[:64]
    first = torch.from_numpy(docs[0])
    assert first[0] == BOS_ID and first[-1] == EOS_ID
    saved = load_file("run/checkpoints/latest/model.safetensors")
    for i in range(2):
        seq = saved[f"blocks.{i}.attn.tokens"]
        assert torch.equal(seq, stream)
        n = min(len(first), 64)
        assert torch.equal(seq[:n], first[:n])  # the first held-out document (cut at seq_len if longer)
    model = RunDir.open("run").load_model("latest")
    assert torch.equal(model.blocks[0].attn.tokens, stream)
    model(torch.randint(0, 320, (1, 32)))  # a rebuilt model runs without the data


def test_fixed_seq_qk_bad_lengths_are_one_line(train_data_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", f"data.dir={train_data_dir}", "data.seq_len=32", "train.steps=1", "model.d_model=32",
            "model.n_layers=1", "model.vocab_size=320", "model.mixer=fixed_seq_qk",
            "model.mixer_options.seq_len=16", "--out", str(tmp_path / "run")]
    assert "fixed_seq_qk: rows of 32 tokens, but its fixed sequence holds model.mixer_options.seq_len=16" in \
        _error(capsys, *argv)
    assert not (tmp_path / "run").exists()  # refused before the run dir is written


# --------------------------------------------------------------------------- freezes


QK_GAINS = ("attn.q_norm.weight", "attn.k_norm.weight")


@pytest.mark.parametrize("target,names", [
    ("qk", ("attn.wq.weight", "attn.wk.weight", *QK_GAINS)),  # Frozen-QK: everything that shapes the scores
    ("qk_proj", ("attn.wq.weight", "attn.wk.weight")),  # the narrower freeze: the gains train
    ("mlp", ("ffn.w_gate.weight", "ffn.w_up.weight", "ffn.w_down.weight")),
])
def test_frozen_weights_stay_bit_identical_without_optimizer_state(target: str, names: tuple[str, ...]) -> None:
    """After optimizer steps the frozen parameters are bit-identical and have no optimizer
    state; every other parameter (the QK-norm gains under `qk_proj` included) has moved."""
    torch.manual_seed(0)
    model = LM(tiny("softmax", "swiglu"))
    frozen = model.freeze([target])
    assert frozen == [f"blocks.{i}.{n}" for i in range(2) for n in names]
    before = {n: p.clone() for n, p in model.named_parameters()}
    opts = _steps(model)
    state_params = {id(p) for o in opts.optimizers for p in o.state}
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, before[n]), n
            assert id(p) not in state_params and not p.requires_grad, n
        else:
            assert not torch.equal(p, before[n]), n
    assert {n for n, _ in route(model)["frozen"]} == set(frozen)


@pytest.mark.parametrize("mixer", [m for m in MIXERS if issubclass(mixers.MIXERS[m], SoftmaxSpec)])
def test_frozen_qk_takes_the_gains_in_every_mixer_that_has_them(mixer: str) -> None:
    """`qk` freezes W_q, W_k and the q/k gains wherever they exist (non-approximate has
    gains only with its own QK-norm); `qk_proj` never the gains."""
    for opts in ({**OPTIONS.get(mixer, {})}, {"qk_norm": True}) if mixer == "non_approximate" else (OPTIONS.get(mixer, {}),):
        model = LM(tiny(mixer, layout="hybrid", mixer_options=opts))
        gains = {f"blocks.{i}.{n}" for i in range(2) for n in QK_GAINS} & {n for n, _ in model.named_parameters()}
        proj = {f"blocks.{i}.attn.{w}.weight" for i in range(2) for w in ("wq", "wk")}
        assert gains or (mixer == "non_approximate" and not opts.get("qk_norm"))
        assert set(model.freeze(["qk"])) == proj | gains, opts
        other = LM(tiny(mixer, layout="hybrid", mixer_options=opts))
        assert set(other.freeze(["qk_proj"])) == proj


@pytest.mark.parametrize("cfg,target", [(tiny("mixit", "swiglu"), "qk"), (tiny("softmax"), "mlp"),
                                        (tiny("mlp", "none"), "qk")])
def test_freezing_what_the_model_lacks_is_an_error(cfg: ModelConfig, target: str) -> None:
    with pytest.raises(ConfigError, match=f"nothing to freeze for '{target}'"):
        LM(cfg).freeze([target])


# --------------------------------------------------------------------------- bad input through the CLI


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == EXIT_USAGE
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sanlab: error: "), captured.err
    return lines[0]


@pytest.mark.parametrize("argv,needle", [
    (["mixer=nope"], "unknown sequence mixer 'nope'"),
    (["layout=zigzag"], "unknown layout 'zigzag'"),
    (["n_layers=2", 'layout=["softmax","mlp","softmax"]'], "3 mixers listed for n_layers=2"),
    (["n_layers=2", "layout=softmax,nope"], "unknown sequence mixer 'nope'"),
    (["mixer=mixit", "model.mixer_options.foo=1"], "mixer_options (mixer mixit): foo: unknown key"),
    (["mixer=mixit", "model.mixer_options.seq_len=abc"], "seq_len"),
    (["model.mixer_options.seed=1"], "mixer_options (mixer softmax): seed: unknown key"),
    (["state_mixer=geglu"], "unknown state mixer 'geglu'"),
    (["ffn=maybe"], "ffn"),
])
def test_bad_variant_input_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert needle in _error(capsys, "match", "--preset", "tiny", *argv)


def test_mixer_names_and_options_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    """A config naming an unregistered mixer, or options its mixer does not have, is refused
    when it loads (one ConfigError naming the key), before any model or accounting."""
    from sanlab.config import Config, load_config, validate

    with pytest.raises(ConfigError, match=r"^config: model: mixer: unknown sequence mixer 'nope'"):
        validate(Config, {"model": {"mixer": "nope"}})
    with pytest.raises(ConfigError, match=r"^config: model: layout: unknown sequence mixer 'nope'"):
        validate(Config, {"model": {"n_layers": 2, "layout": ["softmax", "nope"]}})
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\nmixer = "mixit"\nmixer_options = {seq_len = 0}\n')
    with pytest.raises(ConfigError, match=r"mixer_options \(mixer mixit\): seq_len: Input should be greater than 0"):
        load_config(toml)
    with pytest.raises(ConfigError, match="unknown state mixer 'geglu'"):
        validate(ModelConfig, {"state_mixer": "geglu"})


@pytest.mark.parametrize("overrides,needle", [
    (["model.mixer=mixit", "model.mixer_options.seq_len=64", 'train.freeze=["qk"]'], "nothing to freeze for 'qk'"),
    (['train.freeze=["mlp"]'], "nothing to freeze for 'mlp'"),
    (['train.freeze=["attention"]'], "train.freeze.0: Input should be 'qk', 'qk_proj' or 'mlp'"),
])
def test_bad_freeze_through_train_is_one_line(train_data_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str], overrides: list[str],
                                             needle: str) -> None:
    argv = ["train", f"data.dir={train_data_dir}", "data.seq_len=32", "train.steps=1", "model.d_model=32",
            "model.n_layers=1", "model.vocab_size=320", *overrides, "--out", str(tmp_path / "run")]
    assert needle in _error(capsys, *argv)


# --------------------------------------------------------------------------- sanlab analyze on every mixer


@pytest.mark.parametrize("mixer", MIXERS)
def test_analyze_works_on_every_mixer(mixer: str, train_data_dir: Path, tmp_path: Path) -> None:
    """Attention metrics for the layers that have a pattern (the hybrid's softmax layers, and
    the variant's where it has one), stream statistics incl. the largest activation per layer."""
    import json

    from analysis_rundirs import write_run

    opts = {"mixit": {"seq_len": 32}, "fixed_seq_qk": {"sequence": "random", "seq_len": 32}}.get(
        mixer, OPTIONS.get(mixer, {}))
    cfg = tiny(mixer, "swiglu", "hybrid", vocab_size=320, mixer_options=opts)
    keep = {"latest": lambda m: None, "milestone-000": lambda m: None, "milestone-100": lambda m: None}
    run = write_run(tmp_path / "run", cfg, checkpoints=keep, data_dir=train_data_dir)
    assert main(["analyze", str(run), "--out", str(tmp_path / "out"), "--eval-rows", "4"]) == 0
    res = json.loads((tmp_path / "out" / "analysis.json").read_text())["runs"]["run"]
    layers = sorted(r["layer"] for r in res["attention"]["layers"])
    assert layers == ([0, 1] if mixers.MIXERS[mixer].has_pattern else [0])
    entropy = {r["layer"]: r["entropy"] for r in res["attention"]["layers"]}
    assert entropy[0] > 0
    if mixer == "mixit":  # signed mixing weights: entropy undefined (NaN → null), not −inf; the sink head is a distribution
        heads = {r["head"]: r["entropy"] for r in res["attention"]["heads"] if r["layer"] == 1}
        assert heads[0] > 0 and all(heads[h] is None for h in (1, 2, 3))
    stream = res["stream"]
    rows = stream["rows"] if isinstance(stream, dict) and "rows" in stream else stream
    peaks = [r["max_abs"] for r in (rows if isinstance(rows, list) else [])]
    assert len(peaks) == cfg.n_layers + 1 and all(p > 0 for p in peaks)
    types = {r["type"] for r in res["spectra"]["per_type"]}
    assert {"Q", "K", "V", "O", "gate", "up", "down"} <= types  # (the hybrid's softmax layer has Q/K)
    if mixer == "mlp":
        assert "attn.w_gate" in types  # a variant's own matrices keep their path


def test_old_configs_keep_loading() -> None:
    """A config.json written before state_mixer / layout existed (ffn + ffn_type) loads as before."""
    from sanlab.config import Config, validate

    old = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 64, "ffn": True,
                     "ffn_type": "swiglu", "mixer": "softmax"}, "train": {"steps": 2}}
    cfg = validate(Config, old)
    assert (cfg.model.state_mixer, cfg.model.ffn, cfg.model.layer_mixers) == ("swiglu", True, ["softmax"] * 2)
    san = validate(Config, {**old, "model": {**old["model"], "ffn": False}})
    assert (san.model.state_mixer, san.model.ffn) == ("none", False)
    assert validate(Config, cfg.model_dump()) == cfg  # and the new dump round-trips


def test_layouts_place_the_standard_layers() -> None:
    """SPEC §3's placements name where the standard (softmax) layers go; `hybrid` = `even`."""
    from sanlab.matching import model_label

    expected = {  # 8 layers: S = softmax, v = the variant
        "uniform": "vvvvvvvv", "hybrid": "SvSvSvSv", "even": "SvSvSvSv", "odd": "vSvSvSvS",
        "top": "vvvvSSSS", "bottom": "SSSSvvvv", "middle": "vvSSSSvv", "every4": "SvvvSvvv",
        "first": "Svvvvvvv", "last": "vvvvvvvS", "first_last": "SvvvvvvS",
    }
    for layout, pattern in expected.items():
        cfg = ModelConfig(n_layers=8, d_model=128, mixer="non_approximate", layout=layout)
        assert "".join("S" if m == "softmax" else "v" for m in cfg.layer_mixers) == pattern, layout
    hyb = ModelConfig(n_layers=8, d_model=128, mixer="non_approximate", layout="hybrid")
    assert model_label(hyb) == "hyb-nonapprox-8L d128, no FFN"
    assert model_label(hyb.model_copy(update={"layout": "uniform", "ffn": True})) == "nonapprox-8L d128, d_ff 512"
    assert model_label(ModelConfig(n_layers=2, layout=["softmax", "mixit"])) == "mixed-mixit-2L d128, no FFN"
    assert model_label(ModelConfig(n_layers=8, d_model=128)) == "8L d128, no FFN"  # softmax labels unchanged


def test_old_run_dir_is_the_same_run(tmp_path: Path) -> None:
    """A finished run whose config.json predates state_mixer / layout (ffn, ffn_type, no
    layout keys) is recognised as the same run, not refused as a different config."""
    import json

    from sanlab.config import Config
    from sanlab.train import rundir

    cfg = Config(model=tiny("softmax", "swiglu"))
    stored = rundir.config_json(cfg)
    for key in ("state_mixer", "layout", "mixer_options"):
        stored["model"].pop(key)
    stored["model"] |= {"ffn": True, "ffn_type": "swiglu"}
    stored["train"].pop("freeze")
    (tmp_path / "config.json").write_text(json.dumps(stored))
    (tmp_path / "meta.json").write_text(json.dumps({"status": "completed"}))
    assert rundir.decide(tmp_path, cfg, resume=False, force=False).action == "done"
    other = Config(model=tiny("softmax", "none"))
    with pytest.raises(ConfigError, match="different config: model.state_mixer"):
        rundir.decide(tmp_path, other, resume=False, force=False)


def test_run_dir_from_before_ns_precision_ran_bf16_iterations(tmp_path: Path) -> None:
    """A config.json without optim.ns_precision (written before the key) is a run whose
    Newton–Schulz iterations ran in bf16: the same run as ns_precision=bf16, a different
    one from fp32."""
    import json

    from sanlab.config import Config
    from sanlab.train import rundir

    cfg = Config.model_validate({"model": tiny("softmax", "none").model_dump(), "optim": {"ns_precision": "bf16"}})
    stored = rundir.config_json(cfg)
    stored["optim"].pop("ns_precision")
    (tmp_path / "config.json").write_text(json.dumps(stored))
    (tmp_path / "meta.json").write_text(json.dumps({"status": "completed"}))
    assert rundir.decide(tmp_path, cfg, resume=False, force=False).action == "done"
    fp32 = cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"ns_precision": "fp32"})})
    with pytest.raises(ConfigError, match="different config: optim.ns_precision"):
        rundir.decide(tmp_path, fp32, resume=False, force=False)


@pytest.mark.parametrize("mixer,options,key,before", [
    ("mixit", {"seq_len": 24}, "sigma_length", "row"),
    ("fixed_seq_qk", {}, "sequence", "random"),
    ("non_approximate", {}, "qk_norm", True),
])
def test_run_dir_from_before_a_default_changed_says_what_it_ran(tmp_path: Path, mixer: str, options: dict,
                                                                key: str, before: object) -> None:
    """A run dir written before a variant's option existed ran the old construction: it is not
    the same run as today's default, and it is the same run as that option set explicitly.
    Today's config.json stores every option of the mixer."""
    import json

    from sanlab.config import Config
    from sanlab.train import rundir

    cfg = Config(model=tiny(mixer, "swiglu", mixer_options=options))
    stored = rundir.config_json(cfg)
    assert key in stored["model"]["mixer_options"]
    stored["model"]["mixer_options"] = dict(options)  # as such runs wrote it
    (tmp_path / "config.json").write_text(json.dumps(stored))
    (tmp_path / "meta.json").write_text(json.dumps({"status": "completed"}))
    with pytest.raises(ConfigError, match=re.escape(f"different config: model.mixer_options.{key} ({before!r} in the run dir")):
        rundir.decide(tmp_path, cfg, resume=False, force=False)
    old = Config(model=tiny(mixer, "swiglu", mixer_options={**options, key: before}))
    assert rundir.decide(tmp_path, old, resume=False, force=False).action == "done"
    (tmp_path / "config.json").write_text(json.dumps(rundir.config_json(cfg)))
    assert rundir.decide(tmp_path, cfg, resume=False, force=False).action == "done"  # today's: the same run


def test_a_study_times_a_fixed_seq_qk_arm_without_data() -> None:
    """Timing a step (study plans) needs no data: stand-in ids for the fixed sequence, and
    a row longer than the sequence is refused there as in training."""
    from sanlab.config import Config
    from sanlab.study.speed import _time_config

    base = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 64,
                      "mixer": "fixed_seq_qk", "mixer_options": {"seq_len": 32}},
            "data": {"seq_len": 32}, "train": {"batch_rows": 4, "steps": 1}}
    timing = _time_config(Config.model_validate(base).model_dump(mode="json"), 1)
    assert timing["step_s"] > 0 and timing["tokens_per_s"] == pytest.approx(4 * 32 / timing["step_s"])
    too_long = {**base, "data": {"seq_len": 48}}
    with pytest.raises(ConfigError, match="rows of 48 tokens"):
        _time_config(Config.model_validate(too_long).model_dump(mode="json"), 1)
