"""Pure tensor measurements used by the analysis (SPEC §1.6 and §3).

Everything here takes tensors and returns tensors or floats: no model, no files, no
devices. That keeps every metric testable on constructed inputs with a known answer
(a rank-k matrix, a uniform or identity attention pattern, a sink pattern).

Spectral quantities work on singular values `s` sorted in descending order:
- stable rank ‖W‖²_F / ‖W‖²₂ = Σ s² / s_max²;
- entropy effective rank exp(H(p)) with p = s / Σ s (Roy & Vetterli, 2007);
- spectral norm s_max.

Attention metrics work on packed rows: a query only attends within its own segment
(document piece) and causally, so "the causal support" of query i is the positions
j ≤ i of its segment, and "the first token of the document" is its segment start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

LOCAL_DISTANCES: tuple[int, ...] = (0, 1, 2, 3)


# --------------------------------------------------------------------------- spectra


def singular_values(w: Tensor) -> Tensor:
    """Singular values of a 2-D matrix in float64, descending: (min(m, n),).

    A matrix with a non-finite entry (a diverged run) gets NaN singular values, so
    every rank computed from them is NaN rather than an exception.
    """
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {tuple(w.shape)}")
    w = w.detach().to(torch.float64).cpu()
    if not bool(torch.isfinite(w).all()):
        return torch.full((min(w.shape),), float("nan"), dtype=torch.float64)
    return torch.linalg.svdvals(w)


def stable_rank(s: Tensor) -> float:
    """‖W‖²_F / ‖W‖²₂ from singular values; 0 for the zero matrix, NaN for NaN input."""
    if bool(s.isnan().any()):
        return float("nan")
    top = float(s.max()) if s.numel() else 0.0
    return float((s**2).sum()) / top**2 if top > 0 else 0.0


def normalized_spectrum(s: Tensor) -> Tensor:
    """Singular values as a distribution p = s / Σ s (descending); zeros for a zero matrix."""
    s = torch.sort(s.to(torch.float64), descending=True).values
    total = s.sum()
    return s / total if total > 0 else torch.zeros_like(s)


def entropy_effective_rank(s: Tensor) -> float:
    """exp of the Shannon entropy of the normalised singular values.

    Equals k for k equal non-zero singular values; lies in [1, len(s)] otherwise.
    """
    if bool(s.isnan().any()):
        return float("nan")
    p = normalized_spectrum(s)
    if float(p.sum()) == 0.0:
        return 0.0
    return float(torch.exp(torch.special.entr(p).sum()))


def spectral_norm(s: Tensor) -> float:
    """Largest singular value."""
    return float(s.max()) if s.numel() else 0.0


def spectrum_distance(s_a: Tensor, s_b: Tensor) -> float:
    """Total-variation distance ½‖p_a − p_b‖₁ between two normalised spectra, in [0, 1].

    Only the *shape* of the spectrum counts, not its scale: a matrix that grows
    uniformly (weight-norm drift) has a crystallised spectrum.
    """
    p_a, p_b = normalized_spectrum(s_a), normalized_spectrum(s_b)
    if p_a.shape != p_b.shape:
        raise ValueError(f"spectra of different lengths: {p_a.numel()} vs {p_b.numel()}")
    return 0.5 * float((p_a - p_b).abs().sum())


def crystallisation_index(distances: list[float], tol: float) -> int | None:
    """First milestone index after which every consecutive spectrum change is below `tol`.

    `distances[k]` is the change from milestone k to k+1. Returns m such that
    distances[m:] are all < tol (m = len(distances) means "only at the last
    milestone", which is returned as None: nothing was observed to settle).
    """
    m = len(distances)
    while m > 0 and distances[m - 1] < tol:
        m -= 1
    return m if m < len(distances) else None


# --------------------------------------------------------------------------- hidden states


@dataclass
class CovarianceAccumulator:
    """Streaming first and second moments of d-dimensional vectors (float64).

    The singular values of the centred data matrix X − 1μᵀ are the square roots of the
    eigenvalues of XᵀX − n μμᵀ, so the representation rank of any number of tokens
    needs only O(d²) memory. Rows are shifted by the first batch's mean before they are
    accumulated so that a large common offset (the residual stream has one) does not
    cancel catastrophically.
    """

    dim: int
    n: int = 0
    total: Tensor = field(init=False)
    gram: Tensor = field(init=False)
    shift: Tensor | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.total = torch.zeros(self.dim, dtype=torch.float64)
        self.gram = torch.zeros(self.dim, self.dim, dtype=torch.float64)

    def add(self, x: Tensor) -> None:
        """Add rows of x: (N, d)."""
        x = x.detach().to(torch.float64)  # reduced where it lives (a GPU), summed on the CPU
        if x.shape[0] == 0:
            return
        if self.shift is None:
            self.shift = x.mean(0).cpu()
        x = x - self.shift.to(x.device)
        self.n += x.shape[0]
        self.total += x.sum(0).cpu()
        self.gram += (x.T @ x).cpu()

    def centred_singular_values(self) -> Tensor:
        """Singular values of the centred data matrix, descending: (d,)."""
        if self.n == 0:
            return torch.zeros(self.dim, dtype=torch.float64)
        mu = self.total / self.n
        cov = self.gram - self.n * torch.outer(mu, mu)
        if not bool(torch.isfinite(cov).all()):  # a diverged model's states
            return torch.full((self.dim,), float("nan"), dtype=torch.float64)
        eig = torch.linalg.eigvalsh(0.5 * (cov + cov.T))
        # round-off below this floor is not a direction of the data
        eig = torch.where(eig > eig.max() * self.dim * 1e-12, eig, torch.zeros_like(eig))
        return torch.sort(eig.sqrt(), descending=True).values


def representation_rank(h: Tensor) -> float:
    """Entropy effective rank of centred hidden states h: (N, d)."""
    acc = CovarianceAccumulator(h.shape[-1])
    acc.add(h.reshape(-1, h.shape[-1]))
    return entropy_effective_rank(acc.centred_singular_values())


# --------------------------------------------------------------------------- attention


def segment_positions(segment_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per token: its position inside its segment and the index of the segment's first token.

    segment_ids: (B, T) with each segment contiguous. Returns (pos, start), both (B, T).
    """
    b, t = segment_ids.shape
    idx = torch.arange(t, device=segment_ids.device).expand(b, t)
    is_start = torch.ones_like(segment_ids, dtype=torch.bool)
    is_start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start = torch.where(is_start, idx, torch.zeros_like(idx)).cummax(dim=1).values  # (B, T)
    return idx - start, start


def _support(segment_ids: Tensor) -> Tensor:
    """Causal, same-segment key mask: (B, T, T), True where query i may attend to key j."""
    t = segment_ids.shape[1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    causal = torch.ones(t, t, dtype=torch.bool, device=segment_ids.device).tril()
    return same & causal


@dataclass
class AttentionSums:
    """Running sums and counts of the attention metrics of one layer, per head.

    Kept as sums so batches of any size combine exactly; `means()` turns them into
    the reported numbers.
    """

    n_heads: int
    sums: dict[str, Tensor] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, total: Tensor, count: float) -> None:
        total = total.detach().to(torch.float64).cpu()
        self.sums[name] = self.sums[name] + total if name in self.sums else total
        self.counts[name] = self.counts.get(name, 0.0) + float(count)

    def merge(self, other: "AttentionSums") -> None:
        for name, total in other.sums.items():
            self.add(name, total, other.counts[name])

    def means(self) -> dict[str, Tensor]:
        """Mean of each metric: per-head (H,) tensors, `head_diversity` a 0-d tensor.

        A metric with no eligible queries (e.g. distance-3 focus on 2-token documents) is NaN.
        """
        return {
            k: v / self.counts[k] if self.counts[k] > 0 else torch.full_like(v, float("nan"))
            for k, v in self.sums.items()
        }


def attention_sums(
    pattern: Tensor,
    segment_ids: Tensor | None = None,
    query_mask: Tensor | None = None,
    distances: tuple[int, ...] = LOCAL_DISTANCES,
) -> AttentionSums:
    """Per-head attention metrics of one layer as sums over one batch (SPEC §3).

    pattern: (B, H, T, T) attention probabilities (rows sum to 1 over the support).
    segment_ids: (B, T) or None (one document per row).
    query_mask: (B, T) bool, the query positions to average over (e.g. not padding).

    - entropy: −Σ_j A_ij log A_ij, mean over queries (uniform over i+1 keys → log(i+1));
      NaN for a head with negative weights (a signed mixing matrix such as MixiT's);
    - concentration: ‖A‖_F of each row's (T, T) pattern over its valid queries, mean over
      rows (grows like √T, so compare at equal T);
    - head_diversity: std over heads of A_ij, mean over the causal triangle (one number);
    - sink: attention on the segment's first token, mean over queries that are not that
      token themselves (whose attention there is forced to 1);
    - local_d: A_{i,i−d}, mean over queries with at least d earlier tokens in the segment.
    """
    b, h, t, _ = pattern.shape
    a = pattern.detach().float()
    if segment_ids is None:
        segment_ids = torch.zeros(b, t, dtype=torch.long, device=a.device)
    segment_ids = segment_ids.to(a.device)
    qmask = (
        torch.ones(b, t, dtype=torch.bool, device=a.device)
        if query_mask is None
        else query_mask.to(a.device, torch.bool)
    )
    support = _support(segment_ids) & qmask[:, :, None]  # (B, T, T)
    pos, start = segment_positions(segment_ids)  # (B, T)
    qf = qmask.float()  # (B, T)
    out = AttentionSums(h)

    entropy = torch.special.entr(a).sum(-1)  # (B, H, T)
    # a signed mixing matrix (MixiT's) is not a distribution: its entropy is undefined
    entropy = entropy.masked_fill((a < 0).any(-1), float("nan"))
    out.add("entropy", (entropy * qf[:, None]).sum((0, 2)), qf.sum())

    sq = (a**2).sum(-1)  # (B, H, T)
    frob = ((sq * qf[:, None]).sum(-1)).sqrt()  # (B, H)
    rows = qmask.any(-1)  # (B,)
    out.add("concentration", (frob * rows[:, None]).sum(0), rows.sum())

    # two-pass population std over heads; ~20x faster than Tensor.std over a middle dim on CPU
    std = (a - a.mean(1, keepdim=True)).pow(2).mean(1).sqrt()  # (B, T, T)
    out.add("head_diversity", (std * support).sum(), support.sum())

    first = start[:, None, :, None].expand(b, h, t, 1)  # (B, H, T, 1)
    sink = a.gather(-1, first).squeeze(-1)  # (B, H, T)
    sink_q = (qmask & (pos > 0)).float()  # (B, T)
    out.add("sink", (sink * sink_q[:, None]).sum((0, 2)), sink_q.sum())

    for d in distances:
        if d >= t:
            out.add(f"local_{d}", torch.zeros(h, dtype=torch.float64), 0.0)
            continue
        diag = torch.diagonal(a, offset=-d, dim1=-2, dim2=-1)  # (B, H, T - d): A[i, i-d], i ≥ d
        ok = (qmask[:, d:] & (pos[:, d:] >= d)).float()  # (B, T - d)
        out.add(f"local_{d}", (diag * ok[:, None]).sum((0, 2)), ok.sum())
    return out


def attention_metrics(
    pattern: Tensor, segment_ids: Tensor | None = None, query_mask: Tensor | None = None
) -> dict[str, Tensor]:
    """Means of `attention_sums` for a single batch: per-head (H,) tensors."""
    return attention_sums(pattern, segment_ids, query_mask).means()


def minmax(values: Tensor) -> Tensor:
    """Min–max normalise to [0, 1] ignoring NaNs; a constant input maps to 0."""
    finite = values[~values.isnan()]
    if finite.numel() == 0:
        return values
    lo, hi = finite.min(), finite.max()
    span = hi - lo
    return (values - lo) / span if span > 0 else torch.where(values.isnan(), values, 0 * values)


# --------------------------------------------------------------------------- stream


def rms(x: Tensor, mask: Tensor | None = None) -> float:
    """Root mean square of x: (..., d) over all entries of the (masked) positions."""
    x = x.detach().to(torch.float64)
    if mask is not None:
        x = x[mask.to(x.device, torch.bool)]
    return float(x.pow(2).mean().sqrt()) if x.numel() else float("nan")


def max_abs(x: Tensor, mask: Tensor | None = None) -> float:
    """Largest |entry| of x: (..., d) over the (masked) positions."""
    x = x.detach()
    if mask is not None:
        x = x[mask.to(x.device, torch.bool)]
    return float(x.abs().max()) if x.numel() else float("nan")
