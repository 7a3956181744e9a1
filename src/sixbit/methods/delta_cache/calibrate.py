"""``DeltaCacheConfig(min_psnr=...)``: the largest error budget whose calibration videos reach a
PSNR target against the uncached full-precision model.

The budget is the delta cache's one knob, and a larger one never skips less and, on the shipped
models, never gives a higher PSNR (the method's module doc). So the search is a bisection over
:data:`BUDGETS`: one uncached calibration run for the reference (none when the conversion
already ran the full-precision model before quantizing), then about four cached runs. A budget
meets the target when its videos' mean PSNR minus one standard error reaches it
(:func:`sixbit.calibration.quality.psnr_bound`, what ``sixbit.tune(min_psnr=...)`` checks too): a
margin for prompts the calibration has not seen.

With quantized weights the reference is the full-precision model, so the target holds for the
combined model: the quantization's own error counts against it. Methods a conversion installs
after its fits (DMPQ's per-step precision) are not running during these runs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from ...config.delta_cache import DeltaCacheConfig
from ...calibration.quality import as_videos, psnr_bound, psnr_of, video_mse
from .method import apply_delta_cache, remove_delta_cache

logger = logging.getLogger(__name__)

#: The budgets a calibration chooses from, in increasing order (0 is below them: no skips).
BUDGETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.15, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0, 10.0)


def calibrate_budget(model: nn.Module, config: DeltaCacheConfig, run: Callable[[], object],
                     reference: torch.Tensor | None = None) -> DeltaCacheConfig:
    """``config`` with the largest budget of :data:`BUDGETS` whose calibration videos reach
    ``config.min_psnr`` (0 when none does), and ``calibrated`` saying what was measured.

    ``run()`` runs the calibration generations with ``model`` and returns their videos;
    ``reference``: the full-precision model's videos of the same run, ``None`` when ``model`` is
    still in full precision (one uncached run makes them). The model is left without a cache.
    """
    if config.min_psnr is None:
        raise ValueError("calibrate_budget needs DeltaCacheConfig(min_psnr=...): the PSNR target it calibrates to")
    start = time.perf_counter()
    remove_delta_cache(model)
    runs = 0
    with torch.no_grad():
        if reference is None:
            reference = as_videos(run())
            runs += 1
        tried: dict[float, dict] = {}

        def meets(budget: float) -> bool:
            nonlocal runs
            cache = apply_delta_cache(model, dataclasses.replace(config, error_budget=budget, min_psnr=None))
            try:
                mse = video_mse(run(), reference, f"the delta cache at error_budget={budget:g}")
            finally:
                remove_delta_cache(model)
            runs += 1
            tried[budget] = {"error_budget": budget, "psnr": round(psnr_of(mse), 3), "psnr_bound": round(psnr_bound(mse), 3),
                             "skip_share": round(cache.report().skip_share, 4)}
            logger.info("delta cache at error_budget=%g: %.2f dB (mean − 1 SE), %.0f %% of block calls skipped",
                        budget, tried[budget]["psnr_bound"], 100 * tried[budget]["skip_share"])
            return tried[budget]["psnr_bound"] >= config.min_psnr

        low, high = -1, len(BUDGETS)  # BUDGETS[low] meets the target (-1: budget 0), BUDGETS[high] does not
        while high - low > 1:
            middle = (low + high) // 2
            if meets(BUDGETS[middle]):
                low = middle
            else:
                high = middle
    chosen = BUDGETS[low] if low >= 0 else 0.0
    measured = tried.get(chosen, {"error_budget": 0.0, "psnr": None, "psnr_bound": None, "skip_share": 0.0})
    if low < 0:
        logger.warning("no error budget reaches min_psnr=%g dB on the calibration videos (%g gave %.2f): the delta cache "
                       "will skip nothing; lower min_psnr, or check the quantization's own error", config.min_psnr,
                       BUDGETS[0], tried[BUDGETS[0]]["psnr_bound"])
    record = {**measured, "runs": runs, "seconds": round(time.perf_counter() - start, 2),
              "tried": sorted(tried.values(), key=lambda t: t["error_budget"])}
    logger.info("delta cache calibrated to min_psnr=%g dB: error_budget=%g (%d calibration runs, %.1f s)",
                config.min_psnr, chosen, runs, record["seconds"])
    return dataclasses.replace(config, error_budget=chosen, calibrated=record)


__all__ = ["BUDGETS", "calibrate_budget"]
