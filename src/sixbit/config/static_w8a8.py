"""Settings of static, timestep-aware W8A8 (:mod:`sixbit.methods.static_w8a8`) and its named presets."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from .time_ranges import PER_STEP, group_steps
from ..models.roles import Role
from .validate import report, type_problems
from .quant import pattern_problems
from .serialize import Serializable


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


#: The α values the per-layer grid search tries by default (the source's 0.2, 0.4, 0.625 among them).
DEFAULT_ALPHA_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.625, 0.75)


@dataclasses.dataclass
class StaticW8A8Config(Serializable):
    """How :func:`~sixbit.methods.static_w8a8.apply_static_w8a8` quantizes a model (presets: :meth:`preset`).

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
            (isinstance(tr_spec, int) and tr_spec >= 1) or tr_spec == PER_STEP or isinstance(tr_spec, (list, tuple))
        ):
            problems.append(f"time_ranges must be a count ≥ 1, {PER_STEP!r} or (first, last) pairs; got {tr_spec!r}")
        elif isinstance(tr_spec, (list, tuple)):
            try:
                last = max(int(p[1]) for p in tr_spec)
                group_steps(last + 1, tr_spec)
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
    "w8a8-static-per-step": {"time_ranges": PER_STEP, "outliers": "side", "side_bits": 8, "k_sigma": 2.0},
    "w8a8-static-clip": {"outliers": "clip"},
    "w8a8-static-side6": {"outliers": "side"},
    "w8a8-static-mp": {
        "weight_bits": {"attention": 8, "feedforward": 6},
        "act_bits": [8, 6, 6, 8],
        "boundary_blocks": 1,
        "outliers": "side",
    },
}
