"""Static, timestep-aware W8A8: every activation scale computed offline, per time range.

For targets that cannot compute activation ranges at run time (NPUs, phones, integer-only
accelerators). Weights are quantized per output channel (symmetric); activations per tensor
with **static** scales fitted from calibration runs — no min/max is computed while generating.
Static per-tensor scales lose to dynamic per-token ones unless the activation's spread is
tamed, so the method (arXiv 2502.15077, seed 004) combines:

* **time ranges** — steps grouped (default 4 for 20 steps), one parameter set per range,
  Gaussian-smoothed across ranges (σ = 1.5) and optionally interpolated between range centres
  (:mod:`sixbit.config.time_ranges`);
* **SmoothQuant folded into the weights** — ``s`` aggregated over all steps (ASQ: one weight)
  or per time range (TSQ: one weight per range whose ``s`` differs, stored only where the proxy
  error improves by ``tsq_min_gain``); α searched per layer on the calibration statistics;
* **per-branch scales** for the conditional / unconditional CFG branches (batched CFG: the
  unconditional first half and conditional second half of the batch use their own scales);
* **outliers** clipped at ``±k·σ`` or kept in a 6-bit side path (a second int8 GEMM);
* **mixed precision** — weight bits per role, activation bits per time range, first/last
  blocks at ``boundary_bits``.

Execution is real: activation codes (≤ 8 bits) and weight codes (≤ 8 bits) are int8 values
multiplied by ``torch._int_mm`` with int32 accumulation; 6-bit codes simply use fewer levels of
the int8 container. Parameters are selected once per transformer call from the step tracker
(:func:`~sixbit.runtime.track_steps`; the runtime step is matched to the nearest calibrated
timestep). Checkpoints carry every parameter
(:mod:`sixbit.checkpoint` extension ``"static_w8a8"``): a loaded model needs no calibration.

Example:
    >>> import sixbit                                                          # doctest: +SKIP
    >>> data = sixbit.calibrate(pipe.transformer, lambda: pipe(prompts, generator=torch.Generator().manual_seed(0)))       # doctest: +SKIP
    >>> cfg = sixbit.StaticW8A8Config.preset("w8a8-static")                   # doctest: +SKIP
    >>> sixbit.apply_static_w8a8(pipe.transformer, cfg, data)                 # doctest: +SKIP
    >>> video = pipe("a red circle moving right").frames                      # doctest: +SKIP
"""

from __future__ import annotations

import logging

from torch import nn

from ...config import time_ranges as tr
from ...calibration.data import CalibrationData
from ...config.static_w8a8 import Outliers, Smoothing, StaticW8A8Config
from ...formats import integer
from ...builder import LayerSwap, Part, Recipe, build, parts_of, selected_layers
from ...nn import QuantLinear
from ...runtime.context import track_steps
from ...runtime.wrapped import check_not_wrapped
from .fit import fit_layer
from .layers import StaticActQuantizer, StaticW8A8State, install

logger = logging.getLogger(__name__)

#: The source's α per variant, where the grid search starts (ties go to the nearest value).
ALPHA_START = {Smoothing.ASQ: 0.4, Smoothing.TSQ: 0.2}


def _plan(model: nn.Module, config: StaticW8A8Config, calibration: CalibrationData) -> dict[str, tuple[int, bool]]:
    """``{layer: (weight bits, boundary block?)}`` of the linears to quantize: the builder's layer
    selection (:func:`sixbit.builder.selected_layers`), within the blocks, for the roles
    ``weight_bits`` names. Its layers are ``nn.Linear``: a conv the selection finds stays in full
    precision, said once in the log."""
    plan, already, missing, convs = {}, [], [], []
    found = selected_layers(model, config.include, config.exclude, config.boundary_blocks, quantized=True)
    for name, mod, role, idx, boundary in found:
        if idx is None or role.value not in config.weight_bits:
            continue
        if not isinstance(mod, (nn.Linear, QuantLinear)):
            convs.append(name)
            continue
        if isinstance(mod, QuantLinear):
            already.append(name)
            continue
        if name not in calibration.layers:
            missing.append(name)
            continue
        plan[name] = (config.boundary_bits if boundary else config.weight_bits[role.value], boundary)
    if convs:
        logger.info("static W8A8 quantizes linear layers: the convolutions %s stay in full precision", convs[:5])
    if already:
        raise ValueError(
            f"apply_static_w8a8 needs full-precision nn.Linear layers (SmoothQuant is folded before the weight "
            f"is quantized), but {already[:5]} are already QuantLinear; apply it to the unquantized model"
        )
    if missing:
        raise ValueError(
            f"no calibration statistics for {missing[:5]} ({len(missing)} layers): run "
            "sixbit.calibrate(model, run) on this model (in full precision) and pass its result"
        )
    if not plan:
        raise ValueError("apply_static_w8a8 found no layer to quantize: check weight_bits roles and include/exclude")
    return plan


