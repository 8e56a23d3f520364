#!/usr/bin/env python3
"""A mutation check of the test suite: plant one small bug at a time, run the tests that
should catch it, and report which bugs got through.

Each mutant is (file, original snippet, mutated snippet, test files). The snippet must
occur exactly once in the current file; a mutant whose snippet is missing or ambiguous
(the code moved) is reported as *stale*, never as caught, and the default suite checks
that no mutant is stale (tests/test_mutate.py). Mutants are applied to a temporary copy
of the repository (one per job), so the working tree is never touched; the copy's `src`
comes first on PYTHONPATH, so the tests import the mutated code.

    python scripts/mutate.py                 # every mutant, 2 jobs (`make mutate`)
    python scripts/mutate.py --list          # the mutants, their test files, the per-module counts
    python scripts/mutate.py --module eval   # one module's mutants (comma-separated: eval,probes)
    python scripts/mutate.py --only clip,pad # mutants whose name contains a word given

Every mutant belongs to a module (`module_of`: a package under src/sanlab/, a top-level
module there, `variants` for the sequence mixers, `generate` for decoding, `scripts`,
`benchmarks`); the run ends with a table of mutants and caught per module, every module
of the tree listed (0 where it has none, so the gaps show). Mutants found to be
equivalent (no behaviour can change) are kept in EQUIVALENT with the reason, never run
and never counted.

Outcome per mutant: caught (a test failed, errored or timed out), survived (every test
passed: the diff is printed), stale. Exit status 0 when every mutant is caught, 1 when
any survived or is stale, 2 when the unmutated tree already fails its tests.
"""

from __future__ import annotations

import argparse
import difflib
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    original: str
    mutated: str
    tests: tuple[str, ...]  # test files (or node ids) run with -x, in this order
    what: str  # the bug, in words
    needs: str = ""  # hardware its code path needs ("amx", "avx512", "avx512bf16", "sleef-exp": torch's vector
    #                  exp is SLEEF's, x86 with AVX2 or AVX-512): elsewhere it is untestable

    @property
    def module(self) -> str:
        return module_of(self.path)

    def apply(self, text: str) -> str | None:
        """The mutated file text, or None when the snippet is not exactly once in `text`."""
        if text.count(self.original) != 1:
            return None
        return text.replace(self.original, self.mutated)


def module_of(path: str) -> str:
    """The module a file belongs to in the per-module table: `src/sanlab/PKG/...` -> PKG,
    `src/sanlab/NAME.py` -> NAME; the sequence mixers (the variants) and decoding are
    their own rows apart from the rest of `model`; `scripts/...` -> scripts,
    `benchmarks/...` -> benchmarks."""
    parts = path.split("/")
    if parts[:2] == ["src", "sanlab"] and len(parts) > 2:
        if parts[2:4] in (["model", "mixers.py"], ["model", "mixers"]):
            return "variants"
        if parts[2:4] == ["model", "generate.py"]:
            return "generate"
        return parts[2].removesuffix(".py")
    return parts[0]


