"""Training many small runs at once, as the members of one batched model.

`train_members(cfgs, out_dirs)` trains runs whose configs share the architecture, the
data shape and the plan (they differ in LR, weight decay, schedule, seed and data dir) as
the members of one `sanlab.model.members.MemberLM`, and writes each one's ordinary run dir,
as `sanlab.train.trainer.train` would: config.json, meta.json (plus `members`: the batch it
trained in), metrics.jsonl, checkpoints in the same safetensors + JSON format. Analysis,
export and `sanlab train --resume` cannot tell a member from a solo run.

Per member, as the solo trainer does it: the init (`torch.manual_seed(seed)`, `LM(cfg)`),
the data order (its own `Loader`), the loss weighting, the gradient-norm clip, the
divergence tests, Muon / AdamW with its own LRs and schedule, the evaluation and the
checkpoints. The optimizers step each member's slices with the same torch kernels the
solo optimizers use (`_member_muon`, `_member_adamw`), so a member's update is the solo
update operand for operand.

A member that diverges is recorded as diverged (its weights keep their last finite values)
and is no longer updated; the others go on. Exact resume: the members' checkpoints are
written one after the other, so a kill between two leaves some a save ahead of the others;
the group resumes from the earliest, and a member that is ahead waits (is neither fed nor
updated) until the group reaches its step.

Tolerance against a solo run: the batched matmul runs each member's product as the solo
`F.linear` does (the same operands and fp32 accumulation), every other kernel is the solo
kernel on the member's slice. Measured, a member's losses equal its solo run's bit for bit
in fp32 and bf16 on the test shapes and at the demo's (SAN 5L d64, T128: 12 steps, two
members; before the members' linear layers took `F.linear`'s backward products, bf16
runs drifted there from the first step, ~1e-5 relative in the loss by step 12); the stated tolerance (tests/test_members.py) allows
for a BLAS that splits a batched product's accumulation differently from the single
product, which moves one bf16 rounding (relative 2⁻⁸) of an activation and, through
training's chaotic dynamics, grows: 1e-3 relative in the loss over 8 steps in bf16, 1e-5
in fp32 (`TOLERANCE`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from sanlab.accounting import accounting_summary, count_module_params
from sanlab.config import Config, OptimConfig, apply_overrides
from sanlab.errors import EXIT_INTERRUPTED, EXIT_OK, CheckpointError, ConfigError, SanlabError
from sanlab.fileio import try_read_json_object
from sanlab.model.attention import attention_kernel
from sanlab.model.lm import LM
from sanlab.model.members import MemberLM
from sanlab.paths import check_out_dir, raise_no_space
from sanlab.train import checkpoint, dist, rundir
from sanlab.train.host import tune_cpu_allocator
from sanlab.train.logs import RunLog, truncate_metrics
from sanlab.train.optim import Optimizers, _muon_lr, build_optimizers, route, routing_table
from sanlab.train.resolve import Plan, group_unsupported, make_plan, resolve
from sanlab.train.schedule import lr_multiplier
from sanlab.train.signals import StopSignal
from sanlab.train.trainer import (
    _COLLAPSE_STEPS, _EMA_DECAY, _EMA_WARMUP, _check_finished, _complete_milestones, _heldout_tokens, _loader,
    _micro_batches, collapsed, emulated_bf16_note, evaluate,
)

# The stated tolerance of a member's losses against its solo run's, relative, by precision
# (derived in the module docstring; measured: 0 in both on this project's CPU kernels).
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-3}
# --------------------------------------------------------------------------- the optimizers


@dataclass
class MemberOptim:
    """Per-member Muon / AdamW over a `MemberLM`'s stacked weights, each member stepped as
    its solo `Optimizers` (`build_optimizers`) would be: same groups, same kernels on its
    slices, its own peak LRs and schedule. State is stacked (M, ...) per parameter:
    `momentum_buffer` (Muon), `exp_avg`, `exp_avg_sq` (AdamW) and AdamW's step count per
    member (the solo optimizer keeps one per parameter, all equal)."""

    model: MemberLM
    cfgs: list[OptimConfig]
    ns_dtype: torch.dtype
    groups: dict[str, list[str]] = field(default_factory=dict)  # matrix / embedding / gain_or_gate -> names
    state: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    adam_steps: torch.Tensor | None = None  # (M,) fp32
    # the schedule multiplier of each member's last step in this session (None: none yet, so
    # its solo optimizers keep the LRs they were built or loaded with)
    mults: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mults = [None] * self.model.n_members

    def params_order(self) -> list[str]:
        """Parameter names in the solo `Optimizers.params()` order (the clip's norm order)."""
        return self.groups["matrix"] + self.groups["embedding"] + self.groups["gain_or_gate"]

    def step(self, members: list[int], mults: dict[int, float]) -> None:
        """One optimizer step of `members` (each at its schedule multiplier); the others untouched."""
        if not members:
            return
        for m in members:
            self.mults[m] = mults[m]
        if self.cfgs[0].name == "muon":
            if self.groups["matrix"]:
                self._muon(members, mults)
            rest = self.groups["embedding"] + self.groups["gain_or_gate"]
            if rest:
                self._adamw(members, rest, {m: self.cfgs[m].adam_lr * mults[m] for m in members},
                            {m: 0.0 for m in members})
        else:
            self._adam_count(members)
            for names, decay in ((self.groups["matrix"], True),
                                 (self.groups["embedding"] + self.groups["gain_or_gate"], False)):
                if names:
                    self._adamw(members, names, {m: self.cfgs[m].lr * mults[m] for m in members},
                                {m: self.cfgs[m].weight_decay if decay else 0.0 for m in members}, count=False)

    @torch.no_grad()
    def _muon(self, members: list[int], mults: dict[int, float]) -> None:
        """`sanlab.train.optim.Muon.step` on each member's slices."""
        o = self.cfgs[0]
        W = self.model.by_name
        names = [n for n in self.groups["matrix"] if W[n].grad is not None]
        for n in names:
            self.state.setdefault(n, {}).setdefault("momentum_buffer", torch.zeros_like(W[n]))
        params = [W[n][m] for m in members for n in names]
        grads = [W[n].grad[m] for m in members for n in names]
        bufs = [self.state[n]["momentum_buffer"][m] for m in members for n in names]
        torch._foreach_lerp_(bufs, grads, 1 - o.momentum)
        updates = torch._foreach_lerp(grads, bufs, o.momentum) if o.nesterov else bufs
        lr = {m: self.cfgs[m].lr * mults[m] for m in members}
        for i, m in enumerate(members):
            torch._foreach_mul_(params[i * len(names):(i + 1) * len(names)], 1 - lr[m] * self.cfgs[m].weight_decay)
        a, b, c = o.ns_coefficients
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(tuple(p.shape), []).append(i)
        for shape, idx in by_shape.items():
            x = newton_schulz(torch.stack([updates[i] for i in idx]), a, b, c, o.ns_steps, self.ns_dtype)
            xs = list(x.unbind(0))
            for m in members:
                mine = [j for j, i in enumerate(idx) if members[i // len(names)] == m]
                torch._foreach_add_([params[idx[j]] for j in mine], [xs[j] for j in mine],
                                    alpha=-_muon_lr(lr[m], o.muon_adjust_lr, shape))

    def _steps(self) -> torch.Tensor:
        """AdamW's step counts, one per member, on the weights' device (the fused kernel reads
        them there, as the solo `torch.optim.AdamW(fused=True)` keeps them)."""
        return torch.zeros(self.model.n_members, dtype=torch.float32, device=self.model.weights[0].device)

    def _adam_count(self, members: list[int]) -> None:
        if self.adam_steps is None:
            self.adam_steps = self._steps()
        self.adam_steps[members] += 1

    @torch.no_grad()
    def _adamw(self, members: list[int], names: list[str], lr: dict[int, float], decay: dict[int, float],
               count: bool = True) -> None:
        """torch's fused AdamW (what `build_optimizers` runs) on each member's slices."""
        o = self.cfgs[0]
        W = self.model.by_name
        names = [n for n in names if W[n].grad is not None]
        for n in names:
            st = self.state.setdefault(n, {})
            st.setdefault("exp_avg", torch.zeros_like(W[n]))
            st.setdefault("exp_avg_sq", torch.zeros_like(W[n]))
        if count:
            self._adam_count(members)
        assert self.adam_steps is not None
        for m in members:
            step = self.adam_steps[m:m + 1].view(())
            torch._fused_adamw_([W[n][m] for n in names], [W[n].grad[m] for n in names],
                                [self.state[n]["exp_avg"][m] for n in names],
                                [self.state[n]["exp_avg_sq"][m] for n in names], [], [step] * len(names),
                                lr=lr[m], beta1=o.beta1, beta2=o.beta2, weight_decay=decay[m], eps=o.eps,
                                amsgrad=False, maximize=False, grad_scale=None, found_inf=None)

    # ---- a member's state as its solo optimizers hold it (checkpoints)

    def export(self, m: int, solo: Optimizers, solo_model: LM) -> None:
        """Put member m's state into its solo `Optimizers` (views, no copies) with the LRs its
        last step ran at (`Optimizers.set_lr`, as the solo trainer sets them)."""
        params = dict(solo_model.named_parameters())
        for opt in solo.optimizers:
            opt.state.clear()
        by_param = {id(p): opt for opt in solo.optimizers for g in opt.param_groups for p in g["params"]}
        for n, st in self.state.items():
            entry: dict[str, Any] = {k: v[m] for k, v in st.items()}
            if "exp_avg" in st:
                assert self.adam_steps is not None
                entry["step"] = self.adam_steps[m].clone()
            by_param[id(params[n])].state[params[n]] = entry
        mult = self.mults[m]
        if mult is not None:
            solo.set_lr(mult)

    def absorb(self, m: int, solo: Optimizers, solo_model: LM) -> None:
        """Member m's state from its solo `Optimizers` (after `checkpoint.load`)."""
        for opt in solo.optimizers:
            for n, p in solo_model.named_parameters():
                if p not in opt.state:
                    continue
                for k, v in opt.state[p].items():
                    if k == "step":
                        if self.adam_steps is None:
                            self.adam_steps = self._steps()
                        self.adam_steps[m] = v
                        continue
                    stack = self.state.setdefault(n, {}).setdefault(k, torch.zeros_like(self.model.by_name[n]))
                    stack[m].copy_(v)


def newton_schulz(x: torch.Tensor, a: float, b: float, c: float, steps: int, dtype: torch.dtype,
                  eps: float = 1e-7) -> torch.Tensor:
    """`Muon.step`'s iterations on a stack of matrices (k, rows, cols), each on its own: the
    wide orientation, normalised by its Frobenius norm, then `steps` of the quintic."""
    tall = x.shape[1] > x.shape[2]
    x = x.to(dtype)
    x = x.mT if tall else x
    x = x / torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


# --------------------------------------------------------------------------- one member's run dir


@dataclass
class Member:
    """One member's run: its config, run dir, data, solo twins (evaluation, checkpoints) and state."""

    index: int
    cfg: Config
    out: Path
    decision: rundir.Decision
    plan: Plan
    solo: LM | None = None
    solo_optims: Optimizers | None = None
    train_data: Any = None
    val_batches: list[Any] = field(default_factory=list)
    start: int = 0
    trainer_state: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    log: RunLog | None = None
    status: str = "running"
    row: dict[str, Any] = field(default_factory=dict)
    stop_eval: dict[str, Any] = field(default_factory=dict)
    session_start: float = 0.0


def train_members(cfgs: Sequence[Config], out_dirs: Sequence[str | Path], *, resume: bool = False,
                  force: bool = False) -> list[dict[str, Any]]:
    """Train each config into its run dir, all of them as members of one batched model, and
    return their metas in order (see the module docstring). A finished run is returned as
    it is (as `train` does); the others train together."""
    cfgs = [resolve(c) for c in cfgs]
    if len(cfgs) != len(out_dirs) or not cfgs:
        raise ConfigError("train_members: one run dir per config")
    why = group_unsupported(cfgs)
    if why is not None:
        raise ConfigError(f"these runs cannot train as members of one model: {why}")
    outs = [check_out_dir(o, "run dir") for o in out_dirs]
    if len(set(outs)) != len(outs):
        raise ConfigError("train_members: two members share a run dir")
    metas: list[dict[str, Any] | None] = [None] * len(cfgs)
    members = []
    with dist.session(cfgs[0].train.device) as d:
        if d.world_size != 1:
            raise ConfigError("members train in one process (not under torchrun)")
        for i, (cfg, out) in enumerate(zip(cfgs, outs)):
            decision = rundir.decide(out, cfg, resume=resume, force=force)
            if decision.action == "done":
                _check_finished(out)
                metas[i] = decision.meta
            else:
                members.append(Member(i, cfg, out, decision, make_plan(cfg, 1)))
        if members:
            with StopSignal() as stop:
                for mem, meta in zip(members, _run(members, d, stop, [o.name for o in outs])):
                    metas[mem.index] = meta
    return [m for m in metas if m is not None]


def _setup_member(mem: Member, d: dist.Dist) -> None:
    """The solo trainer's setup for one member: its init, data, and a resume's checkpoint."""
    cfg, t = mem.cfg, mem.cfg.train
    torch.manual_seed(t.seed)
    np.random.seed(t.seed)
    random.seed(t.seed)
    mem.solo = LM(cfg.model).to(d.device)
    mem.solo_optims = build_optimizers(mem.solo, cfg.optim)
    mem.train_data = _loader(cfg, "train", t.batch_rows, d)
    if mem.train_data.seq_len != cfg.data.seq_len:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} but {cfg.data.dir} holds rows of "
                          f"{mem.train_data.seq_len} tokens")
    if mem.train_data.vocab_size > cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the vocabulary "
                          f"of {cfg.data.dir} ({mem.train_data.vocab_size})")
    mem.val_batches = [{k: v.to(d.device) for k, v in b.items()}
                       for b in _loader(cfg, "val", 1, d).eval_batches(t.eval_rows, mem.plan.micro_rows)]
    mem.solo.bind_data(lambda n: _heldout_tokens(cfg, n), cfg.data.seq_len)
    mem.trainer_state = {"ema": 0.0, "ema_n": 0, "train_time_s": 0.0, "last_eval": {}}


