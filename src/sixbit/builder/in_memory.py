"""``sixbit.quantize``: a model in memory gets its linear layers swapped for ``QuantLinear`` s,
at once (no calibration), or block by block on input Hessians recorded from calibration
generations (GPTQ, Hessian-weighted scale search).

Calibrated: the first pass records the inputs of the layers outside the blocks and of block 0,
which are then quantized and swapped in; each later pass records block ``i``'s inputs from the
model whose blocks before ``i`` are already quantized, so GPTQ corrects the error those blocks
pass on. With ``calibration_inputs="full_precision"`` each block's layers are put back to full
precision once built (and refined), and all are swapped in at the end: every pass sees the
unchanged model. Only one block's Hessians are held at a time (``K × K`` fp64 sums per layer).
One calibration run per block: the price of the method, paid once at conversion.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from torch import nn
from tqdm.auto import tqdm

from ..calibration import hessians
from ..config import QuantConfig
from ..memory import allocator
from ..rounding import refine
from .layers import plan_layers, quantized_linear
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
        layer = quantized_linear(original, fmt, hb, self.config, role, stats)
        allocator.trim()  # the layer's temporaries: glibc keeps them otherwise, and they add up layer after layer
        return layer


class _Calibrated(_Layers):
    """Statistics from a calibration run per part; refinement of each block's low-rank branches."""

    def __init__(self, model: nn.Module, plan: Plan, config: QuantConfig, run: Callable[[], object], bar):
        super().__init__(plan, config, bar)
        self.model, self.run = model, run
        self.sequential = config.calibration_inputs == "quantized"
        self.releases_originals = self.sequential  # otherwise the originals run every later pass
        self.built_layers: dict[str, nn.Module] = {}
        self.recorder = None
        self.refined: list[refine.RefineResult] = []
        self.peak = 0

    def inputs(self, part: Part) -> dict[str, object]:
        # refinement needs the block's inputs: recorded in the same run (None without refinement)
        config = self.config
        recording = refine.recording(self.model, part.index, config.refine_calls) if config.refine_steps \
            else contextlib.nullcontext()
        with recording as self.recorder:
            stats = hessians.collect(self.model, self.run, {n: self.model.get_submodule(n) for n in part.layers})
        unused = [n for n in part.layers if n not in stats]
        if unused:
            logger.warning("calibration never ran %d layer(s) (e.g. %s): rounded without GPTQ", len(unused), unused[0])
        self.peak = max(self.peak, sum(s.hessian.numel() * 12 for s in stats.values()))  # fp64 sums + fp32 means
        return stats

    def built(self, part: Part, layers: dict[str, nn.Module], swap: LayerSwap) -> None:
        if self.recorder is not None:
            prefix = part.name + "."
            inside = {n[len(prefix):]: swap.original(n) for n in part.layers if n.startswith(prefix)}
            result = refine.refine_block(part.name, part.module, inside, self.recorder.calls, self.config.refine_steps)
            self.refined.append(result)
            logger.info("refined the low-rank branches of %s (%d layers): output error %.3g -> %.3g (%s)",
                        part.name, result.layers, result.error_before, result.error_after,
                        "kept" if result.kept else "discarded: no better")
        self.built_layers.update(layers)
        if not self.sequential:  # the next blocks' inputs come from the unchanged model
            swap.put_back(part.layers)

    def finish(self, swap: LayerSwap) -> None:
        swap.put(self.built_layers)

    def log(self, layers: int, passes: int, seconds: float) -> None:
        logger.info("calibrated weight quantization of %d layers in %d passes: %.1f s, Hessians ≤ %.1f MiB at a time",
                    layers, passes, seconds, self.peak / 2**20)
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
        recipe = _Calibrated(model, plan, config, run, bar)
        build(model, parts, recipe)
    recipe.log(len(plan), len(parts), time.perf_counter() - start)


def quantize(model: nn.Module, config: QuantConfig | None = None, calibration: Callable[[], object] | None = None,
             progress: bool = True) -> nn.Module:
    """Replace ``model``'s linear layers by packed :class:`~sixbit.nn.QuantLinear` s, in place.

    Layers are chosen by role (from the model's registered metadata, see
    :mod:`sixbit.models`), by ``include``/``exclude`` patterns and by block position, as
    described in :class:`~sixbit.QuantConfig`; its weight algorithms (scale search, GPTQ, the
    low-rank branch) run here, once (:mod:`sixbit.rounding`). An error leaves the model
    unchanged. The model keeps working inside its diffusers pipeline. Returns ``model``.

    Args:
        model: the transformer.
        config: the :class:`~sixbit.QuantConfig` (default: NVFP4 attention and feed-forward).
        calibration: a callable that runs generations with ``model`` (e.g.
            ``lambda: pipe(prompts, num_inference_steps=20, generator=torch.Generator().manual_seed(0))``), needed when ``config.gptq``:
            it is run once per transformer block to record the layers' input Hessians.
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
    plan = plan_layers(model, config)
    quantize_layers(model, plan, config, calibration if config.needs_calibration else None, progress)
    logger.info("quantized %d linear layers of %s", len(plan), type(model).__name__)
    return model