def tree_modules(root: Path) -> list[str]:
    """Every module of the tree at `root`, in table order: src/sanlab's packages and
    top-level modules (variants and generate after model), then scripts and benchmarks."""
    pkg = root / "src" / "sanlab"
    names = sorted(p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    names += sorted(p.stem for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__"))
    if "model" in names:
        i = names.index("model") + 1
        names[i:i] = ["variants", "generate"]
    return names + [d for d in ("scripts", "benchmarks") if (root / d).is_dir()]


T = "tests/"
M = Mutant
MALFORMED = (T + "test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing",)  # the table
MUTANTS: tuple[Mutant, ...] = (
    # ---- the seven bugs of the issue that the suite used to let through
    M("trainer-clip-off", "src/sanlab/train/trainer.py",
      "grad_norm = clip_grad_norm(optims.params(), cfg.optim.grad_clip)",
      "grad_norm = clip_grad_norm(optims.params(), 0.0)",
      (T + "test_catches_trainer.py", T + "test_train_loop.py"), "the trainer never clips the gradient norm"),
    M("tokenizer-sees-val", "src/sanlab/data/prepare.py",
      "sample = [d.plain_text() for i, d in buffered if not is_val(cfg.seed, i, cfg.val_frac)]",
      "sample = [d.plain_text() for i, d in buffered]",
      (T + "test_catches_data.py", T + "test_data_prepare.py"), "the BPE is trained on validation documents too"),
    M("noise-pair-shifted", "src/sanlab/study/table.py",
      "        la = _loss(records, run_id(arm, opt, lr_arm, tokens, seed, slug))",
      "        la = _loss(records, run_id(arm, opt, lr_arm, tokens,\n"
      "                                   seeds[(seeds.index(seed) + 1) % len(seeds)] if role == \"noise\" else seed,"
      " slug))",
      (T + "test_catches_study.py", T + "test_study_orchestrate.py"), "the noise-floor pair is shifted by one seed"),
    M("multihop-first-hop", "src/sanlab/data/synth.py",
      "final = hops[-1][2]",
      "final = hops[0][2]",
      (T + "test_data_synth.py",), "a multihop answer is the first hop's value"),
    M("pad-eos-swapped", "src/sanlab/data/regions.py",
      "SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, BOS, UNK,",
      "SPECIAL_TOKENS: tuple[str, ...] = (EOS, PAD, BOS, UNK,",
      (T + "test_catches_data.py", T + "test_data_tokenizer.py"), "<pad> and <eos> swap ids"),
    M("accum-one-over-n", "src/sanlab/train/trainer.py",
      "(loss * (n * d.world_size / max(n_total, 1.0))).backward()",
      "(loss / len(micro)).backward()",
      (T + "test_catches_trainer.py", T + "test_train_loop.py"), "micro-batch losses weighted 1/n, not by tokens"),
    M("rope-no-restart", "src/sanlab/model/attention/context.py",
      "    positions = masks.segment_positions(segment_ids)\n    cos, sin = rope_tables(",
      "    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)\n"
      "    cos, sin = rope_tables(",
      (T + "test_catches_model.py", T + "test_model.py"), "RoPE positions do not restart per document"),
    # ---- model
    M("embed-unscaled", "src/sanlab/model/lm.py",
      "self.embed_scale = math.sqrt(cfg.d_model)", "self.embed_scale = 1.0",
      (T + "test_model.py",), "the embedding is not scaled by sqrt(d)"),
    M("out-init-unscaled", "src/sanlab/model/lm.py",
      "out_std = s / math.sqrt(2 * self.cfg.n_layers)", "out_std = s / math.sqrt(self.cfg.n_layers)",
      (T + "test_model.py",), "W_o / W_down init std is s/sqrt(L), not s/sqrt(2L)"),
    M("gate-init-one", "src/sanlab/model/blocks.py",
      "                getattr(self, f\"{sub}_gate\").zero_()",
      "                getattr(self, f\"{sub}_gate\").fill_(1.0)",
      (T + "test_model.py",), "residual gates start at 1, not 0"),
    M("zcn-not-centred", "src/sanlab/model/layers.py",
      "1.0 + gain if self.zero_centered else gain", "gain",
      (T + "test_model.py",), "ZCN applies γ instead of 1 + γ"),
    M("rmsnorm-sum-not-mean", "src/sanlab/model/norms.py",
      "r = torch.linalg.vecdot(x, x).unsqueeze(-1).div_(d).add_(eps).rsqrt_()",
      "r = torch.linalg.vecdot(x, x).unsqueeze(-1).add_(eps).rsqrt_()",
      (T + "test_model.py",), "RMS norm divides by the root of the sum of squares, not the mean"),
    M("rmsnorm-backward-sign", "src/sanlab/model/norms.py",
      "c = torch.linalg.vecdot(dyg, x).unsqueeze(-1).mul_(r.pow(3)).div_(-d)",
      "c = torch.linalg.vecdot(dyg, x).unsqueeze(-1).mul_(r.pow(3)).div_(d)",
      (T + "test_model.py",), "RMS norm's hand-written backward has a sign error"),
    M("rope-backward-forward", "src/sanlab/model/kernels.py",
      "return rope_rotate(dy, c, s, -1.0), None, None", "return rope_rotate(dy, c, s, 1.0), None, None",
      (T + "test_model.py",), "RoPE's backward rotates forward instead of back"),
    M("gate-backward", "src/sanlab/model/kernels.py",
      "dg = (1 - s) * torch.linalg.vecdot", "dg = s * torch.linalg.vecdot",
      (T + "test_model.py",), "the σ(g) residual's gate gradient uses σ instead of σ(1 − σ)"),
    M("mask-sees-future", "src/sanlab/model/attention/masks.py",
      "seen = (q >= k) & (doc_q == doc_k)", "seen = (q + 1 >= k) & (doc_q == doc_k)",
      (T + "test_model.py",), "the mask function lets a token see the next one"),
    M("mask-crosses-documents", "src/sanlab/model/attention/masks.py",
      "seen = (q >= k) & (doc_q == doc_k)", "seen = (q >= k) & (doc_q >= doc_k)",
      (T + "test_model.py",), "the mask function lets a document attend to earlier documents"),
    # ---- loss
    M("zloss-not-squared", "src/sanlab/model/loss.py",
      "return ce + z_loss * (lse.square() * weights).sum(), ce", "return ce + z_loss * (lse * weights).sum(), ce",
      (T + "test_model.py",), "z-loss uses logsumexp, not its square"),
    M("fused-zloss-grad", "src/sanlab/model/loss.py",
      "scale = 1.0 + 2.0 * c * lse", "scale = 1.0 + c * lse",
      (T + "test_model.py",), "the fused loss's z-loss gradient is off by a factor 2"),
    M("fused-mean-over-all", "src/sanlab/model/loss.py",
      "    weights = mask / mask.sum().clamp_min(1.0)\n    with torch.autocast(dev, enabled=False):",
      "    weights = mask / mask.numel()\n    with torch.autocast(dev, enabled=False):",
      (T + "test_model.py",), "the fused loss averages over every token, masked ones included"),
    M("fused-lse-underflow", "src/sanlab/model/loss.py",
      "    if bool(tiny.any()):", "    if False:",
      (T + "test_model.py",), "the fused loss takes lse = x_t − log p_t even where p_t underflows (CPU)"),
    M("fused-lse-underflow-sync-free", "src/sanlab/model/loss.py",
      "return torch.where(tiny, torch.logsumexp(logits, dim=-1), lse)", "return torch.where(tiny, lse, torch.logsumexp(logits, dim=-1))",
      (T + "test_model.py",), "the accelerators' lse fallback keeps the wrong side"),
    M("attn-delta-from-bf16-output", "src/sanlab/model/attention/explicit.py",
      "delta = torch.linalg.vecdot(do5, out).unsqueeze(-1)",
      "delta = torch.linalg.vecdot(do5, out.bfloat16().to(out.dtype)).unsqueeze(-1)",
      (T + "test_model.py",), "the backward's δ = rowsum(dO ⊙ O) from the output rounded to bf16"),
    # ---- the compiled kernels (csrc/): rebuilt from the mutated source on first use
    M("fused-amx-sees-next-token", "src/sanlab/model/csrc/attention_amx.c",
      "ok ? st[i] - lo : n1, ok ? i + 1 - lo : n1,", "ok ? st[i] - lo : n1, ok ? i + 2 - lo : n1,",
      (T + "test_native.py",), "the AMX forward lets a token see the next one", needs="amx"),
    M("fused-fp32-sees-next-token", "src/sanlab/model/csrc/attention.c",
      "softmax_row(Sm + (long)r * s.Tp, n0, n1, st[i] - lo, i + 1 - lo, &mx[r])",
      "softmax_row(Sm + (long)r * s.Tp, n0, n1, st[i] - lo, i + 2 - lo, &mx[r])",
      (T + "test_native.py",), "the portable forward lets a token see the next one"),
    M("fused-crosses-documents", "src/sanlab/model/csrc/attention.c",
      "grad_row(Pm + (long)r * s.Tp, dSm + (long)r * s.Tp, n0, n1, st[i] - lo, i + 1 - lo,",
      "grad_row(Pm + (long)r * s.Tp, dSm + (long)r * s.Tp, n0, n1, 0, i + 1 - lo,",
      (T + "test_native.py",), "the portable backward lets a row see the previous document"),
    M("fused-amx-split-dropped", "src/sanlab/model/csrc/attention_amx.c",
      "    if (al) t[n++] = (Term){al, lda, bh, ldb};\n", "",
      (T + "test_native.py",), "the AMX products drop the a_lo·b_hi term (bf16 accuracy)", needs="amx"),
    M("fused-amx-transpose-lanes-swapped", "src/sanlab/model/csrc/attention_amx.c",
      "r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);", "r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);",
      (T + "test_native.py",), "the AMX kernels' 16×16 word transpose repeats a column", needs="amx"),
    M("fused-amx-product-half-width", "src/sanlab/model/csrc/attention_amx.c",
      "const int two = w > 16;", "const int two = w > 32;",
      (T + "test_native.py",), "a 32-column block of P·V or dS·K past the first is computed 16 wide", needs="amx"),
    M("fused-amx-dd-drops-partial-block", "src/sanlab/model/csrc/attention_amx.c",
      "const int Dd = (int)round_up(D, 16); /* the columns of d the products need: the rest is padding */",
      "const int Dd = D / 16 * 16; /* the columns of d the products need: the rest is padding */",
      (T + "test_native.py",), "the AMX backward's key-side products skip d past the last whole 16", needs="amx"),
    M("fused-amx-masked-exp-one", "src/sanlab/model/csrc/attention_amx.c",
      "(__m512)vexp((vf)_mm512_loadu_ps(x) - c)) : _mm512_setzero_ps();",
      "(__m512)vexp((vf)_mm512_loadu_ps(x) - c)) : _mm512_set1_ps(1.0f);",
      (T + "test_native.py",), "a 16-key group with no allowed key gets P = 1 instead of 0", needs="amx"),
    M("bf16-store-subnormals-to-zero", "src/sanlab/model/csrc/common.h",
      "if (!_mm512_fpclass_ps_mask((__m512)x, 0x20)) {", "if (1) {",
      (T + "test_native.py::test_the_kernels_bf16_stores_round_as_torch_does_subnormals_included",),
      "the kernels' bf16 stores take VCVTNEPS2BF16 for every vector (subnormals become zero)", needs="avx512bf16"),
    M("vexp-scalef-unmasked", "src/sanlab/model/csrc/common.h",
      "return (vf)_mm512_maskz_scalef_ps(normal, (__m512)p, (__m512)n);", "(void)normal; return (vf)_mm512_scalef_ps((__m512)p, (__m512)n);",
      (T + "test_native.py::test_the_vector_exp_equals_its_integer_exponent_form",),
      "exp's VSCALEFPS keeps the lanes below −87.3 (−inf gives NaN)", needs="avx512"),
    M("fused-lse-without-log-sum", "src/sanlab/model/csrc/attention.c",
      "a->lse[((long)b * s.H + h) * T + i0 + m + r] = mx[r] + logf(l[r]);",
      "a->lse[((long)b * s.H + h) * T + i0 + m + r] = mx[r];",
      (T + "test_native.py",), "the saved log-sum-exp is the row max (the backward's P unnormalised)"),
    M("qkv-norm-no-scale", "src/sanlab/model/csrc/attention.h",
      "    const float r = *rs * scale;\n", "    const float r = *rs;\n",
      (T + "test_native.py",), "with the QK-norm inside, q is not scaled by 1/sqrt(D)"),
    M("qkv-one-vector-no-scale", "src/sanlab/model/csrc/attention.h",
      "const T n = v * (*rs * scale) * gv", "const T n = v * (*rs) * gv",
      (T + "test_native.py",), "a row of one vector (D = 16) is not scaled by 1/sqrt(D)"),
    M("qkv-one-vector-rope-unswapped", "src/sanlab/model/csrc/attention.h",
      "#define SWAP_H(x) __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3)",
      "#define SWAP_H(x) __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7)",
      (T + "test_native.py",), "a row of half a vector (D = 8) rotates each half with itself",
      needs="avx512"),  # (half a vector is D 8 only where a vector holds 16 floats)
    M("qkv-one-vector-backward-sign", "src/sanlab/model/csrc/attention.h",
      "for (int i = 0; i < W; i++) sgn[i] = i < W / 2 ? 1.0f : -1.0f;",
      "for (int i = 0; i < W; i++) sgn[i] = i < W / 2 ? -1.0f : 1.0f;",
      (T + "test_native.py",), "the one-vector RoPE backward rotates forward (the sign of s swapped)"),
    M("qkv-norm-gain-grad", "src/sanlab/model/csrc/attention.h",
      "vstore(acc + d, vload(acc + d) + vload(n + d) * u1);", "vstore(acc + d, vload(acc + d) + u1);",
      (T + "test_native.py",), "the QK-norm gain's gradient misses the normalised input"),
    M("head-ce-target-not-subtracted", "src/sanlab/model/csrc/head.c",
      "put1(a->grad, a->grad_bf16, go + t, target);", "",
      (T + "test_model.py",), "the compiled head's gradient misses the −w·onehot(target) term"),
    M("head-ce-z-loss-scale-dropped", "src/sanlab/model/csrc/head.c",
      "scale = 1.0f + 2.0f * a->c * lse,", "scale = 1.0f,",
      (T + "test_model.py",), "the compiled head's gradient leaves out the z-loss term"),
    M("head-ce-lse-without-max", "src/sanlab/model/csrc/head.c",
      "const float lse = m + logf(s),", "const float lse = logf(s),",
      (T + "test_model.py",), "the compiled head's lse forgets the row max it subtracted"),
    M("head-ce-target-logit-read-after-the-gradient", "src/sanlab/model/csrc/head.c",
      "                put1(a->grad, a->grad_bf16, go + t, target);\n",
      "                put1(a->grad, a->grad_bf16, go + t, target);\n"
      "                a->x_t[i] = get1(a->logits, bf16, off + t); /* after the gradient row */\n",
      (T + "test_model.py",), "the compiled head reads a row's target logit after writing the row's gradient, "
      "which the fused head writes over the logits (x_t then a gradient value)"),
    M("head-logits-into-the-groups-first-rows", "src/sanlab/model/loss.py",
      "torch.mm(x[j], w_x.t(), out=g)", "torch.mm(x[j], w_x.t(), out=g_rows[:n])",
      (T + "test_model.py",), "a chunk's logits go to the first rows of its dW group's buffer, not its own"),
    M("head-dw-fp32-product-of-another-chunk", "src/sanlab/model/loss.py",
      "        return (x.t() @ g).t()", "        return (x[:g.shape[0]].t() @ g[:1].expand_as(g)).t()",
      (T + "test_model.py",), "the fp32 dW product takes every row's gradient from the first row"),
    M("head-ce-target-unchecked", "src/sanlab/model/csrc/head.c",
      "if (a->targets[i] < 0 || a->targets[i] >= V) return 1;", "(void)0;",
      (T + "test_model.py", T + "test_kernels_build.py"), "the compiled head reads a target outside the vocabulary"),
    M("kernels-do-not-compile", "src/sanlab/model/csrc/head.c",
      "    int status = 0;\n#pragma omp parallel num_threads(a->nthreads)", "    int status = 0\n#pragma omp parallel num_threads(a->nthreads)",
      (T + "test_kernels_build.py",), "a kernel source stops compiling (every compiled-kernel test would skip)"),
    M("members-linear-autograd-through-bmm", "src/sanlab/model/members.py",
      "        y = _BmmLinear.apply(x.reshape(M, -1, k), w)", "        y = torch.bmm(x.reshape(M, -1, k), w.transpose(1, 2))",
      (T + "test_members.py",), "the members' weight gradients are (xᵀ dy)ᵀ: bf16 roundings differ from the solo run's",
      needs="avx512bf16"),  # (in fp32, where a CPU without bf16 products trains, MKL gives both the same bits)
    M("members-linear-batched-weight-grad", "src/sanlab/model/members.py",
      "            for m in range(w.shape[0]):\n                torch.mm(dy[m].t(), x[m], out=dw[m])",
      "            dw.copy_(torch.bmm(dy.transpose(1, 2), x))",
      (T + "test_members.py",), "the members' weight gradients as one batched product (differs from mm at 2 threads)",
      needs="avx512bf16"),  # (the same bits as mm in fp32 on an AVX2 CPU, where training runs in fp32)
    M("attention-zero-grads-materialized", "src/sanlab/model/attention/fused.py",
      "    ctx.set_materialize_grads(False)", "    ctx.set_materialize_grads(True)",
      (T + "test_native.py",), "autograd fills a zero gradient for each kept output of the fused ops every step"),
    M("members-folded-attention-gain-of-member-0", "src/sanlab/model/members.py",
      "q = member_norm_rope(q.reshape(M, B, T, H, D), gq, cfg.norm_eps, c, s)",
      "q = member_norm_rope(q.reshape(M, B, T, H, D), gq[:1].expand(M, -1), cfg.norm_eps, c, s)",
      (T + "test_members.py",), "the folded attention path gives every member member 0's QK-norm gain"),
    M("members-norm-rope-gain-grad-summed", "src/sanlab/model/members.py",
      "for m in range(M)]).to(gain.dtype)", "for m in range(M)]).sum(0, keepdim=True).expand(M, -1).to(gain.dtype)",
      (T + "test_members.py",), "_MemberNormRoPE gives every member the sum of the members' gain gradients"),
    M("members-head-indexes-each-member", "src/sanlab/model/members.py",
      "head_loss(xs[m], tables[m],", "head_loss(x[m], self._w(\"embed.weight\")[m],",
      (T + "test_members.py",), "each member's head backward fills and adds a whole (M, ...) zero gradient"),
    M("gated-residual-fwd-unfused", "src/sanlab/model/csrc/norms.c",
      "vstore(out + j, vfma(getv(a->h, h_bf16, j), sigma, vload(x + j)));",
      "{ vstore(out + j, getv(a->h, h_bf16, j) * sigma); __asm__ volatile(\"\" ::: \"memory\");"
      " vstore(out + j, vload(x + j) + vload(out + j)); }",
      (T + "test_native.py",), "the gated residual's forward rounds σ·h before the sum (addcmul fuses them)"),
    M("gated-residual-fwd-one-gate", "src/sanlab/model/csrc/norms.c",
      "const float sigma = a->sigmas ? a->sigmas[j / group] : a->sigma;\n            for (; j + VL",
      "const float sigma = a->sigmas ? a->sigmas[0] : a->sigma;\n            for (; j + VL",
      (T + "test_native.py",), "every member's residual reads the first member's gate"),
    M("silu-gate-table-act-unrounded", "src/sanlab/model/csrc/swiglu.c",
      "vstore(ACT + i, vround_bf16(g / e1));", "vstore(ACT + i, g / e1);",
      (T + "test_native.py",), "the bf16 SiLU ⊙ up multiplies by the unrounded SiLU (F.silu's tensor is bf16)",
      needs="sleef-exp"),
    M("silu-gate-fp32-slope-unfused", "src/sanlab/model/csrc/swiglu.c",
      "*dg = ((dy * up) * s) * vfmav(g, 1.0f - s, vsplat(1.0f));", "*dg = ((dy * up) * s) * (1.0f + g * (1.0f - s));",
      (T + "test_native.py",), "the fp32 gate gradient rounds g·(1 − s) before adding 1 (torch's silu_backward fuses it)",
      needs="sleef-exp"),
    M("silu-gate-no-libm-tail", "src/sanlab/model/kernels.py",
      "vec_cols = F if floats is None else F - F % (2 * floats * (2 if bf16 else 1))", "vec_cols = F",
      (T + "test_native.py",), "a row's last values take the vector exp where torch's scalar tail calls expf",
      needs="sleef-exp"),
    M("silu-gate-exp-truncates", "src/sanlab/model/csrc/swiglu.c",
      "const vf q = (p + magic) - magic;", "const vf q = __builtin_convertvector(__builtin_convertvector(p, vi), vf);",
      (T + "test_native.py",), "the exp's 2^q rounds toward zero, not to nearest (SLEEF's rint): another polynomial range",
      needs="sleef-exp"),
    M("plan-group-starts-each-member", "src/sanlab/study/groups.py",
      "sum(plan.run_seconds(runs[i], start=False) for i in group)", "sum(plan.run_seconds(runs[i]) for i in group)",
      (T + "test_study_groups.py",), "a member group's estimate counts a process start for every member"),
    M("plan-ignores-warm-processes", "src/sanlab/study/plan.py",
      "return WARM_START_S if self.warm else speed[\"ready_s\"]", "return speed[\"ready_s\"]",
      (T + "test_study_speed.py",), "the plan counts a fresh process's imports for every run forked from a warm one"),
    M("plan-startup-uncounted", "src/sanlab/study/plan.py",
      "default=0.0) if self.warm else 0.0", "default=0.0) * 0 if self.warm else 0.0",
      (T + "test_study_speed.py",), "the warm processes' imports are never counted in the plan's total"),
    M("plan-gpu-runs-warm", "src/sanlab/study/plan.py",
      "warm=local and not spec.runner.gpus_per_run and warm_enabled())", "warm=local and warm_enabled())",
      (T + "test_study_speed.py",), "the plan counts multi-GPU runs (torchrun, a fresh process each) as forked warm"),
    M("warm-workers-never-used", "src/sanlab/study/warm.py",
      "    return os.environ.get(\"SANLAB_WARM_WORKERS\", \"1\") != \"0\" and",
      "    return False and",
      (T + "test_study_warm.py",), "every run starts a new Python process (~2.4 s of imports each)"),
    M("warm-workers-restarted-each-round", "src/sanlab/study/runner.py",
      "        pool.shutdown(wait=True)\n\n    def warm_up",
      "        pool.shutdown(wait=True)\n        self.close()\n\n    def warm_up",
      (T + "test_study_warm.py",), "the warm processes are stopped after each round, their imports paid again"),
    M("warm-process-outlives-the-study", "src/sanlab/study/warm.py",
      "    parent = os.environ.get(\"SANLAB_PARENT_PID\")\n    die_with_parent()",
      "    parent = os.environ.get(\"SANLAB_PARENT_PID\")",
      (T + "test_study_warm.py",), "a killed study leaves its warm process and its run going"),
    M("warm-dead-worker-not-replaced", "src/sanlab/study/runner.py",
      "        if rc is not None:\n            return rc\n",
      "        if rc is not None or worker is not None:\n            return -1 if rc is None else rc\n",
      (T + "test_study_warm.py",), "a run given to a dead warm process fails instead of starting afresh"),
    M("runner-ignores-run-cost", "src/sanlab/study/runner.py",
      "waiting.sort(key=lambda g: (min(j.rank for j in g), -sum(j.cost for j in g)))",
      "waiting.sort(key=lambda g: min(j.rank for j in g))",
      (T + "test_study_warm.py",), "the local runner starts runs in the order given, a long one possibly last"),
    M("study-never-streams", "src/sanlab/study/runner.py",
      "    streams = True  # `run` takes more jobs", "    streams = False  # `run` takes more jobs",
      (T + "test_study_stream.py",), "the local runner goes round by round: a locked cell's final runs wait for the slowest cell's sweep"),
    M("runner-ignores-rank", "src/sanlab/study/runner.py",
      "waiting.sort(key=lambda g: (min(j.rank for j in g), -sum(j.cost for j in g)))",
      "waiting.sort(key=lambda g: -sum(j.cost for j in g))",
      (T + "test_study_stream.py",), "final runs start before the sweep points that decide what runs next"),
    M("runner-never-asks-for-more", "src/sanlab/study/runner.py",
      "                if more is not None:\n                    add(more())",
      "                if False:\n                    add(more())",
      (T + "test_study_stream.py",), "the stream ends with the first batch: no extension, no final runs"),
    M("stream-forgets-what-it-started", "src/sanlab/study/orchestrate.py",
      "            started.update(r.run_id for r in new)", "            pass",
      (T + "test_study_stream.py",), "a run still running is started again by the next finished run's `more`"),
    M("stream-locks-announced-twice", "src/sanlab/study/orchestrate.py",
      "                self.announced.add(cell_key(point.slug, *key))", "                pass",
      (T + "test_study_stream.py",), "each lock is printed (and compared with the store) again at every finished run"),
    M("stream-rank-final-as-sweep", "src/sanlab/study/orchestrate.py",
      'rank=0 if "sweep" in r.phases else 1)', 'rank=0)',
      (T + "test_study_stream.py",), "a study's final runs rank with its sweep points"),
    M("stream-estimate-without-dependencies", "src/sanlab/study/plan.py",
      "        ready = sorted((i for i in waiting if deps[i] <= done),",
      "        ready = sorted((i for i in waiting),",
      (T + "test_study_groups.py",), "`study plan`'s streamed estimate starts final runs before their cell's sweep ends"),
    M("stream-estimate-without-ranks", "src/sanlab/study/plan.py",
      "key=lambda i: (not is_sweep(units[i][1]), -units[i][0], i))",
      "key=lambda i: (-units[i][0], i))",
      (T + "test_study_groups.py",), "`study plan`'s streamed estimate lets a free worker take a final run before a sweep point"),
    M("warm-imports-not-frozen", "src/sanlab/study/warm.py",
      "        gc.freeze()\n        gc.enable()", "        gc.enable()",
      (T + "test_study_warm.py",), "every collection in a forked run walks the ~300k objects of the warm process's imports"),
    M("warm-gc-left-off", "src/sanlab/study/warm.py",
      "        gc.freeze()\n        gc.enable()", "        gc.freeze()",
      (T + "test_study_warm.py",), "forked runs never collect cyclic garbage"),
    M("warm-up-after-the-data", "src/sanlab/study/orchestrate.py",
      "        if warm_up is not None:  # (", "        if False:  # (",
      (T + "test_study_warm.py",), "the warm processes start only with the first round, their imports after the data's preparation"),
    M("unused-warm-process-waited-for", "src/sanlab/study/warm.py",
      "            self.proc.kill()    # stop", "            pass    # stop",
      (T + "test_study_warm.py",), "closing a runner waits for a warm process's imports though it never ran anything"),
    M("runner-starts-queued-runs-after-ctrl-c", "src/sanlab/study/runner.py",
      "                while waiting and len(running) < self.workers:",
      "                while waiting:",
      (T + "test_study_warm.py",), "every run is queued in the pool at once, so after Ctrl-C the pool starts them all before it stops"),
    M("warm-child-takes-ctrl-c-the-study-ignores", "src/sanlab/study/warm.py",
      "        signal.signal(signal.SIGINT, sigint)", "        signal.signal(signal.SIGINT, signal.default_int_handler)",
      (T + "test_study_warm.py",), "a run forked from a warm process stops on a SIGINT its study ignores"),
    M("probe-points-never-grouped", "src/sanlab/study/groups.py",
      "        return callable(getattr(resolve(train_fn), \"finish_member\", None))", "        return False",
      (T + "test_probes_cli.py", T + "test_study_groups.py"), "the probe suite's sweep points never train as members"),
    M("probe-members-not-scored", "src/sanlab/study/groups.py",
      "                metas = [_finish(j, c, d, dict(m)) for j, c, d, m in zip(jobs, cfgs, dirs, metas)]\n", "",
      (T + "test_probes_cli.py",), "a probe run trained as a member is never scored (no accuracy, no probe.json)"),
    M("config-assignment-drops-ffn", "src/sanlab/config.py",
      "        data[\"ffn\"] = None  # (the field's value is set from state_mixer after validation)\n", "",
      (T + "test_config.py",), "assigning any ModelConfig field raises AttributeError 'ffn'"),
    M("config-refused-assignment-kept", "src/sanlab/configbase.py",
      "            self.__dict__.clear()\n            self.__dict__.update(before)\n", "",
      (T + "test_config.py",), "a refused assignment leaves the refused value in the config"),
    M("native-rmsnorm-backward-sign", "src/sanlab/model/csrc/norms.c",
      "const float coef = -ri * ri * ri * dot_f32(g, xi, d) / d;", "const float coef = ri * ri * ri * dot_f32(g, xi, d) / d;",
      (T + "test_native.py",), "the compiled RMS norm's backward has a sign error"),
    M("native-gate-grad", "src/sanlab/model/csrc/norms.c",
      "dg[q] = sigma * (1.0f - sigma) * total;", "dg[q] = sigma * total;",
      (T + "test_native.py",), "the compiled gate gradient uses σ instead of σ(1 − σ)"),
    M("native-rope-sign", "src/sanlab/model/csrc/norm_rope.c",
      "vstore(y + d, n1 * vload(gc1 + d) - n2 * vload(gs2 + d));", "vstore(y + d, n1 * vload(gc1 + d) + n2 * vload(gs2 + d));",
      (T + "test_native.py",), "the compiled RoPE rotates the first half the wrong way"),
    M("block-rows-not-a-panel-multiple", "src/sanlab/model/csrc/attention.h",
      "    if (bq > 64) bq = 64;\n    bq = bq / unit * unit;\n", "    bq = bq / unit * unit;\n    if (bq > 64) bq = 64;\n",
      (T + "test_native.py",), "a query block of 64 rows where the panel is 6 (AVX2): panels read past the block"),
    M("portable-partial-key-panel", "src/sanlab/model/csrc/attention.c",
      "mr = hi - n < MR ? hi - n : MR;", "mr = MR;",
      (T + "test_native.py",), "the last key panel writes MR rows of dK, dV past the block's keys (AVX2's MR 6)"),
    M("portable-mask-drops-the-first-key", "src/sanlab/model/csrc/attention.h",
      "        vstore(row + j, vselect((key >= a) & (key < e), vload(row + j), ninf));\n    }\n    for (int j = n0 + (e",
      "        vstore(row + j, vselect((key > a) & (key < e), vload(row + j), ninf));\n    }\n    for (int j = n0 + (e",
      (T + "test_native.py",), "a row's first allowed key (its document's or window's start) is masked out"),
    M("portable-mask-skips-the-diagonal-vector", "src/sanlab/model/csrc/attention.h",
      "    for (int j = n0 + (e - n0) / VL * VL; j < n1; j += VL) {",
      "    for (int j = n0 + (e - n0) / VL * VL + VL; j < n1; j += VL) {",
      (T + "test_native.py",), "the keys past the diagonal in its own vector are not masked: a row sees the next tokens"),
    M("portable-key-tail-exp-not-summed", "src/sanlab/model/csrc/attention.h",
      "        vstore(row + j, p0);\n        s0 += p0;\n    }", "        vstore(row + j, p0);\n    }",
      (T + "test_native.py",), "a row's last single vector of keys gets its exp but leaves it out of the softmax's sum"),
    M("portable-key-tail-half-panel", "src/sanlab/model/csrc/attention.c",
      "    if (n1 - n > VL) panel_rows(MR", "    if (n1 - n > 2 * VL) panel_rows(MR",
      (T + "test_native.py",), "a whole key panel's scores computed one vector wide: its second half's are never formed"),
    M("portable-one-vector-panel-skipped", "src/sanlab/model/csrc/attention.c",
      "    if (d < D) panel_rows1(", "    if (d + VL < D) panel_rows1(",
      (T + "test_native.py",), "where at most one vector of head-dim columns is left (D 16 on AVX-512) nothing computes it"),
    M("portable-one-vector-panel-drops-the-sum", "src/sanlab/model/csrc/attention.c",
      "c0[m] = acc && m < mr ? vload(C + m * ldc) : vsplat(0.0f);", "c0[m] = vsplat(0.0f);",
      (T + "test_native.py",), "the one-vector panel overwrites dK, dV instead of adding each query block's share"),
    M("portable-half-vector-panel-drops-the-sum", "src/sanlab/model/csrc/attention.c",
      "        if (acc && m < mr) memcpy(&z, C + m * ldc, sizeof z);\n", "",
      (T + "test_native.py",), "the half-vector panel (D 8 on AVX-512) overwrites dK, dV instead of adding each head's share"),
    M("portable-half-vector-panel-too-wide", "src/sanlab/model/csrc/attention.c",
      "    if (d < D && D - d <= VL / 2) {", "    if (d < D && D - d <= VL) {",
      (T + "test_native.py",), "a head of 16 columns (AVX-512) goes through the 8-column panel: half its columns never computed"),
    M("portable-scores-short-of-the-head-dim", "src/sanlab/model/csrc/attention.c",
      "key_panel(n, n1, D, Q + (long)m * s.Dp, s.Dp, 1, Kt + lo + n, s.Tp, Sm + n, s.Tp);",
      "key_panel(n, n1, D - 1, Q + (long)m * s.Dp, s.Dp, 1, Kt + lo + n, s.Tp, Sm + n, s.Tp);",
      (T + "test_native.py",), "the forward's scores sum over all but the head dim's last column"),
    M("qkv-path-never-taken", "src/sanlab/model/attention/dispatch.py",
      "    if ((pattern_hook is not None and pattern_hook.active) or D % 2", "    if (True or D % 2",
      (T + "test_native.py",), "softmax attention never takes the one-op QKV kernel (slower, still right)"),
    M("row-starts-ignore-documents", "src/sanlab/model/attention/masks.py",
      "first = idx - positions + lo\n",
      "first = lo\n",
      (T + "test_native.py",), "the fused kernel's rows see every earlier document"),
    M("fused-fp32-runs-on-amx", "src/sanlab/model/attention/fused.py",
      "return 0 if low_precision or torch.get_float32_matmul_precision() != \"highest\" else 1", "return 0",
      (T + "test_native.py",), "fp32 runs get AMX's split bf16 products instead of fp32 arithmetic"),
    M("abi-version-unchecked", "src/sanlab/model/native.py",
      "    if got != ABI_VERSION:\n", "    if False:\n",
      (T + "test_native.py::test_a_library_of_another_abi_version_is_a_one_line_error",),
      "a library of another ABI version is loaded and called"),
    M("abi-sizes-unchecked", "src/sanlab/model/native.py",
      "if n != len(STRUCTS) or list(sizes) != want:", "if False:",
      (T + "test_native.py::test_the_loaded_library_reports_the_interface_and_a_changed_expectation_is_refused",),
      "a library whose structs have other sizes than the ctypes mirror is loaded"),
    M("stale-build-not-rebuilt", "src/sanlab/model/native.py",
      "    except (ABIMismatch, OSError):\n        fresh =", "    except ():\n        fresh =",
      (T + "test_native.py::test_a_stale_cached_build_is_rebuilt_and_one_that_cannot_match_is_refused",),
      "a stale cached build makes the kernels unavailable instead of being rebuilt"),
    M("isa-not-in-cache-key", "src/sanlab/model/native.py",
      "_cpu_signature().encode(), isa(cc, flags).encode()]", "_cpu_signature().encode()]",
      (T + "test_native.py::test_the_cache_key_names_the_instruction_set",),
      "a build for another instruction set has this CPU's cache key"),
    M("window-mask-off-by-one", "src/sanlab/model/attention/masks.py",
      "return k > q - self.window  # i − j < window", "return k >= q - self.window  # i − j < window",
      (T + "test_model.py::test_window_masks_are_the_definition",),
      "the windowed dense mask lets a token see window + 1 keys"),
    M("window-first-key-off-by-one", "src/sanlab/model/attention/masks.py",
      "        return (q_pos - self.window + 1).clamp_min(0)\n\n\ndef window(",
      "        return (q_pos - self.window).clamp_min(0)\n\n\ndef window(",
      (T + "test_sliding_window.py",), "the fused kernel's rows see window + 1 keys (the window's interval form)"),
    M("window-not-given-to-the-fused-kernel", "src/sanlab/model/attention/dispatch.py",
      "return fused(q, k, v, ctx.first_keys(mask))", "return fused(q, k, v, ctx.first_keys())",
      (T + "test_sliding_window.py",), "attend drops the mask on the fused kernel"),
    M("window-not-given-to-the-explicit-kernel", "src/sanlab/model/attention/explicit.py",
      "bias = ctx.additive_mask(dt, mask)", "bias = ctx.additive_mask(dt)",
      (T + "test_model.py::test_attend_within_a_window_on_every_backend",),
      "attend drops the mask on the explicit kernel and the pattern hook's path"),
    M("window-not-given-to-sdpa", "src/sanlab/model/attention/dispatch.py",
      "attn_mask=ctx.allowed(mask)", "attn_mask=ctx.allowed()",
      (T + "test_model.py::test_attend_within_a_window_on_every_backend",), "attend drops the mask on SDPA"),
    M("additive-mask-cached-per-dtype-only", "src/sanlab/model/attention/context.py",
      "        if (dtype, mask) not in self._additive:\n"
      "            self._additive[dtype, mask] = masks.additive_mask(self.allowed(mask), dtype)\n"
      "        return self._additive[dtype, mask]",
      "        if dtype not in self._additive:\n"
      "            self._additive[dtype] = masks.additive_mask(self.allowed(mask), dtype)\n"
      "        return self._additive[dtype]",
      (T + "test_attention_paths.py",),
      "the explicit kernel's additive mask is cached per dtype only: every layer gets the first layer's mask"),
    M("flex-key-position-from-the-query", "src/sanlab/model/attention/masks.py",
      "q_idx, kv_idx, pos[b, q_idx], pos[b, kv_idx])", "q_idx, kv_idx, pos[b, q_idx], pos[b, q_idx])",
      (T + "test_attention_paths.py",), "FlexAttention's mask function reads the key's document position from the query"),
    M("flex-takes-short-rows", "src/sanlab/model/attention/dispatch.py",
      "return seq_len >= FLEX_BLOCK and seq_len % FLEX_BLOCK == 0", "return seq_len >= 1",
      (T + "test_attention_paths.py",),
      "rows shorter than FlexAttention's block (and odd lengths) go to flex on CUDA, where inductor crashes"),
    M("flex-compiled-inside-a-compiled-model", "src/sanlab/model/attention/dispatch.py",
      'return "compiled" if device_type == "cuda" and not compiling else "plain"',
      'return "compiled" if device_type == "cuda" else "plain"',
      (T + "test_attention_paths.py",), "a separately compiled flex is nested in a compiled model (crashed on an H200)"),
    M("block-mask-built-in-the-graph", "src/sanlab/model/attention/context.py",
      '        if self.backend == "flex":\n            for mask in announced:',
      '        if self.backend == "none":\n            for mask in announced:',
      (T + "test_attention_paths.py",),
      "FlexAttention's block masks are built lazily, inside the compiled layers, not before them"),
    M("masked-mixer-mask-unannounced", "src/sanlab/model/mixers/softmax.py",
      "        return (self.attention_mask(),)", "        return (DOCUMENT,)",
      (T + "test_attention_paths.py",), "a masked mixer announces the document mask, not its own, so its own is built in the graph"),
    M("sink-window-sinks-ignored", "src/sanlab/model/mixers/sink_window.py",
      "return (k_pos < self.sinks) | (k > q - self.window)", "return k > q - self.window",
      (T + "test_sink_window.py",), "sinks + window attends within the window alone"),
    M("sink-window-sinks-of-the-row", "src/sanlab/model/mixers/sink_window.py",
      "return (k_pos < self.sinks) | (k > q - self.window)", "return (k < self.sinks) | (k > q - self.window)",
      (T + "test_sink_window.py",), "the sinks are the row's first tokens, not each document's"),
    M("sink-window-fused-drops-sinks", "src/sanlab/model/mixers/sink_window.py",
      "return (q_pos - self.window + 1).clamp_min(0) if self.sinks == 0 else None",
      "return (q_pos - self.window + 1).clamp_min(0)",
      (T + "test_sink_window.py",), "sinks + window claims the window's interval form: the fused kernel drops the sinks"),
    M("decode-cache-ignores-the-mask", "src/sanlab/model/mixers/softmax.py",
      "allowed = decode_mask(m.attention_mask(), step.positions, e)", "allowed = decode_mask(DOCUMENT, step.positions, e)",
      (T + "test_sink_window.py::test_cached_decoding_equals_the_full_forward",),
      "the KV cache attends to every cached key, whatever the mixer's mask"),
    M("compile-auto-on-the-cpu", "src/sanlab/train/resolve.py",
      'return device == "cuda"', "return True",
      (T + "test_train_compile.py",), "train.compile=auto compiles on the CPU (its numerics and speed change)"),
    M("cuda-available-ignores-imported-torch", "src/sanlab/train/host.py",
      '    if "torch" not in sys.modules and (', "    if (",
      (T + "test_host.py",), "with torch imported, no driver file still says no GPU (a faked or odd GPU setup)"),
    M("cuda-available-always-imports-torch", "src/sanlab/train/host.py",
      "and not any(os.path.exists(f) for f in GPU_DRIVER_FILES))):", "and False)):",
      (T + "test_host.py",), "a study's process imports torch to learn there is no GPU (~2 s before its first run)"),
    M("study-groups-import-the-trainer", "src/sanlab/study/groups.py",
      "from sanlab.train.resolve import resolve as resolve_config",
      "from sanlab.train.trainer import resolve as resolve_config",
      (T + "test_imports.py",), "the study's process imports torch to group its runs"),
    M("compile-failure-crashes-the-run", "src/sanlab/train/compiling.py",
      "        model.fall_back_to_eager(e)\n", "        raise\n",
      (T + "test_train_compile.py",), "a compiler failure stops the run instead of training eagerly"),
    M("compiled-call-failure-crashes-the-run", "src/sanlab/model/lm.py",
      "            except Exception as e:  # noqa: BLE001 - any compiler failure: the eager model runs\n"
      "                self.fall_back_to_eager(e)",
      "            except Exception as e:  # noqa: BLE001 - any compiler failure: the eager model runs\n"
      "                raise",
      (T + "test_train_compile.py",), "a compiled call that fails (inductor at first run) stops the run"),
    M("speed-write-to-a-gone-child", "src/sanlab/study/speed.py",
      "    except BrokenPipeError:\n        return False\n    return True",
      "    except ValueError:\n        return False\n    return True",
      (T + "test_study_speed.py::test_a_measuring_process_gone_before_go_is_a_timing_error_not_a_broken_pipe",),
      "a measuring process that failed before `go` ends the timing in a BrokenPipeError, not its error"),
    # ---- benchmarks
    M("bench-excess-inverted", "benchmarks/bench_arms.py",
      '(step_s[ref] / step_s[n]) / (flops[ref] / flops[n])', '(step_s[n] / step_s[ref]) / (flops[ref] / flops[n])',
      (T + "test_bench_arms.py",), "bench_arms's excess uses the inverse speed ratio"),
    M("bench-paired-unpaired", "benchmarks/bench_arms.py",
      "zip(times[ref], times[n])", "zip(times[ref], times[n][::-1])",
      (T + "test_bench_arms.py",), "bench_arms pairs the SAN's rounds with the partner's in the wrong order"),
    M("bench-paired-interval-point", "benchmarks/bench_arms.py",
      "boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1]",
      "statistics.median(per_round), statistics.median(per_round)",
      (T + "test_bench_arms.py",), "bench_arms's interval collapses to the median"),
    M("bench-paired-first-process-only", "benchmarks/bench_arms.py",
      'pooled = {n: [t for run in runs for t in run["times"][n]] for n in arms}',
      'pooled = {n: list(runs[0]["times"][n]) for n in arms}',
      (T + "test_bench_arms.py",), "bench_arms's pooled interval uses the first process's rounds only"),
    M("bench-paired-groups-ignored", "benchmarks/bench_arms.py",
      "rng.choices(by_group, k=len(by_group)) for x in rng.choices(g, k=len(g))",
      "[per_round] for x in rng.choices(g, k=len(g))",
      (T + "test_bench_arms.py",), "bench_arms's interval pools the processes' rounds as if from one"),
    M("bench-paired-repeats-ungrouped", "benchmarks/bench_arms.py",
      'paired = paired_excess(pooled, flops, groups=[len(run["times"]["san"]) for run in runs])',
      "paired = paired_excess(pooled, flops)",
      (T + "test_bench_arms.py",), "bench_arms --repeats pools the rounds without resampling the processes"),
    M("bench-gpu-flop-ratio-inverted", "benchmarks/bench_gpu.py",
      'ratio = "" if n == san else f"{flops_tok[san] / flops_tok[n]:.2f}"',
      'ratio = "" if n == san else f"{flops_tok[n] / flops_tok[san]:.2f}"',
      (T + "test_bench_gpu.py",), "bench_gpu prints the FLOP ratio inverted"),
    M("bench-product-flops-once", "benchmarks/bench_arms.py",
      "flops = product_flops(e.key, e.input_shapes) * e.count", "flops = product_flops(e.key, e.input_shapes)",
      (T + "test_bench_arms.py",), "bench_arms's product table counts one call's FLOPs for all its calls"),
    M("bench-members-other-lrs", "benchmarks/bench_members.py",
      "cfgs = [OptimConfig(lr=0.02 * 2 ** (m % 3 - 1)) for m in range(M)]",
      "cfgs = [OptimConfig(lr=0.02) for m in range(M)]",
      (T + "test_bench_members.py",), "bench_members times its members on other LRs than its solo runs"),
    M("members-curves-member-against-itself", "scripts/members_curves.py",
      "m, s = curve(member), curve(solo)", "m, s = curve(member), curve(member)",
      (T + "test_members.py",), "members_curves compares each member with itself, not with its solo run"),
    M("bench-waits-on-dead-children", "benchmarks/_children.py",
      "if len(gone) > len(out):  # a process ended without putting its result",
      "if any(p.exitcode not in (None, 0) for p in gone) and not barrier:",
      (T + "test_bench_members.py", T + "test_bench_flags.py"),
      "a benchmark waits forever when a timing process ends without its result (at a barrier, or with exit 0)"),
    M("bench-flag-count-unchecked", "benchmarks/bench_members.py",
      'p.add_argument("--steps", type=positive_int, default=3,', 'p.add_argument("--steps", type=int, default=3,',
      (T + "test_bench_flags.py",), "bench_members --steps 0 runs, then fails with an IndexError traceback"),
    M("bench-shapes-checked-late", "benchmarks/bench_members.py",
      "unknown = [x for x in a.shapes.split(\",\") if x not in SHAPES]", "unknown = []",
      (T + "test_bench_members.py", T + "test_bench_flags.py"),
      "bench_members times the known shapes for minutes, then a KeyError traceback at an unknown one"),
    M("script-main-traceback", "src/sanlab/cliargs.py",
      "    except SanlabError as e:\n        print(f\"{prog}: error:", "    except ValueError as e:\n        print(f\"{prog}: error:",
      (T + "test_bench_flags.py",), "a benchmark's user error (a flag, the config it builds) ends in a traceback"),
    M("script-flags-sanlab-prefix", "src/sanlab/cliargs.py",
      "if self.prog.startswith(\"sanlab \") else \"\"", "if self.prog != \"sanlab\" else \"\"",
      (T + "test_bench_flags.py",), "a benchmark's flag error names the program twice (bench_x.py: error: bench_x.py: …)"),
    # ---- loader
    M("loader-boundary-counts", "src/sanlab/data/loader.py",
      "mask = (seg[:, 1:] == seg[:, :-1]) & (targets != PAD_ID)", "mask = targets != PAD_ID",
      (T + "test_catches_loader.py", T + "test_data_loader.py"), "the EOS → next BOS step counts in the loss"),
    M("loader-same-order-every-epoch", "src/sanlab/data/loader.py",
      "key = [self.seed, epoch]", "key = [self.seed, 0]",
      (T + "test_data_loader.py",), "every epoch repeats the first epoch's row order"),
    M("loader-val-order-from-train-seed", "src/sanlab/data/loader.py",
      "key = [int(self.manifest[\"seed\"]), _VAL_SALT]", "key = [self.seed, _VAL_SALT]",
      (T + "test_data_loader.py",), "the validation rows depend on the training seed"),
    M("loader-rank-overlap", "src/sanlab/data/loader.py",
      "first = step * self.batch_rows + self.rank * self.local_rows",
      "first = step * self.batch_rows + self.rank",
      (T + "test_data_loader.py",), "ranks' rows overlap"),
    # ---- optimizer routing and schedule
    M("routing-embed-to-muon", "src/sanlab/train/optim.py",
      "if name == \"embed.weight\":", "if name == \"embed.weights\":",
      (T + "test_train_optim.py",), "the embedding is routed to Muon as a hidden matrix"),
    M("adamw-arm-decays-gains", "src/sanlab/train/optim.py",
      "((matrices, cfg.weight_decay), (rest, 0.0))", "((matrices, cfg.weight_decay), (rest, cfg.weight_decay))",
      (T + "test_train_optim.py",), "the AdamW arm decays gains, gates and the embedding"),
    M("muon-arm-adam-at-muon-lr", "src/sanlab/train/optim.py",
      "[group(rest, cfg.adam_lr, 0.0)], lr=cfg.adam_lr", "[group(rest, cfg.lr, 0.0)], lr=cfg.adam_lr",
      (T + "test_train_optim.py",), "the Muon arm's AdamW side runs at the Muon LR"),
    M("schedule-ignored", "src/sanlab/train/optim.py",
      "group[\"lr\"] = group[\"peak_lr\"] * multiplier", "group[\"lr\"] = group[\"peak_lr\"]",
      (T + "test_train_optim.py",), "the LR schedule is never applied"),
    M("warmup-starts-at-zero", "src/sanlab/train/schedule.py",
      "return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0",
      "return min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0",
      (T + "test_train_schedule.py",), "warmup's first step has LR 0"),
    M("wsd-decay-late", "src/sanlab/train/schedule.py",
      "progress = (step - decay_start + 1) / decay_steps", "progress = (step - decay_start) / decay_steps",
      (T + "test_train_schedule.py",), "WSD's decay never reaches the final LR"),
    M("cosine-floor-dropped", "src/sanlab/train/schedule.py",
      "return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))",
      "return (1.0 - final_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))",
      (T + "test_train_schedule.py",), "the cosine decays to 0 instead of final_lr_frac"),
    # ---- members (many runs as one batched model)
    M("members-muon-lr-of-first", "src/sanlab/train/members.py",
      "lr = {m: self.cfgs[m].lr * mults[m] for m in members}", "lr = {m: self.cfgs[0].lr * mults[m] for m in members}",
      (T + "test_members.py",), "every member's Muon steps at the first member's LR"),
    M("members-adam-at-muon-lr", "src/sanlab/train/members.py",
      "{m: self.cfgs[m].adam_lr * mults[m] for m in members}", "{m: self.cfgs[m].lr * mults[m] for m in members}",
      (T + "test_members.py",), "the Muon arm's AdamW side of a member runs at its Muon LR"),
    M("members-adam-step-counted-twice", "src/sanlab/train/members.py",
      "{m: self.cfgs[m].weight_decay if decay else 0.0 for m in members}, count=False)",
      "{m: self.cfgs[m].weight_decay if decay else 0.0 for m in members}, count=True)",
      (T + "test_members.py",), "the AdamW arm counts a member's step once per group (bias correction off)"),
    M("members-schedule-of-first", "src/sanlab/train/members.py",
      "mults = {i: lr_multiplier(members[i].cfg.optim, step, plan.steps) for i in active}",
      "mults = {i: lr_multiplier(members[0].cfg.optim, step, plan.steps) for i in active}",
      (T + "test_members.py",), "every member follows the first member's LR schedule"),
    M("members-data-of-first", "src/sanlab/train/members.py",
      "per = [_micro_batches(next(members[i].train_data), plan.micro_rows)",
      "per = [_micro_batches(next(members[0].train_data), plan.micro_rows)",
      (T + "test_members.py",), "every member reads the first member's data stream"),
    M("members-clip-across-members", "src/sanlab/train/members.py",
      "grads = [model.by_name[n].grad[i] for n in names", "grads = [model.by_name[n].grad for n in names",
      (T + "test_members.py",), "the gradient-norm clip of a member is taken over all members"),
    M("members-init-one-seed", "src/sanlab/train/members.py",
      "    torch.manual_seed(t.seed)\n    np.random.seed(t.seed)", "    torch.manual_seed(0)\n    np.random.seed(t.seed)",
      (T + "test_members.py",), "every member starts from the same init, not its seed's"),
    # (an audit of the members code: 21 planted bugs the tests let through, each now caught)
    M("members-muon-decay-of-first", "src/sanlab/train/members.py",
      "1 - lr[m] * self.cfgs[m].weight_decay)", "1 - lr[m] * self.cfgs[0].weight_decay)",
      (T + "test_members.py",), "under Muon every member decays its weights at the first member's weight decay"),
    M("members-clip-of-first", "src/sanlab/train/members.py",
      "torch.clamp(mem.cfg.optim.grad_clip / (total + 1e-6), max=1.0)",
      "torch.clamp(members[0].cfg.optim.grad_clip / (total + 1e-6), max=1.0)",
      (T + "test_members.py",), "every member's gradient is clipped at the first member's grad_clip"),
    M("members-own-milestones-unsaved", "src/sanlab/train/members.py",
      "            if saved or done in members[i].plan.milestones:", "            if saved:",
      (T + "test_members.py",), "a member's own milestones (not the first member's) get no checkpoint"),
    M("members-milestone-completed-by-first", "src/sanlab/train/members.py",
      "_complete_milestones(ckpt_dir, found[i], mem.start, mem.plan)",
      "_complete_milestones(ckpt_dir, found[i], mem.start, plan)",
      (T + "test_members.py",), "a resume completes a member's milestone copy by the first member's milestones"),
    M("members-adam-step-of-first", "src/sanlab/train/members.py",
      'entry["step"] = self.adam_steps[m].clone()', 'entry["step"] = self.adam_steps[0].clone()',
      (T + "test_members.py",), "a member's checkpoint stores the first member's AdamW step count"),
    M("members-train-time-shared", "src/sanlab/train/members.py",
      'mem.trainer_state["train_time_s"] += dt', 'mem.trainer_state["train_time_s"] += dt / len(active)',
      (T + "test_members.py",), "a member's train_time_s is the group's share: its tokens_per_s M times too high"),
    M("members-resume-forgets-meta", "src/sanlab/train/members.py",
      "            mem.meta = rundir.resumed_meta(out / rundir.META_FILE)", "            mem.meta = {}",
      (T + "test_members.py",), "a resumed member's meta.json loses its init evaluation, start time and resumes"),
    M("members-stop-saves-waiting-member", "src/sanlab/train/members.py",
      "                if i in stepped and not saved:", "                if not saved:",
      (T + "test_members.py",), "a stop saves a waiting member's later weights under the group's earlier step"),
    M("members-micro-batches-unweighted", "src/sanlab/train/members.py",
      "weight = torch.tensor([counts[i][k] / max(totals[i], 1.0) if i in counts else 0.0 for i in range(M)])",
      "weight = torch.tensor([1.0 / plan.accum if i in counts else 0.0 for i in range(M)])",
      (T + "test_members.py",), "a member's micro-batches are weighted per micro-batch, not per token"),
    M("members-batch-counts-finished-runs", "src/sanlab/train/members.py",
      '"members": {"batch": len(members),', '"members": {"batch": len(group),',
      (T + "test_members.py",), "meta's members.batch counts runs that had finished and did not train"),
    M("members-spike-never-diverges", "src/sanlab/train/members.py",
      "math.isfinite(grad_norm)) or spike or dead_run:", "math.isfinite(grad_norm)) or dead_run:",
      (T + "test_members.py",), "train.spike_factor never stops a member"),
    M("members-sandwich-accepted", "src/sanlab/model/member_rules.py",
      "    if cfg.sandwich_norm:\n        return \"model.sandwich_norm=true\"\n", "",
      (T + "test_members.py",), "sandwich-norm runs train as members, whose model has no post-norms"),
    M("members-rezero-gain-of-first", "src/sanlab/model/members.py",
      "return x + g.to(h.dtype).view(-1, *([1] * (h.dim() - 1))) * h", "return x + g.to(h.dtype).view(-1)[0] * h",
      (T + "test_members.py",), "with residual=rezero every member scales its branch by the first member's gain"),
    M("members-rms-zero-centred", "src/sanlab/model/members.py",
      'self.zero_centered = cfg.norm == "zcrms"', 'self.zero_centered = "rms" in cfg.norm',
      (T + "test_members.py",), "norm=rms members add 1 to every gain, as zero-centred RMS norm does"),
    M("groups-auto-cap-exclusive", "src/sanlab/study/groups.py",
      "cfg.model.d_model > AUTO_MAX_D:", "cfg.model.d_model >= AUTO_MAX_D:",
      (T + "test_study_groups.py",), "\"auto\" stops grouping at d 256, not above it"),
    M("groups-user-setting-split", "src/sanlab/study/groups.py",
      "    while setting == \"auto\" and sum(counts.values())", "    while sum(counts.values())",
      (T + "test_study_groups.py",), "a user's integer runner.members is split to fill idle workers"),
    M("groups-solo-gets-speedup", "src/sanlab/study/groups.py",
      "return total / MEMBER_SPEEDUP if len(part) > 1 else total", "return total / MEMBER_SPEEDUP",
      (T + "test_study_groups.py",), "balance credits a solo run with the members' speed-up"),
    M("groups-rerun-not-resumed", "src/sanlab/study/groups.py",
      "metas = train_members(cfgs, dirs, resume=True)", "metas = train_members(cfgs, dirs)",
      (T + "test_members.py",), "a killed group rerun by the study fails every member instead of resuming"),
    M("runner-gpu-groups", "src/sanlab/study/runner.py",
      "        if self.members == 1 or self.gpus:", "        if self.members == 1:",
      (T + "test_study_groups.py",), "GPU runs are grouped, a group training on a GPU slot it never took"),
    M("runner-group-cost-max", "src/sanlab/study/runner.py",
      "-sum(j.cost for j in g)))", "-max(j.cost for j in g)))",
      (T + "test_study_groups.py",), "a group starts by its costliest run, not its total"),
    M("warm-raw-wait-status", "src/sanlab/study/warm.py",
      '{"rc": os.waitstatus_to_exitcode(status)}', '{"rc": status}',
      (T + "test_study_warm.py",), "a forked run's exit code is its raw wait status (256 for 1)"),
    M("warm-stderr-lost", "src/sanlab/study/warm.py",
      "        os.dup2(fd, 2)", "        os.dup2(fd, 1)",
      (T + "test_study_warm.py",), "a forked run's traceback is lost, not in its run's log"),
    M("noise-spreads-added-linearly", "src/sanlab/study/noise.py",
      "+ math.hypot(sa or 0.0, sb or 0.0)", "+ (sa or 0.0) + (sb or 0.0)",
      (T + "test_study_noise.py",), "two studies' seed spreads add linearly, not in quadrature"),
    M("members-waiting-member-steps", "src/sanlab/train/members.py",
      "if m.status == \"running\" and m.start <= step]", "if m.status == \"running\"]",
      (T + "test_members.py",), "a member resumed a save ahead of the group is stepped before the group reaches it"),
    M("members-resume-drops-optimizer-state", "src/sanlab/train/members.py",
      "                optim.absorb(i, mem.solo_optims, mem.solo)", "                pass",
      (T + "test_members.py",), "a resumed member restarts its optimizer state from zero"),
    M("members-gated-gate-shared", "src/sanlab/model/members.py",
      "        s = torch.sigmoid(g)  # (M, 1)", "        s = torch.sigmoid(g[:1]).expand(g.shape)",
      (T + "test_members.py",), "every member's residual uses the first member's gate"),
    M("members-gate-grad-summed-over-members", "src/sanlab/model/csrc/norms.c",
      "for (long c = q * per; c < (q + 1) * per; c++) total += partial[c];",
      "for (long c = 0; c < nchunks; c++) total += partial[c];",
      (T + "test_members.py",), "a member's gate gradient sums every member's rows"),
    M("members-norm-gain-shared", "src/sanlab/model/members.py",
      "out_bf16=int(out_dtype == torch.bfloat16), nthreads=torch.get_num_threads(),\n            group_rows=x.numel() // d // M))",
      "out_bf16=int(out_dtype == torch.bfloat16), nthreads=torch.get_num_threads(),\n            group_rows=0))",
      (T + "test_members.py",), "every member's RMS norm uses the first member's gain"),
    M("members-norm-chunks-across-members", "src/sanlab/model/csrc/norms.c",
      "const long g0 = c / per * group, lo = g0 + c % per * CHUNK_ROWS;",
      "const long g0 = c / per * group, lo = g0 + c % per * CHUNK_ROWS + (c / per > 0);",
      (T + "test_members.py",), "a member's norm gradient chunks start one row off its first row"),
    M("members-attention-gains-shared", "src/sanlab/model/members.py",
      "cfg.norm_eps, H, Hkv, fused_mode(qkv), B)", "cfg.norm_eps, H, Hkv, fused_mode(qkv), 0)",
      (T + "test_members.py",), "every member's QK-norm uses the first member's gains"),
    M("members-attention-dgain-summed-over-members", "src/sanlab/model/csrc/attention.c",
      "const long b1 = (long)(m + 1) * every < B ? (long)(m + 1) * every : B;", "const long b1 = B;",
      (T + "test_members.py",), "a member's QK-norm gain gradient sums the later members' rows too"),
    M("study-groups-members-cap-ignored", "src/sanlab/study/groups.py",
      "    return int(setting)", "    return AUTO_MAX_MEMBERS",
      (T + "test_study_groups.py",), "runner.members = N (1 included) does not cap the groups"),
    M("study-groups-arms-mixed", "src/sanlab/study/groups.py",
      '    d["data"].pop("dir", None)', '    d["data"].pop("dir", None)\n    d.pop("model", None)',
      (T + "test_study_groups.py",), "runs of different arms fall into one class of members"),
    M("study-groups-not-balanced", "src/sanlab/study/groups.py",
      "        counts[k] += 1", "        break",
      (T + "test_study_groups.py",), "auto grouping leaves workers idle"),
    M("study-groups-never-cut-for-balance", "src/sanlab/study/groups.py",
      "        if best >= now * (1 - BALANCE_GAIN):", "        if True:",
      (T + "test_study_groups.py",), "a group as costly as the other groups together is never cut"),
    M("study-groups-balance-any-gain", "src/sanlab/study/groups.py",
      "        if best >= now * (1 - BALANCE_GAIN):", "        if best >= now:",
      (T + "test_study_groups.py",), "`balance` cuts a group for any gain, however small"),
    M("runner-balances-every-batch", "src/sanlab/study/runner.py",
      "waiting.extend(self._groups(own, balance=first))", "waiting.extend(self._groups(own, balance=True))",
      (T + "test_study_groups.py",), "the jobs `more` adds while others run are cut as if they started on idle workers"),
    M("runner-never-balances", "src/sanlab/study/runner.py",
      "        add(jobs, first=True)", "        add(jobs)",
      (T + "test_study_groups.py",), "the runner never balances the batch it starts with"),
    M("plan-sweep-not-balanced", "src/sanlab/study/groups.py",
      'if phase == "sweep" or not getattr(plan, "stream", False) else None)', "if False else None)",
      (T + "test_study_groups.py",), "`study plan` groups the sweep without the balance the runner gives it"),
    # ---- trainer
    M("train-loss-unweighted", "src/sanlab/train/trainer.py",
      "ce_sum += ce.detach().double() * n", "ce_sum += ce.detach().double()",
      (T + "test_train_loop.py",), "the logged training loss is not the token mean"),
    M("nonfinite-not-divergence", "src/sanlab/train/trainer.py",
      "diverged = not (math.isfinite(train_loss) and math.isfinite(grad_norm)) or spike",
      "diverged = spike",
      (T + "test_train_loop.py",), "a non-finite loss is not treated as divergence"),
    M("val-loss-per-batch", "src/sanlab/train/trainer.py",
      "out = {\"val_loss\": sum(loss) / max(sum(count), 1.0)}", "out = {\"val_loss\": sum(loss) / max(len(batches), 1)}",
      (T + "test_train_loop.py",), "the validation loss is a mean over batches, not over tokens"),
    # ---- data
    M("split-seed-differs", "src/sanlab/data/prepare.py",
      "held_out = is_val(cfg.seed, index, cfg.val_frac)", "held_out = is_val(cfg.seed + 1, index, cfg.val_frac)",
      (T + "test_catches_data.py", T + "test_data_prepare.py"),
      "the written validation split is not the one the tokenizer held out"),
    M("special-token-regions", "src/sanlab/data/tokenizer.py",
      "        reg[tid < N_SPECIAL] = OTHER\n", "",
      (T + "test_catches_data.py", T + "test_data_tokenizer.py"), "a literal special token in text keeps its span's region"),
    # ---- study sweep and matching
    M("sweep-extension-budget", "src/sanlab/study/sweep.py",
      "budget = max_extensions - extensions", "budget = max_extensions",
      (T + "test_study_sweep.py",), "boundary extension ignores the extensions already made"),
    M("sweep-all-failed-stops", "src/sanlab/study/sweep.py",
      "at_low = best is None or best == lo", "at_low = best == lo",
      (T + "test_study_sweep.py",), "a cell whose every point failed does not try a lower LR"),
    M("matching-smallest-partner", "src/sanlab/matching.py",
      "        return below[-1]\n", "        return below[0]\n",
      (T + "test_match_cli.py", T + "test_accounting.py"), "at_most picks the smallest partner, not the closest"),
    # ---- checkpoint
    M("checkpoint-no-rng", "src/sanlab/train/checkpoint.py",
      "    if restore_rng:\n        set_rng_state(state[\"rng\"])",
      "    if restore_rng:\n        pass",
      (T + "test_train_checkpoint.py", T + "test_train_resume.py"), "a resume does not restore the RNG states"),
    M("checkpoint-no-checksum", "src/sanlab/train/checkpoint.py",
      "        if digest != checksums[name]:", "        if False:",
      (T + "test_train_checkpoint.py",), "a corrupt checkpoint file is loaded"),
    M("checkpoint-optim-state-lost", "src/sanlab/train/checkpoint.py",
      "entry.update({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})", "pass",
      (T + "test_train_checkpoint.py", T + "test_train_resume.py"),
      "a resume restarts the optimizer state (moments, momentum buffers)"),
    # ---- study table
    M("gap-sign-flipped", "src/sanlab/study/table.py",
      "gap.per_seed[seed] = la - lr_", "gap.per_seed[seed] = lr_ - la",
      (T + "test_catches_study.py", T + "test_study_arms.py", T + "test_study_orchestrate.py"),
      "Δ is reference − arm instead of arm − reference"),
    M("spread-population", "src/sanlab/study/noise.py",
      "statistics.stdev(xs) if len(xs) > 1", "statistics.pstdev(xs) if len(xs) > 1",
      (T + "test_catches_study.py", T + "test_study_orchestrate.py", T + "test_study_sweep.py"),
      "the spread over seeds is the population, not the sample, standard deviation"),
    M("floor-ignores-spread", "src/sanlab/study/noise.py",
      "return max(abs(m), sd or 0.0)", "return abs(m)",
      (T + "test_catches_study.py", T + "test_study_orchestrate.py", T + "test_study_sweep.py"),
      "'within noise' ignores the floor's seed-to-seed spread"),
    # ---- records: verdicts, kinds, export
    M("records-shrink-ignores-middle", "src/sanlab/records/matched.py",
      "    if overall == 1 and not grows:\n", "    if overall == 1:\n",
      (T + "test_records.py",), "the iso-param gap 'shrinks' though it grew on the way (only the ends read)"),
    M("records-ordering-one-step", "src/sanlab/records/matched.py",
      "return ordering_verdict(noise.sign(x, floor) for x in steps)",
      "return ordering_verdict(noise.sign(x, floor) for x in steps[:1])",
      (T + "test_records.py",), "the gap ordering reads only its first step (iso-depth vs iso-FLOP)"),
    # ---- issue 46: paths, record files, readers' schemas, formats (each test: one row of the table)
    M('paths-symlinks-followed', 'src/sanlab/paths.py',
      '        if not os.path.islink(walked):',
      '        if True:',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[analyze input a symlink loop]', 'tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[train out a dangling symlink]',),
      'a symlink loop or a dangling symlink as a path is a traceback'),
    M('paths-name-length-unchecked', 'src/sanlab/paths.py',
      '        if len(os.fsencode(part)) > limit:',
      '        if False:',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[export out name too long]',),
      'a name over NAME_MAX is an OSError traceback'),
    M('paths-empty-is-the-cwd', 'src/sanlab/paths.py',
      '    if isinstance(path, str) and not path:',
      '    if False:',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[export out empty]',),
      "--hf '' exports into the current directory"),
    M('paths-parsed-unchecked', 'src/sanlab/cliargs.py',
      '        if action.type is Path:',
      '        if False:',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[analyze input a symlink loop]',),
      'a type=Path argument is not checked as it is parsed'),
    M('paths-cwd-replaced', 'src/sanlab/paths.py',
      '    if here == there or here.is_relative_to(there):',
      '    if False:',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[export into the dir holding the cwd]',),
      'a dir written whole may be the cwd (EBUSY)'),
    M('records-export-hash-unchecked', 'src/sanlab/records/export.py',
      '            if not p.is_file() or p.is_symlink() or hashes.get(f) != marker.file_hash(p):',
      '            if not p.is_file() or p.is_symlink():',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[record export README listed by hand]',),
      "a re-export deletes a file listed in record.json by hand (the user's README)"),
    M('records-marker-dot', 'src/sanlab/records/marker.py',
      '    return all(p not in ("", ".", "..") for p in parts) and parts[0] != MARKER',
      '    return all(p != ".." for p in parts) and parts[0] != MARKER',
      ("tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[record check files lists '.']",),
      "record.json listing '.' is an IndexError"),
    M('records-readme-unpaired-marker', 'src/sanlab/records/readme.py',
      '    seen = _check_markers(text, rec.dir / README)',
      '    seen = [m.group(1) for m in BLOCK.finditer(text)]',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[record check BEGIN without END]',),
      'a BEGIN marker without END is skipped and check passes'),
    M('records-damaged-results-read', 'src/sanlab/records/study.py',
      '    if bad:  # the tables would be computed',
      '    if False:  # the tables would be computed',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[record check garbage in results]',),
      'a record is read from a results store with damaged lines (tables wiped)'),
    M('records-export-torn-line', 'src/sanlab/records/studycopy.py',
      '    if bad:  # a record is built from whole results only',
      '    if False:  # a record is built from whole results only',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[record export a torn last line]',),
      'export commits a torn last line silently'),
    M('suite-points-unchecked', 'src/sanlab/probes/layout.py',
      '            _fields(point, f"cells[{i}].points[{j}]", _POINT)',
      '            pass',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[merge points not objects]',),
      'a suite.json point that is not an object is an AttributeError in merge'),
    M('suite-tasks-any-list', 'src/sanlab/probes/layout.py',
      '_TOP = {"tasks": (_strs, ',
      '_TOP = {"tasks": (lambda v: isinstance(v, list), ',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[merge tasks nested]',),
      'tasks: [["dyck"]] is a TypeError in merge'),
    M('checkpoint-format-unchecked', 'src/sanlab/train/checkpoint.py',
      '    if type(fmt) is not int or fmt != FORMAT:',
      '    if False:',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[sample state.json format 2]',),
      'the verifier accepts a state.json of another format, or of none'),
    M('checkpoint-format-true', 'src/sanlab/train/checkpoint.py',
      '    if type(fmt) is not int or fmt != FORMAT:',
      '    if fmt != FORMAT:',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[analyze state.json format true]',),
      'the verifier takes format true (== 1 in Python)'),
    M('resume-history-dropped', 'src/sanlab/train/rundir.py',
      '            check_history(out / META_FILE)',
      '            pass',
      ('tests/test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[resume over a torn meta.json]',),
      'a resume over a damaged meta.json rewrites it without resumes and init'),
    M("records-export-over-foreign-files", "src/sanlab/records/export.py",
      "                if f.relative_to(dst).as_posix() not in own:\n",
      "                if False:\n",
      (T + "test_records_export.py",), "a re-export runs over a file in the record that is not its own"),
    M("records-export-anywhere", "src/sanlab/records/export.py",
      "    if not dst.exists() or not any(dst.iterdir()):\n        return None\n    if marker.is_record(dst):",
      "    if True:\n        return None\n    if marker.is_record(dst):",
      (T + "test_records_export.py",), "export writes into any dir (a user's, a run dir, a study dir)"),
    M("records-capacity-unbracketed", "src/sanlab/records/probes.py",
      "bracketed = k < best_n and any(int(p[\"n\"]) > best_n for p in pts)", "bracketed = True",
      (T + "test_records_kinds.py",), "a capacity from one N (its maximum over N unknown) decides the claim"),
    M("records-ablation-wrong-reference", "src/sanlab/records/probes.py",
      "return max(subsets, key=lambda a: len(a.get(\"overrides\") or []), default=None)",
      "return min(subsets, key=lambda a: len(a.get(\"overrides\") or []), default=None)",
      (T + "test_records_kinds.py",), "an ablation is compared with the suite arm it changes, not any arm below it"),
    M("records-ablation-diff-reversed", "src/sanlab/records/probes.py",
      "                    diff = a[0] / a[1] - b[0] / b[1]", "                    diff = b[0] / b[1] - a[0] / a[1]",
      (T + "test_records_kinds.py",), "an ablation's difference is ablation minus reference"),
    M("probe-wall-is-reuse-time", "src/sanlab/probes/runner.py",
      "point.wall_s = final.get(RUN_WALL) if final.get(RUN_WALL) is not None else outcome.get(\"wall_s\")",
      "point.wall_s = outcome.get(\"wall_s\")",
      (T + "test_probes_cli.py",), "a reused point reports its run's training wall time, not the reuse's"),
    M("records-probe-runs-not-kept", "src/sanlab/records/kinds.py",
      "    files += _probe_run_files(src, files)\n", "",
      (T + "test_records_export.py",), "a probes record keeps each sweep point's config, meta and probe.json"),
    M("records-probe-run-dir-unchecked", "src/sanlab/probes/layout.py",
      "if len(parts) != 2 or parts[0] != RUNS or \"..\" in parts:", "if False:",
      (T + "test_records_export.py",), "a point's run dir outside the suite's runs/ is refused"),
    M("records-probe-copy-unverified", "src/sanlab/records/kinds.py",
      "        if block(a) != block(b):", "        if False:",
      (T + "test_records_export.py",), "a probes export checks every README block on the copy"),
    M("records-mixit-no-margin", "src/sanlab/records/probes.py",
      "margin = EQUIVALENCE_PTS / 100", "margin = 0.0",
      (T + "test_records_kinds.py",), "'MixiT ≈ standard' needs MixiT at or above the standard arm"),
    M("records-variant-step-reversed", "src/sanlab/records/variants.py",
      "return [db[s] - da[s] for s in paired(da, db)]", "return [da[s] - db[s] for s in paired(da, db)]",
      (T + "test_records_kinds.py",), "a variants step is loss(a) − loss(b): the ordering read backwards"),
    M("records-axis-settled-first-step-only", "src/sanlab/records/axis.py",
      "        if all(s and noise.sign(s, floor) == 0 for s in steps):",
      "        if steps[:1] and steps[0] and noise.sign(steps[0], floor) == 0:",
      (T + "test_records_axis.py",), "the context Δ counts as settled when only its next step is within noise"),
    M("records-axis-stored-one-pair", "src/sanlab/records/axis.py",
      "all(x > 2 * e for x, e in zip(d, se))", "any(x > 2 * e for x, e in zip(d, se))",
      (T + "test_records_axis.py",), "the stored-bits claim holds when any one seed pair clears 2 se"),
    M("records-axis-milestone-replaces-final", "src/sanlab/records/axis.py",
      "    points[100] = view.analyses", "    points[100] = points.get(max(points, default=0), view.analyses)",
      (T + "test_records_axis.py",), "the learning curve's last point reads a milestone analysis, not the final one"),
    # ---- batched greedy generation (generate_until)
    M("eval-gen-bucket-ignores-budget", "src/sanlab/eval/adapter.py",
      "buckets.setdefault((len(job.ids), job.cfg.max_new_tokens), []).append(i)",
      "buckets.setdefault((len(job.ids), 0), []).append(i)",
      (T + "test_eval_adapter.py",), "requests with other token budgets decode in one batch at the first one's"),
    M("eval-gen-row-past-eos", "src/sanlab/eval/adapter.py",
      "                    if tok == EOS_ID:\n                        live[r] = False\n                        continue\n", "",
      (T + "test_eval_adapter.py",), "a batch row goes on decoding after it picked EOS"),
    M("eval-gen-feeds-row-0", "src/sanlab/eval/adapter.py",
      "logits = dec.append(nxt.view(B, 1))", "logits = dec.append(nxt[:1].expand(B).reshape(B, 1))",
      (T + "test_eval_adapter.py",), "every batch row is fed the first row's token"),
    M("eval-gen-batch-unbounded", "src/sanlab/eval/adapter.py",
      "for c in range(0, len(idx), self.batch_rows):\n                chunk = idx[c:c + self.batch_rows]",
      "for c in range(0, len(idx), 64):\n                chunk = idx[c:c + 64]",
      (T + "test_eval_adapter.py",), "a decode batch ignores --batch-size"),
    M("eval-gen-sampled-batched", "src/sanlab/eval/adapter.py",
      "            if job.cfg.temperature == 0:", "            if True:",
      (T + "test_eval_adapter.py",), "a sampled request decodes greedily in a batch"),
    M("eval-gen-no-early-stop", "src/sanlab/eval/adapter.py",
      "                if not any(live) or step == budget - 1:", "                if step == budget - 1:",
      (T + "test_eval_adapter.py",), "a batch decodes to its budget after every row has stopped"),
    M("bench-generate-alone-batched", "benchmarks/bench_generate.py",
      "return 0 if agree == len(reqs) else 1", "return 0",
      (T + "test_bench_generate.py",), "bench_generate passes when the batched answers differ"),
    M("eval-recall-ambiguous-prefix", "src/sanlab/eval/builtin.py",
      "context = _closed_book_context(rng, entities[f.entity], f, RECALL_FORM.get(f.attr))",
      "context = _closed_book_context(rng, entities[f.entity], f)",
      (T + "test_eval_cli.py",), "recall asks a birthplace after '… was born in', which opens a birth year too"),
    M("eval-grounded-drops-peers-first", "src/sanlab/eval/builtin.py",
      "drop = next((s for s in notes if s != key and s not in near), None) or \\",
      "drop = next((s for s in notes if s != key), None) or \\",
      (T + "test_eval_cli.py",), "fitting a grounded item drops the same-attribute distractors as readily as the rest"),
    M("eval-grounded-not-fitted", "src/sanlab/eval/builtin.py",
      "grounded = grounded_items(world, N_ITEMS, rng, fits)", "grounded = grounded_items(world, N_ITEMS, rng)",
      (T + "test_eval_cli.py",), "grounded items longer than the run's rows are cut from the left, key note and all"),
    M("study-plan-groups-as-runs", "src/sanlab/study/groups.py",
      "sum(makespan([_unit_seconds(plan, runs, g) for g in groups], workers)",
      "sum(makespan([_unit_seconds(plan, runs, [i]) for g in groups for i in g], workers)",
      (T + "test_study_groups.py",), "the plan's total spreads a group's runs over the workers as if solo"),
    M("records-check-ignores-missing-files", "src/sanlab/records/readme.py",
      "if readme(r, check=True, log=log) or missing:", "if readme(r, check=True, log=log):",
      (T + "test_records.py",), "`record check` passes a record missing files its record.json lists"),
    M("capacity-fano-no-error-term", "src/sanlab/probes/capacity.py",
      "- h2 - (1.0 - a) * math.log2(alphabet - 1)", "- h2",
      (T + "test_probes_cli.py",), "Fano's bound without the (1 − a)·log2(A − 1) term credits wrong labels"),
    M("capacity-fano-credits-chance", "src/sanlab/probes/capacity.py",
      "if a <= 1.0 / alphabet:", "if a < 0:",
      (T + "test_probes_cli.py",), "the chance-free reading scores accuracy at or below chance"),
    M("records-capacity-fano-se-slope", "src/sanlab/records/probes.py",
      "dbits = best_n * abs(math.log2(a * (alphabet - 1) / (1 - a)))", "dbits = best_n * math.log2(alphabet)",
      (T + "test_records_kinds.py",), "the Fano reading's se uses the count's slope, not the delta method's"),
    M("probe-capacity-model-d64", "src/sanlab/probes/runner.py",
      'CAPACITY_MODEL: tuple[str, ...] = ("model.d_model=16",)', "CAPACITY_MODEL: tuple[str, ...] = ()",
      (T + "test_probes_cli.py",), "full-budget capacity cells train the d64 probe model the grid cannot bracket"),
    M("probe-merge-same-task-twice", "src/sanlab/probes/merge.py",
      "            if task in owner:", "            if False:",
      (T + "test_probes_merge.py",), "a merge takes a task from two pieces (two measurements of one cell)"),
    M("probe-merge-no-run-files", "src/sanlab/probes/merge.py",
      "copied += sum(_copy(d / rd / f, out / rd / f) for f in RUN_FILES)", "pass",
      (T + "test_probes_merge.py",), "a merged suite loses its pieces' run files (the cells' provenance)"),
    M("probe-merge-piece-order", "src/sanlab/probes/merge.py",
      "order = [t for t in SUITE_TASKS if t in set(tasks)]", "order = list(tasks)",
      (T + "test_probes_merge.py",), "a merged grid in the pieces' order, not SPEC §2's"),
    M("probe-merge-run-dir-outside", "src/sanlab/probes/merge.py",
      "        raise DataError(f\"--merge: {e}\") from None", "        run_dirs = []",
      (T + "test_probes_merge.py",), "a merge follows a piece's run dir outside its runs/"),
    M("probe-suite-drops-other-tasks", "src/sanlab/probes/merge.py",
      'keep = [t for t in old["tasks"] if t not in tasks]', "keep = []",
      (T + "test_probes_cli.py",), "a suite of some tasks into a suite's dir drops the other tasks' cells"),
    M("probe-suite-carries-by-task-field", "src/sanlab/probes/merge.py",
      "return [c for c in old[\"cells\"] if task_of(c) in keep]", "return [c for c in old[\"cells\"] if c.get(\"task\") in keep]",
      (T + "test_probes_cli.py::test_a_suite_of_other_tasks_keeps_the_dirs_capacity_column",),
      "a suite of other tasks into a suite's dir drops the capacity column's cells (task memorize)"),
    M("probe-merge-arms-by-name", "src/sanlab/probes/merge.py",
      "return [(a.get(\"name\"), tuple(a.get(\"overrides\") or ())) for a in arms]",
      "return [(a.get(\"name\"), ()) for a in arms]",
      (T + "test_probes_merge.py",), "a merge joins pieces whose arms have the same names but other overrides"),
    M("probe-merge-wall-max", "src/sanlab/probes/merge.py",
      "wall_s=sum(walls) if walls else None", "wall_s=max(walls) if walls else None",
      (T + "test_probes_merge.py",), "a merged suite's wall time is its longest piece's, not their sum"),
    M("probe-merge-quick-mixed", "src/sanlab/probes/merge.py",
      "        if bool(suite.get(\"quick\")) != bool(first.get(\"quick\")):", "        if False:",
      (T + "test_probes_merge.py",), "a merge joins a --quick piece with a full-budget one"),
    M("records-grid-no-bracket-mark", "src/sanlab/records/probes.py",
      """("" if point is None or point["bracketed"] else "†")""", '""',
      (T + "test_records_kinds.py",), "the grid shows an unbracketed capacity maximum as if it were one"),
    M("records-reference-by-spelling", "src/sanlab/records/probes.py",
      'mine = {_override_key(o) for o in arm.get("overrides") or []}', 'mine = {(o, "") for o in arm.get("overrides") or []}',
      (T + "test_records_kinds.py",), "an ablation's reference arm found by the overrides' spelling, not their values"),
    M("probe-registry-skips-a-file", "src/sanlab/data/probes/__init__.py",
      'if not info.ispkg and info.name != "base":', 'if not info.ispkg and info.name not in ("base", "copying"):',
      (T + "test_probes_copying.py",), "a task file the package does not import is no task (the registry lists by hand)"),
    M("probe-task-defaults-swapped", "src/sanlab/data/probes/base.py",
      "return self.quick if quick else self.full", "return self.full if quick else self.quick",
      (T + "test_probes_copying.py",), "--quick runs a task at its full size and the full run at its quick one"),
    M("probe-suite-runs-opt-out-tasks", "src/sanlab/probes/suite.py",
      "SUITE_TASKS: tuple[str, ...] = tuple(c.name for c in columns() if c.suite)",
      "SUITE_TASKS: tuple[str, ...] = tuple(c.name for c in columns())",
      (T + "test_probes_copying.py",), "--suite runs tasks that are not SPEC §2's columns (copying, memorize)"),
    M("records-mixit-tasks-any-number", "src/sanlab/records/probes.py",
      'MIXIT_MATCHES = tuple(name for name, p in _PAPER.items() if p.get("mixit") == "≈ standard")',
      'MIXIT_MATCHES = tuple(name for name, p in _PAPER.items() if "mixit" in p)',
      (T + "test_probes_copying.py",), "'MixiT ≈ standard' read on every task the paper has a MixiT number for"),
    M("records-check-counted-as-claim", "src/sanlab/records/common.py",
      "out.append(replace(row, rule=u.key, check=u.check))", "out.append(replace(row, rule=u.key, check=False))",
      (T + "test_overclaim.py", T + "test_records_claims.py"),
      "the region identity (exact by construction) is a row of the claims table, counted as reproduced"),
    M("records-checks-in-claims-table", "src/sanlab/records/common.py",
      "claims, checks = [c for c in rows if not c.check], [c for c in rows if c.check]",
      "claims, checks = rows, [c for c in rows if c.check]",
      (T + "test_overclaim.py", T + "test_records_claims.py"), "a check is listed among the claims as well"),
    M("records-docs-rule-keeps-label", "src/sanlab/records/common.py",
      "{u.rule.split(': ', 1)[-1]}", "{u.rule}",
      (T + "test_records_claims.py",), "docs/records.md renders a rule other than the unit's (its README label kept)"),
    M("records-identity-verdict-a-claim", "src/sanlab/records/matched.py",
      "return HOLDS if all(e <= IDENTITY_TOL for e in rel_errors) else DOES_NOT_HOLD",
      "return REPRODUCED if all(e <= IDENTITY_TOL for e in rel_errors) else DOES_NOT_HOLD",
      (T + "test_overclaim.py",), "the identity check says 'reproduced', a claim's word"),
    M("study-one-seed-no-floor-ahead", "src/sanlab/study/table.py",
      "        if len(g.per_seed) < 2:\n            return NO_NOISE\n", "",
      (T + "test_overclaim.py", T + "test_study_noise.py"),
      "a one-seed gap with no noise floor names the arm ahead (no noise estimate at all)"),
    M("config-bare-words-refused", "src/sanlab/configbase.py",
      "    if words is not None:\n        candidates.append(words)\n", "",
      (T + "test_config.py",), "an override's [bare, words] is refused, not read as a list of strings"),
    M("config-no-layer-bound", "src/sanlab/config.py",
      "        if self.n_layers > MAX_LAYERS:", "        if False:",
      (T + "test_config.py",), "an absurd n_layers builds a per-layer list during validation"),
    # ---- report: its data path
    M("report-pairs-any-completed", "src/sanlab/report/data.py",
      'if all((data.records.get(r) or {}).get("status") == "completed" for r in (ref, arm)):',
      'if any((data.records.get(r) or {}).get("status") == "completed" for r in (ref, arm)):',
      (T + "test_report_data.py",), "--analyze picks a final pair whose other run failed"),
    M("report-damaged-lines-uncounted", "src/sanlab/report/data.py",
      "data = StudyData(d, spec, records, store.damaged(), tables, err, {}, {}, [])",
      "data = StudyData(d, spec, records, [], tables, err, {}, {}, [])",
      (T + "test_report_data.py", T + "test_report.py"), "the report skips damaged results lines without saying so"),
    M("report-noise-band-spread", "src/sanlab/report/plots.py",
      'return floor[0].get("size") if floor else None', 'return floor[0].get("spread") if floor else None',
      (T + "test_report_data.py",), "the report's noise band is the floor's sd, not its size F"),
    M("report-analysed-pairs-by-arm", "src/sanlab/report/data.py",
      "if any((a, g.reference) not in have or a not in runs for a in g.arms) or g.reference not in runs]",
      "if all((a, g.reference) not in have for a in g.arms)]",
      (T + "test_report_data.py",), "a pair group counts as analysed when any one of its comparisons is"),
    M("report-milestone-final-weights", "src/sanlab/report/data.py",
      'argv += ["--checkpoint", f"milestone-{milestone:03d}", "--skip", MILESTONE_SKIP]',
      'argv += ["--skip", MILESTONE_SKIP]',
      (T + "test_report_milestones.py",), "a milestone analysis reads the final weights, not the milestone's"),
    M("report-milestones-any-run", "src/sanlab/report/data.py",
      "have = ms if have is None else have & ms", "have = ms if have is None else have | ms",
      (T + "test_report_milestones.py",), "a group is analysed at a milestone only some of its runs have"),
    # ---- analysis identities
    M("delta-weight-by-group", "src/sanlab/analysis/losses.py",
      "weighted = k / n * (la - lb)", "weighted = (la - lb) / len(names)",
      (T + "test_analysis_losses.py",), "group Δs are averaged, not token-weighted"),
    M("loss-share-by-tokens", "src/sanlab/analysis/losses.py",
      "\"loss_share\": s / total if total else float(\"nan\"),", "\"loss_share\": k / n,",
      (T + "test_analysis_losses.py",), "the loss share is the token share"),
    M("stable-rank-not-squared", "src/sanlab/analysis/metrics.py",
      "return float((s**2).sum()) / top**2 if top > 0 else 0.0", "return float(s.sum()) / top if top > 0 else 0.0",
      (T + "test_analysis_metrics.py",), "stable rank is Σσ/σ₁ instead of Σσ²/σ₁²"),
    M("accounting-wo-dropped", "src/sanlab/model/mixers/spec.py",
      "return {name: p.size for name, p in cls.params(cfg, opts).items()}",
      "return {name: p.size for name, p in cls.params(cfg, opts).items() if not name.startswith(\"wo.\")}",
      (T + "test_accounting.py",), "the parameter count leaves out W_o"),
    # ---- the variants as the papers define them (SPEC §2–3)
    M("mixit-seed-no-layer", "src/sanlab/model/mixers/mixit.py",
      "return seed * 1_000_003 + layer_idx", "return seed * 1_000_003",
      (T + "test_variants.py::test_each_mixit_layer_draws_its_own_matrices",),
      "every MixiT layer draws the same matrices"),
    M("mixit-sigma-row-length", "src/sanlab/model/mixers/mixit.py",
      "lengths = same.sum(-1)  # (B, T)", "lengths = torch.full_like(pos, T)  # (B, T)",
      (T + "test_variants.py::test_mixit_mixes_each_document_at_its_own_length",),
      "MixiT's σ_h from the row's length instead of each document's"),
    M("mixit-default-row", "src/sanlab/model/mixers/mixit.py",
      "sigma_length: SigmaLength = \"document\"  # what", "sigma_length: SigmaLength = \"row\"  # what",
      (T + "test_variants.py::test_mixit_mixes_each_document_at_its_own_length",),
      "MixiT's default builds σ_h for mixer_options.seq_len again"),
    M("frozen-qk-gains-train", "src/sanlab/model/mixers/softmax.py",
      "freezable = {\"qk\": (\"wq.weight\", \"wk.weight\", \"q_norm.weight\", \"k_norm.weight\"),",
      "freezable = {\"qk\": (\"wq.weight\", \"wk.weight\"),",
      (T + "test_variants.py::test_frozen_weights_stay_bit_identical_without_optimizer_state",),
      "Frozen-QK leaves the QK-norm gains trainable"),
    M("nonapprox-qk-norm-default", "src/sanlab/model/mixers/non_approximate.py",
      "    qk_norm: bool = False\n", "    qk_norm: bool = True\n",
      (T + "test_variants.py::test_non_approximate_is_spec3_by_default",),
      "non-approximate normalises SiLU(q) and k by default again"),
    M("stream-v-from-fixed", "src/sanlab/model/mixers/softmax.py",
      "v = self.wv(u)  # V always from the current hidden state", "v = self.wv(src)  # V always from the current hidden state",
      (T + "test_variants.py::test_stream_qk_takes_v_from_the_real_hidden_state",),
      "the stream-QK variants take V from the fixed / static stream"),
    M("fixedseq-random-ids", "src/sanlab/model/mixers/fixed_seq_qk.py",
      "sequence: Literal[\"data\", \"random\"] = \"data\"", "sequence: Literal[\"data\", \"random\"] = \"random\"",
      (T + "test_variants.py::test_fixed_seq_qk_takes_the_first_held_out_document",),
      "FixedSeqQK's sequence is random token ids again"),
    M("fixedseq-embed-unscaled", "src/sanlab/model/mixers/fixed_seq_qk.py",
      "return embed(tokens[None].to(device)) * scale", "return embed(tokens[None].to(device))",
      (T + "test_variants.py::test_fixed_seq_qk_stream_is_what_the_model_computes_for_its_sequence",),
      "FixedSeqQK's sequence enters the layers without the √d embedding scale real tokens get"),
    # ---- the mixers' specs and hooks (sanlab.model.mixers)
    M("spec-wk-shape-wrong", "src/sanlab/model/mixers/softmax.py",
      "\"wk.weight\": Param((Hkv * D, d), \"routing\", \"normal\"),",
      "\"wk.weight\": Param((H * D, d), \"routing\", \"normal\"),",
      (T + "test_variants.py::test_init_roles_and_accounting_are_the_recorded_ones",),
      "softmax attention's spec gives W_k a query head per row (no GQA)"),
    M("spec-init-order-reversed", "src/sanlab/model/mixers/base.py",
      "        for name, p in self.declared.items():\n            reset_parameter(",
      "        for name, p in reversed(self.declared.items()):\n            reset_parameter(",
      (T + "test_variants.py::test_init_roles_and_accounting_are_the_recorded_ones",),
      "a module initialises its parameters out of their declared order (other draws)"),
    M("spec-out-init-as-std", "src/sanlab/model/mixers/base.py",
      "nn.init.normal_(t, 0.0, out_std)", "nn.init.normal_(t, 0.0, std)",
      (T + "test_variants.py::test_init_is_owned_by_the_modules",),
      "matrices that write into the residual stream get the input-side std"),
    M("spec-part-imports-torch", "src/sanlab/model/mixers/mlp.py",
      "from sanlab.model.mixers.swiglu import swiglu_params\n",
      "from sanlab.model.mixers.swiglu import swiglu, swiglu_params\n",
      (T + "test_variants.py::test_specs_config_and_accounting_need_no_torch",),
      "a spec part takes a name from another file's module part (so loading the registry imports torch)"),
    M("prepare-hook-skipped", "src/sanlab/model/lm.py",
      "if f is not Mixer.prepare]", "if f is Mixer.prepare]",
      (T + "test_variants.py::test_stream_qk_patterns_are_input_independent",),
      "the model never runs its mixers' prepare hooks (the stream-QK variants read their own input)"),
    M("decode-cache-not-inherited", "src/sanlab/model/generate.py",
      "cache = type(mixer).decode_cache", "cache = type(mixer).__dict__.get(\"decode_cache\")",
      (T + "test_generate.py::test_a_subclass_inherits_its_parents_cache_or_decodes_by_full_forward",),
      "a subclass of softmax attention does not inherit its parent's decode cache"),
    M("options-unchecked-at-load", "src/sanlab/config.py",
      "            self._options = check_model(self)\n",
      "            pass\n",
      (T + "test_variants.py::test_mixer_names_and_options_are_checked_when_the_config_loads",),
      "config validation does not check the mixer names and options against the registry"),
    M("mixer-options-dropped", "src/sanlab/model/mixers/__init__.py",
      "    options = spec.validate_options(cfg.mixer_options, ", "    options = spec.validate_options({}, ",
      (T + "test_config.py::test_mixer_options_are_typed_by_the_mixer_s_spec_once_when_the_config_validates",),
      "model.mixer_options validated but dropped: the mixer runs on its defaults"),
    M("mixer-options-given-to-every-mixer", "src/sanlab/model/mixers/__init__.py",
      "    if name == cfg.mixer:\n        return cfg.options", "    if True:\n        return cfg.options",
      (T + "test_config.py::test_mixer_options_are_typed_by_the_mixer_s_spec_once_when_the_config_validates",),
      "a hybrid's softmax layers get the variant's options, not their own defaults"),
    # ---- report figures and tables (tests/test_report_figures.py reads the data behind each figure)
    M("report-delta-population-sd", "src/sanlab/report/build.py",
      "    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))\n    return f\"{m:+.4f} ± {sd:.4f}\"",
      "    sd = math.sqrt(sum((x - m) ** 2 for x in v) / len(v))\n    return f\"{m:+.4f} ± {sd:.4f}\"",
      (T + "test_report.py::test_region_and_exercise_delta_is_the_mean_and_sample_sd_of_the_analysed_pairs",),
      "the report's region / exercise Δ table is mean ± the population sd, not the sample sd"),
    M("report-figure-population-sd", "src/sanlab/report/plots.py",
      "return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))",
      "return math.sqrt(sum((x - m) ** 2 for x in v) / len(v))",
      (T + "test_report_figures.py",), "the Δ-by-group error bars are the population sd over seed pairs"),
    M("report-settled-unchecked", "src/sanlab/report/plots.py",
      "if y is not None and settled_holds(pts, m, tol):", "if y is not None:",
      (T + "test_report_figures.py",), "a 'settled' marker is drawn where its curve still moves"),
    M("report-sweep-absolute", "src/sanlab/report/plots.py",
      "return [(x, v - best) for x, v in ok] if best is not None else [], \\",
      "return [(x, v) for x, v in ok] if best is not None else [], \\",
      (T + "test_report_figures.py",), "the sweep panels plot the raw loss, not loss minus the cell's best"),
    M("report-thin-groups-not-greyed", "src/sanlab/report/plots.py",
      "\"thin\": [g for g in groups if tokens.get(g, 0) < MIN_GROUP_TOKENS]",
      "\"thin\": [g for g in groups if tokens.get(g, 0) < 1]",
      (T + "test_report_figures.py",), "groups with fewer than 200 analysed tokens are drawn as if they were not"),
    M("report-absent-types-dropped", "src/sanlab/report/plots.py",
      "absent = [g for g in corpus_groups(data, grouping) if g not in groups] if grouping == \"exercise\" else []",
      "absent = []",
      (T + "test_report_figures.py",), "exercise types missing from the analysed sample go unmentioned"),
    M("report-noise-arm-solid", "src/sanlab/report/plots.py",
      "ls = \"--\" if kind == \"noise\" else (\":\" if kind == \"sweep\" else \"-\")",
      "ls = \":\" if kind == \"sweep\" else \"-\"",
      (T + "test_report_figures.py",), "the noise-floor arm is drawn solid, hiding the reference under it"),
    M("tables-squeezed-to-columns", "src/sanlab/tables.py",
      "        c.width = max(width, need)\n", "        c.width = width\n",
      (T + "test_tables.py",), "off a terminal a table wider than COLUMNS is squeezed (cells cut with '…', wrapped)"),
    M("analysis-settled-by-shape-only", "src/sanlab/analysis/spectra.py",
      "else max(d, r) for d, r in zip(distances, rank_changes)]", "else d for d, r in zip(distances, rank_changes)]",
      (T + "test_analysis_spectra.py",), "crystallisation ignores the stable rank (a growing top singular value 'settles')"),
    M("analysis-bootstrap-90", "src/sanlab/analysis/losses.py",
      "    alpha = (1 - level) / 2\n", "    alpha = 1 - level\n",
      (T + "test_analysis_losses.py",), "the 95% bootstrap interval is a 90% one"),
    M("train-stop-not-evaluated", "src/sanlab/train/trainer.py",
      "                    stop_eval = evaluate(model, val_batches, amp, d)\n", "                    pass\n",
      (T + "test_train_resume.py::test_sigint_records_the_val_loss_of_the_step_it_stopped_at",),
      "a run stopped by a signal records no validation loss (its last line said val_loss None)"),
    M("plan-extensions-uncounted", "src/sanlab/study/plan.py",
      "room[cell_key(point.slug, arm.name, opt)] = max(\n"
      "                    0, spec.sweep.max_extensions - decision.extensions - len(planned))",
      "room[cell_key(point.slug, arm.name, opt)] = 0",
      (T + "test_study_spec.py::test_plan_counts_the_runs_boundary_extension_may_add",),
      "the plan counts no sweep extensions ('22 runs' for a study that may run 30)"),
    # ---- eval
    M("eval-cloze-first-space", "src/sanlab/eval/builtin.py",
      "ctx, last = text.rsplit(\" \", 1)", "ctx, last = text.split(\" \", 1)",
      (T + "test_eval_cloze.py::test_text_cloze_is_the_document_cut_at_its_last_space",),
      "the plain-text cloze splits a document at its first space: the target is all but the first word"),
    M("eval-cloze-answer-in-trace", "src/sanlab/eval/builtin.py",
      "if t and len(t.split()) <= 4 and at > answer_at:", "if t and len(t.split()) <= 4 and at >= 0:",
      (T + "test_eval_cli.py::test_synth_cloze_asks_for_the_final_answer",),
      "a SYNTH cloze item may ask for a target the trace states, not the final answer"),
    M("eval-greedy-any-token", "src/sanlab/eval/scoring.py",
      "greedy = bool((lp.argmax(dim=-1) == targets).all().item())",
      "greedy = bool((lp.argmax(dim=-1) == targets).any().item())",
      (T + "test_eval_adapter.py",), "a continuation counts as the greedy one when any of its tokens is the argmax"),
    M("eval-table-drops-stderr", "src/sanlab/eval/cli.py",
      "cell = f\"{metrics[m]:.4f}\" + (f\" ± {err:.4f}\" if err is not None and err == err else \"\")",
      "cell = f\"{metrics[m]:.4f}\"",
      (T + "test_eval_cli.py::test_results_table_shows_each_tasks_main_metric_with_its_stderr",),
      "the zero-shot table prints accuracies without their standard errors"),
    # ---- eval: the packed scoring and what a run saw
    M("eval-window-one-short", "src/sanlab/eval/scoring.py",
      "window = full[-(seq_len + 1) :]  # input", "window = full[-seq_len:]  # input",
      (T + "test_eval_adapter.py::test_loglikelihood_equals_direct_forward_in_one_packed_batch",),
      "a truncated request keeps seq_len − 1 inputs, one context token fewer than fit"),
    M("eval-requests-share-a-document", "src/sanlab/eval/scoring.py",
      "                segments[r, pos : pos + n] = seg\n", "                segments[r, pos : pos + n] = 0\n",
      (T + "test_eval_adapter.py::test_loglikelihood_equals_direct_forward_in_one_packed_batch",),
      "requests packed into one row are one document: a request attends to the ones before it"),
    M("eval-rows-read-one-step-more", "src/sanlab/eval/builtin.py",
      "loader.rows_for_step(s) for s in range(step)]", "loader.rows_for_step(s) for s in range(step + 1)]",
      (T + "test_eval_cli.py::test_builtin_tasks_state_what_training_saw",),
      "the facts a run saw include the rows of the step after its checkpoint"),
    # ---- eval: how often each fact was read, stored bits by recall (issue 45)
    M("eval-fact-reads-ignore-repeats", "src/sanlab/eval/builtin.py",
      "            reads[key] += int(k)\n", "            reads[key] += 1\n",
      (T + "test_eval_cli.py::test_fact_reads_count_every_read_of_every_row_stating_the_fact",),
      "a fact read in a row the run read three times counts one read"),
    M("eval-stored-bits-no-chance-correction", "src/sanlab/eval/builtin.py",
      "t = (float(c) - 1 / k) / (1 - 1 / k) if k > 1 else 0.0", "t = float(c)",
      (T + "test_eval_cli.py::test_stored_bits_is_the_chance_corrected_count_of_bits_recalled",),
      "stored bits count lucky guesses as recall (no correction for the 1/K a guess gets right)"),
    M("eval-stored-bits-items-not-pool", "src/sanlab/eval/builtin.py",
      "total = None if per_item is None else pool * per_item", "total = None if per_item is None else n * per_item",
      (T + "test_eval_cli.py::test_stored_bits_is_the_chance_corrected_count_of_bits_recalled",),
      "stored bits are summed over the items asked, not scaled to the pool they sample"),
    M("eval-recall-whitespace-matters", "src/sanlab/eval/builtin.py",
      "    regexes_to_ignore: ['\\\\s+']\n", "",
      (T + "test_eval_cli.py::test_recall_is_exact_match_up_to_whitespace_and_counts_stored_bits",),
      "a recalled answer with a leading space or doubled spaces scores as wrong"),
    # ---- issue 49: a --limit run beside the full one, truncation counted per task
    M("eval-limit-overwrites-full", "src/sanlab/eval/cli.py",
      'return eval_dir / (f"results-{checkpoint}.json" if limit is None else f"results-{checkpoint}-limit{limit}.json")',
      'return eval_dir / f"results-{checkpoint}.json"',
      (T + "test_eval_cli.py::test_a_limited_eval_never_replaces_the_full_one",),
      "a --limit evaluation overwrites the full evaluation's results file"),
    M("eval-truncation-run-total", "src/sanlab/eval/cli.py",
      '"truncated_requests": sum(model.truncated_by_task[t] for t in [task, *members.get(task, [])]),',
      '"truncated_requests": model.truncated,',
      (T + "test_eval_cli.py::test_a_limited_eval_never_replaces_the_full_one",),
      "every task records the run's total of truncated requests"),
    # ---- issues 46 and 49: run dirs from anywhere, --data and --checkpoint checked, import validated
    M("checkpoint-name-may-be-a-path", "src/sanlab/analysis/rundir.py",
      'if name in ("", ".", "..") or "/" in name or "\\\\" in name:', 'if name in ("", ".", ".."):',
      (T + "test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[export checkpoint of "
       "another run]",), "--checkpoint ../../run2/checkpoints/latest exports another run's weights"),
    M("tokenizers-compared-by-bytes", "src/sanlab/data/tokenizer.py",
      'ENCODING_PARTS = ("model", "normalizer", "pre_tokenizer", "added_tokens", "decoder")',
      'ENCODING_PARTS = ("model", "normalizer", "pre_tokenizer", "added_tokens", "decoder", "post_processor")',
      (T + "test_run_portability.py::test_an_imported_run_is_analysed_and_sampled_with_its_original_data",),
      "an export's tokenizer copy (its BOS post-processor) counts as another tokenizer"),
    M("data-override-unchecked", "src/sanlab/analysis/rundir.py",
      "            check_data_tokenizer(self, own, p)\n", "",
      (T + "test_run_portability.py::test_a_tokenizer_that_truly_differs_is_refused_with_the_fix",),
      "sample / eval / export --data use another corpus's tokenizer"),
    M("train-data-dir-stays-relative", "src/sanlab/train/cli.py",
      "    return os.path.abspath(data_dir)\n", "    return data_dir\n",
      (T + "test_run_portability.py::test_a_run_trained_with_a_relative_data_dir_samples_from_any_directory",),
      "a run trained with a relative data.dir only works from where it was trained"),
    M("seq-len-unbounded", "src/sanlab/config.py",
      "if not 0 < self.seq_len <= MAX_SEQ_LEN:", "if not 0 < self.seq_len:",
      (T + "test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[import seq_len 10**12]",),
      "import accepts seq_len 10**12 (sample then allocates terabytes)"),
    M("seq-len-true-is-1", "src/sanlab/config.py",
      "        if isinstance(value, bool):  # pydantic would read `true` as 1\n", "        if False:\n",
      (T + "test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[import seq_len true]",),
      "import reads seq_len true as 1"),
    M("sample-keeps-prompt-head", "src/sanlab/commands/sample.py",
      "        ids = ids[-(L - 1):]\n", "        ids = ids[: L - 1]\n",
      (T + "test_eval_cli.py::test_sample_continues_the_last_seq_len_minus_one_tokens_of_a_long_prompt",),
      "a prompt longer than seq_len keeps its first seq_len − 1 tokens, not its last"),
    # ---- generate: decoding with a KV cache, sampling filters (the temperature has its own mutant)
    M("generate-cache-sees-next-token", "src/sanlab/model/mixers/softmax.py",
      "allowed = decode_mask(m.attention_mask(), step.positions, e)",
      "allowed = decode_mask(m.attention_mask(), step.positions + 1, e)",
      (T + "test_generate.py",), "a multi-token prefill / append lets each new token see the next one"),
    M("generate-positions-restart", "src/sanlab/model/generate.py",
      "positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)",
      "positions = torch.arange(0, tokens.shape[1], device=tokens.device)",
      (T + "test_generate.py",), "every appended token is rotated as position 0 (RoPE positions restart)"),
    M("generate-top-k-drops-kth", "src/sanlab/model/generate.py",
      "logits = logits.masked_fill(logits < kth, float(\"-inf\"))",
      "logits = logits.masked_fill(logits <= kth, float(\"-inf\"))",
      (T + "test_generate.py::test_top_k_and_top_p_filters",), "top-k keeps k − 1 tokens (the k-th is dropped)"),
    M("generate-top-p-drops-crossing", "src/sanlab/model/generate.py",
      "drop = cum - sorted_logits.softmax(dim=-1) >= cfg.top_p",
      "drop = cum >= cfg.top_p",
      (T + "test_generate.py::test_top_k_and_top_p_filters",),
      "top-p drops the token whose mass reaches p (the nucleus falls short of p)"),
    # ---- probes: exact-match accuracy, capacity, the suite table
    M("probes-accuracy-any-token", "src/sanlab/probes/evaluate.py",
      "correct = int(((answer > 0) & (wrong == 0)).sum())", "correct = int((answer > wrong).sum())",
      (T + "test_probes_cli.py::test_accuracy_is_exact_match_over_every_answer_token",),
      "an example counts as correct when any of its answer tokens is right"),
    M("probes-lower-bound-strict", "src/sanlab/probes/capacity.py",
      '"lower_bound": k >= n', '"lower_bound": k > n',
      (T + "test_probes_cli.py::test_capacity_says_when_it_is_only_a_lower_bound_and_what_chance_scores",),
      "a sweep that memorised every pair of its best N is not flagged as a lower bound"),
    M("probes-chance-of-memorised", "src/sanlab/probes/capacity.py",
      '"chance": n / alphabet', '"chance": k / alphabet',
      (T + "test_probes_cli.py::test_capacity_says_when_it_is_only_a_lower_bound_and_what_chance_scores",),
      "the labels right by chance are memorised / alphabet, not N / alphabet"),
    M("probes-trainable-counts-frozen", "src/sanlab/probes/capacity.py",
      "return int(sum(v for g, v in routing.items() if g != \"frozen\"))", "return int(sum(routing.values()))",
      (T + "test_probes_cli.py::test_trainable_params_of_a_tiny_model_by_hand_and_without_frozen_ones",),
      "capacity from meta.json divides by every parameter, the frozen ones included"),
    M("probes-table-val-accuracy", "src/sanlab/probes/suite.py",
      "acc = mine[0][\"test_accuracy\"]", "acc = mine[0][\"val_accuracy\"]",
      (T + "test_probes_suite.py",), "the suite table shows the validation accuracy (the sweep's criterion), not the test's"),
    # ---- accounting and matching
    M("accounting-final-norm-dropped", "src/sanlab/accounting.py",
      "    breakdown[\"final_norm.weight\"] = cfg.d_model\n", "",
      (T + "test_accounting.py",), "the parameter count leaves out the final norm's gain"),
    M("accounting-backward-once", "src/sanlab/accounting.py",
      "        return 2 * self.forward\n", "        return self.forward\n",
      (T + "test_accounting.py",), "training FLOPs are 2× forward, not 3× (the backward costs one forward)"),
    M("accounting-head-multiply-add-once", "src/sanlab/accounting.py",
      "terms[\"head\"] = 2 * cfg.vocab_size * cfg.d_model", "terms[\"head\"] = cfg.vocab_size * cfg.d_model",
      (T + "test_accounting.py",), "the tied head's FLOPs count a multiply-add once"),
    M("matching-iso-param-on-total", "src/sanlab/matching.py",
      "            target = ref.params.non_embedding\n", "            target = ref.params.total\n",
      (T + "test_accounting.py", T + "test_match_cli.py"),
      "iso-param aims at the reference's total parameters (embedding included) but counts the partner's non-embedding"),
    M("matching-mismatch-inverted", "src/sanlab/matching.py",
      "mismatch = (got - target) / target", "mismatch = (target - got) / target",
      (T + "test_accounting.py", T + "test_match_cli.py"), "the mismatch is reference − partner (its sign reversed)"),
    M("matching-width-odd-head-dim", "src/sanlab/matching.py",
      "    d_model = 2 * base.n_heads * step\n", "    d_model = base.n_heads * step\n",
      (T + "test_accounting.py", T + "test_match_cli.py"), "the width search steps by n_heads (odd head_dim widths)"),
    # ---- study: the noise rule, the results store
    M("noise-threshold-floor-only", "src/sanlab/study/noise.py",
      "return floor + (mean_spread(values)[1] or 0.0)", "return floor",
      (T + "test_study_noise.py",), "a quantity counts beyond the floor alone, its own seed-to-seed sd ignored"),
    M("noise-difference-spread-dropped", "src/sanlab/study/noise.py",
      "t = math.hypot(floor_a, floor_b) + math.hypot(sa or 0.0, sb or 0.0)", "t = math.hypot(floor_a, floor_b)",
      (T + "test_study_noise.py",), "two studies' difference ignores the two sides' seed-to-seed spread"),
    M("store-first-record-wins", "src/sanlab/study/store.py",
      "        return {r[\"run_id\"]: r for r in self.records()\n",
      "        return {r[\"run_id\"]: r for r in reversed(self.records())\n",
      (T + "test_study_store.py",), "a rerun's record loses to the run's first (failed) record"),
    # ---- records: the shared verdict rules and a study record's pairs
    M("records-ordering-any-step", "src/sanlab/records/common.py",
      "if s and all(x == 1 for x in s):", "if s and any(x == 1 for x in s):",
      (T + "test_records.py", T + "test_records_kinds.py"),
      "an ordering counts as reproduced when any one step is (a reversed step ignored)"),
    M("records-pairs-reversed", "src/sanlab/records/study.py",
      "c = comps.get((ids[\"arm\"], ids[\"reference\"]))", "c = comps.get((ids[\"reference\"], ids[\"arm\"]))",
      (T + "test_records.py",), "a gap's analysed pairs are looked up reference-vs-arm: none is found"),
    M("records-exercise-share-summed", "src/sanlab/records/study.py",
      "return out, {k: statistics.fmean(v) for k, v in share.items()}", "return out, {k: sum(v) for k, v in share.items()}",
      (T + "test_records.py",), "an exercise type's token share is summed over the seed pairs, not averaged"),
    # ---- data: the entropy floor's arithmetic
    M("floor-draws-log2", "src/sanlab/data/synth.py",
      "self.nats[self.region] -= math.log(p)", "self.nats[self.region] -= math.log2(p)",
      (T + "test_data_floor.py",), "a draw is charged in bits, the floor's unit is nats"),
    M("floor-sample-unordered", "src/sanlab/data/synth.py",
      "math.lgamma(n + 1) - math.lgamma(n - k + 1)",
      "math.lgamma(n + 1) - math.lgamma(n - k + 1) - math.lgamma(k + 1)",
      (T + "test_data_floor.py",), "an ordered sample is charged as an unordered one (log C(n, k), not n!/(n−k)!)"),
    M("floor-eos-not-scored", "src/sanlab/data/floor.py",
      "        counts[OTHER] += 1  # the EOS is a scored target; the BOS never is\n", "",
      (T + "test_data_floor.py",), "the floor's token count leaves out each document's EOS"),
    # ---- analysis
    M("effective-rank-exp2", "src/sanlab/analysis/metrics.py",
      "return float(torch.exp(torch.special.entr(p).sum()))", "return float(torch.exp2(torch.special.entr(p).sum()))",
      (T + "test_analysis_metrics.py",), "the effective rank is 2^H of an entropy in nats (wrong base)"),
    M("sink-counts-first-token", "src/sanlab/analysis/metrics.py",
      "sink_q = (qmask & (pos > 0)).float()  # (B, T)", "sink_q = qmask.float()  # (B, T)",
      (T + "test_analysis_metrics.py",), "the sink share averages in the first token itself (forced to 1)"),
    M("stream-rms-per-token", "src/sanlab/analysis/stream.py",
      "        self.count[name] += v.numel()\n", "        self.count[name] += v.shape[0]\n",
      (T + "test_analysis_stream.py",),
      "the stream's RMS divides the sum of squares by tokens, not by elements (√d too large)"),
    M("stream-peak-includes-padding", "src/sanlab/analysis/stream.py",
      "self.peak[name] = max(self.peak[name], float(v.abs().max()))",
      "self.peak[name] = max(self.peak[name], float(x.detach().abs().max()))",
      (T + "test_analysis_stream.py",), "the stream's largest activation is taken over padding tokens too"),
    # ---- the variants: non-approximate, Taylor, MLP
    M("nonapprox-no-silu", "src/sanlab/model/mixers/non_approximate.py",
      "q = F.silu(upcast(q)).view(B, T, H, D)", "q = upcast(q).view(B, T, H, D)",
      (T + "test_variants.py::test_non_approximate_is_its_formula",), "non-approximate's q without its SiLU"),
    M("taylor-no-half", "src/sanlab/model/mixers/approximate.py",
      "    w = (1 + s + 0.5 * s * s) * allowed\n", "    w = (1 + s + s * s) * allowed\n",
      (T + "test_variants.py::test_taylor_linear_time_equals_quadratic_formula",), "the Taylor weights' quadratic term is s², not s²/2"),
    M("taylor-features-unscaled", "src/sanlab/model/mixers/approximate.py",
      "outer = (x[..., :, None] * x[..., None, :]).flatten(-2) * 0.5**0.5",
      "outer = (x[..., :, None] * x[..., None, :]).flatten(-2)",
      (T + "test_variants.py::test_taylor_linear_time_equals_quadratic_formula",), "linear-time Taylor carries s² instead of s²/2 for keys of earlier blocks"),
    M("mlp-mixer-width", "src/sanlab/model/mixers/mlp.py",
      "return max(1, attn // (3 * d))", "return max(1, attn // (2 * d))",
      (T + "test_variants.py::test_mlp_mixer_matches_the_attention_parameter_count",),
      "the MLP mixer's width is (W_q + W_k + W_v + W_o)/(2d): more parameters than the attention it replaces"),
    # ---- config: token counts and layouts
    M("config-k-is-1024", "src/sanlab/configbase.py",
      "_SUFFIX = {\"K\": 10**3,", "_SUFFIX = {\"K\": 2**10,",
      (T + "test_config.py::test_token_counts_read_like_the_paper",), "'500k' reads as 512,000 tokens"),
    M("config-format-tokens-boundary", "src/sanlab/configbase.py",
      "        if n >= scale:\n", "        if n > scale:\n",
      (T + "test_config.py::test_token_counts_print_in_the_largest_unit_they_reach",),
      "a budget of exactly 10^6 prints as 1000K (run ids and tables change)"),
    M("config-top-layout-short", "src/sanlab/config.py",
      "\"top\": lambda i: i >= L - L // 2,", "\"top\": lambda i: i > L - L // 2,",
      (T + "test_variants.py::test_layouts_place_the_standard_layers",),
      "layout top puts L/2 − 1 standard layers at the top, not L/2"),
    # ---- this script: what counts as stale, the per-module table
    M("mutate-ambiguous-not-stale", "scripts/mutate.py",
      "    if n != 1:\n        return f\"{m.path}: the original snippet occurs",
      "    if n < 1:\n        return f\"{m.path}: the original snippet occurs",
      (T + "test_mutate.py::test_a_snippet_that_moved_is_stale_not_caught",),
      "a snippet found twice is not stale (the mutant would be applied at one of two places)"),
    M("mutate-table-hides-empty-modules", "scripts/mutate.py",
      "    for mod in modules + extra:\n", "    for mod in sorted({m.module for m in mutants}):\n",
      (T + "test_mutate.py::test_the_module_table_lists_modules_without_mutants_and_the_totals",),
      "the per-module table leaves out the modules without mutants (the gaps do not show)"),
    # ---- sharing models (sanlab export --hf): the exported code and the conversions
    M("hf-gate-not-folded", "src/sanlab/hf/stock.py",
      "out[o + \"self_attn.o_proj.weight\"] = (W[b + \"attn.wo.weight\"] * s_attn).contiguous()",
      "out[o + \"self_attn.o_proj.weight\"] = W[b + \"attn.wo.weight\"]",
      (T + "test_hf_stock.py",), "--as: the attention gate σ(g) is not folded into W_o"),
    M("hf-sandwich-gate-not-folded", "src/sanlab/hf/stock.py",
      "norm(W[b + \"ffn_post_norm.weight\"], s_ffn)", "norm(W[b + \"ffn_post_norm.weight\"])",
      (T + "test_hf_stock.py",), "--as gemma2/3: the FFN gate is not folded into the post-norm's gain"),
    M("hf-llama-embed-unscaled", "src/sanlab/hf/stock.py",
      "E if scaled else (E * math.sqrt(m.d_model)).contiguous()", "E",
      (T + "test_hf_stock.py",), "--as llama/qwen3: the √d embedding scale is dropped"),
    M("hf-embed-scale-dropped", "src/sanlab/hf/remote/modeling_sanlab.py",
      "x = x * self.embed_scale  # (B, T, d)", "x = x * 1.0  # (B, T, d)",
      (T + "test_hf_export.py",), "the exported model does not scale the embedding by √d"),
    M("hf-qk-norm-after-rope", "src/sanlab/hf/remote/modeling_sanlab.py",
      "        if self.q_norm is not None:\n            q, k = self.q_norm(q.float()), self.k_norm(k.float())\n"
      "        q, k = rope(q, step.cos, step.sin), rope(k, step.cos, step.sin)\n",
      "        q, k = rope(q, step.cos, step.sin), rope(k, step.cos, step.sin)\n"
      "        if self.q_norm is not None:\n            q, k = self.q_norm(q.float()), self.k_norm(k.float())\n",
      (T + "test_hf_export.py",), "the exported model applies QK-norm after RoPE"),
    M("hf-zcn-gain", "src/sanlab/hf/remote/modeling_sanlab.py",
      "            gain = 1.0 + gain\n", "            gain = gain\n",
      (T + "test_hf_export.py",), "the exported ZCN multiplies by γ instead of 1 + γ"),
    M("hf-left-padding-positions", "src/sanlab/hf/remote/modeling_sanlab.py",
      "position_ids = (valid.long().cumsum(-1) - 1).clamp_min(0)[:, past:]",
      "position_ids = torch.arange(past, total, device=device)[None]",
      (T + "test_hf_export.py",), "positions count padding, so a left-padded row is shifted"),
    M("hf-nonapprox-cache-stale", "src/sanlab/hf/remote/modeling_sanlab.py",
      "        s, v = cache_update(cache, self.layer_idx, s, v)\n", "        cache_update(cache, self.layer_idx, s, v)\n",
      (T + "test_hf_export.py",), "non-approximate decodes without its cached scores and values"),
    M("hf-stream-v-from-fixed", "src/sanlab/hf/remote/modeling_sanlab.py",
      "        v = self.wv(u).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)\n"
      "        if self.q_norm is not None:",
      "        v = self.wv(src).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)\n"
      "        if self.q_norm is not None:",
      (T + "test_hf_export.py",), "rnd_emb_qk / fixed_seq_qk / static_emb_qk take V from the Q/K source too"),
    M("hf-tied-head-saved-twice", "src/sanlab/hf/export.py",
      "    return {PREFIX + k: t.contiguous() for k, t in weights.items()}",
      "    return {PREFIX + k: t.contiguous() for k, t in weights.items()} | "
      "{\"lm_head.weight\": src.weights[\"embed.weight\"].clone()}",
      (T + "test_hf_export.py::test_folder_layout_config_and_no_pickle",), "the tied head is saved a second time"),
    M("hf-checkpoint-unverified", "src/sanlab/hf/export.py",
      "    state = run.verify(name)  # state.json's sha256 of the weights, as every reader checks\n",
      "    state = {}\n",
      (T + "test_hf_export.py::test_bad_input_is_one_line_and_writes_nothing",),
      "export reads a checkpoint without verifying its checksums"),
    # ---- issue 49: stock exports on packed rows; the model card
    M("hf-stock-caches-packed-rows", "src/sanlab/hf/stock.py",
      '"tie_word_embeddings": scaled, "use_cache": False,', '"tie_word_embeddings": scaled, "use_cache": True,',
      (T + "test_hf_stock_packed.py::test_packed_row_with_restarting_positions_gives_each_documents_logits[qwen3]",),
      "a stock export attends across documents when called with restarting position_ids"),
    M("hf-card-shows-limited-eval", "src/sanlab/hf/card.py",
      '            and r.get("limit") is None}', "            }",
      (T + "test_hf_card.py::test_the_card_has_hub_front_matter_limitations_and_the_runs_eval",),
      "the model card publishes a --limit evaluation as a result"),
    M("hf-card-always-tied", "src/sanlab/hf/card.py",
      'tied = family is None or family.startswith("gemma")', "tied = True",
      (T + "test_hf_card.py::test_the_card_says_what_config_json_says_of_the_embedding",),
      "the qwen3 / llama card says tied embedding while config.json is untied"),
    M("hf-card-tokenizer-prompts", "src/sanlab/hf/card.py",
      """f'tokenizer = AutoTokenizer.from_pretrained("{folder}"{remote})',""",
      """f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',""",
      (T + "test_hf_card.py::test_the_cards_snippet_runs_as_written",),
      "the card's tokenizer line asks whether to run the custom code"),
    M("hf-provenance-lost-on-import", "src/sanlab/hf/export.py",
      '"data": data or source.get("data") or {},', '"data": data,',
      (T + "test_hf_card.py::test_provenance_survives_import_and_reexport",),
      "a re-export of an imported run forgets the corpus and prepare seed"),
    # ---- issue 48: export → load → import at non-default settings (tests/test_hf_roundtrip.py)
    M("import-seq-len-default", "src/sanlab/hf/import_cli.py",
      "\"data\": {\"seq_len\": seq_len}}", "\"data\": {}}",
      (T + "test_hf_roundtrip.py::test_sanlab_export_load_import_round_trip",),
      "sanlab import writes the default data.seq_len (256), not the folder's"),
    M("import-accepts-non-finite", "src/sanlab/hf/import_cli.py",
      "        if t.is_floating_point() and not bool(torch.isfinite(t).all()):", "        if False:",
      (T + "test_hf_roundtrip.py::test_non_finite_weights_are_refused_by_import_and_export",),
      "sanlab import accepts weights holding NaN or inf"),
    M("export-accepts-non-finite", "src/sanlab/hf/export.py",
      "        if t.is_floating_point() and not bool(torch.isfinite(t).all()):", "        if False:",
      (T + "test_hf_roundtrip.py::test_non_finite_weights_are_refused_by_import_and_export",),
      "sanlab export writes a checkpoint holding NaN or inf"),
    M("stock-rope-theta-default", "src/sanlab/hf/stock.py",
      "\"rope_theta\": m.rope_theta}", "\"rope_theta\": 10000.0}",
      (T + "test_hf_roundtrip.py::test_stock_family_writes_the_runs_settings",),
      "export --as FAMILY writes RoPE θ 10000 whatever model.rope_theta the run trained with"),
    M("stock-max-positions-fixed", "src/sanlab/hf/stock.py",
      "\"max_position_embeddings\": seq_len", "\"max_position_embeddings\": 256",
      (T + "test_hf_roundtrip.py::test_stock_family_writes_the_runs_settings",),
      "export --as FAMILY states the default context (256), not the run's data.seq_len"),
    M("export-seq-len-default", "src/sanlab/hf/export.py",
      "        \"seq_len\": seq_len,\n", "        \"seq_len\": 256,\n",
      (T + "test_hf_roundtrip.py::test_sanlab_export_load_import_round_trip",),
      "export --hf writes the default row length (256) into config.json, not the run's"),
    # ---- probes: the sweep's selection, the capacity arithmetic, paths, failed cells, writes
    M("probe-select-on-test", "src/sanlab/probes/runner.py",
      "return (1.0 - self.val_accuracy) + 1e-6 * min(loss, 1e3)",
      "return (1.0 - (self.test_accuracy or 0.0)) + 1e-6 * min(loss, 1e3)",
      (T + "test_probes_decisions.py::test_the_sweep_selects_the_lr_on_validation_not_test",),
      "the probe sweep selects the LR on the test split"),
    M("probe-capacity-key-symbols", "src/sanlab/probes/suite.py",
      'alphabet = mine[0]["task_config"]["alphabet"] if mine else None',
      'alphabet = mine[0]["task_config"]["key_symbols"] if mine else None',
      (T + "test_probes_decisions.py::test_capacity_is_memorised_labels_times_log2_of_the_label_alphabet",),
      "capacity counts log2 of the key symbols instead of the label alphabet"),
    M("probe-csv-fano-is-count", "src/sanlab/probes/suite.py",
      "                fano = cap.get(\"fano\") or {}\n                w.writerow(",
      "                fano = cap\n                w.writerow(",
      (T + "test_probes_suite.py::test_suite_csv_fano_row_holds_the_chance_free_reading",),
      "suite.csv's bits_per_param_fano row holds the count reading"),
    M("capacity-tie-larger-n", "src/sanlab/probes/capacity.py",
      "if best[\"bits\"] is None or b > best[\"bits\"]:", "if best[\"bits\"] is None or b >= best[\"bits\"]:",
      (T + "test_probes_cli.py::test_capacity_on_a_tie_is_reported_at_the_smaller_n_in_any_order",),
      "capacity's maximum over N, on a tie, is reported at the larger N"),
    M("capacity-tie-by-order", "src/sanlab/probes/capacity.py",
      "for p in sorted(points, key=lambda p: int(p[\"n\"])):", "for p in points:",
      (T + "test_probes_cli.py::test_capacity_on_a_tie_is_reported_at_the_smaller_n_in_any_order",),
      "capacity's tie goes to whichever N comes first (a merge's order), not the smaller"),
    M("probe-data-dir-cwd-relative", "src/sanlab/probes/runner.py",
      "    return os.path.join(os.pardir, os.pardir, DATA, data.out.name)\n",
      "    return os.path.relpath(data.out)\n",
      (T + "test_probes_cli.py::test_a_task_runs_from_a_working_directory_with_a_relative_out",),
      "a probe run's data.dir is relative to where the command started (the runs train in their run dir)"),
    M("probe-failed-cell-at-edge", "src/sanlab/probes/runner.py",
      '"at_edge": d.at_edge and self.sweep.enabled and best is not None,',
      '"at_edge": d.at_edge and self.sweep.enabled,',
      (T + "test_probes_decisions.py::test_a_cell_whose_every_run_failed_shows_no_edge_marker_at_all",),
      "a cell whose every run failed is marked as an LR at the edge of its sweep"),
    M("probe-extends-on-errors", "src/sanlab/probes/runner.py",
      "extend = self.sweep.enabled and not self.failed()", "extend = self.sweep.enabled",
      (T + "test_probes_decisions.py::test_a_cell_whose_every_run_failed_says_failed_with_the_error_and_no_edge",),
      "a cell whose runs all failed with an error tries lower LRs, as if they had diverged"),
    M("probe-freeze-arms-sequence-only", "src/sanlab/probes/arms.py",
      "for spec in [*MIXERS.values(), *STATE_MIXERS.values()]:", "for spec in [*MIXERS.values()]:",
      (T + "test_probes_cli.py::test_freeze_arms_come_from_the_specs",),
      "the FFN's freeze arm (Frozen-MLP) is dropped: only the sequence mixers' probe_freeze is read"),
    M("probe-out-made-before-checks", "src/sanlab/probes/cli.py",
      "    cells = build_cells(tasks, arms, ov, opts, args.quick, out)\n    out.mkdir(parents=True, exist_ok=True)\n",
      "    out.mkdir(parents=True, exist_ok=True)\n    cells = build_cells(tasks, arms, ov, opts, args.quick, out)\n",
      (T + "test_malformed.py",),
      "a probe with a bad task or run setting creates its --out dir (./runs/probe) before refusing"),
    # ---- round 3 reliability (issue 29): one verifier, one reader per format, validation first
    M("reader-skips-verify", "src/sanlab/analysis/rundir.py",
      "        self.verify(name)\n        try:", "        try:",
      MALFORMED,
      "sample / eval / analyze read weights without checking them against state.json"),
    M("state-not-self-checked", "src/sanlab/train/checkpoint.py",
      "    if \"state_sha256\" in state and state[\"state_sha256\"] != state_digest(state):",
      "    if False:",
      MALFORMED,
      "a state.json damaged into other valid JSON (another step) is believed"),
    M("reader-config-unchecked", "src/sanlab/analysis/rundir.py",
      "        self._check_written_config(f.parent, state.get(\"config\"))\n",
      "",
      MALFORMED,
      "a config.json edited into another model rebuilds it over the checkpoint's weights"),
    M("reader-seq-len-unchecked", "src/sanlab/analysis/rundir.py",
      "self.config.data.seq_len)):", "then.data.seq_len)):",
      tuple(T + f"test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[{c} seq_len edited]"
            for c in ("sample", "eval", "analyze", "export")),
      "a config.json whose data.seq_len was edited after training is believed by sample, eval, analyze, export"),
    M("resume-config-unchecked", "src/sanlab/train/trainer.py",
      "        if diff and not decision.force:", "        if False:",
      MALFORMED,
      "a resume continues a checkpoint under a config.json it was not written with"),
    M("ffn-contradiction-accepted", "src/sanlab/configbase.py",
      "            if why := ffn_contradiction(ffn, given[mixer]):", "            if False:",
      MALFORMED,
      "model.ffn=true model.state_mixer=none on one command line is resolved silently"),
    M("eval-checks-tasks-late", "src/sanlab/eval/cli.py",
      "    defaults = check_task_names(tasks, args.verbose)", "    defaults = None",
      MALFORMED,
      "eval writes the built-in task files before refusing an unknown task"),
    M("out-dir-not-tried", "src/sanlab/paths.py",
      "    try:\n        probe = tempfile.mkdtemp(", "    return None\n    try:\n        probe = tempfile.mkdtemp(",
      MALFORMED,
      "a destination in /proc passes the checks and fails with a traceback"),
    M("toml-depth-uncaught", "src/sanlab/fileio.py",
      "    except RecursionError:\n        raise error(f\"{p}: malformed TOML: nested too deeply\") from None\n", "",
      MALFORMED,
      "a TOML nested 100,000 deep is a RecursionError"),
    M("json-depth-uncaught", "src/sanlab/fileio.py",
      "    except RecursionError:\n        raise ValueError(\"nested too deeply\")",
      "    except MemoryError:\n        raise ValueError(\"nested too deeply\")",
      (T + "test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[meta.json nested 100,000 deep]",), "a JSON file nested 100,000 deep is a RecursionError"),
    M("fileio-not-utf8-replaced", "src/sanlab/fileio.py",
      "        return raw.decode(\"utf-8\")\n", "        return raw.decode(\"utf-8\", \"replace\")\n",
      (T + "test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[config.json not UTF-8 (sample)]",), "a file that is not UTF-8 is read with its bad bytes replaced, not refused"),
    M("jsonl-non-object-a-record", "src/sanlab/fileio.py",
      "    return rec if isinstance(rec, dict) else None", "    return rec",
      (T + "test_malformed.py::test_damaged_but_readable_input_answers_and_names_the_damage_in_one_line[status with results lines [1], 5 and null]",),
      "a JSON Lines line that is JSON but not an object ([1], 5, null) is returned as a record"),
    M("fileio-object-unchecked", "src/sanlab/fileio.py",
      "    if not isinstance(data, dict):\n        raise error(f\"{path}: malformed JSON (a",
      "    if False:\n        raise error(f\"{path}: malformed JSON (a",
      (T + "test_malformed.py::test_malformed_input_is_one_line_exit_2_and_changes_nothing[config.json a list]",), "a JSON file that must hold an object is believed when it holds a list"),
    M("match-no-targets-accepted", "src/sanlab/commands/match.py",
      "    if not targets:\n", "    if False:\n",
      MALFORMED,
      "match --targets , prints the SAN row only"),
    M("store-types-unchecked", "src/sanlab/study/store.py",
      "    if not all(k in rec for k in required) or not all(check(rec[k]) for k, check in checks.items() if k in rec):",
      "    if False:",
      (T + "test_reliability.py::test_records_of_the_wrong_types_are_damaged_lines",),
      "a results record without its status (or a final that is not a dict) reaches the tables"),
    M("sigterm-after-run-kills", "src/sanlab/train/cli.py",
      "        signals.ended()\n", "",
      (T + "test_train_signals.py",), "a second SIGTERM after the run completed exits 4"),
    M("sample-seed-unbounded", "src/sanlab/model/generate.py",
      "        if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:", "        if False:",
      (T + "test_generate.py",), "--seed 1e23 reaches torch and overflows"),
    # ---- issue 33 item 5: sampling honours the temperature
    M("sampling-ignores-temperature", "src/sanlab/model/generate.py",
      "    logits = logits.float() / cfg.temperature\n", "    logits = logits.float()\n",
      (T + "test_generate.py",), "sampling draws from softmax(logits), whatever the temperature"),
    M("sample-drops-temperature", "src/sanlab/commands/sample.py",
      "temperature=args.temperature,", "temperature=1.0,",
      (T + "test_eval_cli.py::test_sample_passes_the_temperature_through",),
      "sanlab sample samples at T = 1 whatever --temperature says"),
    # ---- the data axis, the world's bits and facts per parameter
    M("axis-value-shared", "src/sanlab/study/spec.py",
      '        return corpus, [f"{self.key}={value}"]',
      '        return corpus, [f"{self.key}={self.values[0]}"]',
      (T + "test_study_axis.py::test_axis_study_prepares_each_value_once_and_tables_delta_against_it",),
      "every value of the data axis is prepared with the first value's setting (one corpus shared by all)"),
    M("axis-listed-dir-moved", "src/sanlab/study/spec.py",
      "    def dir(self, value: Any, base: str) -> str:\n        return str(value)",
      "    def dir(self, value: Any, base: str) -> str:\n        return str(Path(base) / self.slug(value))",
      (T + "test_study_axis.py::test_each_kind_of_axis_names_and_places_its_values",),
      "a listed prepared dir of data.axis.dir is looked for under the study's data dir, not where it is"),
    M("axis-corpora-read-as-setting", "src/sanlab/study/spec.py",
      '{"dir": "dirs", "corpus": "corpora"}', '{"dir": "dirs", "corpus": "prepare"}',
      (T + "test_study_axis.py::test_each_kind_of_axis_names_and_places_its_values",),
      "data.axis.corpus is typed as a prepare setting (`corpus=kjv` as an extra setting, data.corpus required)"),
    M("axis-run-id-unprefixed", "src/sanlab/study/plan.py",
      '    return f"{data}-{rid}" if data else rid',
      "    return rid",
      (T + "test_study_axis.py::test_plan_runs_every_arm_sweep_seed_and_noise_pair_at_every_value",),
      "runs at different values of the data axis share one run id"),
    M("world-bits-in-nats", "src/sanlab/data/synth.py",
      '"bits_per_fact": math.log2(counts[attr])}',
      '"bits_per_fact": math.log(counts[attr])}',
      (T + "test_study_axis.py::test_world_bits_by_hand",), "a fact's information in nats, not bits"),
    M("world-bits-mentor-self", "src/sanlab/data/synth.py",
      '        "mentor": people - 1,', '        "mentor": people,',
      (T + "test_study_axis.py::test_world_bits_by_hand",),
      "a mentor counted as drawn from every person, the person included"),
    M("facts-per-param-total", "src/sanlab/study/table.py",
      "            n = a.params_non_embedding\n            out.append(",
      "            n = a.params_total\n            out.append(",
      (T + "test_study_axis.py::test_axis_study_prepares_each_value_once_and_tables_delta_against_it",),
      "facts and bits per parameter over all parameters, not the non-embedding ones"),
    # ---- issues 46, 48, 49: the study's tables as data, the study dir as one study, overrides
    M("data-table-bits-facts-swapped", "src/sanlab/study/table.py",
      '_num(r["facts_per_param"], "{:.4f}"), _num(r["bits_per_param"], "{:.4f}"))',
      '_num(r["bits_per_param"], "{:.4f}"), _num(r["facts_per_param"], "{:.4f}"))',
      (T + "test_table_formats.py::test_data_table_puts_facts_per_param_and_bits_per_param_where_their_names_say",),
      "the data table prints bits/param under facts/param and the reverse"),
    M("axis-star-without-floor", "src/sanlab/study/table.py",
      '            beyond = "× floor" in c["verdict"]  # beyond this value\'s noise floor',
      '            beyond = c["verdict"] not in ("within noise", MISSING, NO_NOISE)',
      (T + "test_table_formats.py::test_axis_table_marks_beyond_noise_only_against_a_noise_floor",),
      "the Δ-against-axis table marks a value beyond noise (*) when it has no noise floor"),
    # ---- the sweep's lock read against the noise floor
    M("lock-margin-over-the-worst", "src/sanlab/study/table.py",
      "return finite[1] - finite[0] if", "return finite[-1] - finite[0] if",
      (T + "test_study_lock_margin.py",), "the lock's margin taken over the worst sweep point, not the runner-up"),
    M("lock-margin-strict-floor", "src/sanlab/study/table.py",
      "noise.sign([r.margin], floor) == 0", "abs(r.margin) < floor",
      (T + "test_study_lock_margin.py",), "a lock that beats its runner-up by exactly F counts as resolved"),
    M("lock-margin-json-never-flags", "src/sanlab/study/results.py",
      '"within_floor": unresolved_lock(r, sizes.get(p.slug))', '"within_floor": False',
      (T + "test_study_lock_margin.py",), "the sweep rows' within_floor is never set, so the figure never flags"),
    M("sweep-figure-floor-band-doubled", "src/sanlab/report/plots.py",
      "ax.axhspan(0, size, color=", "ax.axhspan(0, 2 * size, color=",
      (T + "test_report_figures.py",), "the sweep figure's noise band is twice the floor"),
    M("sweep-figure-flags-the-resolved", "src/sanlab/report/plots.py",
      '        elif r.get("within_floor"):', '        elif not r.get("within_floor"):',
      (T + "test_report_figures.py",), "the sweep figure flags the resolved locks instead of the unresolved one"),
    M("lock-margin-report-without-floor", "src/sanlab/study/results.py",
      "p if p.slug else None, sizes.get(p.slug))", "p if p.slug else None)",
      (T + "test_study_lock_margin.py",), "the report's sweep warnings never read the lock against the floor"),
    M("csv-progress-on-stdout", "src/sanlab/tables.py",
      '        if self.format in ("csv", "json"):\n            print(text, file=self.err, flush=True)',
      '        if self.format == "json":\n            print(text, file=self.err, flush=True)',
      (T + "test_table_formats.py::test_csv_progress_goes_to_stderr",),
      "--format csv prints progress lines on stdout, inside the CSV"),
    M("csv-display-strings", "src/sanlab/tables.py",
      '                          else cell_value("" if c is None else str(c)) for c in cells])',
      '                          else ("" if c is None else str(c)) for c in cells])',
      (T + "test_table_formats.py::test_csv_and_json_hold_numbers_as_numbers",),
      "csv and json hold the display strings (\"123,268\"), not numbers"),
    M("terminal-splits-numbers", "src/sanlab/tables.py",
      "    while len(keep) > 1 and sum(_min_width(t, j) for j in keep) + 3 * len(keep) + 1 > width:",
      "    while len(keep) > 1 and sum(_min_width(t, j) for j in keep) + 3 * len(keep) + 1 > 10 * width:",
      (T + "test_table_formats.py::test_an_80_column_terminal_never_splits_a_number",),
      "on a narrow terminal every column is kept and numbers are cut"),
    M("study-dir-takes-any-spec", "src/sanlab/study/orchestrate.py",
      "        check_same_study(self.spec, self.dir, extend=self.extend)\n", "",
      (T + "test_study_usage.py::test_a_study_dir_refuses_another_spec_and_rewrites_nothing",),
      "a study dir is silently rewritten by another spec"),
    M("study-dir-sweep-free", "src/sanlab/study/orchestrate.py",
      'FREE_KEYS = ("runner",)', 'FREE_KEYS = ("runner", "sweep")',
      (T + "test_study_usage.py::test_a_study_dir_refuses_another_spec_and_rewrites_nothing",),
      "a rerun may change the sweep of a study dir's existing runs"),
    M("extend-moves-noise-pair", "src/sanlab/study/orchestrate.py",
      '    d["noise"].update(optimizer=spec.noise_optimizer, tokens=spec.noise_tokens, seeds=spec.noise_seeds)',
      '    d["noise"].update(optimizer=spec.noise_optimizer, seeds=spec.noise_seeds)',
      (T + "test_study_usage.py::test_extend_refuses_moving_the_noise_pair",),
      "--extend with a larger budget silently moves the noise pair to it"),
    M("run-costs-flops-only", "src/sanlab/study/orchestrate.py",
      "cost=cost, rank=0 if \"sweep\" in r.phases else 1)\n                for r, cost in zip(todo, run_costs(todo, records))]",
      "cost=float(r.tokens * r.flops_per_token), rank=0 if \"sweep\" in r.phases else 1)\n                for r in todo]",
      (T + "test_study_costs.py",), "runs start by FLOPs although the study measured each arm's speed"),
    M("run-costs-group-speed-per-member", "src/sanlab/study/table.py",
      "float(r[\"tokens_per_s\"]) * (m if isinstance(m, int) and m > 1 else 1)", "float(r[\"tokens_per_s\"])",
      (T + "test_study_costs.py",), "a member's tokens/s is taken for its group's"),
    M("run-costs-nearest-by-difference", "src/sanlab/study/orchestrate.py",
      "abs(math.log(flops[a] / r.flops_per_token))", "abs(flops[a] - r.flops_per_token)",
      (T + "test_study_costs.py",), "the nearest measured arm by FLOPs difference, not ratio"),
    M("run-costs-unscaled", "src/sanlab/study/orchestrate.py",
      "(speed[near] * flops[near] / r.flops_per_token)", "speed[near]",
      (T + "test_study_costs.py",), "an unmeasured arm takes its neighbour's tokens/s unscaled by FLOPs"),
    M("sweep-goes-round-forever", "src/sanlab/study/orchestrate.py",
      "            if len(stuck) == len(batch):", "            if not batch:",
      (T + "test_study_usage.py::test_a_store_whose_sweep_points_read_as_other_runs_is_one_line_not_an_endless_sweep"
           "[by-rounds]",),
      "a sweep whose wanted points are finished runs of another phase plans them again forever"),
    M("stream-ends-stuck-in-silence", "src/sanlab/study/orchestrate.py",
      "        if stuck:\n            raise self._stuck(stuck)", "        if False:\n            raise self._stuck(stuck)",
      (T + "test_study_usage.py::test_a_store_whose_sweep_points_read_as_other_runs_is_one_line_not_an_endless_sweep"
           "[streamed]",),
      "a streamed sweep whose wanted points are finished runs of another phase ends without a lock or a word"),
    M("override-tokens-unparsed", "src/sanlab/configbase.py",
      "            current = field.rebuild_annotation()", "            current = field.annotation",
      (T + "test_study_usage.py",), "sweep.tokens=30K is refused on the command line (the file reads it)"),
    M("override-any-stays-text", "src/sanlab/configbase.py",
      "        candidates += _toml_value(raw)\n", "        pass\n",
      (T + "test_study_usage.py::test_lock_at_override_means_what_the_file_means",),
      "sweep.lock_at=400 stays the string '400' (the file's 400 is a number)"),
    M("report-counts-store-only", "src/sanlab/report/build.py",
      "    rows = data.statuses if data.statuses is not None else",
      "    rows = None if data.statuses is not None else None\n    rows =",
      (T + "test_study_usage.py::test_report_and_status_count_the_same_runs_without_a_results_store",),
      "report says 0 runs where study status counts the completed runs of the run dirs"),
    M("json-and-format-both", "src/sanlab/tables.py",
      '    if getattr(args, "json", False) and getattr(args, "format_given", False):',
      '    if False:',
      MALFORMED, "--json with --format: --format ignored without a word"),
    M("lock-at-with-sweep-off", "src/sanlab/study/spec.py",
      "            if not self.sweep.enabled:\n                raise ValueError(\"sweep.lock_at says",
      "            if False:\n                raise ValueError(\"sweep.lock_at says",
      MALFORMED, "sweep.lock_at ignored without a word when the sweep is off"),
    M("axis-claim-ends-swapped", "src/sanlab/records/axis.py",
      "    return [b[s] - a[s] for s in seeds], floor, ax.label(lo), ax.label(hi)",
      "    return [a[s] - b[s] for s in seeds], floor, ax.label(lo), ax.label(hi)",
      (T + "test_records_axis.py::test_axis_record_claims_curve_and_check",),
      "the axis claims read smallest minus largest world"),
    M("noise-floor-rounds-to-zero", "src/sanlab/study/noise.py",
      "    if v != 0 and math.isfinite(v) and abs(v) < 5e-5:", "    if False:",
      (T + "test_study_noise.py",), "a floor of 3e-5 prints +0.0000 ± 0.0000 beside its verdicts"),
    M("gap-table-floor-four-decimals", "src/sanlab/study/table.py",
      '    per = " ".join(noise.nats(v) for v in g.per_seed.values()) or MISSING',
      '    per = " ".join(f"{v:+.4f}" for v in g.per_seed.values()) or MISSING',
      (T + "test_study_noise.py",), "the gap table's per-seed Δ of a tiny floor prints +0.0000"),
    M("records-floor-four-decimals", "src/sanlab/records/common.py",
      '    return "–" if x is None or not finite(x) else nats(x, signed=False)',
      '    return "–" if x is None or not finite(x) else f"{x:.4f}"',
      (T + "test_records.py::test_a_records_floor_keeps_two_significant_digits_where_four_decimals_show_zero",),
      "a record's claims say F = 0.0000 for an fp32 CPU's floor of 3e-5"),
    M("study-dir-unchecked", "src/sanlab/commands/study.py",
      '    if args.action in ("status", "table"):', '    if False:',
      MALFORMED, "study table with a 300-byte name or a symlink loop: a traceback, not one line"),
    M("override-union-one-branch", "src/sanlab/configbase.py",
      '    return lead + " or ".join(dict.fromkeys(wants))', '    return lead + wants[0]',
      (T + "test_study_groups.py::test_a_runner_members_override_that_fits_neither_form_names_both",),
      "runner.members=AUTO names only the integer form, not \"auto\""),
    M("bench-members-device-peak-bf16", "benchmarks/bench_members.py",
      "    peak = device_peak(a.device, a.precision)", "    peak = device_peak(a.device)",
      (T + "test_bench_members.py::test_the_device_mode_times_solo_against_members_in_one_process",),
      "--device measures a bf16 peak for an fp32 run (8,881% of peak on an AVX2 CPU)"),
)

# Mutants that change no behaviour a test could observe (kept so nobody adds them again;
# `what` says why). Never run, never counted; tests/test_mutate.py keeps their snippets current.
EQUIVALENT: tuple[Mutant, ...] = (
    M("probes-capacity-from-val", "src/sanlab/probes/suite.py",
      "points = [{\"n\": s[\"task_config\"][\"n_train\"], \"memorised\": s[\"test_correct\"]} for s in mine]",
      "points = [{\"n\": s[\"task_config\"][\"n_train\"], \"memorised\": round(s[\"val_accuracy\"] * s[\"test_total\"])} "
      "for s in mine]",
      (T + "test_probes_suite.py",), "capacity from the validation split's correct labels: memorize's val and test splits are both its "
      "training set (probes.runner), so in a real run the two counts are the same"),
)


# --------------------------------------------------------------------------- running


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # caught | survived | stale
    detail: str
    seconds: float


def stale_reason(root: Path, m: Mutant) -> str | None:
    """Why `m` cannot be applied to the tree at `root`, or None when it can."""
    f = root / m.path
    if not f.is_file():
        return f"{m.path}: no such file"
    n = f.read_text().count(m.original)
    if n != 1:
        return f"{m.path}: the original snippet occurs {n} times (expected once)"
    missing = [t for t in m.tests if not (root / t.split("::")[0]).exists()]
    if missing:
        return f"test file {missing[0]} does not exist"
    return None


def copy_tree(dest: Path) -> Path:
    """A copy of the tree without caches, the venv and the top-level `runs/` (the user's
    studies); a committed record's `study/runs/` (run metadata its README reads) is kept."""
    anywhere = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", "*.egg-info",
                                      ".mypy_cache", ".ruff_cache")

    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = set(anywhere(directory, names))
        if Path(directory).resolve() == ROOT.resolve():
            skip |= {n for n in ("runs", "site") if n in names}
        return skip

    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    return dest


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float, threads: int | None) -> tuple[int | None, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return p.returncode, (p.stdout + p.stderr)


def _summary_line(output: str) -> str:
    """The first failing test (pytest's short summary), else pytest's last line."""
    lines = output.strip().splitlines()
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            return line.strip()
    return lines[-1].strip() if lines else ""


_HARDWARE: dict[str, bool] = {}


def has_hardware(tree: Path, needs: str) -> bool:
    """Whether this machine has what a mutant's tests need (asked once, of the tree's kernels)."""
    if needs not in _HARDWARE:
        probe = {"amx": "from sanlab.model import native\n"
                        "print(int(native.available() and bool(native.library().sanlab_amx_available())))",
                 "avx512": "import pathlib\nfrom sanlab.model import native\n"
                           "info = pathlib.Path('/proc/cpuinfo')\n"
                           "print(int(native.available() and info.exists() and 'avx512f' in info.read_text()))",
                 "avx512bf16": "import pathlib\nfrom sanlab.model import native\n"
                               "info = pathlib.Path('/proc/cpuinfo')\n"
                               "print(int(native.available() and info.exists() and 'avx512_bf16' in info.read_text()))",
                 "sleef-exp": "import torch\nfrom sanlab.model import native\n"
                              "print(int(native.available() and torch.backends.cpu.get_cpu_capability() in "
                              "('AVX2', 'AVX512')))"}[needs]
        env = dict(os.environ, PYTHONPATH=str(tree / "src"))
        p = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True)
        _HARDWARE[needs] = p.stdout.strip() == "1"
    return _HARDWARE[needs]


