"""``sixbit.quantize``: a model in memory gets its linear layers swapped for ``QuantLinear`` s,
at once (no calibration), or block by block on input Hessians recorded from calibration
generations (GPTQ, Hessian-weighted scale search).

Calibrated: the generations run once, recording the inputs of the layers outside the blocks
and of the first block, and every call's inputs to that block
(:mod:`sixbit.builder.block_inputs`). Each block is then quantized from the Hessians of a
replay of those inputs, and (``calibration_inputs="quantized"``, the default) the *quantized*
block's outputs become the next block's inputs, so GPTQ corrects the error the blocks before it
pass on; with ``"full_precision"`` the full-precision block's outputs do, each block's layers go
back to full precision once built (and refined), and all are swapped in at the end. The cost
is one generation run plus two block calls per kept call and block. Where the inputs cannot be
kept (more than one block list, a model that changes the hidden states between its blocks, or
more than a quarter of the device's memory), the generations run once per block instead, each
on the model whose blocks before it are quantized. Only one block's Hessians are held at a time
(``K × K`` fp64 sums per layer).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from ..calibration import hessians
from .block_inputs import BlockInputs, default_budget, keeping
from ..config import QuantConfig
from ..lora import check_no_loras
from ..memory import allocator
from ..memory.weights import check_not_offloaded
from ..models import iter_blocks
from ..rounding import refine
from ..runtime.wrapped import check_not_wrapped
from .layers import check_plan, plan_layers, quantized_linear
from .swap import LayerSwap, Part, Recipe, build, parts_of

logger = logging.getLogger(__name__)

Plan = dict[str, tuple[str, int | None, str]]  # {layer: (format, hadamard block, role)}


class _Layers(Recipe):
    """Every planned layer rounded as ``config`` says, from its input statistics if any."""

    releases_originals = True

    def __init__(self, plan: Plan, config: QuantConfig, bar):
        self.plan, self.config, self.bar = plan, config, bar

    def layer(self, name: str, original: nn.Module, stats) -> nn.Module:
        fmt, hb, role = self.plan[name]
        self.bar.update()
        layer = quantized_linear(original, fmt, hb, self.config, role, stats, name=name)
        allocator.trim()  # the layer's temporaries: glibc keeps them otherwise, and they add up layer after layer
        return layer


class _Calibrated(_Layers):
    """Statistics from the calibration run, then from replays of the first block's kept inputs
    (or from a run per part, where they cannot be kept); refinement of each block's low-rank
    branches."""

    def __init__(self, model: nn.Module, plan: Plan, config: QuantConfig, run: Callable[[], object], bar, last: int):
        super().__init__(plan, config, bar)
        self.model, self.run, self.last = model, run, last  # last: the index of the last block built
        self.sequential = config.calibration_inputs == "quantized"
        self.releases_originals = self.sequential  # otherwise the originals run every later pass
        self.blocks = [block for _, _, block, _ in iter_blocks(model)]
        self.built_layers: dict[str, nn.Module] = {}
        self.kept: BlockInputs | None = None  # the next block's inputs, once the first run kept them
        self.recorder = None  # refinement's block inputs from a run (None: from the kept calls, or no refinement)
        self.block_calls: list = []  # the block's kept inputs, for refinement
        self.refined: list[refine.RefineResult] = []
        self.peak = 0
        self.passes = 0

    def inputs(self, part: Part) -> dict[str, object]:
        layers = {n: self.model.get_submodule(n) for n in part.layers}
        stats = self._generated(part, layers) if self.kept is None else self._replayed(part, layers)
        unused = [n for n in part.layers if n not in stats]
        if unused:
            logger.warning("calibration never ran %d layer(s) (e.g. %s): rounded without GPTQ", len(unused), unused[0])
        self.peak = max(self.peak, sum(s.hessian.numel() * 12 for s in stats.values()))  # fp64 sums + fp32 means
        return stats

    def _generated(self, part: Part, layers: dict) -> dict[str, object]:
        """A calibration run; the first also keeps the block's inputs."""
        config = self.config
        recording = refine.recording(self.model, part.index, config.refine_calls) if config.refine_steps \
            else contextlib.nullcontext()
        first = self.passes == 0
        keep = keeping(self.model, part.index, default_budget(self.model)) if first else contextlib.nullcontext()
        with recording as self.recorder, keep as kept:
            stats = hessians.collect(self.model, self.run, layers)
        self.passes += 1
        if first and kept.problem is None:
            self.kept = kept
            if not self.sequential:  # the next block's inputs: this full-precision block's outputs
                self.block_calls = list(kept.calls)
                kept.replay(part.module, advance=True)
            logger.info("calibration: %d calls to the first block kept (%.1f MiB); each block replays them",
                        len(kept.calls), kept.nbytes / 2**20)
        elif first:
            logger.info("calibration: %s, so the generations run once per block", kept.problem)
        return stats

    def _replayed(self, part: Part, layers: dict) -> dict[str, object]:
        """The block's statistics from a replay of the kept inputs."""
        kept = self.kept
        while kept.index < part.index:  # blocks without planned layers run as they are
            kept.replay(self.blocks[kept.index], advance=True)
        self.recorder, self.block_calls = None, list(kept.calls)
        return hessians.collect(part.module, lambda: kept.replay(part.module, advance=not self.sequential), layers)

    def built(self, part: Part, layers: dict[str, nn.Module], swap: LayerSwap) -> None:
        config = self.config
        if config.refine_steps:
            prefix = part.name + "."
            inside = {n[len(prefix):]: swap.original(n) for n in part.layers if n.startswith(prefix)}
            calls = self.recorder.calls if self.recorder is not None else \
                refine.sample_calls(self.block_calls, config.refine_calls)
            result = refine.refine_block(part.name, part.module, inside, calls, config.refine_steps)
            self.refined.append(result)
            logger.info("refined the low-rank branches of %s (%d layers): output error %.3g -> %.3g (%s)",
                        part.name, result.layers, result.error_before, result.error_after,
                        "kept" if result.kept else "discarded: no better")
        self.built_layers.update(layers)
        if self.sequential and self.kept is not None and part.index < self.last:  # its outputs feed the next one
            self.kept.replay(part.module, advance=True)
        if not self.sequential:  # the next blocks' inputs come from the unchanged model
            swap.put_back(part.layers)

    def finish(self, swap: LayerSwap) -> None:
        swap.put(self.built_layers)

    def log(self, layers: int, seconds: float) -> None:
        logger.info("calibrated weight quantization of %d layers with %d calibration run(s): %.1f s, "
                    "Hessians ≤ %.1f MiB at a time", layers, self.passes, seconds, self.peak / 2**20)
        refined = self.refined
        if refined:
            kept = [r for r in refined if r.kept]
            logger.info("refinement kept in %d of %d blocks; mean block output error %.3g -> %.3g", len(kept),
                        len(refined), sum(r.error_before for r in refined) / len(refined),
                        sum(min(r.error_before, r.error_after) for r in refined) / len(refined))


