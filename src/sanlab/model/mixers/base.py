"""The torch side of a mixer: a module that builds and initialises its parameters from
its spec, and the two hooks a mixer may need beyond its forward pass.

- `Mixer.__init__` creates the parameters `spec.params(cfg, opts)` declares, in that
  order (`build_parameters`); `param_roles`, `reset_parameters` and `frozen_names` read
  the same declaration. A subclass adds buffers (fixed random state, never re-drawn
  by `reset_parameters`) and its forward pass.
- `prepare(model, ctx)`: before the blocks run on a batch, a mixer class may put into the
  attention context what its layers need from the whole model (the stream-QK variants
  run the blocks once on their fixed sequence). `LM.forward` calls each distinct hook
  of its layers once per forward pass.
- `decode_cache`: the class that decodes this mixer one token at a time
  (`sanlab.model.generate`), a `DecodeCache`. A subclass inherits its parent's; one whose
  forward pass computes something the parent's cache does not (other Q/K, its own
  scores) sets its own or `None` (a mask is not such a thing: the softmax KV cache
  applies the mixer's `attention_mask`), and a mixer without one decodes by a full forward pass
  over the context at every step (the same tokens, slower; `Decoder.note` says so).
  tests/test_generate.py holds every registered mixer's cached decoding against its
  full forward pass, so an inherited cache that does not fit fails there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from sanlab.config import ModelConfig
from sanlab.model.attention import AttentionContext, Mask
from sanlab.model.layers import HookPoint, make_norm
from sanlab.model.mixers import implement
from sanlab.model.mixers.spec import MixerSpec, Param, Role, SequenceSpec, StateSpec


def build_parameters(module: nn.Module, cfg: ModelConfig, params: dict[str, Param]) -> None:
    """Create on `module` what `params` declares (see `Param`), in order."""
    for name, p in params.items():
        owner, dot, leaf = name.partition(".")
        if not dot:
            setattr(module, name, nn.Parameter(torch.empty(p.shape)))
        elif leaf == "weight" and p.init in ("normal", "out") and len(p.shape) == 2:
            setattr(module, owner, nn.Linear(p.shape[1], p.shape[0], bias=False))
        elif leaf == "weight" and p.init == "norm" and len(p.shape) == 1:
            setattr(module, owner, make_norm(cfg, p.shape[0]))
        else:
            raise TypeError(f"{type(module).__name__}: cannot build parameter {name} {p} (a `X.weight` "
                            "matrix with a normal/out init, a `X.weight` norm gain, or a bare name)")


@torch.no_grad()
def reset_parameter(module: nn.Module, name: str, p: Param, std: float, out_std: float) -> None:
    if p.init == "norm":
        module.get_submodule(name.rpartition(".")[0]).reset_parameters()
        return
    t = module.get_parameter(name)
    if p.init == "normal":
        nn.init.normal_(t, 0.0, std)
    elif p.init == "out":
        nn.init.normal_(t, 0.0, out_std)
    elif p.init == "zeros":
        t.zero_()
    else:
        t.fill_(1.0)


class Mixer(nn.Module):
    """A module built from its spec (`spec`, a class attribute; a subclass without its own
    implements its parent's)."""

    spec: ClassVar[type[MixerSpec]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "spec" in cls.__dict__:
            implement(cls.spec, cls)

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.opts = opts
        self.declared = type(self).spec.params(cfg, opts)
        build_parameters(self, cfg, self.declared)

    def param_roles(self) -> dict[str, Role]:
        """The role of each parameter (`ROLES`), which the optimizer routing reads."""
        return {name: p.role for name, p in self.declared.items()}

    def reset_parameters(self, std: float, out_std: float) -> None:
        """Each parameter by its declared init, in declaration order (`out_std` for those
        that write into the residual stream, SPEC §1.1). Buffers are left alone."""
        for name, p in self.declared.items():
            reset_parameter(self, name, p, std, out_std)

    def frozen_names(self, target: str) -> tuple[str, ...]:
        """The parameters `train.freeze=[target]` keeps at init: the declared ones this module has."""
        return tuple(n for n in type(self).spec.freezable.get(target, ()) if n in self.declared)

    def bind_data(self, heldout: Callable[[int], torch.Tensor], seq_len: int) -> None:
        """Before training on rows of `seq_len` tokens: take what the mixer needs from the
        data (`heldout(n)`: the first n tokens of the held-out split, fewer if it has fewer;
        `sanlab.data.shards.heldout_tokens`), and refuse a row length it cannot serve.
        Most mixers take none."""

    @staticmethod
    def prepare(model: nn.Module, ctx: AttentionContext) -> None:
        """Before the blocks of `model` run on a batch: put what this class's layers need
        into `ctx` (nothing, unless a mixer says otherwise)."""


@dataclass
class DecodeStep:
    """What a decode cache needs for one call: the positions of the new tokens (T,) in
    the context (one document, positions 0, 1, 2, …) and the RoPE base."""

    positions: torch.Tensor
    rope_theta: float


class DecodeCache(nn.Module):
    """A sequence mixer's state for decoding (`SequenceMixer.decode_cache`): made for one
    mixer, a batch and the longest context (`max_len`); `forward(u, step)` maps the new
    tokens' normalised inputs (B, T, d) to the mixer's output for them, attending to
    every position seen so far. It reads the mixer's own weights."""

    def __init__(self, mixer: SequenceMixer, batch: int, max_len: int) -> None:
        super().__init__()
        self.mixer = mixer

    @staticmethod
    def unsupported(mixer: SequenceMixer) -> str | None:
        """Why this cache cannot decode `mixer`'s configuration (None: it can)."""
        return None

    def forward(self, u: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        raise NotImplementedError


class SequenceMixer(Mixer):
    """A token mixer: maps the normalised residual stream u (B, T, d) to an update
    (B, T, d) using the `AttentionContext`. With `spec.has_pattern` it holds
    `self.pattern`, a HookPoint that sees its (B, H, T, T) mixing weights when someone
    captures them."""

    spec: ClassVar[type[SequenceSpec]]
    decode_cache: ClassVar[type[DecodeCache] | None] = None

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        if type(self).spec.has_pattern:
            self.pattern = HookPoint()

    def attention_masks(self) -> tuple[Mask, ...]:
        """The masks this mixer attends under (`attend(mask=)`, `masks.Mask`), so the model
        builds their forms once per batch before its compiled layers
        (`AttentionContext.build_masks`); () for a mixer that never calls `attend`."""
        return ()


class StateMixer(Mixer):
    """A token-local mixer (FFN) of width `cfg.ffn_dim`: maps x (B, T, d) to (B, T, d)."""

    spec: ClassVar[type[StateSpec]]
