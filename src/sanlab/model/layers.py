"""Building blocks: ZCN / RMS norm, RoPE tables, SwiGLU, hook points, the attention context.

The hand-written kernels these call live in `sanlab.model.kernels`, each beside its
reference formula. Everything here is single-device and has no knowledge of the config
file format beyond `ModelConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import ModelConfig
from sanlab.errors import ConfigError
from sanlab.model import native
from sanlab.model.kernels import (  # noqa: F401 - attend, explicit_keep and upcast are part of this module's interface
    attend,
    explicit_keep,
    fused_products,
    rms_norm,
    rope,
    unfused_cpu_backend,
    upcast,
)


class HookPoint(nn.Module):
    """Identity module marking a tensor that analysis may capture.

    Its module path is its stable name (`blocks.3.attn.pattern`). Forward hooks
    registered on it see the tensor; with no hooks it costs a function call.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        return bool(self._forward_hooks)


class RMSNorm(nn.Module):
    """RMS norm computed in fp32.

    zero_centered=True is the paper's ZCN: (1 + γ) ⊙ z / RMS(z) with γ initialised
    to 0, so the parameter's origin is the identity scale (SPEC §1.1).
    zero_centered=False is plain RMS norm with γ initialised to 1; with the gains
    undecayed the two differ by a constant shift (the noise-floor pair of SPEC §1.4).
    """

    def __init__(self, dim: int, eps: float = 1e-6, zero_centered: bool = True, feeds_matmul: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        # A norm whose only reader is a matmul writes its result in the autocast dtype
        # directly (the matmul would cast it anyway): one pass over the activations less
        # each way. Computed in fp32 all the same.
        self.feeds_matmul = feeds_matmul
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """γ = 0 for ZCN (the identity scale), 1 for plain RMS norm."""
        self.weight.fill_(0.0 if self.zero_centered else 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev = x.device.type
        cast = self.feeds_matmul and torch.is_autocast_enabled(dev)
        return self.normalize(upcast(x), torch.get_autocast_dtype(dev) if cast else x.dtype)

    def gain(self, dtype: torch.dtype) -> torch.Tensor:
        """The scale the norm multiplies by, in `dtype`: 1 + γ for ZCN, γ otherwise."""
        gain = self.weight.to(dtype)
        return 1.0 + gain if self.zero_centered else gain

    def normalize(self, x32: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The norm on an already-upcast tensor, result in `out_dtype` (default x32's)."""
        return rms_norm(x32, self.gain(x32.dtype), self.eps, out_dtype or x32.dtype)


def make_norm(cfg: ModelConfig, dim: int, feeds_matmul: bool = False) -> RMSNorm:
    return RMSNorm(dim, cfg.norm_eps, zero_centered=cfg.norm == "zcrms", feeds_matmul=feeds_matmul)


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for rotate-half RoPE at integer `positions` (B, T) -> (B, T, 1, D)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    angles = positions.float()[..., None] * inv_freq  # (B, T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (B, T, D)
    return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE, x·cos + rotate_half(x)·sin. x: (B, T, H, D); cos/sin: (B, T, 1, D)
    from `rope_tables` (both halves equal). Computed in fp32, returned in x's dtype."""
    half = x.shape[-1] // 2
    return rope(upcast(x), cos[..., :half], sin[..., :half]).to(x.dtype)


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Position of each token inside its segment (document): restarts at 0. (B, T) -> (B, T)."""
    B, T = segment_ids.shape
    idx = torch.arange(T, device=segment_ids.device).expand(B, T)
    is_start = torch.ones_like(segment_ids, dtype=torch.bool)
    is_start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_idx = torch.where(is_start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - start_idx


@dataclass
class AttentionContext:
    """Per-batch data every attention layer shares: RoPE tables and the document mask.

    Built once per forward pass in `LM.forward`, not once per layer; masks are built
    on first use and cached.
    """

    segment_ids: torch.Tensor  # (B, T)
    positions: torch.Tensor  # (B, T) position within the document
    cos: torch.Tensor  # (B, T, 1, head_dim)
    sin: torch.Tensor  # (B, T, 1, head_dim)
    backend: str  # "explicit" | "sdpa" | "flex"
    single_document: bool = False  # every row is one document (no segment ids given)
    embedded: torch.Tensor | None = None  # (B, T, d) the scaled input embedding (static_emb_qk)
    # Q/K source stream of rnd_emb_qk / fixed_seq_qk: per layer its input on the fixed
    # sequence, (1, T, d); None while that fixed pass runs, which fills `qk_record`.
    qk_stream: dict[int, torch.Tensor] | None = None
    qk_record: dict[int, torch.Tensor] = field(default_factory=dict)
    _static_qk: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    _dense_mask: torch.Tensor | None = None
    _block_mask: object | None = None
    _additive: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    _row_starts: torch.Tensor | None = None
    _row_starts_known: bool = False

    def static_qk_input(self, dtype: torch.dtype) -> torch.Tensor:
        """The input embedding RMS-normalised (no gain), in `dtype`: StaticEmbQK's Q/K input."""
        if dtype not in self._static_qk:
            x = upcast(self.embedded)
            self._static_qk[dtype] = (x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()).to(dtype)
        return self._static_qk[dtype]

    @property
    def dense_mask(self) -> torch.Tensor:
        """(B, 1, T, T) bool: causal AND same document. True = may attend."""
        if self._dense_mask is None:
            seg = self.segment_ids
            T = seg.shape[1]
            causal = torch.ones(T, T, dtype=torch.bool, device=seg.device).tril()
            same = seg[:, :, None] == seg[:, None, :]
            self._dense_mask = (same & causal)[:, None]
        return self._dense_mask

    @property
    def row_starts(self) -> torch.Tensor | None:
        """(B, T) int32: the first key each query may see, i.e. where its document starts
        (the fused kernel's mask: row i sees keys [row_starts[i], i]). That describes the
        dense mask exactly when every segment id is one run in its row, as packed rows
        are (ids rise along the row); None otherwise (an id that recurs after another)."""
        if not self._row_starts_known:
            seg = self.segment_ids
            if self.single_document or bool((seg[:, 1:] >= seg[:, :-1]).all()):
                T = seg.shape[1]
                idx = torch.arange(T, device=seg.device)
                self._row_starts = (idx - self.positions).to(torch.int32).contiguous()
            self._row_starts_known = True
        return self._row_starts

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(B, 1, T, T): 0 where attention is allowed, -inf elsewhere."""
        if dtype not in self._additive:
            bias = torch.zeros(self.dense_mask.shape, dtype=dtype, device=self.segment_ids.device)
            self._additive[dtype] = bias.masked_fill_(~self.dense_mask, float("-inf"))
        return self._additive[dtype]

    @property
    def block_mask(self) -> object:
        if self._block_mask is None:
            from torch.nn.attention.flex_attention import create_block_mask

            seg = self.segment_ids

            def doc_causal(b, h, q_idx, kv_idx):  # noqa: ANN001 - flex mask signature
                return (q_idx >= kv_idx) & (seg[b, q_idx] == seg[b, kv_idx])

            B, T = seg.shape
            self._block_mask = create_block_mask(doc_causal, B, None, T, T, device=seg.device)
        return self._block_mask


def resolve_backend(cfg: ModelConfig, tokens: torch.Tensor) -> str:
    """The attention kernel for this batch when `cfg.attn_backend` is `auto`.

    CUDA: FlexAttention with a document block mask (when it imports). CPU: the fused
    compiled kernel (`sanlab.model.native`; memory O(T), any length) where it builds;
    else the explicit kernel while its saved probabilities fit `CPU_EXPLICIT_MAX_BYTES`
    (in fp32, or in bf16 under bf16 autocast: `explicit_keep`), SDPA with a dense mask
    otherwise (FlexAttention has no CPU backward in this torch, so an explicit `flex`
    request falls back to SDPA there). `attend` still routes inputs the fused kernel
    does not take (fp64, fp16, recurring segment ids) to the explicit kernel or SDPA.
    An explicit `fused` request that cannot be met is a ConfigError naming the reason.
    """
    requested, device = cfg.attn_backend, tokens.device
    if requested == "fused":
        if device.type != "cpu":
            raise ConfigError(f"model.attn_backend=fused: the fused kernel runs on the CPU, not on {device.type}")
        try:
            native.library()
        except native.NativeUnavailable as e:
            raise ConfigError(f"model.attn_backend=fused: the fused CPU kernel is unavailable here: {e}") from None
    if requested == "auto":
        if device.type == "cuda":
            requested = "flex"
        elif native.available():
            requested = "fused"
        else:
            B, T = tokens.shape
            low = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
            low = low if low is not None and low.itemsize == 2 else None
            requested = unfused_cpu_backend(B, cfg.n_heads, T, low)
    if requested == "flex":
        if device.type != "cuda":
            return "sdpa"
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except ImportError:
            return "sdpa"
    return requested


def attention_kernel(cfg: ModelConfig, device: torch.device, precision: str) -> str:
    """The attention kernel a run on `device` in `precision` uses for its usual batches, as
    a run's meta.json records it: `fused/amx` or `fused/portable` (the compiled CPU kernel
    and where its products run), `explicit`, `sdpa` or `flex` (auto's choice depends on
    the batch shape where the fused kernel is unavailable: `explicit/sdpa`). Raises the
    ConfigError of an explicit `fused` request that cannot be met."""
    requested = cfg.attn_backend
    if requested in ("auto", "fused"):
        probe = resolve_backend(cfg, torch.zeros(1, 1, dtype=torch.long, device=device))
        if probe == "fused":
            amx = native.library().sanlab_amx_available() and fused_products(precision == "bf16") == 0
            return "fused/amx" if amx else "fused/portable"
        if requested == "auto" and device.type == "cpu":
            return "explicit/sdpa"
        return probe
    if requested == "flex" and device.type != "cuda":
        return "sdpa"
    return requested


def build_context(
    cfg: ModelConfig, tokens: torch.Tensor, segment_ids: torch.Tensor | None
) -> AttentionContext:
    single = segment_ids is None
    if segment_ids is None:
        segment_ids = torch.zeros_like(tokens)
    positions = segment_positions(segment_ids)
    cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
    return AttentionContext(
        segment_ids=segment_ids,
        positions=positions,
        cos=cos,
        sin=sin,
        backend=resolve_backend(cfg, tokens),
        single_document=single,
    )
