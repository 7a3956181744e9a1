"""Statistics over a token sequence split across processes (``sixbit.parallel``'s sequence mode).

When each rank of a process group holds a slice of a call's tokens, a statistic that a runtime
method decides on — the delta cache's and DMPQ's relative L1 changes, PDR's outlier ratio, an
NVFP4 activation's per-tensor abs-max — must be taken over every token, or the ranks would
decide differently (and no longer match the single-process run). :func:`token_sum` and
:func:`token_max` reduce such a statistic over the group set by :func:`set_token_group`; with no
group (the default, and tensor-parallel mode, where every rank holds every token) they return
their input unchanged.

Both are safe on tensors every rank holds whole (replicated): a ratio of two token sums is
unchanged when both sums are multiplied by the world size, and a max is a max. One
sequence-parallel model per process: the group is process-wide.
"""

from __future__ import annotations

import torch

_group = None  # the process group whose ranks split the tokens; None: nothing is split


def set_token_group(group) -> None:
    """Reduce statistics over ``group`` from now on (``None``: stop)."""
    global _group
    _group = group


def tokens_split() -> bool:
    """Whether a call's tokens are split across processes."""
    return _group is not None


def token_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the ranks that split the tokens (``t`` itself when none do)."""
    return _reduce(t, torch.distributed.ReduceOp.SUM) if _group is not None else t


def token_max(t: torch.Tensor) -> torch.Tensor:
    """``t``'s element-wise max over the ranks that split the tokens (``t`` itself when none do)."""
    return _reduce(t, torch.distributed.ReduceOp.MAX) if _group is not None else t


def token_mean_of_sum(total: torch.Tensor, count: int) -> torch.Tensor:
    """``total / count`` over every rank's tokens, for ``total`` this rank's sum of ``count`` elements."""
    if _group is None:
        return total / count
    total, count = _reduce(torch.stack([total, total.new_tensor(float(count))]), torch.distributed.ReduceOp.SUM)
    return total / count


@torch.compiler.disable
def _reduce(t: torch.Tensor, op) -> torch.Tensor:
    out = t.detach().clone()
    torch.distributed.all_reduce(out, op=op, group=_group)
    return out
