"""One training run, start to finish, into one self-describing run dir.

`train(cfg, out_dir)` is the whole public surface: the CLI and the study orchestrator
both call it. The loop below is deliberately flat, one comment-headed phase after
another; everything with its own concern (routing, schedule, checkpoints, data
parallelism, logging, the run dir) lives in its own module.

Loss normalisation: the loss of a step is the mean over *all* unmasked target tokens
of the global batch, whatever the split into ranks and micro-batches: each
micro-batch's mean loss is weighted by its share of the step's tokens. So one process
with gradient accumulation and N processes with DDP compute the same gradient.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from sanlab.accounting import accounting_summary, count_module_params
from sanlab.config import Config
from sanlab.data.loader import Loader
from sanlab.data.regions import REGION_NAMES
from sanlab.data.shards import heldout_tokens
from sanlab.errors import CheckpointError, ConfigError, DataError
from sanlab.model.attention import attention_kernel
from sanlab.model.lm import LM, token_losses
from sanlab.paths import check_out_dir, raise_no_space
from sanlab.train import checkpoint, dist, rundir
from sanlab.train.compiling import compile_for_training
from sanlab.train.host import native_bf16, tune_cpu_allocator
from sanlab.train.logs import RunLog, truncate_metrics
from sanlab.train.optim import build_optimizers, clip_grad_norm, routing_table
from sanlab.train.resolve import Plan, make_plan, resolve
from sanlab.train.schedule import lr_multiplier
from sanlab.train.signals import StopSignal

Batch = dict[str, torch.Tensor]
_EMA_DECAY, _EMA_WARMUP = 0.9, 10  # running mean for the loss-spike test
# Collapse: a model killed by a huge LR predicts the uniform distribution (loss = ln V)
# and gets no gradient. Healthy training never has a gradient norm near zero, so this
# many consecutive such steps mark the run diverged: a sweep must never lock it.
_COLLAPSE_STEPS, _COLLAPSE_GRAD, _COLLAPSE_LOSS_TOL = 5, 1e-6, 1e-3


def collapsed(train_loss: float, grad_norm: float, vocab_size: int) -> bool:
    """Whether one step looks dead: loss at ln(vocab_size) and a (near-)zero gradient."""
    return abs(train_loss - math.log(vocab_size)) <= _COLLAPSE_LOSS_TOL and 0 <= grad_norm <= _COLLAPSE_GRAD


# --------------------------------------------------------------------------- resolution


def emulated_bf16_note(cfg: Config) -> str | None:
    """A one-line note when a resolved config asks for bf16 on a CPU that emulates it."""
    asked = []
    if cfg.train.precision == "bf16":
        asked.append("train.precision")
    if cfg.optim.name == "muon" and cfg.optim.ns_precision == "bf16":
        asked.append("optim.ns_precision")
    if cfg.train.device != "cpu" or not asked or native_bf16("cpu"):
        return None
    return (f"note: {' and '.join(asked)}=bf16 on a CPU without bf16 dot-product instructions "
            "(AVX512-BF16, AMX): its bf16 products are emulated and over 10x slower than fp32; "
            "'auto' picks fp32 here")



def _heldout_tokens(cfg: Config, n: int) -> torch.Tensor:
    """The first n tokens of the held-out split of `data.dir` (fewer if it holds fewer)."""
    return torch.from_numpy(heldout_tokens(cfg.data.dir, n))


def _loader(cfg: Config, split: str, rows: int, d: dist.Dist) -> Any:
    """This rank's loader for `split`; `rows` is the global batch (the loader shards it)."""
    if cfg.data.dir is None:
        raise ConfigError("data.dir is not set (point it at a directory made by `sanlab prepare`)")
    if not Path(cfg.data.dir).is_dir():
        what = "a file, not a directory made by `sanlab prepare`" if Path(cfg.data.dir).exists() else "no such directory"
        raise DataError(f"data.dir={cfg.data.dir}: {what}")
    # sha256 of every data file once per run: rank 0's train loader checks the whole
    # manifest (all splits); the val loader and the other ranks read the same files, so
    # they check sizes only (hashing is ~1 s/GB, minutes per loader at paper scale).
    return Loader(cfg.data.dir, split=split, batch_rows=rows, seed=cfg.train.seed,
                  rank=d.rank, world_size=d.world_size, verify=split == "train" and d.is_main)


