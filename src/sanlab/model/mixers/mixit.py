"""`mixit`: fixed random causal mixing matrices per head, no Q/K, no RoPE (SPEC §2 MixiT)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from sanlab.configbase import StrictModel
from sanlab.model.mixers import register_mixer
from sanlab.model.mixers.spec import Param, SequenceSpec, attention_terms, matrix_flops

if TYPE_CHECKING:
    from sanlab.config import ModelConfig  # annotations only: sanlab.config imports the registry

# What sets T in σ_h for the rows of a document (docs/variants.md, "MixiT"):
#   document  the document's own length L: each document is mixed by SPEC §2's matrix for a
#             sequence of L tokens (the paper's form; the default)
#   prefix    row i (document position i) by σ_h(i + 1), the number of tokens it mixes: the
#             weights never depend on the document's length, so decoding is exact
#   row       a fixed T = `seq_len` for every row (the construction before the document length
#             was used: a short document only sees the top-left block of a matrix built for T)
SigmaLength = Literal["document", "prefix", "row"]


class MixiTOptions(StrictModel):
    seed: int = 0  # the fixed draw comes from this seed (and the layer index)
    seq_len: int = Field(256, gt=0)  # the longest document the draw covers (and T for sigma_length="row")
    sigma_length: SigmaLength = "document"  # what sets T in σ_h (see above)
    sink_head: bool = True  # head 0 is the sink head (½I + ½ on column 0)


@register_mixer
class MixiTSpec(SequenceSpec):
    """Each head mixes values with a fixed random, input-independent causal matrix
    (`mixit_matrices`), out = W_o(A v): only W_v and W_o are parameters."""

    name = "mixit"
    short = "mixit"
    summary = "fixed random causal mixing matrices per head, σ_h at each document's length, no Q/K, no RoPE"
    paper = "SPEC §2"
    Options = MixiTOptions
    has_pattern = True
    probe_arm = "MixiT"

    @classmethod
    def params(cls, cfg: ModelConfig, opts: Any) -> dict[str, Param]:
        d, H, Hkv, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        return {"wv.weight": Param((Hkv * D, d), "content", "normal"),
                "wo.weight": Param((d, H * D), "content", "out")}

    @classmethod
    def flops(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        return {"attn_proj": matrix_flops(cls.params(cfg, opts)),
                "attn_mix": attention_terms(cfg, seq_len, causal_half)}


# ---- the module
import torch

from sanlab.errors import ConfigError
from sanlab.model.attention import AttentionContext
from sanlab.model.mixers.base import DecodeCache, DecodeStep, SequenceMixer


def mixit_seed(seed: int, layer_idx: int) -> int:
    """The seed of layer `layer_idx`'s draw: every layer has its own matrices."""
    return seed * 1_000_003 + layer_idx


def mixit_draw(n_heads: int, T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed random state of SPEC §2's construction, float64: u (H,) ~ U(0,1) (σ_h's
    mixing coefficient) and C (H, T, T), standard normals on and below the diagonal with
    each row's mean over its causal support subtracted (so N − drift = σ_h · C).

    Drawn row by row (row i: H·(i+1) normals), so the draw for T is the top-left block of
    the draw for any longer T: the matrices of a document of L tokens are the same
    whatever `seq_len` the draw was made for."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n_heads, generator=g, dtype=torch.float64)
    Z = torch.zeros(n_heads, T, T, dtype=torch.float64)
    for i in range(T):
        Z[:, i, : i + 1] = torch.randn(n_heads, i + 1, generator=g, dtype=torch.float64)
    support = torch.arange(1, T + 1, dtype=torch.float64)[:, None]  # row i has i+1 causal entries
    C = (Z - Z.sum(-1, keepdim=True) / support).tril()
    return u, C


def mixit_sigma(u: torch.Tensor, T: torch.Tensor | int, head_dim: int) -> torch.Tensor:
    """σ_h = 1/√(T·d_h) + u_h·(1/√T − 1/√(T·d_h)) (SPEC §2), broadcast over u and T."""
    T = torch.as_tensor(T, dtype=u.dtype, device=u.device)
    low = (T * head_dim) ** -0.5
    return low + u * (T**-0.5 - low)


def mixit_matrices(n_heads: int, T: int, head_dim: int, seed: int, sink_head: bool = True,
                   sigma_length: SigmaLength = "document", seq_len: int | None = None) -> torch.Tensor:
    """SPEC §2's fixed random causal mixing matrices of one sequence of T tokens, (H, T, T) fp32.

    Per head h: N ~ Normal(0, σ_h²), N ← tril(N); subtract each row's mean over its causal
    support (so the noise rows are centred); A = tril(I + N − drift): rows sum to 1. With
    `sigma_length="document"` σ_h is σ_h(T) in every row (SPEC §2: T the length of the
    sequence mixed); "prefix": row i uses σ_h(i + 1); "row": σ_h(seq_len). Head 0 (with
    `sink_head`) is ½I plus ½ on column 0."""
    u, C = mixit_draw(n_heads, T, seed)
    if sigma_length == "document":
        sigma = mixit_sigma(u, T, head_dim)[:, None, None]  # (H, 1, 1)
    elif sigma_length == "prefix":
        sigma = mixit_sigma(u[:, None], torch.arange(1, T + 1, dtype=torch.float64), head_dim)[:, :, None]
    else:
        if seq_len is None:
            raise ValueError("sigma_length='row' needs the seq_len the matrices are built for")
        sigma = mixit_sigma(u, seq_len, head_dim)[:, None, None]
    A = torch.eye(T, dtype=torch.float64) + sigma * C
    if sink_head:
        sink = 0.5 * torch.eye(T, dtype=torch.float64)
        sink[:, 0] += 0.5
        A[0] = sink
    return A.float()


