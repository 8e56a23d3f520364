"""Reading run dirs and their checkpoints, with one-line errors for every bad input.

Analysis reads run dirs only (docs/architecture.md): `config.json` says how to rebuild the model,
`checkpoints/{latest,milestone-NNN}/model.safetensors` hold the weights, `meta.json` the
recorded final metrics, and `config.data.dir` where the held-out documents live.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from tokenizers import Tokenizer

from sanlab.config import Config, validate
from sanlab.data.tokenizer import TOKENIZER_FILE, encoding_difference, load_tokenizer
from sanlab.analysis.output import MILESTONE_NAME
from sanlab.errors import CheckpointError, ConfigError, DataError
from sanlab.fileio import read_json_object
from sanlab.model.lm import LM
from sanlab.train.checkpoint import verify

MODEL_FILE = "model.safetensors"


def checkpoint_name(name: str) -> str:
    """Accept `latest`, `milestone-050` or a bare percentage `50` for the same checkpoint.
    A name is one directory inside the run's `checkpoints/`: a path (`../../run2/…`, an
    absolute one) would read another run's weights under this run's name."""
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise ConfigError(f"--checkpoint {name!r}: not a checkpoint name (latest, milestone-050 or 50; "
                          "a checkpoint of another run is read from that run's dir)")
    return f"milestone-{int(name):03d}" if name.isdigit() else name


@dataclass(frozen=True)
class RunDir:
    """A trained (or training) run directory."""

    path: Path
    config: Config
    meta: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> "RunDir":
        """Read config.json (required) and meta.json (optional) of a run dir."""
        p = Path(path)
        if not p.is_dir():
            raise CheckpointError(f"{p}: run dir not found")
        cfg_file = p / "config.json"
        if not cfg_file.is_file():
            raise CheckpointError(f"{p}: not a run dir (no config.json)")
        raw = read_json_object(cfg_file, CheckpointError)
        try:
            config = validate(Config, raw, source=str(cfg_file))
        except ConfigError as e:
            raise CheckpointError(str(e)) from None
        meta: dict[str, Any] = {}
        meta_file = p / "meta.json"
        if meta_file.is_file():
            meta = read_json_object(meta_file, CheckpointError)
        return cls(p, config, meta)

    @property
    def name(self) -> str:
        return self.path.resolve().name

    # ----------------------------------------------------------------- checkpoints

    def checkpoints(self) -> list[str]:
        """Names of the checkpoints that hold model weights, sorted."""
        root = self.path / "checkpoints"
        if not root.is_dir():
            return []
        return sorted(d.name for d in root.iterdir() if (d / MODEL_FILE).is_file())

    def milestones(self) -> list[tuple[float, str]]:
        """(fraction of training, name) of every milestone checkpoint, in training order."""
        out = [(int(m.group(1)) / 100, n) for n in self.checkpoints() if (m := MILESTONE_NAME.match(n))]
        return sorted(out)

    def checkpoint_file(self, name: str) -> Path:
        """The weights file of checkpoint `name`; a clear error naming the ones there are."""
        name = checkpoint_name(name)
        f = self.path / "checkpoints" / name / MODEL_FILE
        if not f.is_file():
            if not self.checkpoints():
                raise CheckpointError(f"{self.path}: no checkpoint with model weights yet (is it trained?)")
            raise CheckpointError(f"{self.path}: no checkpoint {name!r} (available: {', '.join(self.checkpoints())})")
        return f

    def verify(self, name: str) -> dict[str, Any]:
        """Check checkpoint `name`'s weights against the sha256 its state.json records
        (`sanlab.train.checkpoint.verify`, the check of every reader); returns state.json."""
        f = self.checkpoint_file(name)
        state = verify(f.parent, (MODEL_FILE,))
        self._check_written_config(f.parent, state.get("config"))
        return state

    def _check_written_config(self, ckpt: Path, written: Any) -> None:
        """config.json must describe the model the checkpoint was written with (its state.json
        records that config, checksummed): a config.json damaged into another valid config
        (a digit of rope_theta changed) would otherwise rebuild another model silently.
        Compared: the model section and data.seq_len (data.dir may move with the run)."""
        if not isinstance(written, dict):
            return  # a checkpoint that records no config (older ones, hand-written ones)
        try:
            then = validate(Config, written, source="checkpoint")
        except ConfigError:
            return  # written by a version whose config this one no longer reads: nothing to compare
        for key, a, b in (("model", then.model, self.config.model), ("data.seq_len", then.data.seq_len,
                                                                      self.config.data.seq_len)):
            if a != b:
                raise CheckpointError(f"{self.path / 'config.json'}: its {key} differs from the config "
                                      f"{ckpt.name} was written with (a damaged or edited config.json)")

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """The model weights of checkpoint `name` (safetensors, no code executed), verified."""
        f = self.checkpoint_file(name)
        self.verify(name)
        try:
            return load_file(str(f))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{f}: unreadable checkpoint: {e}") from None

    def load_model(self, name: str = "latest", device: str | torch.device = "cpu") -> torch.nn.Module:
        """Rebuild the model from config.json and load checkpoint `name`, in eval mode."""
        model = LM(self.config.model)
        sd = self.state_dict(name)
        try:
            model.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            first = str(e).splitlines()[1].strip() if "\n" in str(e) else str(e)
            raise CheckpointError(
                f"{self.checkpoint_file(name)}: does not match the run's config.json ({first})"
            ) from None
        return model.to(device).eval()

    # ----------------------------------------------------------------- data

    def data_dir(self, override: str | Path | None = None) -> Path:
        """The prepared data dir of the run: `override`, else config.data.dir as written
        (relative paths tried from the working directory, the run dir, then each dir
        above it). An `override` must encode text as the run's own data does, where that
        can be found (`check_data_tokenizer`): every command taking `--data` reads it here."""
        if override is not None:
            p = Path(override)
            if not p.is_dir():
                raise DataError(f"data dir not found: {p}")
            try:
                own = self.data_dir()
            except DataError:
                own = None  # moved or never recorded: nothing to compare against
            check_data_tokenizer(self, own, p)
            return p
        raw = self.config.data.dir
        if raw is None:
            raise DataError(f"{self.path}: config.json has no data.dir; pass --data DIR")
        # `sanlab train` stores an absolute path; a run dir written before holds the path
        # relative to where it was trained, most often a directory above the run dir
        above = [d / raw for d in self.path.absolute().parents]
        for p in (Path(raw), self.path / raw, *above):
            if p.is_dir():
                return p
        raise DataError(f"{self.path}: data dir {raw!r} not found; pass --data DIR")


def _tokenizer(data_dir: Path | None) -> Tokenizer | None:
    """The data dir's tokenizer, or None where there is none to compare."""
    if data_dir is None or not (data_dir / TOKENIZER_FILE).is_file():
        return None
    return load_tokenizer(data_dir)


