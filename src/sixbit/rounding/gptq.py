"""GPTQ (Frantar et al., 2022) on a fixed scale grid: round one input column at a time and
spread its error over the columns not yet rounded, weighted by the inverse input Hessian.

``H = 2/n · Σ x xᵀ`` over the layer's inputs as seen at run time (rotated / divided like the
stored weight); the output error ``‖X(W − Q)ᵀ‖²`` is what GPTQ lowers, where round to nearest
lowers ``‖W − Q‖²``. Details (the paper's, with the choices for low-bit block formats):

- **Static scales.** The grid (:mod:`sixbit.rounding.grid`) is fixed from the original weight
  before any column moves, so act-order can visit columns in any order and every block of 16
  (NVFP4) or g (integer groups) keeps one scale ("MR-GPTQ", arXiv 2509.23202).
- **Act-order.** Columns go by decreasing Hessian diagonal: the most used inputs are rounded
  first, while most columns are still free to absorb their error.
- **Damping with retries.** ``damp · mean(diag H)`` is added to the diagonal (default 1%); if
  the Cholesky factorization still fails (a rank-deficient Hessian: few calibration rows), the
  damping grows 10× per try, up to 4 tries, then a ``ValueError`` says what to do.
- **Unused inputs.** A channel whose inputs were all zero in calibration gets ``H_jj = 1`` and
  is rounded to nearest; unlike the reference code its weight is kept (not zeroed), since
  calibration may simply not have exercised it.
- **Blocks of 128 columns with lazy updates, two levels.** Within a sub-block of 16 columns,
  errors update its columns one by one (rank-1 updates in place); the block's later columns
  are updated once per sub-block and the rest of the weight once per block (GEMMs). The same
  sums as updating column by column, grouped: equal to fp32 rounding (the one-by-one updates of
  a 128-column block were most of GPTQ's time: 8× less elementwise work). Each block is worked
  on transposed, so that its columns are contiguous rows; the column loop runs on one CPU
  thread (:mod:`sixbit.kernels.threads`), the GEMMs between blocks on all of them.

Everything runs in fp32 on the weight's device; peak memory is about three weight-sized fp32
tensors plus two ``K × K`` matrices.
"""

from __future__ import annotations

import torch

from .. import kernels
from .grid import Grid

BLOCK = 128
_INNER = 16  # columns updated one by one inside a block; the block's later columns once per 16 (a GEMM)
DAMP = 0.01
_RETRIES = 4
_SOLVE_BELOW = 512