def _resume_member(mem: Member) -> Path | None:
    """Load a resumed member's latest checkpoint into its solo twins (as `train` does)."""
    if mem.decision.action != "resume":
        return None
    ckpt_dir = mem.out / rundir.CHECKPOINTS
    found = checkpoint.find(ckpt_dir / "latest")
    if found is None:
        raise CheckpointError(f"--resume: {ckpt_dir / 'latest' / checkpoint.STATE_FILE} is missing, so the "
                              "checkpoint cannot be verified or resumed; start the run over with --force")
    state = checkpoint.load(found, mem.solo, mem.solo_optims)
    if not (isinstance(state.get("loader"), dict) and isinstance(state.get("trainer"), dict)):
        raise CheckpointError(f"{found}: not a training checkpoint (no loader / trainer state)")
    written = state.get("config")
    diff = rundir.first_difference(rundir.config_json(mem.cfg), written) if isinstance(written, dict) else None
    if diff and not mem.decision.force:
        raise CheckpointError(f"{found}: written under another config than the run dir's config.json "
                              f"({diff.replace('in the run dir', 'in the checkpoint')}; a damaged config.json?); "
                              "use --force to continue under config.json's")
    mem.train_data.load_state_dict(state["loader"])
    mem.start, mem.trainer_state = state["step"], state["trainer"]
    return found


