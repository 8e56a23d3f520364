"""The study spec: one TOML file that describes a whole controlled study (SPEC §1.2–1.4).

A study spec is a run config (`model`, `optim`, `train`, `data`) for the *reference*
arm, plus what the study does around it: which matched arms to build, how to sweep
their learning rates, how long to train them and with which seeds, the noise-floor
control and where to run. Keeping the run sections identical to `sanlab.config.Config`
means a user promotes a single run to a study by adding sections, and every value is
validated by the same code as a run config (unknown key or wrong type → one line
naming the key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Sequence, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, PrivateAttr, StrictInt, Tag, TypeAdapter, field_validator,
                      model_validator)

from sanlab.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    StrictModel,
    Tokens,
    TrainConfig,
    apply_overrides,
    load_toml,
)
from sanlab.errors import ConfigError

Optimizer = Literal["muon", "adamw"]
Matching = Literal["iso_param", "iso_flop", "iso_depth"]
ArmKind = Literal["san", "ffn"]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")


# --------------------------------------------------------------------------- sections


AXIS_FIXED = ("seq_len", "vocab_size")  # the models are built for these: never an axis

_SLUG_BAD = re.compile(r"[^a-z0-9._]+")


@dataclass(frozen=True)
class DataPoint:
    """One corpus the study trains on: the one corpus of a study without a data axis
    (`key` None, `slug` ""), else one value of `data.axis` (`axis`, its typed view)."""

    key: str | None
    value: Any
    slug: str  # the run-id prefix and the data dir's name: "facts400"; "" without an axis
    dir: str  # the prepared dir
    axis: "DataAxis | None" = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        """`synth.facts=400`; "" without an axis."""
        return "" if self.key is None else f"{self.key}={self.value}"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "slug": self.slug, "label": self.label, "dir": self.dir}


class _Axis(BaseModel):
    """`data.axis` typed: its key, its values, and what each value is (`DataAxis`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    key: str
    values: list[Any]
    names_data: ClassVar[bool] = False  # the values name the data itself (data.dir / data.corpus may be unset)
    prepares: ClassVar[bool] = True  # the study prepares each value's dir

    def _name(self, value: Any) -> str:
        return f"{self.key.rsplit('.', 1)[-1]}{value:g}" if isinstance(value, float) else f"{self.key.rsplit('.', 1)[-1]}{value}"

    def slug(self, value: Any) -> str:
        """A value's name in run ids and dirs: the key's last part and the value (`facts400`);
        a corpus by its name (`kjv`), a listed dir by its base name."""
        return _SLUG_BAD.sub("_", self._name(value).lower()).strip("_.") or "value"

    def dir(self, value: Any, base: str) -> str:
        """The value's prepared dir, `base/SLUG` (`base`: data.dir, else the study's data/)."""
        return str(Path(base) / self.slug(value))

    def prepare_settings(self, value: Any, corpus: str | None) -> tuple[str | None, list[str]]:
        """(corpus, extra `sanlab prepare` settings) that prepare `value`'s dir."""
        return corpus, [f"{self.key}={value}"]

    def check_corpus(self, corpus: str | None) -> None:
        if corpus is None:
            raise ValueError(f"data.axis.{self.key} is a prepare setting: set data.corpus")

    def points(self, base: str) -> list[DataPoint]:
        """One data point per value, in order. Raises `ConfigError` when two values share a slug."""
        points = [DataPoint(self.key, v, self.slug(v), self.dir(v, base), self) for v in self.values]
        slugs = [p.slug for p in points]
        if len(set(slugs)) != len(slugs):
            dup = next(s for s in slugs if slugs.count(s) > 1)
            raise ConfigError(f"data.axis.{self.key}: two values are both named {dup!r} in run ids; use distinct values")
        return points


class PrepareAxis(_Axis):
    """`{"synth.facts" = [400, 1600]}`: one `sanlab prepare` setting, a dir prepared per value."""


class CorporaAxis(_Axis):
    """`{corpus = ["synth", "kjv"]}`: several corpora, a dir prepared per corpus."""

    key: Literal["corpus"] = "corpus"
    names_data: ClassVar[bool] = True

    def _name(self, value: Any) -> str:
        return str(value)

    def prepare_settings(self, value: Any, corpus: str | None) -> tuple[str | None, list[str]]:
        return str(value), []

    def check_corpus(self, corpus: str | None) -> None:
        if corpus is not None:
            raise ValueError("data.axis.corpus lists the corpora: unset data.corpus")


class DirsAxis(_Axis):
    """`{dir = ["data/a", "data/b"]}`: prepared dirs, each used as it is."""

    key: Literal["dir"] = "dir"
    names_data: ClassVar[bool] = True
    prepares: ClassVar[bool] = False

    def _name(self, value: Any) -> str:
        return Path(str(value)).name or str(value)

    def dir(self, value: Any, base: str) -> str:
        return str(value)

    def check_corpus(self, corpus: str | None) -> None:
        if corpus is not None:
            raise ValueError("data.axis.dir lists prepared dirs: unset data.corpus")


def _axis_kind(v: Any) -> str:
    key = v.get("key") if isinstance(v, dict) else getattr(v, "key", None)
    return {"dir": "dirs", "corpus": "corpora"}.get(key, "prepare")  # type: ignore[arg-type]


DataAxis = Annotated[Union[Annotated[DirsAxis, Tag("dirs")], Annotated[CorporaAxis, Tag("corpora")],
                           Annotated[PrepareAxis, Tag("prepare")]], Discriminator(_axis_kind)]
_DATA_AXIS: TypeAdapter[Any] = TypeAdapter(DataAxis)


class StudyData(DataConfig):
    """The prepared data dir, or how to prepare it; optionally a data axis.

    With `corpus` set the study runs `sanlab prepare` into `dir` (default: `data/` inside
    the study dir) unless that dir already holds a prepared corpus; without it `dir`
    must already exist.

    `axis` sweeps one data knob: every arm, sweep, seed and noise pair is run at each of
    its values, and the tables read Δ against it. `{"synth.facts" = [400, 1600]}` (any
    `sanlab prepare` key, as in `data.prepare`) prepares one dir per value,
    `DIR/facts400/`, `DIR/facts1600/` (DIR: `data.dir`, else the study's `data/`),
    each once: a value whose dir already holds a prepared corpus is reused;
    `{corpus = ["synth", "kjv"]}` prepares several corpora the same way; `{dir =
    ["data/a", "data/b"]}` lists prepared dirs (no `corpus`).
    """

    corpus: str | None = None
    """Prepare this corpus (synth, text, hf, kjv) into dir; unset: dir must already hold a prepared corpus."""
    tokens: Tokens | None = None  # corpus size to prepare
    prepare: list[str] = []  # extra `key=value` settings passed to `sanlab prepare`
    axis: dict[str, list[Any]] = {}
    """One data knob and its values, e.g. {"synth.facts" = [400, 1600, 6400]}; {} (default): one corpus."""

    @model_validator(mode="before")
    @classmethod
    def _flat_axis(cls, data: Any) -> Any:
        """`[data.axis] synth.facts = [...]` (a nested table) reads as {"synth.facts": [...]}."""
        if isinstance(data, dict) and isinstance(data.get("axis"), dict):
            flat: dict[str, Any] = {}

            def walk(prefix: str, d: dict[str, Any]) -> None:
                for k, v in d.items():
                    name = f"{prefix}.{k}" if prefix else str(k)
                    if isinstance(v, dict):
                        walk(name, v)
                    else:
                        flat[name] = v

            walk("", data["axis"])
            data = {**data, "axis": flat}
        return data

    @property
    def axis_key(self) -> str | None:
        return next(iter(self.axis), None)

    @property
    def axis_values(self) -> list[Any]:
        return list(self.axis.values())[0] if self.axis else []

    _typed_axis: Any = PrivateAttr(None)

    @property
    def typed_axis(self) -> "DirsAxis | CorporaAxis | PrepareAxis | None":
        """`axis` typed (built by the validator): None without an axis."""
        return self._typed_axis

    @model_validator(mode="after")
    def _check_source(self) -> "StudyData":
        key = self.axis_key
        ax = self._typed_axis = None if key is None else _DATA_AXIS.validate_python(
            {"key": key, "values": self.axis_values})
        if self.dir is None and self.corpus is None and not (ax is not None and ax.names_data):
            raise ValueError("set data.dir (a prepared dir) or data.corpus (to prepare one)")
        if (self.corpus is not None or isinstance(ax, CorporaAxis)) and (self.tokens is None or self.tokens <= 0):
            raise ValueError("data.corpus needs data.tokens (how many tokens to prepare)")
        for item in self.prepare:
            if "=" not in item:
                raise ValueError(f"data.prepare entry {item!r} is not key=value")
            key_ = item.split("=", 1)[0].strip()
            if key_ in ("corpus", "tokens", "seq_len", "vocab_size"):
                raise ValueError(f"data.prepare: {key_} is set by data.corpus / data.tokens / "
                                 "data.seq_len / model.vocab_size")
            if key is not None and key_ == key:
                raise ValueError(f"data.prepare sets {key}, which data.axis sweeps")
        if len(self.axis) > 1:
            raise ValueError(f"data.axis sweeps one key, got {len(self.axis)} ({', '.join(self.axis)})")
        if key is not None:
            values = self.axis_values
            if key in AXIS_FIXED:
                raise ValueError(f"data.axis: {key} is fixed by the models (data.seq_len / model.vocab_size)")
            if len(values) < 2:
                raise ValueError(f"data.axis.{key}: give at least 2 values")
            if len({repr(v) for v in values}) != len(values):
                raise ValueError(f"data.axis.{key} lists a value twice")
            if any(isinstance(v, (dict, list)) for v in values):
                raise ValueError(f"data.axis.{key}: values must be strings or numbers")
            ax.check_corpus(self.corpus)
        return self


class MatchingSpec(StrictModel):
    """Which standard arms to match to the reference (SPEC §1.2) and how.

    The solver (`sanlab.matching.match`, the same as `sanlab match`) searches the
    partner's depth (or width) under `policy`: `at_most` is the paper's Table 1.
    `tolerance` is the largest |relative mismatch| accepted for iso-param
    (non-embedding parameters) and iso-FLOP (training FLOPs per token); beyond it the
    study refuses to start rather than compare unmatched arms. `partner` holds model
    keys in which the partners differ from the reference besides `ffn`.
    """

    arms: list[Matching] = ["iso_param", "iso_flop", "iso_depth"]
    """The matched standard partners to build."""
    policy: Literal["at_most", "nearest", "at_least"] = "at_most"
    """Which candidate to take: at_most (not above the reference, the paper's Table 1), nearest, at_least."""
    tolerance: float | None = 0.25
    """Largest accepted |relative mismatch| for iso_param / iso_flop; none: no limit."""
    vary: Literal["depth", "width"] = "depth"
    """Search the partner's depth (at the reference width) or its width (at the reference depth)."""
    causal_half: bool = False  # count attention FLOPs over the causal half, not the full square
    partner: dict[str, Any] = {}
    """Model keys in which every partner differs from the reference besides ffn, e.g. {d_ff = 1024}."""

    @model_validator(mode="after")
    def _check(self) -> "MatchingSpec":
        if len(set(self.arms)) != len(self.arms):
            raise ValueError("matching.arms lists a matching twice")
        if self.tolerance is not None and not 0 <= self.tolerance:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")
        return self


class ArmSpec(StrictModel):
    """An explicit arm: the reference run with `model` and `train` keys replaced.

    An arm may be any model the config can describe (a variant mixer, a layout, no FFN)
    and any training switch the study does not set per run (`train.freeze`). `base_lr`
    gives this arm its own base LR per optimizer, the centre of its own sweep; an
    optimizer it does not name uses `sweep.base_lr` by the arm's kind (with or without
    a state mixer).
    """

    name: str
    """The arm's name in run ids and tables (lower-case letters, digits, _)."""
    model: dict[str, Any] = {}
    """Model keys that replace the reference's, e.g. {mixer = "...", ffn = true}."""
    train: dict[str, Any] = {}
    """Train keys that replace the reference's (not tokens, steps or seed, which the study sets)."""
    base_lr: dict[Optimizer, float] = {}
    """This arm's own base LR per optimizer, e.g. {muon = 0.03}; others come from sweep.base_lr."""

    @model_validator(mode="after")
    def _check(self) -> "ArmSpec":
        if not _NAME_RE.match(self.name):
            raise ValueError(f"arm name {self.name!r}: use lower-case letters, digits and _")
        for key in ("tokens", "steps", "seed"):
            if key in self.train:
                raise ValueError(f"arms.{self.name}.train.{key} is set per run by the study")
        for opt, lr in self.base_lr.items():
            if not lr > 0:
                raise ValueError(f"arms.{self.name}.base_lr.{opt} must be positive, got {lr}")
        return self


class BaseLR(StrictModel):
    """Base learning rate per arm kind × optimizer (SPEC §1.3, single-device values)."""

    san_muon: float = 0.02
    """Attention-only arms under Muon."""
    ffn_muon: float = 0.04
    """Arms with an FFN under Muon."""
    san_adamw: float = 6e-4
    """Attention-only arms under AdamW."""
    ffn_adamw: float = 2.4e-3
    """Arms with an FFN under AdamW."""

    def get(self, kind: ArmKind, optimizer: Optimizer) -> float:
        return float(getattr(self, f"{kind}_{optimizer}"))

    @model_validator(mode="after")
    def _check(self) -> "BaseLR":
        for key, value in self.model_dump().items():
            if value <= 0:
                raise ValueError(f"{key} must be positive, got {value}")
        return self


class SweepSpec(StrictModel):
    """The per-arm × optimizer LR sweep with boundary extension (SPEC §1.4)."""

    enabled: bool = True  # false: every arm trains at its base LR
    tokens: Tokens = 5_000_000_000
    """Training budget of every sweep run."""
    multipliers: list[float] = [0.5, 1.0, 2.0]
    """Multiples of the arm's base LR to try first."""
    extend: bool = True  # add ×2 / ×½ points while the best sits at an edge
    max_extensions: int = 4  # per arm × optimizer, both directions together
    seed: int | None = None  # None: the first of `seeds`
    lock_at: Any = None
    """With a data axis: sweep only at this axis value and reuse its locked LRs at every value; none: each value sweeps."""
    base_lr: BaseLR = BaseLR()
    """The LR the multipliers scale, per arm kind × optimizer."""

    @model_validator(mode="after")
    def _check(self) -> "SweepSpec":
        if self.tokens <= 0:
            raise ValueError("sweep.tokens must be positive")
        if not self.multipliers or any(m <= 0 for m in self.multipliers):
            raise ValueError("sweep.multipliers must be a non-empty list of positive numbers")
        if len(set(self.multipliers)) != len(self.multipliers):
            raise ValueError("sweep.multipliers lists a value twice")
        if self.max_extensions < 0:
            raise ValueError("sweep.max_extensions must be >= 0")
        return self


class FinalSpec(StrictModel):
    """The long runs at the locked LRs: every budget × seed (SPEC §1.6's 5B/30B/105B axis)."""

    tokens: list[Tokens] = [105_000_000_000]
    """Budgets of the final runs; each arm × optimizer × seed trains at every budget."""

    @model_validator(mode="after")
    def _check(self) -> "FinalSpec":
        if not self.tokens or any(t <= 0 for t in self.tokens):
            raise ValueError("final.tokens must be a non-empty list of positive budgets")
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("final.tokens lists a budget twice")
        return self


class NoiseSpec(StrictModel):
    """The noise-floor control pair (SPEC §1.4): the reference arm with norm=zcrms and
    norm=rms, which the optimizer cannot tell apart (weight decay on matrices only).
    Their gap is the floor every reported gap is read against."""

    enabled: bool = True
    """Train the noise-floor pair."""
    optimizer: Optimizer | None = None  # None: the first of `optimizers`
    tokens: Tokens | None = None  # None: the largest final budget
    seeds: list[int] | None = None  # None: the study's seeds


class SlurmSpec(StrictModel):
    """SLURM parameters handed to submitit (`slurm_*` in submitit's names)."""

    partition: str | None = None
    """SLURM partition (slurm_partition)."""
    account: str | None = None
    """SLURM account to charge."""
    qos: str | None = None
    """SLURM quality of service."""
    constraint: str | None = None
    """SLURM node constraint, e.g. a GPU type."""
    time_min: int = 24 * 60
    """Wall-clock limit of one job, in minutes."""
    cpus_per_task: int = 8
    """CPU cores per task."""
    mem_gb: int | None = None
    """Memory per node in GB; none: the partition's default."""
    nodes: int = 1  # >1: a run spans nodes (torchrun rendezvous on the first node)
    array_parallelism: int = 64
    """Most jobs of the study's array running at once."""
    # Run with submitit's local executor instead of sbatch: the same code path on one machine.
    local: bool = False


class RunnerSpec(StrictModel):
    """Where runs execute. `local`: `workers` processes on this machine, one run per
    process, CPU threads split between them. `slurm`: one submitit job per run."""

    kind: Literal["local", "slurm"] = "local"
    """local: processes on this machine; slurm: one submitit job per run."""
    workers: int = 1
    """Runs in parallel on this machine (local runner)."""
    threads: int | None = None  # torch threads per run; None: cores // workers
    gpus_per_run: int = 0  # >1: the run starts through torchrun
    members: StrictInt | Literal["auto"] = "auto"
    """Runs trained together as the members of one batched model (local runner; an arm's
    sweep points and seeds): the most a group holds; 1 trains every run solo; "auto"
    groups where it pays (sanlab/study/groups.py)."""
    # Throughput of the reference arm on one worker, for the time estimate in `study plan`
    # where the arms are not timed (SLURM, `--no-timing`, steps too large to time here);
    # other arms are scaled by their FLOPs per token. A local plan times every arm's
    # step on this machine instead (sanlab/study/speed.py).
    tokens_per_s: float = 9000.0
    slurm: SlurmSpec = SlurmSpec()
    """SLURM settings (runner.kind = "slurm")."""

    @field_validator("members", mode="before")
    @classmethod
    def _members(cls, v: Any) -> Any:
        if v != "auto" and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"runner.members must be \"auto\" or an integer >= 1, got {v!r}")
        return v

    @model_validator(mode="after")
    def _check(self) -> "RunnerSpec":
        if self.workers <= 0:
            raise ValueError(f"runner.workers must be positive, got {self.workers}")
        if self.threads is not None and self.threads <= 0:
            raise ValueError(f"runner.threads must be positive, got {self.threads}")
        if self.gpus_per_run < 0:
            raise ValueError("runner.gpus_per_run must be >= 0")
        if self.members != "auto" and self.members < 1:
            raise ValueError(f"runner.members must be \"auto\" or an integer >= 1, got {self.members!r}")
        if self.tokens_per_s <= 0:
            raise ValueError("runner.tokens_per_s must be positive")
        return self


