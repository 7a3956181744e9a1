"""Build the quantized layers of a model: at once (no calibration), or block by block on
input Hessians recorded from calibration generations (GPTQ, Hessian-weighted scale search).

Sequential mode: the first pass records the inputs of the layers outside the blocks and of
block 0, which are then quantized and swapped in; each later pass records block ``i``'s inputs
from the model whose blocks before ``i`` are already quantized, so GPTQ corrects the error those
blocks pass on. With ``calibration_inputs="full_precision"`` each block's layers are put back to
full precision once built (and refined), and all are swapped in at the end: every pass sees the
unchanged model. Only one block's Hessians are held at a time (``K × K`` fp64 sums per layer).
One calibration run per block: the price of the method, paid once at conversion.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable

import torch
from torch import nn

from .. import formats
from ..calibration import hessians
from ..config import QuantConfig
from ..models import block_index_of, iter_blocks, swap_layers
from ..nn import QuantLinear
from ..transforms import hadamard, smoothquant
from . import quantize_weight, refine, supports

logger = logging.getLogger(__name__)

# Formats of at most this many bits per element get the low-rank branch (8-bit ones need none).
_BRANCH_MAX_BITS = 4


def build(linear: nn.Linear, fmt: str, hadamard_block: int | None, config: QuantConfig, role: str,
          stats: hessians.InputStats | None = None) -> QuantLinear:
    """The :class:`QuantLinear` for ``linear`` as ``config`` says (``stats``: its inputs, or ``None``)."""
    weight_only = role in config.weight_only_roles
    # The branch goes on the 4-bit compute layers. Measured on the shipped CogVideoX (W4A16, GPTQ +
    # MSE scales, 4 held-out pairs): a branch on the weight-only modulation layers too cost 4.4 dB.
    branched = formats.get(fmt).element_bits <= _BRANCH_MAX_BITS and not weight_only
    rank = config.lowrank_rank_for(linear.in_features, linear.out_features) if branched else 0
    divisor = None
    if rank and config.smooth_alpha is not None and stats is not None:
        divisor = smoothquant.smoothing_factors(stats.amax, smoothquant.weight_channel_amax(linear.weight),
                                                config.smooth_alpha)
        hadamard_block = None  # smoothing replaces the rotation
    w = QuantLinear.stored_weight(linear, hadamard_block, divisor)
    hessian = None
    if stats is not None:
        hessian = stats.hessian
        if hadamard_block is not None:  # the stored space: (x·R)ᵀ(x·R) = Rᵀ H R
            hessian = hadamard.rotate(hadamard.rotate(hessian, hadamard_block).T.contiguous(), hadamard_block)
        if divisor is not None:  # (x / s)ᵀ(x / s)
            hessian = hessian / torch.outer(divisor, divisor)
    searchable = supports(fmt)
    use_gptq = config.gptq and searchable and hessian is not None
    q, branch = quantize_weight(
        w, fmt, config.scale_rule if searchable else "absmax", hessian, use_gptq,
        config.gptq_damp, rank, config.lowrank_iterations,
    )
    return QuantLinear(q, fmt, linear.bias, hadamard_block, config.act_mode, source_dtype=linear.weight.dtype,
                       input_divisor=divisor, lowrank=branch, weight_only=weight_only)


def quantize_layers(model: nn.Module, plan: dict[str, tuple[str, int | None, str]], config: QuantConfig,
                    run: Callable[[], object] | None = None, progress: bool = True) -> None:
    """Replace the planned layers (``{name: (format, hadamard block, role)}``) of ``model``.

    Without calibration every layer is built before any is swapped in. With ``run`` (needed
    when ``config.needs_calibration``), layers are built and swapped in block by block; if
    anything fails, every original layer is put back before the error propagates.
    """
    from tqdm.auto import tqdm

    if config.needs_calibration and run is None:
        raise ValueError("this QuantConfig needs calibration (gptq=True or smooth_alpha): "
                         "pass calibration=<callable that runs generations>")
    bar = tqdm(total=len(plan), desc="quantizing weights", disable=not progress, leave=False)
    if run is None:
        new = {}
        for name, (fmt, hb, role) in plan.items():
            new[name] = build(model.get_submodule(name), fmt, hb, config, role)
            bar.update()
        swap_layers(model, new)
        bar.close()
        return
    found = list(iter_blocks(model))
    blocks = {name: idx for idx, name, _, _ in found}
    groups: dict[int, list[str]] = {}
    for name in plan:  # layers outside the blocks go with block 0 (the first pass)
        groups.setdefault(block_index_of(name, blocks) or 0, []).append(name)
    originals = {name: model.get_submodule(name) for name in plan}
    sequential = config.calibration_inputs == "quantized"
    built: dict[str, nn.Module] = {}
    start, peak = time.perf_counter(), 0
    refined: list[refine.RefineResult] = []
    try:
        for idx in sorted(groups):
            names = groups[idx]
            # refinement needs the block's inputs: recorded in the same run (None without refinement)
            recording = refine.recording(model, idx, config.refine_calls) if config.refine_steps else contextlib.nullcontext()
            with recording as recorder:
                stats = hessians.collect(model, run, {n: originals[n] for n in names})
            unused = [n for n in names if n not in stats]
            if unused:
                logger.warning("calibration never ran %d layer(s) (e.g. %s): rounded without GPTQ", len(unused), unused[0])
            peak = max(peak, sum(s.hessian.numel() * 12 for s in stats.values()))  # fp64 sums + fp32 means
            new = {}
            for name in names:
                fmt, hb, role = plan[name]
                new[name] = build(originals[name], fmt, hb, config, role, stats.get(name))
                bar.update()
            swap_layers(model, new)
            del stats
            if recorder is not None and idx < len(found):
                _, block_name, block, _ = found[idx]
                inside = {n[len(block_name) + 1:]: originals[n] for n in names if n.startswith(block_name + ".")}
                result = refine.refine_block(block_name, block, inside, recorder.calls, config.refine_steps)
                refined.append(result)
                logger.info("refined the low-rank branches of %s (%d layers): output error %.3g -> %.3g (%s)",
                            block_name, result.layers, result.error_before, result.error_after,
                            "kept" if result.kept else "discarded: no better")
            built.update(new)
            if not sequential:  # the next blocks' inputs come from the unchanged model
                swap_layers(model, {n: originals[n] for n in names})
        swap_layers(model, built)
    except BaseException:
        swap_layers(model, originals)
        raise
    finally:
        bar.close()
    logger.info("calibrated weight quantization of %d layers in %d passes: %.1f s, Hessians ≤ %.1f MiB at a time",
                len(plan), len(groups), time.perf_counter() - start, peak / 2**20)
    if refined:
        kept = [r for r in refined if r.kept]
        logger.info("refinement kept in %d of %d blocks; mean block output error %.3g -> %.3g", len(kept),
                    len(refined), sum(r.error_before for r in refined) / len(refined),
                    sum(min(r.error_before, r.error_after) for r in refined) / len(refined))