def run_mutant(tree: Path, m: Mutant, timeout: float, threads: int | None) -> Outcome:
    t0 = time.monotonic()
    reason = stale_reason(tree, m)
    if reason is not None:
        return Outcome(m, "stale", reason, 0.0)
    if m.needs and not has_hardware(tree, m.needs):
        return Outcome(m, "untestable", f"needs {m.needs.upper()}, which this machine lacks", 0.0)
    f = tree / m.path
    original = f.read_text()
    mutated = m.apply(original)
    assert mutated is not None
    f.write_text(mutated)
    try:
        rc, out = run_tests(tree, m.tests, timeout, threads)
    finally:
        f.write_text(original)
    dt = time.monotonic() - t0
    if rc == 0:
        return Outcome(m, "survived", "every test passed", dt)
    if rc is None:
        return Outcome(m, "caught", f"timed out after {timeout:.0f} s", dt)
    if rc == 5:
        return Outcome(m, "stale", "no tests collected", dt)
    return Outcome(m, "caught", _summary_line(out), dt)


def diff(m: Mutant) -> str:
    text = (ROOT / m.path).read_text()
    mutated = m.apply(text) or text
    return "".join(difflib.unified_diff(text.splitlines(True), mutated.splitlines(True),
                                        f"a/{m.path}", f"b/{m.path}", n=2))


