"""Static, timestep-aware W8A8: every activation scale computed offline, per time range.

For targets that cannot compute activation ranges at run time (NPUs, phones, integer-only
accelerators). Weights are quantized per output channel (symmetric); activations per tensor
with **static** scales fitted from calibration runs — no min/max is computed while generating.
Static per-tensor scales lose to dynamic per-token ones unless the activation's spread is
tamed, so the method (arXiv 2502.15077, seed 004) combines:

* **time ranges** — steps grouped (default 4 for 20 steps), one parameter set per range,
  Gaussian-smoothed across ranges (σ = 1.5) and optionally interpolated between range centres
  (:mod:`sixbit.calibration.time_ranges`);
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

import dataclasses
import enum
import logging
import re
from typing import Any

from torch import nn

from ..._validate import report, type_problems
from ...calibration import time_ranges as tr
from ...calibration.data import CalibrationData
from ...config import Role, pattern_problems
from ...formats import integer
from ...models import block_index_of, iter_blocks, spec_for, swap_layers
from ...nn import QuantLinear
from ...runtime.context import track_steps
from .fit import fit_layer
from .layers import StaticActQuantizer, StaticW8A8State, install

logger = logging.getLogger(__name__)


class Smoothing(str, enum.Enum):
    """SmoothQuant variant: none, aggregated over all steps (ASQ) or per time range (TSQ)."""

    NONE = "none"
    ASQ = "asq"
    TSQ = "tsq"


class Outliers(str, enum.Enum):
    """Activations beyond ``k·σ``: kept (``none``), clipped, or sent to a 6-bit side path."""

    NONE = "none"
    CLIP = "clip"
    SIDE = "side"


#: The source's α per variant, where the grid search starts (ties go to the nearest value).
ALPHA_START = {Smoothing.ASQ: 0.4, Smoothing.TSQ: 0.2}
DEFAULT_ALPHA_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.625, 0.75)


@dataclasses.dataclass
class StaticW8A8Config:
    """How :func:`apply_static_w8a8` quantizes a model (presets: :meth:`preset`).

    Args:
        smoothing: ``"tsq"`` (default: per-range smoothing, up to one weight per range),
            ``"asq"`` (one smoothing vector, one weight) or ``"none"``.
        alpha: fixed SmoothQuant α, or ``None`` (default) to search ``alpha_grid`` per layer.
        alpha_grid: candidate α values (default 0 … 0.75, including the source's 0.2/0.4/0.625).
        time_ranges: a count (default 4), ``"per_step"`` or explicit ``(first, last)`` pairs.
            More ranges track the statistics better and store more parameters.
        sigma: Gaussian smoothing across ranges, in ranges (default 1.5; 0 disables).
        interpolate: interpolate scales linearly between range centres (default ``False``).
        per_branch: separate scales for the ``cond``/``uncond`` CFG branches (default ``True``).
        outliers: ``"none"`` (default: scale = calibrated abs-max), ``"clip"`` at ``±k_sigma·σ``
            (finer grid, clipped tails) or ``"side"`` (finer grid, tails in a ``side_bits`` path:
            best quality, a second GEMM).
        k_sigma: the outlier threshold in RMS units (default 3).
        side_bits: bits of the outlier side path (default 6).
        weight_bits: weight bits per role (default attention and feed-forward 8; only these
            roles inside the blocks are quantized).
        act_bits: activation bits (2…8), one value or one per time range.
        boundary_blocks: the first and last N blocks use ``boundary_bits`` for weights and
            activations (default 0).
        boundary_bits: bits of those blocks (default 8).
        include, exclude: ``re.fullmatch`` patterns on layer names.
        tsq_min_gain: TSQ stores per-range weights for a layer only if they lower its proxy
            error by this fraction (default 0.05); else one shared (ASQ) weight. 0 keeps
            per-range weights everywhere.
    """

    smoothing: str = "tsq"
    alpha: float | None = None
    alpha_grid: tuple[float, ...] = DEFAULT_ALPHA_GRID
    time_ranges: Any = 4
    sigma: float = 1.5
    interpolate: bool = False
    per_branch: bool = True
    outliers: str = "none"
    k_sigma: float = 3.0
    side_bits: int = 6
    weight_bits: dict[str, int] = dataclasses.field(default_factory=lambda: {"attention": 8, "feedforward": 8})
    act_bits: Any = 8
    boundary_blocks: int = 0
    boundary_bits: int = 8
    include: list[str] = dataclasses.field(default_factory=list)
    exclude: list[str] = dataclasses.field(default_factory=list)
    tsq_min_gain: float = 0.05

    def __post_init__(self):
        problems = type_problems(self)

        def bits_ok(b):
            return isinstance(b, int) and not isinstance(b, bool) and 2 <= b <= 8

        if self.smoothing not in [m.value for m in Smoothing]:
            problems.append(f"smoothing={self.smoothing!r} is not one of {[m.value for m in Smoothing]}")
        if self.outliers not in [m.value for m in Outliers]:
            problems.append(f"outliers={self.outliers!r} is not one of {[m.value for m in Outliers]}")
        if self.alpha is not None and not (isinstance(self.alpha, (int, float)) and 0 <= self.alpha <= 1):
            problems.append(f"alpha must be None (search) or in [0, 1], got {self.alpha!r}")
        self.alpha_grid = tuple(self.alpha_grid)
        if not self.alpha_grid or not all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in self.alpha_grid):
            problems.append(f"alpha_grid must be a non-empty list of values in [0, 1], got {list(self.alpha_grid)}")
        tr_spec = self.time_ranges
        if isinstance(tr_spec, bool) or not (
            (isinstance(tr_spec, int) and tr_spec >= 1) or tr_spec == tr.PER_STEP or isinstance(tr_spec, (list, tuple))
        ):
            problems.append(f"time_ranges must be a count ≥ 1, {tr.PER_STEP!r} or (first, last) pairs; got {tr_spec!r}")
        elif isinstance(tr_spec, (list, tuple)):
            try:
                last = max(int(p[1]) for p in tr_spec)
                tr.group_steps(last + 1, tr_spec)
            except (ValueError, TypeError, IndexError) as e:
                problems.append(f"time_ranges: {e}")
        if not (isinstance(self.sigma, (int, float)) and 0 <= self.sigma < float("inf")):
            problems.append(f"sigma must be a number ≥ 0, got {self.sigma!r}")
        if not (isinstance(self.k_sigma, (int, float)) and self.k_sigma > 0):
            problems.append(f"k_sigma must be > 0, got {self.k_sigma!r}")
        if not bits_ok(self.side_bits):
            problems.append(f"side_bits must be an integer in 2…8, got {self.side_bits!r}")
        valid_roles = [r.value for r in Role]
        for role, bits in self.weight_bits.items():
            if role not in valid_roles:
                problems.append(f"weight_bits has unknown role {role!r} (valid: {valid_roles})")
            if not bits_ok(bits):
                problems.append(f"weight_bits[{role!r}] must be an integer in 2…8, got {bits!r}")
        act = self.act_bits if isinstance(self.act_bits, (list, tuple)) else [self.act_bits]
        if not act or not all(bits_ok(b) for b in act):
            problems.append(f"act_bits must be an integer in 2…8 or a list of them (one per time range), got {self.act_bits!r}")
        elif isinstance(self.act_bits, (list, tuple)):
            self.act_bits = list(self.act_bits)
            count = len(self.time_ranges) if isinstance(self.time_ranges, (list, tuple)) else self.time_ranges
            if isinstance(count, int) and len(self.act_bits) != count:
                problems.append(f"act_bits lists {len(self.act_bits)} values but there are {count} time ranges")
        if not isinstance(self.boundary_blocks, int) or self.boundary_blocks < 0:
            problems.append(f"boundary_blocks must be an integer ≥ 0, got {self.boundary_blocks!r}")
        if not bits_ok(self.boundary_bits):
            problems.append(f"boundary_bits must be an integer in 2…8, got {self.boundary_bits!r}")
        problems += pattern_problems("include", self.include) + pattern_problems("exclude", self.exclude)
        if not (isinstance(self.tsq_min_gain, (int, float)) and 0 <= self.tsq_min_gain <= 1):
            problems.append(f"tsq_min_gain must be in [0, 1], got {self.tsq_min_gain!r}")
        if problems:
            raise ValueError(report("invalid StaticW8A8Config", problems))

    @classmethod
    def preset(cls, name: str, **overrides) -> "StaticW8A8Config":
        """A named configuration (:data:`PRESETS`), with optional field overrides.

        ``w8a8-static`` (= ``w8a8-static-tsq``): TSQ, 4 ranges, 8-bit side path beyond 2σ;
        ``-asq``: one smoothing vector; ``-naive``: one per-tensor scale per layer, nothing
        else; ``-per-step``: one range per step; ``-clip`` / ``-side6``: the source's outlier
        options A (clip at 3σ) and B (6-bit side path); ``-mp``: the source's mixed precision
        (attention W8, feed-forward W6, activations 8/6/6/8 bits, first/last block 8-bit).

        Example:
            >>> StaticW8A8Config.preset("w8a8-static-mp").weight_bits
            {'attention': 8, 'feedforward': 6}
        """
        if name not in PRESETS:
            raise ValueError(f"unknown static W8A8 preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def act_bits_for(self, num_ranges: int) -> list[int]:
        """Activation bits of each of ``num_ranges`` time ranges."""
        if isinstance(self.act_bits, list):
            if len(self.act_bits) != num_ranges:
                raise ValueError(f"act_bits lists {len(self.act_bits)} values for {num_ranges} time ranges")
            return list(self.act_bits)
        return [self.act_bits] * num_ranges

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["alpha_grid"] = list(self.alpha_grid)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StaticW8A8Config":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"invalid StaticW8A8Config:\n  - unknown keys {unknown} (valid: {sorted(fields)})")
        return cls(**data)


#: Named configurations. ``w8a8-static`` is TSQ with 4 time ranges and an 8-bit outlier side
#: path beyond 2σ: on the shipped models the source's 6-bit side path at 3σ left static ~1–2 dB
#: behind dynamic per-token W8A8 (the side path's step ``(amax − 3σ)/31`` is coarse for the heavy
#: post-GELU tails), and clipping at 3σ destroyed the output (those tails carry signal); an 8-bit
#: side path from 2σ matched or beat dynamic. The others are the source's ablations and variants.
PRESETS: dict[str, dict[str, Any]] = {
    "w8a8-static": {"outliers": "side", "side_bits": 8, "k_sigma": 2.0},
    "w8a8-static-tsq": {"outliers": "side", "side_bits": 8, "k_sigma": 2.0},
    "w8a8-static-asq": {"smoothing": "asq", "outliers": "side", "side_bits": 8, "k_sigma": 2.0},
    "w8a8-static-naive": {"smoothing": "none", "time_ranges": 1, "sigma": 0.0, "per_branch": False},
    "w8a8-static-per-step": {"time_ranges": tr.PER_STEP, "outliers": "side", "side_bits": 8, "k_sigma": 2.0},
    "w8a8-static-clip": {"outliers": "clip"},
    "w8a8-static-side6": {"outliers": "side"},
    "w8a8-static-mp": {
        "weight_bits": {"attention": 8, "feedforward": 6},
        "act_bits": [8, 6, 6, 8],
        "boundary_blocks": 1,
        "outliers": "side",
    },
}


def _plan(model: nn.Module, config: StaticW8A8Config, calibration: CalibrationData) -> dict[str, tuple[int, bool]]:
    """``{layer: (weight bits, boundary block?)}`` of the linears to quantize."""
    spec = spec_for(model)
    blocks = {name: idx for idx, name, _, _ in iter_blocks(model, spec)}
    n_blocks = max(blocks.values()) + 1
    plan, already, missing = {}, [], []
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.Linear, QuantLinear)):
            continue
        idx = block_index_of(name, blocks)
        role = spec.role_of(name).value
        if idx is None or role not in config.weight_bits:
            continue
        if config.include and not any(re.fullmatch(p, name) for p in config.include):
            continue
        if any(re.fullmatch(p, name) for p in config.exclude):
            continue
        if isinstance(mod, QuantLinear):
            already.append(name)
            continue
        if name not in calibration.layers:
            missing.append(name)
            continue
        boundary = config.boundary_blocks > 0 and (idx < config.boundary_blocks or idx >= n_blocks - config.boundary_blocks)
        plan[name] = (config.boundary_bits if boundary else config.weight_bits[role], boundary)
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


def apply_static_w8a8(
    model: nn.Module, config: StaticW8A8Config | None = None, calibration: CalibrationData | None = None
) -> nn.Module:
    """Quantize ``model``'s attention and feed-forward linears to static W8A8, in place.

    Args:
        model: a full-precision diffusers transformer (registered in :mod:`sixbit.models`).
        config: a :class:`StaticW8A8Config` (default: the ``"w8a8-static"`` preset).
        calibration: :func:`sixbit.calibrate` statistics of this model (10 varied prompts is
            the source's recipe), recorded with the step count used to generate.

    Every layer is fitted before any is swapped, so an error leaves ``model`` unchanged. The
    model keeps working in its diffusers pipeline and in plain sampling loops (see
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
    steps = calibration.steps
    if not steps:
        raise ValueError("the calibration data holds no steps: calibrate with at least one generation")
    ranges = tr.group_steps(len(steps), config.time_ranges)
    act_bits = config.act_bits_for(len(ranges))
    plan = _plan(model, config, calibration)
    smoothing = Smoothing(config.smoothing)
    k_sigma = None if config.outliers == Outliers.NONE.value else float(config.k_sigma)
    state = StaticW8A8State(
        timesteps=[calibration.timesteps[s] for s in steps],
        ranges=ranges,
        per_branch=config.per_branch,
        config=config.to_dict(),
    )
    built = {}
    for name, (wbits, boundary) in plan.items():
        linear = model.get_submodule(name)
        fit = fit_layer(
            linear.weight, calibration.layers[name], steps, ranges,
            smoothing=smoothing.value, alpha=config.alpha, alpha_grid=config.alpha_grid,
            alpha_start=ALPHA_START.get(smoothing, 0.0), sigma=float(config.sigma),
            interpolate=config.interpolate, per_branch=config.per_branch, k_sigma=k_sigma,
            weight_bits=wbits, act_bits=[config.boundary_bits] * len(ranges) if boundary else act_bits,
            tsq_min_gain=config.tsq_min_gain, name=name,
        )
        divisor0 = None if smoothing is Smoothing.NONE else fit.divisors[0]
        layer = QuantLinear.from_linear(linear, f"int{wbits}", act_mode="int8", input_divisor=divisor0)
        weights = [layer.quantized_weight()] + [
            integer.quantize(linear.weight.detach().float() * d.reshape(1, -1), bits=wbits) for d in fit.divisors[1:]
        ]
        quantizer = StaticActQuantizer(
            state, fit.divisors, weights, fit.threshold, fit.amax, fit.qmax, fit.range_variant,
            side_bits=config.side_bits if config.outliers == Outliers.SIDE.value else None,
        )
        state.layers[name] = {"alpha": fit.alpha, "weight_bits": wbits, "boundary": boundary,
                              "error": fit.error, "error_shared": fit.error_shared}
        built[name] = (layer, quantizer)
    for layer, quantizer in built.values():
        quantizer.attach(layer)
    swap_layers(model, {name: layer for name, (layer, _) in built.items()})
    install(state, track_steps(model))
    logger.info("static W8A8: %d layers, %d time range(s), smoothing %s", len(built), len(ranges), smoothing.value)
    return model