class _StaticLayers(Recipe):
    """Each planned linear fitted on its calibration statistics (time ranges, smoothing,
    outliers) and built with its :class:`StaticActQuantizer`; the step policy installed last."""

    def __init__(self, model: nn.Module, config: StaticW8A8Config, calibration: CalibrationData):
        self.model, self.config, self.calibration = model, config, calibration
        self.steps = calibration.steps
        self.ranges = tr.group_steps(len(self.steps), config.time_ranges)
        self.act_bits = config.act_bits_for(len(self.ranges))
        self.plan = _plan(model, config, calibration)
        self.smoothing = Smoothing(config.smoothing)
        self.k_sigma = None if config.outliers == Outliers.NONE.value else float(config.k_sigma)
        self.state = StaticW8A8State(
            timesteps=[calibration.timesteps[s] for s in self.steps],
            ranges=self.ranges,
            per_branch=config.per_branch,
            config=config.to_dict(),
        )
        self.info: dict[str, dict] = {}

    def inputs(self, part: Part) -> dict[str, object]:
        return {name: self.calibration.layers[name] for name in part.layers}

    def layer(self, name: str, linear: nn.Module, stats) -> nn.Module:
        config, smoothing = self.config, self.smoothing
        wbits, boundary = self.plan[name]
        fit = fit_layer(
            linear.weight, stats, self.steps, self.ranges,
            smoothing=smoothing.value, alpha=config.alpha, alpha_grid=config.alpha_grid,
            alpha_start=ALPHA_START.get(smoothing, 0.0), sigma=float(config.sigma),
            interpolate=config.interpolate, per_branch=config.per_branch, k_sigma=self.k_sigma,
            weight_bits=wbits, act_bits=[config.boundary_bits] * len(self.ranges) if boundary else self.act_bits,
            tsq_min_gain=config.tsq_min_gain, name=name,
        )
        divisor0 = None if smoothing is Smoothing.NONE else fit.divisors[0]
        layer = QuantLinear.from_linear(linear, f"int{wbits}", act_mode="int8", input_divisor=divisor0)
        weights = [layer.quantized_weight()] + [
            integer.quantize(linear.weight.detach().float() * d.reshape(1, -1), bits=wbits) for d in fit.divisors[1:]
        ]
        quantizer = StaticActQuantizer(
            self.state, fit.divisors, weights, fit.threshold, fit.amax, fit.qmax, fit.range_variant,
            side_bits=config.side_bits if config.outliers == Outliers.SIDE.value else None,
        )
        quantizer.attach(layer)
        self.info[name] = {"alpha": fit.alpha, "weight_bits": wbits, "boundary": boundary,
                           "error": fit.error, "error_shared": fit.error_shared}
        return layer

    def finish(self, swap: LayerSwap) -> None:
        self.state.layers.update((name, self.info[name]) for name in self.plan)  # in plan order
        install(self.state, track_steps(self.model))


def apply_static_w8a8(
    model: nn.Module, config: StaticW8A8Config | None = None, calibration: CalibrationData | None = None
) -> nn.Module:
    """Quantize ``model``'s attention and feed-forward linears to static W8A8, in place.

    Args:
        model: a full-precision diffusers transformer (registered in :mod:`sixbit.models`).
        config: a :class:`StaticW8A8Config` (default: the ``"w8a8-static"`` preset).
        calibration: :func:`sixbit.calibrate` statistics of this model (10 varied prompts is
            the source's recipe), recorded with the step count used to generate.

    Layers are fitted and swapped in block by block (:func:`sixbit.builder.build`); an error
    puts every original layer back, so it leaves ``model`` unchanged. The model keeps working
    in its diffusers pipeline and in plain sampling loops (see
    :func:`~sixbit.runtime.track_steps` for how calls are mapped to steps and branches).
    Returns ``model``; :func:`static_w8a8_info` reports what was chosen.
    """
    config = config or StaticW8A8Config.preset("w8a8-static")
    if not isinstance(config, StaticW8A8Config):
        raise ValueError(f"config must be a sixbit.StaticW8A8Config, got {type(config).__name__}")
    if not isinstance(calibration, CalibrationData):
        raise ValueError(
            f"calibration must be sixbit.calibrate(...)'s CalibrationData, got {type(calibration).__name__}"
        )
    if not calibration.steps:
        raise ValueError("the calibration data holds no steps: calibrate with at least one generation")
    check_not_wrapped(model, "apply static W8A8 to the model")  # a conversion: as convert_model (sixbit.preflight)
    recipe = _StaticLayers(model, config, calibration)
    build(model, parts_of(model, recipe.plan, outside_alone=False), recipe)
    logger.info("static W8A8: %d layers, %d time range(s), smoothing %s", len(recipe.plan), len(recipe.ranges),
                recipe.smoothing.value)
    return model