class StudySpec(StrictModel):
    """A whole study. `model` is the reference arm (normally the SAN, `ffn = false`); every
    gap is read as Δ = arm − reference. Matched partners are built from the reference by
    the solver (by default the other kind: FFN partners for an attention-only reference,
    attention-only partners for one with an FFN; `matching.partner` changes any other key,
    e.g. a softmax partner for a variant reference)."""

    name: str = "study"
    """Study name (lower-case letters, digits, - and _)."""
    optimizers: list[Optimizer] = ["muon"]
    """Optimizers each arm is studied under; every arm × optimizer gets its own sweep."""
    seeds: list[int] = [42]
    """Seeds of the final runs, shared by all arms so gaps pair."""
    model: ModelConfig = ModelConfig()
    """The reference arm (normally the SAN, ffn = false)."""
    data: StudyData
    """The corpus every run trains and evaluates on."""
    optim: OptimConfig = OptimConfig()
    """Optimizer settings shared by all runs (name and lr are set per run)."""
    train: TrainConfig = TrainConfig()
    """Training settings shared by all runs (tokens, steps and seed are set per run)."""
    matching: MatchingSpec = MatchingSpec()
    """The matched standard arms."""
    arms: list[ArmSpec] = []
    """Explicit extra arms ([[arms]] tables)."""
    sweep: SweepSpec = SweepSpec()
    """The per-arm LR sweep."""
    final: FinalSpec = FinalSpec()
    """The long runs at the locked LRs."""
    noise: NoiseSpec = NoiseSpec()
    """The noise-floor control pair."""
    runner: RunnerSpec = RunnerSpec()
    """Where the runs execute."""

    @model_validator(mode="after")
    def _check(self) -> "StudySpec":
        if not _NAME_RE.match(self.name.replace("-", "_")):
            raise ValueError(f"name {self.name!r}: use lower-case letters, digits, - and _")
        if not self.optimizers or len(set(self.optimizers)) != len(self.optimizers):
            raise ValueError("optimizers must list muon and/or adamw, each once")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be a non-empty list of distinct integers")
        # The study sets these per run; a value here would be silently ignored.
        for key in ("tokens", "steps", "seed"):
            if key in self.train.model_fields_set:
                raise ValueError(f"train.{key} is set per run by the study (sweep/final/seeds)")
        for key in ("name", "lr"):
            if key in self.optim.model_fields_set:
                raise ValueError(f"optim.{key} is set per run by the study (optimizers/sweep)")
        if self.noise.optimizer is not None and self.noise.optimizer not in self.optimizers:
            raise ValueError(f"noise.optimizer={self.noise.optimizer} is not one of optimizers")
        lock_at = self.sweep.lock_at
        if lock_at is not None:
            if not self.data.axis:
                raise ValueError("sweep.lock_at needs a data axis (data.axis)")
            if not self.sweep.enabled:
                raise ValueError("sweep.lock_at says where to sweep, but sweep.enabled = false: "
                                 "unset one of them")
            if repr(lock_at) not in {repr(v) for v in self.data.axis_values}:
                raise ValueError(f"sweep.lock_at={lock_at!r} is not one of data.axis.{self.data.axis_key}'s values")
        if not self.matching.arms and not self.arms:
            raise ValueError("nothing to compare: set matching.arms or list [[arms]]")
        names = [a.name for a in self.arms]
        reserved = {reference_name(self), *self.matching.arms, f"{reference_name(self)}_rms"}
        if len(set(names)) != len(names) or reserved & set(names):
            raise ValueError("arms: names must be distinct and differ from the reference and matched arms")
        return self

    @property
    def sweep_seed(self) -> int:
        return self.sweep.seed if self.sweep.seed is not None else self.seeds[0]

    @property
    def noise_optimizer(self) -> Optimizer:
        return self.noise.optimizer or self.optimizers[0]

    @property
    def noise_tokens(self) -> int:
        return self.noise.tokens or max(self.final.tokens)

    @property
    def noise_seeds(self) -> list[int]:
        return self.noise.seeds if self.noise.seeds is not None else list(self.seeds)


def reference_name(spec: StudySpec) -> str:
    """The reference arm's name: `san` for an attention-only reference, else `ref`."""
    return "ref" if spec.model.ffn else "san"


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> StudySpec:
    """Load and validate a study spec; `overrides` are `section.key=value` strings."""
    return apply_overrides(StudySpec, load_toml(path), overrides, source=str(path))