class MixiTVCache(DecodeCache):
    """MixiT with a V cache: out = W_o(A v) with
    the rows of the new positions of A for one document of the context's length
    (`MixiT.sequence_weights`), in fp32. Exact where the weights of position p depend on p
    alone (`sigma_length` prefix or row); with "document" they depend on the document's
    length, which grows with every token, so such a model decodes by full forward passes
    (`unsupported`)."""

    def __init__(self, mixer: MixiT, batch: int, max_len: int) -> None:
        super().__init__(mixer, batch, max_len)
        dev = mixer.wv.weight.device
        self.v = torch.zeros(batch, mixer.n_kv_heads, max_len, mixer.head_dim, device=dev)  # (B, Hkv, T_max, D)
        self.length = 0

    @staticmethod
    def unsupported(mixer: MixiT) -> str | None:
        if mixer.opts.sigma_length == "document":
            return ("mixit with sigma_length=document (every position's weights depend on the "
                    "document's length, which grows with the context)")
        return None

    def forward(self, u: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        m = self.mixer
        B, T, _ = u.shape
        H, Hkv, D = m.n_heads, m.n_kv_heads, m.head_dim
        s, e = self.length, self.length + T
        self.v[:, :, s:e] = m.wv(u).view(B, T, Hkv, D).float().transpose(1, 2)
        self.length = e
        A = m.sequence_weights(e)[:, s:e].float()  # (H, T, e)
        y = A @ self.v[:, :, :e].repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D)
        return m.wo(y.transpose(1, 2).reshape(B, T, H * D).to(u.dtype))


class MixiT(SequenceMixer):
    """The fixed draw (`mixit_draw`: u and the centred normals C) is a pair of persistent
    buffers (`sigma_u`, `noise`; saved in checkpoints, never trained or re-drawn). In a
    packed row, token t at document position p mixes the tokens of its own document with
    A[p, p'] = δ + σ_h(T_t)·C[p, p'], where T_t is what `sigma_length` says (the length of
    t's document by default), so each document gets exactly what it would alone."""

    spec = MixiTSpec
    decode_cache = MixiTVCache

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        u, C = mixit_draw(H, opts.seq_len, mixit_seed(opts.seed, layer_idx))
        self.register_buffer("sigma_u", u.float())
        self.register_buffer("noise", C.float())

    def _sigma(self, lengths: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """σ_h of each token: lengths (its document's length) and positions (…) -> (H, …)."""
        mode = self.opts.sigma_length
        T = lengths if mode == "document" else positions + 1 if mode == "prefix" else self.opts.seq_len
        u = self.sigma_u.view(-1, *([1] * positions.dim()))
        return mixit_sigma(u, T, self.head_dim).expand(-1, *positions.shape)

    def bind_data(self, heldout: Callable[[int], torch.Tensor], seq_len: int) -> None:
        self._check_length(seq_len)  # a document may fill a row

    def _check_length(self, T: int) -> None:
        if T > self.noise.shape[-1]:
            raise ConfigError(f"mixit: documents of up to {T} tokens, but its fixed draw covers "
                              f"model.mixer_options.seq_len={self.noise.shape[-1]}")

    def sequence_weights(self, n: int) -> torch.Tensor:
        """The mixing weights of one document of `n` tokens, (H, n, n)."""
        self._check_length(n)
        pos = torch.arange(n, device=self.noise.device)
        sigma = self._sigma(torch.full_like(pos, n), pos)  # (H, n)
        A = torch.eye(n, dtype=self.noise.dtype, device=pos.device) + sigma[..., None] * self.noise[:, :n, :n]
        if self.opts.sink_head:
            A[0] = 0.5 * torch.eye(n, dtype=A.dtype, device=A.device)
            A[0, :, 0] += 0.5
        return A

    def weights(self, ctx: AttentionContext, T: int) -> torch.Tensor:
        """The mixing weights of this batch: (1 or B, H, T, T), zero across documents."""
        if ctx.single_document:
            return self.sequence_weights(T)[None]
        pos, seg = ctx.positions, ctx.segment_ids  # (B, T)
        same = seg[:, :, None] == seg[:, None, :]  # (B, T, T)
        self._check_length(int(pos.max()) + 1)
        lengths = same.sum(-1)  # (B, T): the length of each token's document (its segment in the row)
        sigma = self._sigma(lengths, pos)  # (H, B, T)
        eye = (pos[:, :, None] == pos[:, None, :]) & same  # (B, T, T)
        A = eye.to(self.noise.dtype) + sigma[..., None] * self.noise[:, pos[:, :, None], pos[:, None, :]]
        if self.opts.sink_head:
            A[0] = 0.5 * eye + 0.5 * (pos[:, None, :] == 0)
        return A.transpose(0, 1) * ctx.dense_mask  # (B, H, T, T)

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        v = self.wv(u).view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D)
        A = self.pattern(self.weights(ctx, T).to(v.dtype))
        y = A @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))