def check_same_tokenizer(a: RunDir, a_data: Path | None, b: RunDir, b_data: Path | None) -> None:
    """Raise a one-line error when two runs do not share a tokenizer.

    Per-token losses of two runs are only comparable on the same token ids: the
    vocabulary sizes must agree, and so must what the tokenizers encode where both have
    one (vocabulary, merges, special ids; not the files' bytes: an export's or import's
    copy adds a post-processor and reorders keys).
    """
    va, vb = a.config.model.vocab_size, b.config.model.vocab_size
    if va != vb:
        raise DataError(f"tokenizers differ: {a.path} has vocab {va}, {b.path} has vocab {vb}")
    ta, tb = _tokenizer(a_data), _tokenizer(b_data)
    why = encoding_difference(ta, tb) if ta is not None and tb is not None else None
    if why:
        raise DataError(
            f"tokenizers differ ({why}): {a_data}/tokenizer.json (run {a.path}) vs "
            f"{b_data}/tokenizer.json (run {b.path}); per-token losses are not comparable"
        )


def check_data_tokenizer(run: RunDir, run_data: Path | None, data_dir: Path) -> None:
    """Raise a one-line error when `data_dir` (a `--data` given to analyze, eval, sample or
    export) encodes text differently from the data the run was trained on: its ids would
    mean other tokens to the model. Compared by what the tokenizers encode, as above."""
    own, other = _tokenizer(run_data), _tokenizer(data_dir)
    why = encoding_difference(own, other) if own is not None and other is not None else None
    if why:
        raise DataError(
            f"tokenizers differ ({why}): data {data_dir} vs {run_data} that run {run.path} was "
            f"trained on; pass --data {run_data}, or prepare this corpus with the run's tokenizer "
            f"(sanlab prepare … tokenizer={run_data})"
        )
