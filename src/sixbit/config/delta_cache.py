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

    Args:
        threshold: largest per-step relative change of the residuals that still counts as
            stable (default 0.2). Higher: more skips, faster, less exact.
        max_skips: consecutive skips allowed (default 2).
        error_budget: largest accumulated error estimate before a forced recompute (τ, default 0.6).
        warmup_steps: first steps always computed (default 2; two are needed to measure stability).
        warmup_fraction: when the pipeline says how many steps it runs, at least this share of
            them is warm-up too (default 0.2, as MagCache's ``retention_ratio``): a skip in the
            first steps costs 10–100× one in the middle of the run on the shipped models.
        final_steps: last steps always computed when the number of steps is known (default 1).
        drift: share of the residual's measured per-step change added to a replay, times its
            age (default 0.5; 0 replays the cached residual unchanged).
        decide_per_block: each block decides alone from its own stability instead of all
            blocks skipping the same steps (default False; measured worse, see the module doc).
        cache_format: ``"fp"`` (default), ``"int8"`` (per-token, ~¼ of fp32 memory) or
            ``"int4-g64"`` (the seed's 4-bit residuals, ~⅛).
        pdr: purify refreshes of quantized blocks (default True; no effect on FP models).
        pdr_outlier_ratio: input ``max|X| / mean|X|`` above which a linear refreshes in full
            precision (default 25).
    """

    threshold: float = 0.2
    max_skips: int = 2
    error_budget: float = 0.6
    warmup_steps: int = 2
    warmup_fraction: float = 0.2
    final_steps: int = 1
    drift: float = 0.5
    decide_per_block: bool = False
    cache_format: str = "fp"
    pdr: bool = True
    pdr_outlier_ratio: float = 25.0

    def __post_init__(self):
        problems = type_problems(self)
        if not self.threshold >= 0:
            problems.append(f"threshold must be ≥ 0, got {self.threshold!r}")
        if not isinstance(self.max_skips, int) or self.max_skips < 0:
            problems.append(f"max_skips must be an integer ≥ 0, got {self.max_skips!r}")
        if not self.error_budget >= 0:
            problems.append(f"error_budget must be ≥ 0, got {self.error_budget!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 2:
            problems.append(f"warmup_steps must be an integer ≥ 2 (stability needs two residuals), got {self.warmup_steps!r}")
        if not 0 <= self.warmup_fraction < 1:
            problems.append(f"warmup_fraction must be within [0, 1), got {self.warmup_fraction!r}")
        if not isinstance(self.final_steps, int) or self.final_steps < 0:
            problems.append(f"final_steps must be an integer ≥ 0, got {self.final_steps!r}")
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
