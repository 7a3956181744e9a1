"""Offline refinement of the low-rank branches, block by block (seed 000 §2.1, step 3).

After a block's layers are quantized (:mod:`sixbit.builder`), the 16-bit low-rank branches of its
4-bit layers are fitted to what the block must output: the **full-precision block's output on
the same inputs** (the inputs the calibration runs fed it, every recorded step and CFG branch),
by Adam on the branches' factors alone — no model weight, scale or code changes. The layers run
weight-only while fitting (dequantize, then matmul: differentiable), which is the error the
branch exists to correct. A block keeps the refined factors only if they lower its output error
on the recorded calls; :class:`RefineResult` says by how much.

What it refines is the branch; block scales and rounding stay as GPTQ and the scale search left
them (their codes are discrete: refining them needs a straight-through estimator, not done here).
Cost: one forward and backward of the block per iteration, plus the recorded inputs in memory
(``max_calls`` calls of one block, kept as a seeded random sample of all its calls).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Iterator

import torch
from torch import nn

from ..models import swap_layers
from ..nn import QuantLinear
from ..nn.precision import ActMode
from ..runtime.blocks import OBSERVER_ORDER, BlockMethod, attach, detach


def _detached(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


class BlockRecorder(BlockMethod):
    """Keeps a seeded random sample of ``max_calls`` calls (args, kwargs) of block ``index``."""

    order = OBSERVER_ORDER

    def __init__(self, index: int, max_calls: int = 32, seed: int = 0):
        self.index, self.max_calls, self.rng = index, max_calls, random.Random(seed)
        self.calls: list[tuple[tuple, dict]] = []
        self.seen = 0

    def after(self, call, output) -> None:
        if call.index != self.index:
            return
        self.seen += 1
        if len(self.calls) < self.max_calls:
            self.calls.append((_detached(call.args), _detached(call.kwargs)))
        else:  # reservoir sampling: every call equally likely to be kept
            slot = self.rng.randrange(self.seen)
            if slot < self.max_calls:
                self.calls[slot] = (_detached(call.args), _detached(call.kwargs))


def sample_calls(calls: list, max_calls: int, seed: int = 0) -> list:
    """A seeded random sample of at most ``max_calls`` of ``calls``, in their order."""
    if len(calls) <= max_calls:
        return list(calls)
    keep = sorted(random.Random(seed).sample(range(len(calls)), max_calls))
    return [calls[i] for i in keep]


@contextlib.contextmanager
def recording(model: nn.Module, index: int, max_calls: int = 32) -> Iterator[BlockRecorder]:
    """A :class:`BlockRecorder` of block ``index`` attached for the ``with`` body."""
    recorder = BlockRecorder(index, max_calls)
    attach(model, recorder)
    try:
        yield recorder
    finally:
        detach(model, recorder)


@dataclasses.dataclass
class RefineResult:
    """Relative squared error of a block's output (to full precision) before and after, and
    whether the refined branches were kept."""

    block: str
    error_before: float
    error_after: float
    kept: bool
    layers: int


def _outputs(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, torch.Tensor)]
    return [out[0]]


def _error(block: nn.Module, calls, targets) -> torch.Tensor:
    total = 0.0
    for (args, kwargs), target in zip(calls, targets):
        for got, want in zip(_outputs(block(*args, **kwargs)), target):
            total = total + (got.float() - want).pow(2).mean() / want.pow(2).mean().clamp_min(1e-12)
    return total / len(calls)


def refine_block(name: str, block: nn.Module, originals: dict[str, nn.Linear], calls: list[tuple[tuple, dict]],
                 iterations: int, lr: float = 0.002) -> RefineResult:
    """Fit the branches of ``block``'s quantized layers to its full-precision outputs on
    ``calls``. ``originals``: ``{name inside the block: full-precision linear}`` of the quantized
    layers, swapped in to compute the targets. ``lr``: Adam's step as a fraction of each
    factor's RMS."""
    quantized = {n: block.get_submodule(n) for n in originals}
    branched = {n: q for n, q in quantized.items() if isinstance(q, QuantLinear) and q.lowrank_up is not None}
    if not branched or not calls:
        return RefineResult(name, float("nan"), float("nan"), False, 0)
    with torch.no_grad():
        swap_layers(block, originals)
        try:
            targets = [[o.detach().float() for o in _outputs(block(*a, **k))] for a, k in calls]
        finally:
            swap_layers(block, quantized)
    modes = {n: q.act_mode for n, q in quantized.items()}
    stored = {n: (q.lowrank_down, q.lowrank_up) for n, q in branched.items()}
    groups = []
    try:
        for q in quantized.values():
            q.act_mode = ActMode.FP  # weight-only while fitting: differentiable
        for n, q in branched.items():
            down, up = (t.detach().float().clone().requires_grad_(True) for t in stored[n])
            q.lowrank_down, q.lowrank_up = down, up
            groups += [{"params": [t], "lr": lr * float(t.detach().pow(2).mean().sqrt().clamp_min(1e-8))} for t in (down, up)]
        factors = [t for g in groups for t in g["params"]]
        with torch.no_grad():
            before = after = float(_error(block, calls, targets))
        best = [t.detach().clone() for t in factors]
        optimizer = torch.optim.Adam(groups)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(iterations, 1))
        check = max(iterations // 4, 1)  # the error on every recorded call, 4 times: keep the best factors
        with torch.enable_grad():
            for step in range(iterations):
                i = step % len(calls)
                optimizer.zero_grad(set_to_none=True)
                _error(block, calls[i:i + 1], targets[i:i + 1]).backward()
                optimizer.step()
                schedule.step()
                if (step + 1) % check == 0 or step + 1 == iterations:
                    with torch.no_grad():
                        error = float(_error(block, calls, targets))
                    if error < after:
                        after, best = error, [t.detach().clone() for t in factors]
        kept = after < before
        for (n, q), (down_new, up_new) in zip(branched.items(), zip(best[::2], best[1::2])):
            down, up = stored[n]
            if kept:
                q.lowrank_down, q.lowrank_up = down_new.to(down.dtype), up_new.to(up.dtype)
            else:
                q.lowrank_down, q.lowrank_up = down, up
    except BaseException:
        for n, q in branched.items():
            q.lowrank_down, q.lowrank_up = stored[n]
        raise
    finally:
        for n, q in quantized.items():
            q.act_mode = modes[n]
    return RefineResult(name, before, after, kept, len(branched))


__all__ = ["BlockRecorder", "RefineResult", "recording", "refine_block", "sample_calls"]