def inverse_cholesky(hessian: torch.Tensor, damp: float = DAMP) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor of ``(H + λI)⁻¹`` and the damping ``λ / mean(diag H)`` that worked:
    one Cholesky factorization of the reversed matrix and one triangular inverse (the inverse is
    never formed, nor factored again)."""
    mean_diag = float(hessian.diagonal().mean())
    if not mean_diag > 0:
        mean_diag = 1.0
    flipped = hessian.flip(0, 1)  # J·H·J (J reverses the order): its lower factor L gives H = R·Rᵀ with R = J·L·J upper
    diagonal = flipped.diagonal()  # damped in place (no K × K identity or sum at K = 8960: 320 MB each)
    undamped = diagonal.clone()
    for attempt in range(_RETRIES):
        lam = damp * 10**attempt
        torch.add(undamped, lam * mean_diag, out=diagonal)
        factor, info = torch.linalg.cholesky_ex(flipped)
        if int(info) == 0:  # (H + λI)⁻¹ = R⁻ᵀ·R⁻¹, so its upper Cholesky factor is R⁻¹ = J·L⁻¹·J
            return _lower_inverse(factor).flip(0, 1), lam
    raise ValueError(
        f"GPTQ: the input Hessian is not positive definite even with damping {damp * 10 ** (_RETRIES - 1):g}: "
        "calibrate on more or more varied data, or raise gptq_damp"
    )


def _lower_inverse(lower: torch.Tensor) -> torch.Tensor:
    """The inverse of a lower-triangular matrix, by halves: ``[[A, 0], [C, D]]⁻¹ =
    [[A⁻¹, 0], [−D⁻¹·C·A⁻¹, D⁻¹]]``, the corner by two triangular solves on ``A`` and ``D``
    themselves (``n³/3`` multiply-adds in all, as LAPACK's ``trtri``; GEMMs with the inverted
    halves took twice as many: 1.9 → 1.1 s at K = 8960 on 2 AMX cores, the same largest error
    against an fp64 inverse); triangular solves below 512 rows."""
    n = lower.shape[0]
    if n <= _SOLVE_BELOW:
        return torch.linalg.solve_triangular(lower, torch.eye(n, dtype=lower.dtype, device=lower.device), upper=False)
    half = n // 2
    a, c, d = lower[:half, :half], lower[half:, :half], lower[half:, half:]
    out = torch.zeros_like(lower)
    out[:half, :half], out[half:, half:] = _lower_inverse(a), _lower_inverse(d)
    c_a = torch.linalg.solve_triangular(a, c, upper=False, left=False)  # C·A⁻¹
    out[half:, :half] = -torch.linalg.solve_triangular(d, c_a, upper=False)  # D⁻¹·C·A⁻¹
    return out


def gptq(
    w: torch.Tensor,
    hessian: torch.Tensor,
    grid: Grid,
    block: int = BLOCK,
    damp: float = DAMP,
    act_order: bool = True,
) -> torch.Tensor:
    """GPTQ-rounded ``w`` (``(N, K)``): fp32 values on ``grid``, in ``w``'s column order.

    Args:
        w: the weight as stored (rotated / divided already).
        hessian: ``(K, K)`` input second moment in the same space (:mod:`sixbit.calibration.hessians`).
        grid: the fixed scales (:func:`sixbit.rounding.grid.grid_for` of ``w``).
        block: columns per lazy-update block (default 128).
        damp: diagonal damping as a fraction of the mean diagonal (default 0.01).
        act_order: visit columns by decreasing Hessian diagonal (default ``True``).

    Example:
        >>> from sixbit.rounding.grid import grid_for
        >>> x, w = torch.randn(256, 32), torch.randn(8, 32)
        >>> q = gptq(w, x.T @ x / 256, grid_for(w, "int4"))
        >>> bool(((x @ (q - w).T) ** 2).sum() < ((x @ (grid_for(w, "int4").round(w, torch.arange(32)) - w).T) ** 2).sum())
        True
    """
    n, k = w.shape
    if hessian.shape != (k, k):
        raise ValueError(f"GPTQ needs a ({k}, {k}) Hessian for a weight with {k} inputs, got {tuple(hessian.shape)}")
    diag = hessian.diagonal().float()
    if act_order:
        perm = torch.argsort(torch.where(diag <= 0, 1.0, diag), descending=True)
    else:
        perm = torch.arange(k, device=w.device)
    h = hessian.float()[perm[:, None], perm]  # one gather, a fresh copy
    dead = h.diagonal() <= 0
    h[dead, dead] = 1.0
    hinv, _ = inverse_cholesky(h, damp)
    w = w.float()[:, perm].contiguous()
    q = torch.empty_like(w)
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        # the block transposed: each of its columns a contiguous row for the one-by-one updates
        w1, hinv1 = w[:, i1:i2].T.contiguous(), hinv[i1:i2, i1:i2]
        rows = grid.rows(perm[i1:i2])
        q1, err1 = torch.empty_like(w1), torch.empty_like(w1)
        with kernels.one_thread(w.device):  # small ops in a loop: one thread (kernels.threads says why)
            _columns(w1, q1, err1, hinv1, rows)
        q[:, i1:i2] = q1.T
        w[:, i2:] -= err1.T.contiguous() @ hinv[i1:i2, i2:]
    out = torch.empty_like(q)
    out[:, perm] = q
    return out


def _columns(w1: torch.Tensor, q1: torch.Tensor, err1: torch.Tensor, hinv1: torch.Tensor, rows) -> None:
    """One block's columns (the rows of the transposed ``w1``) rounded one by one into ``q1``,
    their scaled errors into ``err1``, each spread over the block's later columns: one by one
    inside a sub-block of 16, then on the block's later columns once per sub-block."""
    b = w1.shape[0]
    for s1 in range(0, b, _INNER):
        s2 = min(s1 + _INNER, b)
        for j in range(s1, s2):
            q1[j] = rows(j, w1[j])
            e = err1[j] = (w1[j] - q1[j]) / hinv1[j, j]
            w1[j + 1:s2].addr_(hinv1[j, j + 1:s2], e, alpha=-1.0)
        w1[s2:] -= hinv1[s1:s2, s2:].T @ err1[s1:s2]