def select(names: str | None, modules: str | None = None) -> list[Mutant]:
    """Mutants whose name contains one of the comma-separated `names` (all when None) and
    whose module is one of `modules` (all when None)."""
    out = list(MUTANTS)
    if names:
        words = [w.strip() for w in names.split(",") if w.strip()]
        out = [m for m in out if any(w in m.name for w in words)]
    if modules:
        wanted = {w.strip() for w in modules.split(",") if w.strip()}
        out = [m for m in out if m.module in wanted]
    return out


def module_table(mutants: list[Mutant], outcomes: list[Outcome] | None, modules: list[str]) -> str:
    """Module, mutants, caught (and survived / stale where any), one row per module, then
    the totals. Without outcomes (`--list`) the caught column is left out."""
    head = ["module", "mutants"] + (["caught"] if outcomes is not None else [])
    status = {o.mutant.name: o.status for o in outcomes or []}
    bad = any(s in ("survived", "stale") for s in status.values())
    kinds = (["survived", "stale"] if bad else []) + (["untestable"] if "untestable" in status.values() else [])
    head += kinds
    extra = sorted({m.module for m in mutants} - set(modules))
    rows = []
    for mod in modules + extra:
        mine = [m for m in mutants if m.module == mod]
        row = [mod, str(len(mine))]
        if outcomes is not None:
            row.append(str(sum(status.get(m.name) == "caught" for m in mine)))
            row += [str(sum(status.get(m.name) == s for m in mine)) for s in kinds]
        rows.append(row)
    total = ["total", str(len(mutants))]
    if outcomes is not None:
        total.append(str(sum(s == "caught" for s in status.values())))
        total += [str(sum(s == k for s in status.values())) for k in kinds]
    widths = [max(len(r[i]) for r in [head, total, *rows]) for i in range(len(head))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), rule, *map(line, rows), rule, line(total)])


