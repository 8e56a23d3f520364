"""The language model: embed (× √d) → blocks → final norm → tied head (SPEC §1.1)."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import ModelConfig
from sanlab.errors import ConfigError, SanlabError
from sanlab.model.blocks import Block
from sanlab.model.attention import AttentionContext, build_context
from sanlab.model.layers import HookPoint, make_norm
from sanlab.model.loss import head_loss, lm_loss  # noqa: F401 - lm_loss is part of this module's interface
from sanlab.model.mixers.base import Mixer, SequenceMixer
from sanlab.model.mixers.spec import Role


class LM(nn.Module):
    """Decoder-only LM. `state_mixer="none"` is the SAN; `"swiglu"` the standard arm; the
    sequence mixer of each layer follows `cfg.layer_mixers` (softmax attention or a variant)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = make_norm(cfg, cfg.d_model, feeds_matmul=True)
        self.final = HookPoint()
        self.embed_scale = math.sqrt(cfg.d_model)
        # each distinct per-forward hook of the mixers (`Mixer.prepare`), once, in layer order
        self._prepare = [f for f in dict.fromkeys(type(m).prepare for _, m in self._mixers()) if f is not Mixer.prepare]
        # the masks its layers attend under, built once per batch before the compiled layers
        self._masks = tuple(dict.fromkeys(mask for _, m in self._mixers() if isinstance(m, SequenceMixer)
                                          for mask in m.attention_masks()))
        self._compiled: Callable[..., Any] | None = None  # `compile_layers`
        self._on_compile_failure: Callable[[str], None] = print
        self.frozen: list[str] = []  # the train.freeze targets applied (see `freeze`)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """SPEC §1.1 init: N(0, s) for the embedding, then each block's own init (N(0, s)
        for input-side matrices, N(0, s / √(2L)) for those that write into the residual
        stream, W_o and W_down; gains at their identity, gates at 0). Buffers (fixed random
        state such as MixiT's matrices) are left alone."""
        s = self.cfg.init_std
        out_std = s / math.sqrt(2 * self.cfg.n_layers) if self.cfg.scale_out_init else s
        nn.init.normal_(self.embed.weight, 0.0, s)
        for block in self.blocks:
            block.reset_parameters(s, out_std)
        self.final_norm.reset_parameters()

    def param_roles(self) -> dict[str, Role]:
        """The role of every parameter by full name (read by the optimizer routing)."""
        roles: dict[str, Role] = {"embed.weight": "table", "final_norm.weight": "gain"}
        for i, block in enumerate(self.blocks):
            roles |= {f"blocks.{i}.{k}": r for k, r in block.param_roles().items()}
        for name, p in self.named_parameters():
            if not p.requires_grad:
                roles[name] = "frozen"
        return roles

    def _mixers(self) -> Iterator[tuple[str, Mixer]]:
        """(name prefix, module) of every sequence and state mixer, in layer order."""
        for i, block in enumerate(self.blocks):
            for sub in ("attn", "ffn"):
                mixer = getattr(block, sub)
                if mixer is not None:
                    yield f"blocks.{i}.{sub}", mixer

    def bind_data(self, heldout: Callable[[int], torch.Tensor], seq_len: int) -> None:
        """Before training on rows of `seq_len` tokens: each mixer takes what it needs from
        the data (`Mixer.bind_data`; FixedSeqQK its fixed sequence) or refuses the length."""
        for _, mixer in self._mixers():
            mixer.bind_data(heldout, seq_len)

    def freeze(self, targets: list[str]) -> list[str]:
        """Keep the weights of `targets` (`train.freeze`: "qk", "qk_proj", "mlp") at their
        initialisation: requires_grad off, so they get no gradient and no optimizer state.
        Returns the frozen parameter names. A target no layer has is a ConfigError."""
        names: list[str] = []
        for target in targets:
            found = []
            for prefix, mixer in self._mixers():
                found += [f"{prefix}.{n}" for n in mixer.frozen_names(target)]
            if not found:
                mixers = ", ".join(dict.fromkeys(self.cfg.layer_mixers))
                raise ConfigError(f"train.freeze: nothing to freeze for {target!r} in this model "
                                  f"(sequence mixers: {mixers}; state mixer: {self.cfg.state_mixer})")
            names += found
        names = list(dict.fromkeys(names))  # `qk` and `qk_proj` together name W_q, W_k twice
        params = dict(self.named_parameters())
        for n in names:
            params[n].requires_grad_(False)
        self.frozen = list(dict.fromkeys([*self.frozen, *targets]))
        return names

    def forward(
        self,
        tokens: torch.Tensor,
        segment_ids: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        z_loss: float = 1e-4,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tokens, segment_ids: (B, T) -> logits (B, T, V); with `targets` (B, T) the
        training loss instead: (loss to optimise, cross-entropy alone), as `lm_loss`,
        from the fused head + loss (`head_loss`) that never materialises the logits.

        Tokens with different segment ids never attend to each other and RoPE
        positions restart at every document start, so a packed row gives each
        document exactly the logits it would get alone.

        The attention context (with its masks) is built here, eagerly; the rest runs in
        `_layers`, compiled after `compile_layers`.
        """
        ctx = build_context(self.cfg, tokens, segment_ids, self._masks)
        if self._compiled is not None:
            try:
                return self._compiled(tokens, ctx, targets, loss_mask, z_loss)
            except (SanlabError, torch.OutOfMemoryError):
                raise  # the eager model would raise the same
            except Exception as e:  # noqa: BLE001 - any compiler failure: the eager model runs
                self.fall_back_to_eager(e)
                ctx = build_context(self.cfg, tokens, segment_ids, self._masks)
        return self._layers(tokens, ctx, targets, loss_mask, z_loss)

    def compile_layers(self, on_failure: Callable[[str], None] = print, **kwargs: Any) -> None:
        """`torch.compile` (with `kwargs`) what `forward` runs after the attention context:
        the embedding, the blocks, the head and the loss (`train.compile`). The context and
        its masks (FlexAttention's block masks) are built before it, once per batch, so the
        compiled graph takes them in and calls flex plainly (`dispatch.flex_call`). A
        compiled call that fails is run again eagerly and the model stays eager from then
        on, with one line to `on_failure`."""
        self._on_compile_failure = on_failure
        self._compiled = torch.compile(self._layers, **kwargs)

    def fall_back_to_eager(self, error: BaseException) -> None:
        """After the compiler's `error`: run eagerly from now on, saying so in one line."""
        self._compiled = None
        text = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {text[0] if text else ''}"[:200]  # a compiler's errors run long
        self._on_compile_failure(f"warning: torch.compile failed ({reason}); running without it")

    @property
    def compiled(self) -> bool:
        """Whether `forward` runs its layers compiled (`compile_layers`, and no failure since)."""
        return self._compiled is not None

    def _layers(self, tokens: torch.Tensor, ctx: AttentionContext, targets: torch.Tensor | None,
                loss_mask: torch.Tensor | None, z_loss: float) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(tokens) * self.embed_scale  # (B, T, d)
        ctx.embedded = x
        for prepare in self._prepare:
            prepare(self, ctx)
        for block in self.blocks:
            x = block(x, ctx)
        x = self.final(self.final_norm(x))
        if targets is not None:
            if loss_mask is None:
                loss_mask = torch.ones_like(targets, dtype=torch.bool)
            return head_loss(x, self.embed.weight, targets, loss_mask, z_loss)
        return F.linear(x, self.embed.weight)  # tied head, (B, T, V)


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy in fp32. (B, T, V), (B, T) -> (B, T)."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().reshape(B * T, V), targets.reshape(B * T), reduction="none").view(B, T)


