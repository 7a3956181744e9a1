"""Low-rank split of a weight: ``W ≈ up · down`` with ``up (N, r)``, ``down (r, K)`` (truncated SVD).

The singular values are shared evenly (``up = U·√S``, ``down = √S·Vᵀ``) so both factors have
the same range: they are stored in 16 bits. Up to 1 M elements (every weight of the shipped
models) the split is exact: the top ``rank`` eigenpairs of the smaller Gram matrix (``WᵀW`` or
``WWᵀ``, ``eigh``) give ``V`` and ``S²``, and ``U = WV/S`` (3× faster than a full SVD at 1536²,
the same factors to fp32 rounding: only the top directions are used, where squaring the singular
values loses nothing that matters). Larger weights use a randomized SVD (``torch.svd_lowrank``,
Halko et al., 4 power iterations) with a fixed seed, so the split is deterministic: at rank 16
on one thread, 0.018 s against the exact split's 0.32 s at 1536² and 0.030 against 0.58 s at
1920², the same residual ``‖W − up·down‖`` to 7 digits on weights with a decaying spectrum (a
conversion splits each weight three times: :func:`sixbit.rounding.quantize_weight`). On random
weights, whose spectrum is flat, it picks slightly worse directions: two random Wan2.1-1.3B
blocks rounded to nearest with the branch gave 6 % more output error (BENCHMARKS
``conversion-block``), 2 % with GPTQ.

Example:
    >>> import torch
    >>> w = torch.randn(32, 8) @ torch.randn(8, 48)        # rank 8
    >>> up, down = split(w, 8)
    >>> bool(torch.allclose(up @ down, w, atol=1e-3))
    True
"""

from __future__ import annotations

import torch

# Exact (Gram eigendecomposition) up to this many elements; randomized above.
_EXACT_NUMEL = 1 << 20
_OVERSAMPLE, _POWER_ITERATIONS = 16, 4


def split(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best rank-``rank`` factors ``(up, down)`` of ``w`` (fp32), ``up @ down ≈ w``."""
    n, k = w.shape
    if not 1 <= rank <= min(n, k):
        raise ValueError(f"low-rank rank must be 1…{min(n, k)} for a {n}×{k} weight, got {rank}")
    w = w.float()
    if w.numel() <= _EXACT_NUMEL:
        return _gram_split(w, rank)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        u, s, v = torch.svd_lowrank(w, q=min(rank + _OVERSAMPLE, n, k), niter=_POWER_ITERATIONS)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, (v[:, :rank] * root).T.contiguous()


def _gram_split(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact top-``rank`` split from the smaller Gram matrix's eigenpairs (ascending from ``eigh``)."""
    wide = w.shape[0] < w.shape[1]
    a = w.T if wide else w  # (long, short): its Gram matrix is short × short
    values, vectors = torch.linalg.eigh(a.T @ a)
    v = vectors[:, -rank:].flip(-1)  # top first, as an SVD orders them
    root = values[-rank:].flip(-1).clamp_min(0).sqrt().sqrt()  # √S, S = √eigenvalue
    u_root = torch.where(root > 0, (a @ v) / root.clamp_min(torch.finfo(a.dtype).tiny), 0.0)  # U·√S = AV/√S
    v_root = v * root
    if wide:
        return v_root, u_root.T.contiguous()
    return u_root, v_root.T.contiguous()


def energy(w: torch.Tensor, rank: int) -> float:
    """Share of ``‖W‖²`` in its top ``rank`` singular directions (1.0: ``W`` is rank ≤ ``rank``)."""
    s = torch.linalg.svdvals(w.float())
    total = float(s.square().sum())
    return float(s[:rank].square().sum()) / total if total > 0 else 1.0