def _run(members: list[Member], d: dist.Dist, stop: StopSignal, group: list[str]) -> list[dict[str, Any]]:
    cfg0, t0 = members[0].cfg, members[0].cfg.train
    session_start = time.time()
    if t0.threads:
        torch.set_num_threads(t0.threads)
    malloc_tuned = d.device.type == "cpu" and tune_cpu_allocator()
    attention = attention_kernel(cfg0.model, d.device, t0.precision)
    for mem in members:
        _setup_member(mem, d)
    model = MemberLM.stack([mem.solo for mem in members])  # type: ignore[misc]
    model.set_roles(members[0].solo.param_roles())  # type: ignore[union-attr]
    groups = route(members[0].solo)  # type: ignore[arg-type]
    optim = MemberOptim(model, [m.cfg.optim for m in members],
                        {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg0.optim.ns_precision])
    optim.groups = {g: [n for n, _ in v] for g, v in groups.items() if g != "frozen"}
    found = [_resume_member(mem) for mem in members]
    with torch.no_grad():
        for i, mem in enumerate(members):
            if found[i] is not None:
                for n, p in mem.solo.named_parameters():  # type: ignore[union-attr]
                    model.by_name[n][i].copy_(p)
                optim.absorb(i, mem.solo_optims, mem.solo)  # type: ignore[arg-type]
    bf16 = t0.precision == "bf16"
    plan = members[0].plan

    def amp() -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=bf16)

    def to_solo(i: int) -> LM:
        """Member i's weights in its solo twin (evaluation, checkpoints)."""
        solo = members[i].solo
        assert solo is not None
        with torch.no_grad():
            for n, p in solo.named_parameters():
                p.copy_(model.by_name[n][i])
        return solo

    init_evals = {i: evaluate(to_solo(i), mem.val_batches, amp, d) for i, mem in enumerate(members)
                  if mem.start == 0}

    for i, mem in enumerate(members):
        out, ckpt_dir = mem.out, mem.out / rundir.CHECKPOINTS
        rundir.prepare(out, mem.decision)
        if found[i] is not None:
            mem.meta = rundir.resumed_meta(out / rundir.META_FILE)
            truncate_metrics(out / rundir.METRICS_FILE, mem.start)
            _complete_milestones(ckpt_dir, found[i], mem.start, mem.plan)  # type: ignore[arg-type]
        mem.meta.update({
            "status": "running", "versions": rundir.versions(), "git": rundir.git_commit(),
            "device": {**rundir.device_info(d.device, t0.precision, 1), "malloc_tuned": malloc_tuned,
                       "attention": attention, "compile": False},  # (members run eager: group_unsupported)
            "accounting": accounting_summary(mem.cfg.model, mem.cfg.data.seq_len)
                          | {"params_module": count_module_params(mem.solo).total},
            "routing": {g: v["numel"] for g, v in routing_table(mem.solo).items()},  # type: ignore[arg-type]
            "plan": asdict(mem.plan) | {"total_tokens": mem.plan.steps * mem.plan.tokens_per_step},
            "members": {"batch": len(members), "index": i, "runs": [group[m.index] for m in members]},
            "resumes": mem.meta.get("resumes", -1) + 1,
            "started_at": mem.meta.get("started_at", datetime.now(timezone.utc).isoformat()),
        })
        mem.meta["plan"]["milestones"] = {str(k): v for k, v in mem.plan.milestones.items()}
        rundir.write_json(out / rundir.CONFIG_FILE, rundir.config_json(mem.cfg))
        rundir.write_json(out / rundir.META_FILE, mem.meta)
        mem.log = RunLog(out, mem.cfg, plan.steps, mem.start, enabled=True)
        if i == 0 and (note := emulated_bf16_note(mem.cfg)):
            mem.log.message(note)
        mem.session_start = session_start

    def save(i: int, step: int) -> None:
        mem = members[i]
        ckpt_dir = mem.out / rundir.CHECKPOINTS
        solo = to_solo(i)
        optim.export(i, mem.solo_optims, solo)  # type: ignore[arg-type]
        state = {"step": step, "tokens": step * plan.tokens_per_step, "loader": mem.train_data.state_dict(),
                 "trainer": mem.trainer_state, "config": rundir.config_json(mem.cfg)}
        checkpoint.save(ckpt_dir / "latest", solo, mem.solo_optims, state)  # type: ignore[arg-type]
        for opt in mem.solo_optims.optimizers:  # type: ignore[union-attr]
            opt.state.clear()  # (views of the stacks: nothing to keep)
        if step in mem.plan.milestones:
            checkpoint.copy(ckpt_dir / "latest", ckpt_dir / f"milestone-{mem.plan.milestones[step]:03d}")

    try:
        for i, mem in enumerate(members):
            if mem.start == 0:
                mem.meta["init"] = init_evals[i]
                save(i, 0)
        _loop(members, model, optim, plan, amp, d, stop, save, to_solo)
    except BaseException as e:
        for mem in members:
            if mem.status == "running":
                mem.meta["status"] = "failed"
                with contextlib.suppress(OSError):
                    rundir.write_json(mem.out / rundir.META_FILE, mem.meta)
        raise_no_space(e, f"run dir {members[0].out}")
        raise
    finally:
        for mem in members:
            if mem.log is not None:
                mem.log.close()
    for mem in members:
        if mem.status != "diverged":  # (a diverged member's record is written where it diverged)
            _finish(mem)
    return [mem.meta for mem in members]


