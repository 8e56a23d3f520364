"""Checkpoints: safetensors + JSON, atomic, checksummed, enough for an exact resume.

A checkpoint directory holds
    model.safetensors   the weights (tied tensors stored once)
    optim.safetensors   every tensor of the optimizer state, keyed `{optimizer}/{param name}/{key}`
    state.json          step, loader position, every RNG state, trainer scalars, the
                        non-tensor optimizer state (param groups, scalars), the sha256
                        of both safetensors files and of its own content (`state_sha256`)
No pickle anywhere: a checkpoint can be read without executing code.

Writes are atomic: the files go to a temporary sibling directory that is renamed into
place, so a crash (even SIGKILL) leaves either the old checkpoint or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from sanlab.errors import CheckpointError
from sanlab.paths import raise_no_space
from sanlab.train.optim import Optimizers

FORMAT = 1
MODEL_FILE, OPTIM_FILE, STATE_FILE = "model.safetensors", "optim.safetensors", "state.json"


# --------------------------------------------------------------------------- RNG state


def _bytes_hex(t: torch.Tensor) -> str:
    return bytes(t.tolist()).hex()


def _hex_bytes(s: str) -> torch.Tensor:
    return torch.tensor(list(bytes.fromhex(s)), dtype=torch.uint8)


def rng_state() -> dict[str, Any]:
    """Every RNG the process might draw from (torch CPU and CUDA, numpy, python), as JSON."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch_cpu": _bytes_hex(torch.get_rng_state()),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = [_bytes_hex(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured."""
    torch.set_rng_state(_hex_bytes(state["torch_cpu"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_hex_bytes(s) for s in state["torch_cuda"]])


# --------------------------------------------------------------------------- optimizer state


def _flatten_optim(optims: Optimizers) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Split the optimizers' state into named tensors and JSON (param groups, scalars)."""
    tensors: dict[str, torch.Tensor] = {}
    meta: list[dict[str, Any]] = []
    for i, (opt, group_names) in enumerate(zip(optims.optimizers, optims.names)):
        sd = opt.state_dict()
        names = [n for g in group_names for n in g]  # state_dict indexes params in group order
        scalars: dict[str, dict[str, Any]] = {}
        for idx, entry in sd["state"].items():
            for key, value in entry.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"{i}/{names[idx]}/{key}"] = value.detach().contiguous().cpu()
                else:
                    scalars.setdefault(names[idx], {})[key] = value
        groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
        meta.append({"type": type(opt).__name__, "params": group_names, "groups": groups,
                     "scalars": scalars})
    return tensors, meta


def _restore_optim(optims: Optimizers, tensors: dict[str, torch.Tensor], meta: list[dict[str, Any]]) -> None:
    """Load state written by `_flatten_optim`, refusing a different routing."""
    if len(meta) != len(optims.optimizers):
        raise CheckpointError("checkpoint optimizer does not match the config (optim.name differs?)")
    for i, (opt, group_names, saved) in enumerate(zip(optims.optimizers, optims.names, meta)):
        if saved["type"] != type(opt).__name__ or saved["params"] != group_names:
            raise CheckpointError("checkpoint parameter routing does not match this model/config")
        names = [n for g in group_names for n in g]
        state: dict[int, dict[str, Any]] = {}
        for idx, name in enumerate(names):
            entry = dict(saved["scalars"].get(name, {}))
            prefix = f"{i}/{name}/"
            entry.update({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
            if entry:
                state[idx] = entry
        groups, start = [], 0
        for g, gnames in zip(saved["groups"], group_names):
            # JSON turned tuples (betas, ns_coefficients) into lists; give them back.
            g = {k: tuple(v) if isinstance(v, list) else v for k, v in g.items()}
            groups.append({**g, "params": list(range(start, start + len(gnames)))})
            start += len(gnames)
        opt.load_state_dict({"state": state, "param_groups": groups})


# --------------------------------------------------------------------------- files


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def state_digest(state: dict[str, Any]) -> str:
    """sha256 of state.json's content without its own `state_sha256` (canonical JSON: sorted
    keys, no spaces), so damage that still parses (a digit of the step changed) is seen."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_dir(tmp: Path, dest: Path) -> None:
    """Move `tmp` onto `dest`; at every instant one complete copy exists on disk."""
    old = dest.with_name(f".old-{dest.name}")
    if old.exists():
        shutil.rmtree(old)
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    _fsync(dest.parent)
    if old.exists():
        shutil.rmtree(old)


def save(dest: Path, model: nn.Module, optims: Optimizers, state: dict[str, Any]) -> None:
    """Write a checkpoint atomically to `dest` (a directory, replaced if present).

    `state` holds the trainer's JSON state (step, loader position, scalars); RNG states,
    the optimizer's non-tensor state and the checksums are added here.
    """
    dest = Path(dest)
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / MODEL_FILE))
        tensors, optim_meta = _flatten_optim(optims)
        save_file(tensors, str(tmp / OPTIM_FILE))
        full = {
            "format": FORMAT, **state, "rng": rng_state(), "optim": optim_meta,
            "checksums": {f: _sha256(tmp / f) for f in (MODEL_FILE, OPTIM_FILE)},
        }
        full["state_sha256"] = state_digest(full)
        (tmp / STATE_FILE).write_text(json.dumps(full))
        for f in (MODEL_FILE, OPTIM_FILE, STATE_FILE):
            _fsync(tmp / f)
    except (OSError, SafetensorError) as e:
        # Nothing was replaced yet: the previous checkpoint at `dest` is intact.
        shutil.rmtree(tmp, ignore_errors=True)
        raise_no_space(e, f"checkpoint {dest} (the previous one is intact)")
        raise
    _replace_dir(tmp, dest)


def copy(src: Path, dest: Path) -> None:
    """Atomically copy a finished checkpoint (a milestone taken at the same step)."""
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        shutil.copytree(src, tmp)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise_no_space(e, f"checkpoint {dest}")
        raise
    _replace_dir(tmp, dest)


def find(path: Path) -> Path | None:
    """The checkpoint at `path`, or the previous copy if a crash hit mid-replace."""
    for candidate in (path, path.with_name(f".old-{path.name}")):
        if (candidate / STATE_FILE).is_file():
            return candidate
    return None


def verify(path: Path, files: Sequence[str] = (MODEL_FILE, OPTIM_FILE)) -> dict[str, Any]:
    """The one checkpoint verifier: every reader of a checkpoint (sample, eval, analyze,
    export, probe scoring, train --resume) goes through it before it reads a tensor.

    Reads `state.json` (missing, unreadable, not UTF-8 JSON or not sanlab's format: one
    line naming it) and compares the sha256 of each of `files` with the checksum it
    records; a mismatch is a `CheckpointError` naming the file. A reader of the weights
    verifies `model.safetensors` only; a resume verifies both tensor files. Returns
    state.json.
    """
    f = path / STATE_FILE
    if not f.is_file():
        raise CheckpointError(f"{f}: missing, so the checkpoint cannot be verified (an incomplete or "
                              "damaged checkpoint)")
    try:
        state = json.loads(f.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 JSON" if isinstance(e, UnicodeDecodeError) \
            else "nested too deeply" if isinstance(e, RecursionError) else f"malformed JSON: {e}"
        raise CheckpointError(f"{f}: unreadable checkpoint state ({why})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{f}: not a sanlab checkpoint (a JSON {type(state).__name__}, not an object)")
    fmt = state.get("format")
    if type(fmt) is not int or fmt != FORMAT:  # `true` and 1.0 equal 1 in Python, and are no format
        raise CheckpointError(f"{f}: not a sanlab checkpoint of format {FORMAT} "
                              f"({'no format' if 'format' not in state else f'format {json.dumps(fmt)}'})")
    if "state_sha256" in state and state["state_sha256"] != state_digest(state):  # (older checkpoints lack it)
        raise CheckpointError(f"{f}: checksum mismatch of its own content (a damaged checkpoint state)")
    checksums = state.get("checksums")
    if not isinstance(checksums, dict) or not all(isinstance(checksums.get(n), str) for n in files):
        raise CheckpointError(f"{f}: no checksums of {' and '.join(files)}")
    for name in files:
        data = path / name
        if not data.is_file():
            raise CheckpointError(f"{data}: missing checkpoint file")
        try:
            digest = _sha256(data)
        except OSError as e:
            raise CheckpointError(f"{data}: unreadable ({e.strerror})") from None
        if digest != checksums[name]:
            raise CheckpointError(f"{data}: checksum mismatch with {STATE_FILE} (corrupt checkpoint)")
    return state


def read_state(path: Path) -> dict[str, Any]:
    """Read and verify a checkpoint to resume from: both tensor files against state.json
    (`verify`), and every key a resume restores."""
    state = verify(path, (MODEL_FILE, OPTIM_FILE))
    missing = [k for k in ("step", "rng", "optim", "checksums") if k not in state]
    if missing:
        raise CheckpointError(f"{path / STATE_FILE}: incomplete checkpoint state (no {missing[0]!r})")
    checksums = state["checksums"]
    if set(checksums) != {MODEL_FILE, OPTIM_FILE}:
        raise CheckpointError(f"{path / STATE_FILE}: no checksums of {MODEL_FILE} and {OPTIM_FILE}")
    return state


def _first_shape_mismatch(file: Path, model: nn.Module) -> str | None:
    """The first parameter whose stored shape differs from the model's, as one phrase."""
    try:
        with safe_open(str(file), "pt") as f:
            saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        return f"unreadable {file.name} ({e})"
    for name, t in model.state_dict().items():
        if name in saved and saved[name] != tuple(t.shape):
            return (f"{name} has shape {list(saved[name])} in the checkpoint, "
                    f"{list(t.shape)} in the model (a different model config?)")
    return None


def load(path: Path, model: nn.Module, optims: Optimizers | None = None,
         *, restore_rng: bool = True) -> dict[str, Any]:
    """Verify and load a checkpoint into `model` (and `optims`); returns its state.json."""
    state = read_state(path)
    mismatch = _first_shape_mismatch(path / MODEL_FILE, model)
    if mismatch is not None:
        raise CheckpointError(f"{path}: checkpoint does not fit this model: {mismatch}")
    try:
        missing, unexpected = load_model(model, str(path / MODEL_FILE), strict=False)
        if optims is not None:
            _restore_optim(optims, load_file(str(path / OPTIM_FILE)), state["optim"])
    except (SafetensorError, RuntimeError, KeyError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: checkpoint does not fit this model ({first})") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: checkpoint does not fit this model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})"
        )
    if restore_rng:
        set_rng_state(state["rng"])
    return state
