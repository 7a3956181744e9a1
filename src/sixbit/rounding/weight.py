"""One weight in its format, with its optional 16-bit low-rank branch: :func:`quantize_weight`."""

from __future__ import annotations

import torch

from .. import formats, kernels
from ..transforms import lowrank
from .gptq import DAMP, gptq
from .grid import grid_for

BRANCH_DTYPE = torch.float16


def quantize_weight(
    w: torch.Tensor,
    fmt_name: str,
    scale_rule: str = "absmax",
    hessian: torch.Tensor | None = None,
    use_gptq: bool = False,
    damp: float = DAMP,
    rank: int = 0,
    iterations: int = 2,
) -> tuple[formats.Quantized, tuple[torch.Tensor, torch.Tensor] | None]:
    """``(quantized weight, (up, down) or None)`` for ``w`` (``(N, K)``, as stored).

    Args:
        w: the weight, rotated / divided like the layer stores it.
        fmt_name: the weight format (scale search and GPTQ: NVFP4 or symmetric integers).
        scale_rule: ``"absmax"`` (default), ``"mse"`` or ``"4/6"`` (:mod:`sixbit.rounding.grid`);
            with a ``hessian``, the search weighs each input channel by its diagonal entry.
        hessian: ``(K, K)`` input second moment in the stored space, or ``None``.
        use_gptq: round with GPTQ (needs ``hessian``) instead of to nearest.
        damp: GPTQ's relative damping (default 0.01).
        rank: rank of the 16-bit low-rank branch (0: none, default). The stored weight is then
            ``W − up·down``; ``up·down`` is refit to ``W − Q(residual)`` ``iterations`` times
            (default 2) with the cheap quantizer, and the final residual gets the full one.
    """
    if use_gptq and hessian is None:
        raise ValueError("GPTQ needs the layer's input Hessian: pass calibration data")
    w = w.float()
    importance = None if hessian is None else hessian.diagonal()

    def quantize(target: torch.Tensor) -> formats.Quantized:
        if scale_rule == "absmax" and not use_gptq:
            return formats.get(fmt_name).quantize(target)
        grid = grid_for(target, fmt_name, scale_rule, importance)
        if use_gptq:
            return grid.pack(gptq(target, hessian, grid, damp=damp))
        return grid.pack(grid.round(target, torch.arange(target.shape[1], device=target.device)))

    def rounded(target: torch.Tensor) -> torch.Tensor:  # the cheap quantizer's values, never packed
        if scale_rule == "absmax":
            return formats.get(fmt_name).quantize(target).dequantize()
        return grid_for(target, fmt_name, scale_rule, importance).round(
            target, torch.arange(target.shape[1], device=target.device))

    if rank == 0:
        return quantize(w), None
    up, down = _branch(w, rank)
    for _ in range(iterations):
        up, down = _branch(w - rounded(w - up.float() @ down.float()), rank)
    return quantize(w - up.float() @ down.float()), (up, down)


def _branch(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    with kernels.one_thread(w.device):  # eigh / svd_lowrank: many small LAPACK steps
        up, down = lowrank.split(w, rank)
    return up.to(BRANCH_DTYPE), down.to(BRANCH_DTYPE)


__all__ = ["BRANCH_DTYPE", "quantize_weight"]
