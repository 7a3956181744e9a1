"""Low-rank split of a weight: ``W ≈ up · down`` with ``up (N, r)``, ``down (r, K)`` (truncated SVD).

The singular values are shared evenly (``up = U·√S``, ``down = √S·Vᵀ``) so both factors have
the same range: they are stored in 16 bits. Large weights use a randomized SVD
(``torch.svd_lowrank``, Halko et al.) with a fixed seed, so the split is deterministic.

Example:
    >>> import torch
    >>> w = torch.randn(32, 8) @ torch.randn(8, 48)        # rank 8
    >>> up, down = split(w, 8)
    >>> bool(torch.allclose(up @ down, w, atol=1e-3))
    True
"""

from __future__ import annotations

import torch

# Full SVD below this many elements (exact, fast enough); randomized above.
_EXACT_NUMEL = 1 << 22
_OVERSAMPLE, _POWER_ITERATIONS = 16, 4


def split(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best rank-``rank`` factors ``(up, down)`` of ``w`` (fp32), ``up @ down ≈ w``."""
    n, k = w.shape
    if not 1 <= rank <= min(n, k):
        raise ValueError(f"low-rank rank must be 1…{min(n, k)} for a {n}×{k} weight, got {rank}")
    w = w.float()
    if w.numel() <= _EXACT_NUMEL:
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        u, s, v = u[:, :rank], s[:rank], vh[:rank].T
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            u, s, v = torch.svd_lowrank(w, q=min(rank + _OVERSAMPLE, n, k), niter=_POWER_ITERATIONS)
        u, s, v = u[:, :rank], s[:rank], v[:, :rank]
    root = s.sqrt()
    return u * root, (v * root).T.contiguous()


def energy(w: torch.Tensor, rank: int) -> float:
    """Share of ``‖W‖²`` in its top ``rank`` singular directions (1.0: ``W`` is rank ≤ ``rank``)."""
    s = torch.linalg.svdvals(w.float())
    total = float(s.square().sum())
    return float(s[:rank].square().sum()) / total if total > 0 else 1.0
