"""``sixbit.calibrate``: run generations with hooks that record running statistics."""

from __future__ import annotations

import logging
import re
from typing import Callable

import torch
from torch import nn

from ..models import Role, block_index_of, iter_blocks, spec_for
from ..nn import QuantLinear
from ..nn.pointwise_conv import features_last
from ..runtime import blocks
from ..runtime.blocks import relative_l1
from ..runtime.context import StepTracker, track_steps
from ..runtime.wrapped import changes_model
from .data import BlockStats, CalibrationData, LayerStats

logger = logging.getLogger(__name__)

# Layers whose inputs quantized activation paths see: those inside the blocks.
_QUANTIZABLE_ROLES = (Role.ATTENTION, Role.FEEDFORWARD, Role.OTHER)


def _split(x: torch.Tensor, tracker: StepTracker) -> list[tuple[str, torch.Tensor]]:
    """Per-branch slices of a batch-first tensor (batched CFG: uncond half, cond half)."""
    info = tracker.info
    branches = info.batch_branches(x.shape[0]) if x.dim() >= 2 else [info.branch]
    if len(set(branches)) == 1:
        return [(branches[0], x)]
    half = x.shape[0] // 2
    return [(branches[0], x[:half]), (branches[-1], x[half:])]


class _DeltaMemory:
    """Per-run, per-branch: the previous residual of every block (one tensor per block)."""

    def __init__(self):
        self.previous: dict[str, torch.Tensor] = {}


@changes_model("calibrate")
def calibrate(
    model: nn.Module,
    run: Callable[[], object],
    layers: list[str] | None = None,
    batched_cfg: bool | None = None,
) -> CalibrationData:
    """Run ``run()`` (one or more generations) and record activation statistics.

    Recorded per quantizable linear layer × step × CFG branch: per-channel and per-tensor
    abs-max of the inputs, mean ``|x|``, RMS and the 99.9/99.99 % quantiles of ``|x|``; per
    block × step × branch: Γ (relative L1 change input → output) and the step-to-step change
    of the residual Δ. Branches follow :mod:`sixbit.runtime.context`; batched-CFG calls are
    split into their unconditional and conditional halves.

    Args:
        model: the transformer (full precision or already quantized).
        run: a callable that runs generations, e.g. ``lambda: pipe(prompts, num_inference_steps=20, generator=torch.Generator().manual_seed(0))``.
        layers: ``re.fullmatch`` patterns of the layers to record (default: every linear
            inside the blocks except modulation projections).
        batched_cfg: calls made without a diffusers cache context hold both CFG branches in one
            batch (see :class:`~sixbit.runtime.StepTracker`); ``None`` keeps the tracker's setting.

    Example:
        >>> data = sixbit.calibrate(pipe.transformer, lambda: pipe(["a red circle moving right"], generator=torch.Generator().manual_seed(0)))  # doctest: +SKIP
        >>> data.save("calibration.safetensors")                                                  # doctest: +SKIP
    """
    tracker = track_steps(model, batched_cfg)
    tracker.new_generation()
    collector = _Collector(tracker)
    handles = []
    try:
        blocks.attach(model, collector)
        for name, mod in _chosen_layers(model, layers):
            handles.append(mod.register_forward_pre_hook(collector.layer_hook(name)))
        with torch.no_grad():
            run()
    finally:
        blocks.detach(model, collector)
        for h in handles:
            h.remove()
        tracker.new_generation()
    data = collector.data
    data.generations = len(collector.generations)
    if not data.layers and not data.blocks:
        raise ValueError("calibration recorded nothing: `run` never called the model")
    logger.info("calibrated %d layers and %d blocks over %d generation(s)", len(data.layers), len(data.blocks), data.generations)
    return data


def _chosen_layers(model: nn.Module, patterns: list[str] | None) -> list[tuple[str, nn.Module]]:
    """The linears to record: those matching ``patterns``, else the quantizable ones inside blocks."""
    spec = spec_for(model)
    block_names = {name: idx for idx, name, _, _ in iter_blocks(model, spec)}
    chosen = []
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.Linear, QuantLinear)):
            continue
        if patterns is not None:
            keep = any(re.fullmatch(p, name) for p in patterns)
        else:
            keep = block_index_of(name, block_names) is not None and spec.role_of(name) in _QUANTIZABLE_ROLES
        if keep:
            chosen.append((name, mod))
    return chosen


class _Collector(blocks.BlockMethod):
    """Statistics of one calibration: every chosen linear's inputs and every block's residual."""

    def __init__(self, tracker: StepTracker):
        self.tracker = tracker
        self.data = CalibrationData()
        self.generations: set[int] = set()
        self._input: torch.Tensor | None = None

    def note_step(self) -> None:
        info = self.tracker.info
        self.generations.add(info.generation)
        if len(self.generations) == 1:
            self.data.timesteps.setdefault(info.step, info.timestep)

    def layer_hook(self, name: str):
        def hook(module, args):
            self.note_step()
            per = self.data.layers.setdefault(name, {})
            # a conv's features: its channels (× kernel taps, unfolded); the batch stays first
            for branch, x in _split(features_last(module, args[0]), self.tracker):
                key = (self.tracker.info.step, branch)
                if key not in per:
                    per[key] = LayerStats(torch.zeros(x.shape[-1]))
                per[key].update(x)
        return hook

    def before(self, call) -> None:
        x = call.input()
        self._input = None if x is None else x.detach().clone()  # blocks may update their input in place

    def after(self, call, output) -> None:
        x_in, y, self._input = self._input, call.output(output), None
        if x_in is None or y is None or y.shape != x_in.shape:
            return
        self.note_step()
        tracker = self.tracker
        per = self.data.blocks.setdefault(call.name, {})
        for (branch, xb), (_, yb) in zip(_split(x_in, tracker), _split(y.detach(), tracker)):
            stats = per.setdefault((tracker.info.step, branch), BlockStats())
            delta = (yb - xb).float()
            stats.gamma_sum += float(relative_l1(delta.reshape(1, -1), xb.reshape(1, -1)))
            stats.delta_abs_sum += float(delta.abs().mean())
            stats.calls += 1
            memory = tracker.state(_DeltaMemory, _DeltaMemory, branch)
            prev = memory.previous.get(call.name)
            if prev is not None and prev.shape == delta.shape:
                stats.delta_change_sum += float(relative_l1((delta - prev).reshape(1, -1), prev.reshape(1, -1)))
                stats.delta_change_calls += 1
            memory.previous[call.name] = delta