def _micro_batches(batch: Batch, rows: int) -> list[Batch]:
    n = batch["inputs"].shape[0]
    return [{k: v[i:i + rows] for k, v in batch.items()} for i in range(0, n, rows)]


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[Batch],
             amp: Callable[[], contextlib.AbstractContextManager[Any]], d: dist.Dist) -> dict[str, float]:
    """Held-out CE (no z-loss) over the masked targets, overall and by region of the target.

    Regions are reported when the data has any (a plain-text corpus is all `other`).
    """
    was_training = model.training
    model.eval()
    n_regions = len(REGION_NAMES)
    sums = torch.zeros(2 * n_regions, dtype=torch.float64)  # loss sums, then token counts
    for mb in batches:
        with amp():
            logits = model(mb["inputs"], mb["segment_ids"])
        losses = token_losses(logits, mb["targets"]).double()  # (B, T)
        mask = mb["loss_mask"]
        regions = mb["region_ids"][mask]
        sums[:n_regions] += torch.bincount(regions, losses[mask], n_regions).cpu()
        sums[n_regions:] += torch.bincount(regions, minlength=n_regions).double().cpu()
    model.train(was_training)
    totals = d.sum(sums.tolist())
    loss, count = totals[:n_regions], totals[n_regions:]
    out = {"val_loss": sum(loss) / max(sum(count), 1.0)}
    if any(count[1:]):
        for name, s, c in zip(REGION_NAMES, loss, count):
            if c:
                out[f"val_loss_{name}"] = s / c
    return out


# --------------------------------------------------------------------------- the run


def _check_finished(out: Path) -> None:
    """A finished run is returned as it is, but only with an intact latest checkpoint."""
    latest = out / rundir.CHECKPOINTS / "latest"
    found = checkpoint.find(latest)
    if found is None and latest.is_dir():
        raise CheckpointError(f"{out} is a finished run, but {latest / checkpoint.STATE_FILE} is missing "
                              "(a damaged checkpoint); retrain it with --force")
    if found is not None:
        try:
            checkpoint.read_state(found)
        except CheckpointError as e:
            raise CheckpointError(f"{out} is a finished run, but {e}") from None


def _complete_milestones(ckpt_dir: Path, latest: Path, start: int, plan: Plan) -> None:
    """Make the milestone of the resumed step exist.

    `save` writes `latest` and then copies it to the milestone; a kill between the two
    leaves `latest` at a milestone step without its copy, and the resumed loop starts
    after that step, so the copy is made here. Earlier milestones cannot be missing that
    way (each was copied before a later `latest` replaced the one it came from).
    """
    pct = plan.milestones.get(start)
    if pct is not None and checkpoint.find(ckpt_dir / f"milestone-{pct:03d}") is None:
        checkpoint.copy(latest, ckpt_dir / f"milestone-{pct:03d}")


