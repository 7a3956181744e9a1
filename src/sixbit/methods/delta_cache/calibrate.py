"""``DeltaCacheConfig(min_psnr=...)``: the fastest error budget whose calibration videos reach a
PSNR target against the uncached full-precision model.

The budget is the delta cache's one knob, and a larger one never skips less and, on the shipped
models, never gives a higher PSNR (the method's module doc). So the search is a bisection over
:data:`BUDGETS`: one uncached calibration run for the reference (none when the conversion
already ran the full-precision model before quantizing), then about four cached runs for the
largest budget that meets the target. A budget meets it when its videos' mean PSNR minus one
standard error reaches it (:func:`sixbit.calibration.quality.psnr_bound`, what
``sixbit.tune(min_psnr=...)`` checks too): a margin for prompts the calibration has not seen.

Skips come in whole steps, so neighbouring budgets often skip the same number of steps: they are
equally fast, and the smaller one spends its skips in shorter streaks, which is no less exact and
sometimes more (the method's module doc). A second bisection, about three more runs, finds the
smallest budget that skips as many steps as the largest, and the calibration keeps it.

The chosen config also caps the share of steps a run may skip (``max_skip_share``) at the most
the calibration runs skipped at that budget. How many steps a budget skips depends on the prompts
(blocks decide together on the batch's worst stability, so a 16-prompt calibration batch skips
fewer steps than the same budget on one prompt), whereas what the calibration measured is the
PSNR at the skips it made: with the cap, a run never skips more than the videos the target was
measured on. On shapes-cogvideox (with ``final_fraction`` 0.1, the default then), budget 2 skipped
half of the steps of 16 calibration prompts in one batch (36.29 dB) and 55 % of the benchmark's 4
held-out pairs (33.89 dB).

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


def _last_true(low: int, high: int, holds: Callable[[int], bool]) -> int:
    """Bisection: the last index in ``(low, high)`` where ``holds``, given that it holds up to some
    index and not after, that it holds at ``low`` and not at ``high`` (``low`` when it holds nowhere)."""
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            low = middle
        else:
            high = middle
    return low


def calibrate_budget(model: nn.Module, config: DeltaCacheConfig, run: Callable[[], object],
                     reference: torch.Tensor | None = None) -> DeltaCacheConfig:
    """``config`` with the fastest budget of :data:`BUDGETS` whose calibration videos reach
    ``config.min_psnr`` (the smallest of equally fast ones; 0 when none reaches it),
    ``max_skip_share`` the most they skipped at it, and ``calibrated`` saying what was measured.

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
        caps: dict[float, float] = {0.0: 0.0}  # budget → the most a block skipped at it (unrounded)

        def measure(budget: float) -> dict:
            nonlocal runs
            if budget not in tried:
                cache = apply_delta_cache(model, dataclasses.replace(config, error_budget=budget, min_psnr=None))
                try:
                    mse = video_mse(run(), reference, f"the delta cache at error_budget={budget:g}")
                finally:
                    remove_delta_cache(model)
                runs += 1
                tried[budget] = {"error_budget": budget, "psnr": round(psnr_of(mse), 3),
                                 "psnr_bound": round(psnr_bound(mse), 3), "skip_share": round(cache.peak_skip_share(), 4)}
                caps[budget] = cache.peak_skip_share()
                logger.info("delta cache at error_budget=%g: %.2f dB (mean − 1 SE), %.0f %% of block calls skipped",
                            budget, tried[budget]["psnr_bound"], 100 * tried[budget]["skip_share"])
            return tried[budget]

        def skipped(budget: float) -> float:
            measure(budget)
            return caps[budget]

        # the largest budget that meets the target: the fastest setting
        low = _last_true(-1, len(BUDGETS), lambda i: measure(BUDGETS[i])["psnr_bound"] >= config.min_psnr)
        if low > 0:  # then the smallest budget that skips as many steps: as fast, and no less exact
            share = caps[BUDGETS[low]]
            first = _last_true(-1, low, lambda i: skipped(BUDGETS[i]) < share) + 1
            if measure(BUDGETS[first])["psnr_bound"] >= config.min_psnr:
                low = first
    chosen = BUDGETS[low] if low >= 0 else 0.0
    measured, cap = tried.get(chosen, {"error_budget": 0.0, "psnr": None, "psnr_bound": None, "skip_share": 0.0}), caps[chosen]
    if low < 0:
        logger.warning("no error budget reaches min_psnr=%g dB on the calibration videos (%g gave %.2f): the delta cache "
                       "will skip nothing; lower min_psnr, or check the quantization's own error", config.min_psnr,
                       BUDGETS[0], tried[BUDGETS[0]]["psnr_bound"])
    record = {**measured, "runs": runs, "seconds": round(time.perf_counter() - start, 2),
              "tried": sorted(tried.values(), key=lambda t: t["error_budget"])}
    logger.info("delta cache calibrated to min_psnr=%g dB: error_budget=%g, at most %.0f %% of steps skipped "
                "(%d calibration runs, %.1f s)", config.min_psnr, chosen, 100 * cap, runs, record["seconds"])
    return dataclasses.replace(config, error_budget=chosen, max_skip_share=cap, calibrated=record)


__all__ = ["BUDGETS", "calibrate_budget"]
