"""`sanlab import --hf DIR --out RUN_DIR`: a folder written by `sanlab export --hf` back into
a run dir that sanlab's commands read (`sample`, `eval`, `analyze`, `export`).

The run dir gets the model section of the folder's config.json (validated as any config),
the row length it was trained on, the weights under sanlab's names in
`checkpoints/latest/` (written by the trainer's checkpoint writer, with checksums; the
optimizer state is empty, so the run cannot be resumed for training), the tokenizer in
`RUN_DIR/tokenizer/` (named by `data.dir`), and a meta.json with status `imported` and the
folder's provenance (run id, checkpoint, step, git commit of the original run). A stock
`--as` export is not read back (its weights are folded).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from sanlab.accounting import accounting_summary
from sanlab.config import Config, ModelConfig, validate
from sanlab.errors import CheckpointError, ConfigError
from sanlab.fileio import read_json
from sanlab.paths import staged_dir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf", type=Path, required=True, metavar="DIR", help="a folder written by sanlab export --hf")
    parser.add_argument("--out", type=Path, required=True, metavar="RUN_DIR",
                        help="the run dir to write (must not exist, or be empty)")


def read_folder(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, weights by sanlab's names) of an exported folder, checked."""
    # lazy: torch; `sanlab import --help` runs without it
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from sanlab.hf.export import PREFIX

    if not folder.is_dir():
        raise CheckpointError(f"--hf {folder}: no such folder")
    config = read_json(folder / "config.json", CheckpointError)
    if not isinstance(config, dict) or config.get("model_type") != "sanlab":
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise CheckpointError(f"{folder}: not a sanlab export (model_type {kind!r}; a stock --as export "
                              "cannot be read back)")
    try:
        raw = load_file(str(folder / "model.safetensors"))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{folder / 'model.safetensors'}: unreadable ({e})") from None
    bad = [k for k in raw if not k.startswith(PREFIX)]
    if bad:
        raise CheckpointError(f"{folder / 'model.safetensors'}: unexpected tensor {bad[0]}")
    # the fixed-stream layers' Q/K inputs are the export's, computed from the weights: not sanlab's state
    weights = {k[len(PREFIX):]: t for k, t in raw.items() if not k.endswith(".attn.qk_stream")}
    for k, t in weights.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{folder / 'model.safetensors'}: {k} holds non-finite values")
    return config, weights


def run(args: argparse.Namespace) -> int:
    # lazy: torch, numpy; `sanlab import --help` runs without them
    from sanlab.data.tokenizer import load_tokenizer
    from sanlab.hf.export import check_out
    from sanlab.model.lm import LM
    from sanlab.train import checkpoint
    from sanlab.train.optim import build_optimizers
    from sanlab.train.rundir import write_json

    folder, out = args.hf, args.out
    check_out(out, "--out")
    config, weights = read_folder(folder)
    fields = {k: config[k] for k in ModelConfig.model_fields if k in config and k != "ffn"}
    model_cfg = validate(ModelConfig, fields, source=f"{folder / 'config.json'}")
    seq_len = config.get("seq_len")
    if not isinstance(seq_len, int) or seq_len <= 0:
        raise ConfigError(f"{folder / 'config.json'}: seq_len must be a positive integer, got {seq_len!r}")
    # the run's config as `train` validates it (seq_len: not a boolean, at most a prepared row)
    cfg = validate(Config, {"model": model_cfg.model_dump(), "data": {"seq_len": seq_len}},
                   source=f"{folder / 'config.json'}")
    load_tokenizer(folder)  # the ids SPEC §1.5 fixes, or a one-line error
    model = LM(model_cfg)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        first = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e))
        raise CheckpointError(f"{folder / 'model.safetensors'}: does not fit its config.json ({first})") from None
    source = config.get("sanlab") or {}
    with staged_dir(out) as tmp:
        (tmp / "tokenizer").mkdir()
        shutil.copy(folder / "tokenizer.json", tmp / "tokenizer" / "tokenizer.json")
        cfg.data.dir = str((out / "tokenizer").resolve())
        write_json(tmp / "config.json", cfg.model_dump())
        write_json(tmp / "meta.json", {"status": "imported", "imported_from": str(folder.resolve()),
                                       "source": source, "git": source.get("git"),
                                       "accounting": accounting_summary(model_cfg, seq_len)})
        checkpoint.save(tmp / "checkpoints" / "latest", model, build_optimizers(model, cfg.optim),
                        {"step": source.get("step"), "imported_from": str(folder.resolve())})
        checkpoint.verify(tmp / "checkpoints" / "latest")  # read back as every reader will, before the swap
    print(f"imported {folder} into {out}")
    return 0
