"""The 16-bit low-rank products of :class:`~sixbit.nn.QuantLinear`: the SVDQuant branch beside a
4-bit weight and the LoRAs appended to it."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


def branch_factors(down: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A LoRA's factors as the layers keep them: fp16 copies, contiguous (a transposed view would
    sum its GEMM in another order: the same LoRA would give another output for its memory layout)."""
    return tuple(t.detach().to(torch.float16).clone(memory_format=torch.contiguous_format) for t in (down, up))


def low_rank(x: torch.Tensor, down: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``up · (down · x)`` in ``x``'s dtype: the low-rank branch and every LoRA."""
    return F.linear(F.linear(x, down.to(x.dtype)), up.to(x.dtype))


class Branch(NamedTuple):
    """A layer's low-rank branch on one input: ``down`` = ``x·Dᵀ`` (tokens, rank) and the up factor
    ``U`` (N, rank); :func:`full` makes its output ``x·Dᵀ·Uᵀ`` as :func:`low_rank` does."""

    down: torch.Tensor
    up: torch.Tensor


def branch(x: torch.Tensor, down: torch.Tensor, up: torch.Tensor) -> Branch:
    return Branch(F.linear(x, down.to(x.dtype)), up)


def full(branch: Branch | None) -> torch.Tensor | None:
    return None if branch is None else F.linear(branch.down, branch.up.to(branch.down.dtype))


def add_branch(acc: torch.Tensor, branch: Branch, x_scale: torch.Tensor) -> None:
    """``acc += branch / x_scale`` in place (``x_scale`` (tokens, 1): an epilogue multiplies by it
    next): one GEMM over the branch's rank accumulating into ``acc``, rounded once to its dtype."""
    acc.addmm_((branch.down.float() / x_scale).to(acc.dtype), branch.up.to(acc.dtype).t())


def add(y: torch.Tensor, branch: Branch | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``y + branch + bias`` in ``y``'s dtype, in that order."""
    if branch is not None:
        y = y + full(branch)
    return y if bias is None else y + bias.to(y.dtype)