def _finish(mem: Member) -> None:
    """The run's record, as `train` writes it."""
    plan, ts = mem.plan, mem.trainer_state
    train_time, last_loss = ts["train_time_s"], mem.row.get("loss", ts.get("last_loss"))
    done_steps = mem.row.get("step", mem.start)
    mem.meta.update({
        "status": mem.status,
        "final": {"train_loss": last_loss if last_loss is not None and math.isfinite(last_loss) else None,
                  **ts["last_eval"], **mem.stop_eval, "tokens": done_steps * plan.tokens_per_step,
                  "steps": done_steps},
        "train_time_s": train_time,
        "tokens_per_s": done_steps * plan.tokens_per_step / train_time if train_time else None,
        "wall_time_s": mem.meta.get("wall_time_s", 0.0) + time.time() - mem.session_start,
        "finished_at": datetime.now(timezone.utc).isoformat(),
    })
    rundir.write_json(mem.out / rundir.META_FILE, mem.meta)


def _stacked(batches: list[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """The members' batches stacked (M, ...); a member without one (waiting, diverged) gets
    an all-masked copy of another's, which adds nothing to any loss."""
    some = next(b for b in batches if b is not None)
    filler = {k: v if k != "loss_mask" else torch.zeros_like(v) for k, v in some.items()}
    return {k: torch.stack([(b or filler)[k] for b in batches]) for k in some}


def _loop(members: list[Member], model: MemberLM, optim: MemberOptim, plan: Plan, amp: Any, d: dist.Dist,
          stop: StopSignal, save: Any, to_solo: Any) -> None:
    t = members[0].cfg.train
    names = optim.params_order()
    M = len(members)
    for step in range(min(m.start for m in members), plan.steps):
        active = [i for i, m in enumerate(members) if m.status == "running" and m.start <= step]
        if not active:
            break
        t_start = time.perf_counter()
        mults = {i: lr_multiplier(members[i].cfg.optim, step, plan.steps) for i in active}
        per = [_micro_batches(next(members[i].train_data), plan.micro_rows) if i in active else None
               for i in range(M)]
        counts = {i: [float(mb["loss_mask"].sum()) for mb in per[i]] for i in active}  # type: ignore[union-attr]
        totals = {i: sum(c) for i, c in counts.items()}
        ce_sum = torch.zeros(M, dtype=torch.float64)
        for k in range(plan.accum):
            mb = _stacked([p[k] if p is not None else None for p in per])
            mb = {key: v.to(d.device, non_blocking=True) for key, v in mb.items()}
            n = torch.tensor([counts[i][k] if i in counts else 0.0 for i in range(M)])
            weight = torch.tensor([counts[i][k] / max(totals[i], 1.0) if i in counts else 0.0 for i in range(M)])
            with amp():
                loss, ce = model(mb["inputs"], mb["segment_ids"], mb["targets"], mb["loss_mask"], t.z_loss)
            (loss * weight.to(loss.device, loss.dtype)).sum().backward()
            ce_sum += ce.detach().double().cpu() * n.double()
        stepped, diverged = [], []
        for i in active:
            mem = members[i]
            ts = mem.trainer_state
            train_loss = float(ce_sum[i]) / max(totals[i], 1.0)
            grads = [model.by_name[n].grad[i] for n in names if model.by_name[n].grad is not None]
            total = torch.nn.utils.get_total_norm(grads)
            if mem.cfg.optim.grad_clip > 0:
                torch._foreach_mul_(grads, torch.clamp(mem.cfg.optim.grad_clip / (total + 1e-6), max=1.0))
            grad_norm = float(total)
            spike = (t.spike_factor is not None and ts["ema_n"] >= _EMA_WARMUP
                     and train_loss > t.spike_factor * ts["ema"])
            dead = collapsed(train_loss, grad_norm, mem.cfg.model.vocab_size)
            ts["dead_steps"] = ts.get("dead_steps", 0) + 1 if dead else 0
            dead_run = ts["dead_steps"] >= _COLLAPSE_STEPS
            if not (math.isfinite(train_loss) and math.isfinite(grad_norm)) or spike or dead_run:
                diverged.append((i, train_loss, grad_norm, dead_run))
            else:
                stepped.append(i)
                ema, n_ema = ts["ema"], ts["ema_n"]
                ts["ema"] = train_loss if n_ema == 0 else _EMA_DECAY * ema + (1 - _EMA_DECAY) * train_loss
                ts["ema_n"] = n_ema + 1
            ts["last_loss"] = train_loss
            mem.row = {"step": step + 1, "tokens": (step + 1) * plan.tokens_per_step, "loss": train_loss,
                       "lr": mem.cfg.optim.lr * mults[i], "grad_norm": grad_norm}
        optim.step(stepped, mults)
        for p in model.parameters():
            p.grad = None
        done = step + 1
        dt = time.perf_counter() - t_start
        for i in active:
            mem = members[i]
            mem.trainer_state["train_time_s"] += dt
            mem.row["tokens_per_s"] = plan.tokens_per_step / dt
        for i, train_loss, grad_norm, dead_run in diverged:
            mem = members[i]
            mem.row["diverged"] = True
            mem.log.log(mem.row)  # type: ignore[union-attr]
            mem.status = "diverged"
            if dead_run:
                mem.meta["diverged_reason"] = "collapse"
                mem.log.message(f"diverged at step {done}: collapsed (loss {train_loss:.4g} = ln(vocab) and "  # type: ignore[union-attr]
                                f"gradient norm {grad_norm:.2g} for {_COLLAPSE_STEPS} steps); lower the LR")
            else:
                mem.log.message(f"diverged at step {done}: loss {train_loss:.4g}, grad norm {grad_norm:.4g}")  # type: ignore[union-attr]
            _finish(mem)
        for i in stepped:
            mem = members[i]
            if done == plan.steps or (t.eval_every and done % t.eval_every == 0):
                mem.trainer_state["last_eval"] = evaluate(to_solo(i), mem.val_batches, amp, d)
                mem.row.update(mem.trainer_state["last_eval"])
            mem.log.log(mem.row)  # type: ignore[union-attr]
        saved = done in plan.milestones or done == plan.steps or bool(
            t.checkpoint_every and done % t.checkpoint_every == 0)
        for i in stepped:
            if saved or done in members[i].plan.milestones:
                save(i, done)
        if stop.requested:
            for i, mem in enumerate(members):
                if mem.status != "running":
                    continue
                if i in stepped and not saved:
                    save(i, done)
                mem.status = "interrupted"
                if i in stepped and "val_loss" not in mem.row:
                    mem.stop_eval = evaluate(to_solo(i), mem.val_batches, amp, d)
                mem.log.message(f"interrupted at step {done}; resume with --resume")  # type: ignore[union-attr]
            return
    for mem in members:
        if mem.status == "running":
            mem.status = "completed"


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sanlab.train.members SPEC.json [--resume] [--force]`: train the runs SPEC.json
    lists, `{"runs": [{"config": {...}, "out": "RUN_DIR"}, ...]}`, as members of one model.
    Exit codes as `sanlab train`'s: 0 every run completed (or diverged: a recorded result,
    told in its meta.json), 2 a user error (one line), 4 interrupted by a signal after
    saving every member's checkpoint."""
    p = argparse.ArgumentParser(prog="python -m sanlab.train.members", description=main.__doc__)
    p.add_argument("spec", type=Path)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    try:
        spec = try_read_json_object(a.spec)
        runs = spec.get("runs") if spec is not None else None
        if not isinstance(runs, list) or not runs or not all(
                isinstance(r, dict) and isinstance(r.get("config"), dict) and isinstance(r.get("out"), str)
                for r in runs):
            raise ConfigError(f"{a.spec}: expected {{\"runs\": [{{\"config\": {{...}}, \"out\": \"RUN_DIR\"}}, ...]}}")
        cfgs = [apply_overrides(Config, r["config"], [], source=str(a.spec)) for r in runs]
        metas = train_members(cfgs, [r["out"] for r in runs], resume=a.resume, force=a.force)
    except SanlabError as e:
        print(f"sanlab: error: {' '.join(str(e).splitlines())}", file=sys.stderr)
        return e.exit_code
    return EXIT_INTERRUPTED if any(m.get("status") == "interrupted" for m in metas) else EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