def train(cfg: Config, out_dir: str | Path, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
    """Train one run into `out_dir` and return its meta (see docs/architecture.md, run dir).

    A finished run with the same config is returned without retraining; `resume=True`
    continues an unfinished one exactly (or starts fresh when there is nothing to
    resume). `meta["status"]` is `completed`, `diverged` or `interrupted`; user
    mistakes raise `SanlabError`.
    """
    cfg = resolve(cfg)
    out = check_out_dir(out_dir, "run dir")
    with dist.session(cfg.train.device) as d:
        plan = make_plan(cfg, d.world_size)
        decision = rundir.decide(out, cfg, resume=resume, force=force)
        if decision.action == "done":
            assert decision.meta is not None
            _check_finished(out)
            return decision.meta
        with StopSignal() as stop:
            return _run(cfg, out, plan, d, decision, stop)


def _run(cfg: Config, out: Path, plan: Plan, d: dist.Dist, decision: rundir.Decision,
         stop: StopSignal) -> dict[str, Any]:
    t, session_start = cfg.train, time.time()
    # ---- setup: seeds, threads, model, optimizers, data
    if t.threads:
        torch.set_num_threads(t.threads)
    malloc_tuned = d.device.type == "cpu" and tune_cpu_allocator()  # see train/host.py
    torch.manual_seed(t.seed)
    np.random.seed(t.seed)
    random.seed(t.seed)
    model = LM(cfg.model).to(d.device)
    attention = attention_kernel(cfg.model, d.device, t.precision, cfg.data.seq_len)  # (ConfigError: `fused` unmet)
    model.freeze(cfg.train.freeze)  # train.freeze: weights kept at init, no optimizer state
    optims = build_optimizers(model, cfg.optim)
    train_model = d.wrap(model)
    train_data = _loader(cfg, "train", t.batch_rows, d)
    if train_data.seq_len != cfg.data.seq_len:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} but {cfg.data.dir} holds rows of "
                          f"{train_data.seq_len} tokens")
    if train_data.vocab_size > cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the vocabulary "
                          f"of {cfg.data.dir} ({train_data.vocab_size})")
    # The same held-out rows at every evaluation (and in every run of a study), kept in memory.
    val_batches = [{k: v.to(d.device) for k, v in b.items()}
                   for b in _loader(cfg, "val", d.world_size, d).eval_batches(t.eval_rows, plan.micro_rows)]
    # State a mixer takes from the data (FixedSeqQK: its fixed sequence, the held-out split's
    # first tokens), or a row length it cannot serve; a resume then restores the checkpoint's.
    model.bind_data(lambda n: _heldout_tokens(cfg, n), cfg.data.seq_len)
    bf16 = t.precision == "bf16"

    def amp() -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=bf16)

    # ---- an exact resume: the latest checkpoint verified and loaded before the run dir is touched
    ckpt_dir = out / rundir.CHECKPOINTS
    start, trainer_state = 0, {"ema": 0.0, "ema_n": 0, "train_time_s": 0.0, "last_eval": {}}
    found = None
    if decision.action == "resume":
        found = checkpoint.find(ckpt_dir / "latest")
        if found is None:
            raise CheckpointError(f"--resume: {ckpt_dir / 'latest' / checkpoint.STATE_FILE} is missing, so the "
                                  "checkpoint cannot be verified or resumed; start the run over with --force")
        state = checkpoint.load(found, model, optims)
        if not (isinstance(state.get("loader"), dict) and isinstance(state.get("trainer"), dict)):
            raise CheckpointError(f"{found}: not a training checkpoint (no loader / trainer state)")
        written = state.get("config")
        diff = rundir.first_difference(rundir.config_json(cfg), written) if isinstance(written, dict) else None
        if diff and not decision.force:
            raise CheckpointError(f"{found}: written under another config than the run dir's config.json "
                                  f"({diff.replace('in the run dir', 'in the checkpoint')}; a damaged config.json?); "
                                  "use --force to continue under config.json's")
        train_data.load_state_dict(state["loader"])
        start, trainer_state = state["step"], state["trainer"]
    # ---- the dry check of a fresh start: the evaluation at init, a forward pass through every
    # layer on the held-out rows, so a model that cannot run on this data fails before any file
    # is written (evaluation draws no random numbers: the run is unchanged)
    init_eval = evaluate(model, val_batches, amp, d) if start == 0 else None

    # ---- the run dir: fresh start or exact resume
    if d.is_main:
        rundir.prepare(out, decision)
    d.barrier()
    meta: dict[str, Any] = {}
    if found is not None:
        meta = rundir.resumed_meta(out / rundir.META_FILE)
        if d.is_main:
            truncate_metrics(out / rundir.METRICS_FILE, start)
            _complete_milestones(ckpt_dir, found, start, plan)
    meta.update({
        "status": "running", "versions": rundir.versions(), "git": rundir.git_commit(),
        "device": {**rundir.device_info(d.device, t.precision, d.world_size), "malloc_tuned": malloc_tuned,
                   "attention": attention},
        "accounting": accounting_summary(cfg.model, cfg.data.seq_len)
                      | {"params_module": count_module_params(model).total},
        "routing": {g: v["numel"] for g, v in routing_table(model).items()},
        "plan": asdict(plan) | {"total_tokens": plan.steps * plan.tokens_per_step},
        "resumes": meta.get("resumes", -1) + 1,
        "started_at": meta.get("started_at", datetime.now(timezone.utc).isoformat()),
    })
    meta["plan"]["milestones"] = {str(k): v for k, v in plan.milestones.items()}

    def write_meta() -> None:
        if d.is_main:
            rundir.write_json(out / rundir.META_FILE, meta)

    def save(step: int) -> None:
        """Rolling latest, plus a milestone copy when `step` is one (rank 0 writes)."""
        if d.is_main:
            state = {"step": step, "tokens": step * plan.tokens_per_step,
                     "loader": train_data.state_dict(), "trainer": trainer_state,
                     "config": rundir.config_json(cfg)}
            checkpoint.save(ckpt_dir / "latest", model, optims, state)
            if step in plan.milestones:
                checkpoint.copy(ckpt_dir / "latest", ckpt_dir / f"milestone-{plan.milestones[step]:03d}")
        d.barrier()

    if d.is_main:
        rundir.write_json(out / rundir.CONFIG_FILE, rundir.config_json(cfg))
    write_meta()
    log = RunLog(out, cfg, plan.steps, start, enabled=d.is_main)
    if note := emulated_bf16_note(cfg):
        log.message(note)

    def compile_probe() -> None:  # a training step's forward and backward (its gradients are dropped)
        mb = val_batches[0]
        with d.no_sync(train_model, sync=False):
            with amp():
                loss, _ = train_model(mb["inputs"], mb["segment_ids"], mb["targets"], mb["loss_mask"], t.z_loss)
            loss.backward()

    status, row, stop_eval = "running", {}, {}
    try:
        meta["device"]["compile"] = compile_for_training(model, t.compile, compile_probe, log.message)
        if start == 0:
            meta["init"] = init_eval
            save(0)
        # ---- the loop: one optimizer step per iteration
        for step in range(start, plan.steps):
            t0 = time.perf_counter()
            mult = lr_multiplier(cfg.optim, step, plan.steps)
            optims.set_lr(mult)
            micro = _micro_batches(next(train_data), plan.micro_rows)  # step `step`, on the CPU
            # Token counts first (on the CPU: no device sync): each micro-batch's loss is
            # weighted by its share of the global step (× world_size: DDP averages over ranks).
            counts = [float(mb["loss_mask"].sum()) for mb in micro]
            micro = [{k: v.to(d.device, non_blocking=True) for k, v in mb.items()} for mb in micro]
            (n_total,) = d.sum([sum(counts)])
            ce_sum = torch.zeros((), dtype=torch.float64, device=d.device)
            for i, (mb, n) in enumerate(zip(micro, counts)):
                with d.no_sync(train_model, sync=i == len(micro) - 1):
                    with amp():
                        # the fused head + loss: the (b, T, V) logits are never materialised
                        loss, ce = train_model(mb["inputs"], mb["segment_ids"], mb["targets"], mb["loss_mask"],
                                               t.z_loss)
                    (loss * (n * d.world_size / max(n_total, 1.0))).backward()
                ce_sum += ce.detach().double() * n
            (ce_total,) = d.sum([float(ce_sum)])
            train_loss = ce_total / max(n_total, 1.0)
            grad_norm = clip_grad_norm(optims.params(), cfg.optim.grad_clip)

            # ---- divergence: a recorded result; the weights keep their last finite values
            spike = (t.spike_factor is not None and trainer_state["ema_n"] >= _EMA_WARMUP
                     and train_loss > t.spike_factor * trainer_state["ema"])
            dead = collapsed(train_loss, grad_norm, cfg.model.vocab_size)
            trainer_state["dead_steps"] = trainer_state.get("dead_steps", 0) + 1 if dead else 0
            dead_run = trainer_state["dead_steps"] >= _COLLAPSE_STEPS
            diverged = not (math.isfinite(train_loss) and math.isfinite(grad_norm)) or spike or dead_run
            if not diverged:
                optims.step()
                ema, n_ema = trainer_state["ema"], trainer_state["ema_n"]
                trainer_state["ema"] = train_loss if n_ema == 0 else _EMA_DECAY * ema + (1 - _EMA_DECAY) * train_loss
                trainer_state["ema_n"] = n_ema + 1
            optims.zero_grad()
            trainer_state["last_loss"] = train_loss
            done = step + 1
            dt = time.perf_counter() - t0
            trainer_state["train_time_s"] += dt

            # ---- metrics, evaluation
            row = {"step": done, "tokens": done * plan.tokens_per_step, "loss": train_loss,
                   "lr": cfg.optim.lr * mult, "grad_norm": grad_norm,
                   "tokens_per_s": plan.tokens_per_step / dt}
            if diverged:
                row["diverged"] = True
            elif done == plan.steps or (t.eval_every and done % t.eval_every == 0):
                trainer_state["last_eval"] = evaluate(model, val_batches, amp, d)
                row.update(trainer_state["last_eval"])
            log.log(row)
            if diverged:
                status = "diverged"
                if dead_run:
                    meta["diverged_reason"] = "collapse"
                    log.message(f"diverged at step {done}: collapsed (loss {train_loss:.4g} = ln(vocab) and "
                                f"gradient norm {grad_norm:.2g} for {_COLLAPSE_STEPS} steps); lower the LR")
                else:
                    log.message(f"diverged at step {done}: loss {train_loss:.4g}, grad norm {grad_norm:.4g}")
                break

            # ---- checkpoints: milestones, rolling latest, and on a stop signal
            saved = done in plan.milestones or done == plan.steps or bool(
                t.checkpoint_every and done % t.checkpoint_every == 0)
            if saved:
                save(done)
            if d.any(stop.requested):
                if not saved:
                    save(done)
                status = "interrupted"
                if "val_loss" not in row:
                    # the run's record gets the validation loss of the step it stopped at (the
                    # checkpoint is already written and evaluation draws no random numbers, so
                    # the resumed run is unchanged; metrics.jsonl keeps the uninterrupted rows)
                    stop_eval = evaluate(model, val_batches, amp, d)
                log.message(f"interrupted at step {done}; resume with --resume")
                break
        else:
            status = "completed"
    except BaseException as e:
        meta["status"] = "failed"
        with contextlib.suppress(OSError):  # the disk may be the problem
            write_meta()
        raise_no_space(e, f"run dir {out}")
        raise
    finally:
        log.close()

    # ---- the run's record
    train_time, last_loss = trainer_state["train_time_s"], row.get("loss", trainer_state.get("last_loss"))
    done_steps = row.get("step", start)
    meta.update({
        "status": status,
        "final": {"train_loss": last_loss if last_loss is not None and math.isfinite(last_loss) else None,
                  **trainer_state["last_eval"], **stop_eval,
                  "tokens": done_steps * plan.tokens_per_step, "steps": done_steps},
        "train_time_s": train_time,  # optimizer steps only, summed over resumes
        "tokens_per_s": done_steps * plan.tokens_per_step / train_time if train_time else None,
        "wall_time_s": meta.get("wall_time_s", 0.0) + time.time() - session_start,
        "finished_at": datetime.now(timezone.utc).isoformat(),
    })
    meta["device"]["compile"] = model.compiled  # (false after a compiler failure mid-run)
    write_meta()
    return meta
