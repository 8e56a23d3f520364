"""What a mixer declares, without torch: its options, parameters, FLOPs and freeze targets.

A spec is a class whose class methods compute, from the model config and the mixer's
validated options, everything the rest of sanlab reads about a mixer without building
it: config validation (`Options`), accounting and matching (`params`, `flops`), the
optimizer routing (each parameter's role), the init (each parameter's init rule),
`train.freeze` (`freezable`), labels (`short`) and the generated docs tables
(`summary`, `paper`). The torch module (`sanlab.model.mixers.base`) builds its
parameters from `params`, so a parameter is declared once, here.

A spec subclasses another to reuse its declarations (every Q/K variant of softmax
attention starts from `SoftmaxSpec`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from sanlab.configbase import StrictModel, validate

if TYPE_CHECKING:
    from sanlab.config import ModelConfig  # (sanlab.config validates a model against these specs)

# What a parameter is, for the optimizer routing (sanlab.train.optim) and the spectra:
#   routing  a matrix that decides where information flows (W_q, W_k)
#   content  a matrix that carries the information (W_v, W_o, FFN matrices)
#   table    an embedding-like lookup table
#   gain     a norm gain;  gate  a residual scalar
#   frozen   kept at its initialisation (no gradient, no optimizer state)
Role = Literal["routing", "content", "table", "gain", "gate", "frozen"]
ROLES: tuple[Role, ...] = ("routing", "content", "table", "gain", "gate", "frozen")

# How `reset_parameters` sets a parameter (SPEC §1.1):
#   normal  N(0, init_std)
#   out     N(0, out_std): a matrix that writes into the residual stream (W_o, W_down),
#           init_std / √(2L) unless model.scale_out_init is off
#   norm    a norm's gain at its identity (0 for ZCN, 1 for plain RMS norm)
#   zeros, ones
Init = Literal["normal", "out", "norm", "zeros", "ones"]
INITS: tuple[Init, ...] = ("normal", "out", "norm", "zeros", "ones")


@dataclass(frozen=True)
class Param:
    """One parameter: its shape, its role and its init.

    The name it is declared under says what the module holds (`base.build_parameters`):
    `X.weight` with a 2-D shape (out, in) and a `normal` / `out` init is a bias-free
    `nn.Linear` `X`; `X.weight` with the `norm` init is a norm `X` of the model's kind
    (`make_norm`) over that one dimension; a name without a dot is a bare `nn.Parameter`.
    """

    shape: tuple[int, ...]
    role: Role
    init: Init

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class NoOptions(StrictModel):
    """A mixer without options: any `model.mixer_options` key is unknown."""


class MixerSpec:
    """The declarations every mixer makes (subclassed by `SequenceSpec` and `StateSpec`).

    - `name`: its registered name (`model.mixer`, `model.layout`, `model.state_mixer`);
    - `summary`, `paper`: one line on what it computes and where the science defines it
      (the mixer tables of docs/variants.md and docs/architecture.md are generated
      from these);
    - `Options`: its own typed options (`model.mixer_options`), a `StrictModel`;
    - `params(cfg, opts)`: its parameters by name (relative to the module), in the order
      the module creates and initialises them (the order of the draws);
    - `flops(cfg, opts, seq_len, causal_half)`: its forward FLOPs per token as named
      terms (a multiply-add counts 2; only matrix products, as SPEC §1.2 counts);
    - `freezable`: the `train.freeze` targets it has (`qk`, `qk_proj`, `mlp`) and their
      parameters (a name `params` does not give for a config, such as a QK-norm gain
      with QK-norm off, is skipped);
    - `probe_freeze`: {target: label} for each `freezable` target that is a probe-suite arm
      of its own: the standard architecture with that target kept at init, named
      `frozen_<target>` (`sanlab probe`'s presets; SPEC §2's Frozen-QK and Frozen-MLP).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    Options: ClassVar[type[StrictModel]] = NoOptions
    freezable: ClassVar[dict[str, tuple[str, ...]]] = {}
    probe_freeze: ClassVar[dict[str, str]] = {}

    @classmethod
    def params(cls, cfg: ModelConfig, opts: Any) -> dict[str, Param]:
        raise NotImplementedError(f"{cls.__name__} declares no params")

    @classmethod
    def flops(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        raise NotImplementedError(f"{cls.__name__} declares no flops")

    # ---- derived from the declarations above (not overridden)

    @classmethod
    def param_terms(cls, cfg: ModelConfig, opts: Any) -> dict[str, int]:
        """Parameter counts by name."""
        return {name: p.size for name, p in cls.params(cfg, opts).items()}

    @classmethod
    def roles(cls, cfg: ModelConfig, opts: Any) -> dict[str, Role]:
        return {name: p.role for name, p in cls.params(cfg, opts).items()}

    @classmethod
    def frozen_names(cls, cfg: ModelConfig, opts: Any, target: str) -> tuple[str, ...]:
        """The parameters `train.freeze=[target]` keeps at init: the declared ones this config has."""
        have = cls.params(cfg, opts)
        return tuple(n for n in cls.freezable.get(target, ()) if n in have)

    @classmethod
    def validate_options(cls, raw: dict[str, Any], source: str) -> Any:
        return validate(cls.Options, raw, source=source)


class SequenceSpec(MixerSpec):
    """A token mixer's spec. `short`: its name in labels and run ids (`hyb-nonapprox-…`);
    `has_pattern`: the module exposes its (B, H, T, T) mixing weights at the hook point
    `blocks.{i}.attn.pattern`; `probe_arm`: the label of a probe-suite arm that runs
    this mixer in the standard architecture (`sanlab probe`'s presets; "" for none)."""

    short: ClassVar[str] = ""
    has_pattern: ClassVar[bool] = False
    probe_arm: ClassVar[str] = ""


class StateSpec(MixerSpec):
    """A token-local mixer's (FFN's) spec; its width is `cfg.ffn_dim`."""


def attention_terms(cfg: ModelConfig, seq_len: int, causal_half: bool) -> int:
    """FLOPs per token of one pairwise product over the sequence (q·kᵀ or A·v), all heads:
    2·T·H·d_h for the full square, half that for the causal half (SPEC §1.2)."""
    square = 2 * seq_len * cfg.n_heads * cfg.head_dim
    return square // 2 if causal_half else square


def matrix_flops(params: dict[str, Param]) -> int:
    """Forward FLOPs per token of multiplying the input by every matrix in `params` (2 per weight)."""
    return 2 * sum(p.size for p in params.values() if len(p.shape) == 2)