def quantize_layers(model: nn.Module, plan: Plan, config: QuantConfig, run: Callable[[], object] | None = None,
                    progress: bool = True) -> None:
    """Replace the planned layers (``{name: (format, hadamard block, role)}``) of ``model``.

    Without ``run`` every layer is built from its weight alone. With ``run`` (needed when
    ``config.needs_calibration``), block by block from calibration statistics. Either way
    through :func:`~sixbit.builder.swap.build`: if anything fails, every original layer is put
    back before the error propagates.
    """
    if config.needs_calibration and run is None:
        raise ValueError("this QuantConfig needs calibration (gptq=True or smooth_alpha): "
                         "pass calibration=<callable that runs generations>")
    with tqdm(total=len(plan), desc="quantizing weights", disable=not progress, leave=False) as bar:
        if run is None:
            build(model, parts_of(model, plan, outside_alone=False), _Layers(plan, config, bar))
            return
        start = time.perf_counter()
        parts = parts_of(model, plan, outside_alone=False)
        recipe = _Calibrated(model, plan, config, run, bar, parts[-1].index)
        build(model, parts, recipe)
    recipe.log(len(plan), time.perf_counter() - start)


def quantize(model: nn.Module, config: QuantConfig | None = None, calibration: Callable[[], object] | None = None,
             progress: bool = True) -> nn.Module:
    """Replace ``model``'s linear layers by packed :class:`~sixbit.nn.QuantLinear` s, in place.

    Layers are chosen by role (from the model's registered metadata, see
    :mod:`sixbit.models`), by ``include``/``exclude`` patterns and by block position, as
    described in :class:`~sixbit.QuantConfig`; its weight algorithms (scale search, GPTQ, the
    low-rank branch) run here, once (:mod:`sixbit.rounding`). An error leaves the model
    unchanged; a model with a LoRA loaded (sixbit's or PEFT's) is refused (:func:`sixbit.lora.check_no_loras`).
    The model keeps working inside its diffusers pipeline. Returns ``model``.

    Args:
        model: the transformer.
        config: the :class:`~sixbit.QuantConfig` (default: NVFP4 attention and feed-forward).
        calibration: a callable that runs generations with ``model`` (e.g.
            ``lambda: pipe(prompts, num_inference_steps=20, generator=torch.Generator().manual_seed(0))``), needed when ``config.gptq``:
            it is run once, and each block's input Hessians come from replaying the first
            block's inputs (once per block where they cannot be kept: see the module doc).
        progress: show a progress bar over the layers (default ``True``).

    Example:
        >>> import torch, sixbit
        >>> from diffusers import CogVideoXTransformer3DModel
        >>> model = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=16,
        ...     in_channels=4, time_embed_dim=32, text_embed_dim=32, num_layers=2, sample_width=8,
        ...     sample_height=8, sample_frames=9)
        >>> model = sixbit.quantize(model, sixbit.QuantConfig(weight_format="nvfp4"))
        >>> sixbit.summary(model).compression > 3
        True
    """
    config = config or QuantConfig()
    if not isinstance(config, QuantConfig):
        raise ValueError(f"config must be a sixbit.QuantConfig, got {type(config).__name__}")
    check_not_wrapped(model, "quantize the model")  # as convert_model (sixbit.preflight): its layers are cut and hooked
    check_no_loras(model, "sixbit.quantize")
    check_not_offloaded(model, "sixbit.quantize")  # it would quantize the offload's placeholders
    check_plan(model, config)  # a call that would quantize nothing is refused, naming why
    plan = plan_layers(model, config)
    quantize_layers(model, plan, config, calibration if config.needs_calibration else None, progress)
    logger.info("quantized %d linear layers of %s", len(plan), type(model).__name__)
    return model
