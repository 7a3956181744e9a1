"""Settings of the delta cache (:mod:`sixbit.methods.delta_cache`): which block calls may skip."""

from __future__ import annotations

import dataclasses

from .validate import report, type_problems
from .serialize import Serializable

#: How cached residuals are stored: full precision, INT8 per token, or 4-bit groups of 64.
CACHE_FORMATS = ("fp", "int8", "int4-g64")


@dataclasses.dataclass
class DeltaCacheConfig(Serializable):
    """Settings of the delta cache.

    One knob sets how much it skips: ``error_budget``. The cache adds up an error estimate for
    the skips since a block's last compute (each skip: the residuals' measured per-step relative
    change times the square of the cached residual's age in steps, ``age_exponent``) and computes again before the
    sum would pass the budget. A larger budget never skips less, and on both shipped models PSNR
    never rose with it (BENCHMARKS ``cache-pareto``): pick it by speed, or let ``min_psnr`` pick it.

    Args:
        error_budget: the knob (τ, default 1.0: half of the block calls skipped on both shipped
            models at 20 steps). 0 skips nothing; larger: more skips, faster, less exact.
        min_psnr: calibrate instead (dB): :func:`sixbit.convert_model` tries budgets on the
            calibration data and keeps the fastest whose videos reach ``min_psnr`` against the
            uncached full-precision model (with the conversion's quantization, so the target holds
            for the combined model), and caps the share of steps skipped at what they skipped
            (``max_skip_share``). ``None`` (default): use ``error_budget`` as given.
        calibrated: what that calibration chose and measured (written by it, stored in
            checkpoints; ``None`` until then).
        threshold: optional extra gate: a step whose stability passes it computes (``None``,
            default: the budget alone decides). Seed configs' ``threshold`` sets it.
        max_skips: optional cap on consecutive skips (``None``, default: the budget alone decides).
        max_skip_share: optional cap on the share of a run's steps that skip (``None``, default).
            A ``min_psnr`` calibration sets it to the most its calibration runs skipped at the
            budget it chose, so an unseen prompt (or a smaller batch, where fewer samples' worst
            stability decides) never skips more steps than the videos the target was measured on.
        warmup_steps: first steps always computed (default 2; two are needed to measure stability).
        warmup_fraction: when the pipeline says how many steps it runs, at least this share of
            them is warm-up too (default 0.2, as MagCache's ``retention_ratio``): a skip in the
            first steps costs 10–100× one in the middle of the run on the shipped models.
        final_steps: last steps always computed when the number of steps is known (default 1).
        final_fraction: and at least this share of the steps at the end (default 0: only
            ``final_steps``; 0.1 until ``tail_fraction`` replaced it, see the method's module doc).
        tail_fraction: in this share of the steps at the end (default 0.1), a step skips only
            right after a computed one: a replay there is one step old at most, because nothing
            after it corrects a longer streak's error.
        drift: share of the residual's measured per-step change added to a replay, times its
            age (default 0.7; 0 replays the cached residual unchanged).
        age_exponent: a skip's error estimate is its stability times its age to this power
            (default 2; configs stored before issue 62 load with 1, the rule they ran with).
        decide_per_block: each block decides alone from its own stability instead of all
            blocks skipping the same steps (default False; measured worse, see the module doc).
        cache_format: ``"fp"`` (default), ``"int8"`` (per-token, ~¼ of fp32 memory) or
            ``"int4-g64"`` (the seed's 4-bit residuals, ~⅛).
        pdr: purify refreshes of quantized blocks (default True; no effect on FP models).
        pdr_outlier_ratio: input ``max|X| / mean|X|`` above which a linear refreshes in full
            precision (default 25).
    """

    # the order of the dict form written before min_psnr and final_fraction (see to_dict)
    threshold: float | None = None
    max_skips: int | None = None
    max_skip_share: float | None = None
    error_budget: float = 1.0
    warmup_steps: int = 2
    warmup_fraction: float = 0.2
    final_steps: int = 1
    final_fraction: float = 0.0
    tail_fraction: float = 0.1
    drift: float = 0.7
    age_exponent: int = 2
    decide_per_block: bool = False
    cache_format: str = "fp"
    pdr: bool = True
    pdr_outlier_ratio: float = 25.0
    min_psnr: float | None = None
    calibrated: dict | None = None

    def __post_init__(self):
        problems = type_problems(self)
        if not self.error_budget >= 0 or self.error_budget == float("inf"):
            problems.append(f"error_budget must be a finite number ≥ 0, got {self.error_budget!r}")
        if self.min_psnr is not None and not 0 < self.min_psnr < float("inf"):
            problems.append(f"min_psnr must be a number of dB > 0, or None, got {self.min_psnr!r}")
        if self.threshold is not None and not self.threshold >= 0:
            problems.append(f"threshold must be ≥ 0 or None, got {self.threshold!r}")
        if self.max_skips is not None and (isinstance(self.max_skips, bool) or not isinstance(self.max_skips, int)
                                           or self.max_skips < 0):
            problems.append(f"max_skips must be an integer ≥ 0 or None, got {self.max_skips!r}")
        if self.max_skip_share is not None and not 0 <= self.max_skip_share <= 1:
            problems.append(f"max_skip_share must be within [0, 1] or None, got {self.max_skip_share!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 2:
            problems.append(f"warmup_steps must be an integer ≥ 2 (stability needs two residuals), got {self.warmup_steps!r}")
        if not 0 <= self.warmup_fraction < 1:
            problems.append(f"warmup_fraction must be within [0, 1), got {self.warmup_fraction!r}")
        if not isinstance(self.final_steps, int) or self.final_steps < 0:
            problems.append(f"final_steps must be an integer ≥ 0, got {self.final_steps!r}")
        if not 0 <= self.final_fraction < 1:
            problems.append(f"final_fraction must be within [0, 1), got {self.final_fraction!r}")
        if not 0 <= self.tail_fraction < 1:
            problems.append(f"tail_fraction must be within [0, 1), got {self.tail_fraction!r}")
        if isinstance(self.age_exponent, bool) or not isinstance(self.age_exponent, int) or not 1 <= self.age_exponent <= 4:
            problems.append(f"age_exponent must be an integer from 1 to 4, got {self.age_exponent!r}")
        if not 0 <= self.drift <= 1:
            problems.append(f"drift must be within [0, 1], got {self.drift!r}")
        if not isinstance(self.decide_per_block, bool):
            problems.append(f"decide_per_block must be True or False, got {self.decide_per_block!r}")
        if self.cache_format not in CACHE_FORMATS:
            problems.append(f"cache_format must be one of {CACHE_FORMATS}, got {self.cache_format!r}")
        if not self.pdr_outlier_ratio > 0:
            problems.append(f"pdr_outlier_ratio must be > 0, got {self.pdr_outlier_ratio!r}")
        if problems:
            raise ValueError(report("invalid DeltaCacheConfig", problems))

    #: Fields added after configs were first stored, with the value a stored config without them
    #: ran with; left out of the dict form at that value, so such a config is written again unchanged.
    _ADDED = {"final_fraction": 0.0, "age_exponent": 1, "min_psnr": None, "calibrated": None, "max_skip_share": None,
              "tail_fraction": 0.0}

    def to_dict(self) -> dict:
        """The JSON form, without the later fields (:attr:`_ADDED`) where they hold the value
        configs written before them ran with."""
        return {k: v for k, v in super().to_dict().items() if k not in self._ADDED or v != self._ADDED[k]}

    @classmethod
    def from_dict(cls, data: dict) -> DeltaCacheConfig:
        """Read :meth:`to_dict`'s form; a later field it leaves out takes the value configs
        written before it ran with (a stored cache runs as it did)."""
        if isinstance(data, dict):
            data = {**cls._ADDED, **data}
        return super().from_dict(data)

    def describe(self) -> str:
        """The knob in words: ``"error budget 1"``, with what a ``min_psnr`` calibration chose
        and measured."""
        text = f"error budget {self.error_budget:g}"
        if self.min_psnr is not None:
            c = self.calibrated
            measured = ("not calibrated yet" if c is None else "no budget reached it" if c.get("psnr_bound") is None
                        else f"{c['psnr_bound']:.2f} dB, mean − 1 SE, on the calibration videos; {c['runs']} runs, "
                             f"{c['seconds']:.1f} s")
            text += f", calibrated to {self.min_psnr:g} dB ({measured})"
        if self.max_skip_share is not None:
            text += f", at most {100 * self.max_skip_share:.0f} % of steps skipped"
        return text

    @property
    def needs_calibration(self) -> bool:
        """Whether a conversion must calibrate the budget first: ``min_psnr`` is set and not yet met."""
        return self.min_psnr is not None and self.calibrated is None