def equivalent_lines() -> list[str]:
    return [f"  {e.name} ({e.path}): {e.what}" for e in EQUIVALENT]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", metavar="WORDS", help="comma-separated words; run the mutants whose name contains one")
    ap.add_argument("--module", metavar="NAMES", help="comma-separated modules (as the table names them); "
                    "run only their mutants")
    ap.add_argument("--jobs", type=int, default=2, help="mutants run at once, each on its own copy (default 2)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant before it counts as caught")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the tests on the unmutated tree first")
    ap.add_argument("--list", action="store_true", help="list the mutants and the per-module counts, and exit")
    args = ap.parse_args(argv)
    modules = tree_modules(ROOT)
    if args.module:
        unknown = [w.strip() for w in args.module.split(",") if w.strip() and w.strip() not in modules]
        if unknown:
            print(f"mutate: unknown module {unknown[0]!r} (modules: {', '.join(modules)})", file=sys.stderr)
            return 2
        modules = [m for m in modules if m in {w.strip() for w in args.module.split(",")}]
    mutants = select(args.only, args.module)
    if args.only:
        modules = [m for m in modules if any(x.module == m for x in mutants)]
    if args.list:
        for m in mutants:
            print(f"{m.name:34s} {m.module:10s} {m.path:32s} {m.what}\n{'':34s} tests: {' '.join(m.tests)}")
        print("\n" + module_table(mutants, None, modules))
        if EQUIVALENT and not (args.only or args.module):
            print("\nequivalent mutants (no behaviour change; not run, not counted):")
            print("\n".join(equivalent_lines()))
        return 0
    if not mutants:
        what = " and ".join(f"{k} {v!r}" for k, v in (("--only", args.only), ("--module", args.module)) if v)
        print(f"mutate: no mutant matches {what}", file=sys.stderr)
        return 2
    jobs = max(1, min(args.jobs, len(mutants)))
    threads = 1 if jobs > 1 else None
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sanlab-mutate-") as tmp:
        trees = [copy_tree(Path(tmp) / f"tree{i}") for i in range(jobs)]
        if not args.no_baseline:
            tests = list(dict.fromkeys(t for m in mutants for t in m.tests if (ROOT / t.split("::")[0]).exists()))
            print(f"mutate: baseline: {len(tests)} test files on the unmutated tree ...", flush=True)
            results: list[tuple[int | None, str]] = []
            chunks = [tuple(tests[i::jobs]) for i in range(jobs) if tests[i::jobs]]
            runners = [threading.Thread(target=lambda tr, ch: results.append(run_tests(tr, ch, args.timeout * 2, threads)),
                                        args=(tr, ch)) for tr, ch in zip(trees, chunks)]
            for r in runners:
                r.start()
            for r in runners:
                r.join()
            for rc, out in results:
                if rc != 0:
                    print(out[-4000:])
                    print("mutate: the unmutated tree fails its tests; fix that first", file=sys.stderr)
                    return 2
            print(f"mutate: baseline passed in {time.monotonic() - start:.0f} s", flush=True)
        todo: queue.Queue[Mutant] = queue.Queue()
        for m in mutants:
            todo.put(m)
        outcomes: list[Outcome] = []
        lock = threading.Lock()

        def worker(tree: Path) -> None:
            while True:
                try:
                    m = todo.get_nowait()
                except queue.Empty:
                    return
                o = run_mutant(tree, m, args.timeout, threads)
                with lock:
                    outcomes.append(o)
                    print(f"[{len(outcomes):2d}/{len(mutants)}] {o.status:8s} {m.name:34s} {o.seconds:5.0f} s  "
                          f"{o.detail[:90]}", flush=True)

        workers = [threading.Thread(target=worker, args=(t,)) for t in trees]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    order = {m.name: i for i, m in enumerate(mutants)}
    outcomes.sort(key=lambda o: order[o.mutant.name])
    counts = {s: sum(o.status == s for o in outcomes) for s in ("caught", "survived", "stale", "untestable")}
    for o in outcomes:
        if o.status == "untestable":
            print(f"\nUNTESTABLE HERE: {o.mutant.name} ({o.mutant.what}): {o.detail}")
        elif o.status != "caught":
            print(f"\n{o.status.upper()}: {o.mutant.name} ({o.mutant.what}); ran {' '.join(o.mutant.tests)}")
            print(o.detail if o.status == "stale" else diff(o.mutant))
    print("\n" + module_table(mutants, outcomes, modules))
    if EQUIVALENT and not (args.only or args.module):
        print("\nequivalent mutants (no behaviour change; not run, not counted):")
        print("\n".join(equivalent_lines()))
    here = f", {counts['untestable']} untestable on this machine" if counts["untestable"] else ""
    print(f"\nmutate: {counts['caught']} caught, {counts['survived']} survived, {counts['stale']} stale{here} "
          f"of {len(outcomes)} mutants in {time.monotonic() - start:.0f} s ({jobs} jobs)")
    return 0 if counts["caught"] + counts["untestable"] == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
