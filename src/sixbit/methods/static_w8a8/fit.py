"""Fit static W8A8 parameters of one linear layer from calibration statistics (offline only).

Inputs are the layer's weight and its :class:`~sixbit.calibration.LayerStats` per
(step, branch); outputs are a :class:`LayerFit`: smoothing vectors (one per stored weight
variant), and per calibrated step × branch slot the clip threshold and abs-max of the smoothed
activation. Runtime (:mod:`sixbit.methods.static_w8a8`) turns them into static scales.

Branch slots: 0 pools every branch of a step, 1 is ``"cond"``, 2 is ``"uncond"`` (a slot not
recorded at a step, e.g. without guidance, falls back to the pooled statistics).

How a threshold is made (all in the domain of the step's smoothing ``s``):

1. per time range and slot: per-channel abs-max = max over the range's steps; mean square =
   pooled over the range's elements;
2. both smoothed across ranges with a Gaussian (:func:`~.time_ranges.gaussian_smooth`);
3. ``amax' = max_c amax_c / s_c`` (exact); with outlier handling the threshold is
   ``min(amax', k·σ')`` where σ' is the RMS of ``x / s`` (:func:`~sixbit.transforms.smoothquant.smoothed_rms`);
4. per step, linear interpolation between range centres (optional).

The side path's ceiling (``amax`` of :class:`LayerFit`) is the larger of the smoothed and the
range's own unsmoothed abs-max, so smoothing never saturates outliers the side path exists for.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from ...config import time_ranges as tr
from ...calibration.data import LayerStats
from ...transforms import smoothquant as sq

SLOTS = ("all", "cond", "uncond")


@dataclasses.dataclass
class LayerFit:
    """Static parameters of one layer.

    Attributes:
        alpha: SmoothQuant α used (``None`` without smoothing).
        divisors: ``(V, K)`` smoothing vector of each stored weight variant.
        range_variant: per time range, the weight variant it uses.
        threshold: ``(T, 3)`` per calibrated step × slot, the clip threshold of ``x / s``
            (``s`` of the step's variant): the static scale is ``threshold / qmax``.
        amax: ``(T, 3)`` the abs-max of ``x / s`` (sets the side path's scale).
        qmax: per step, the activation grid's largest code ``2^(bits-1) - 1``.
        error: the proxy output error (relative) of the chosen parameters.
        error_shared: for TSQ, the error with one shared smoothing vector instead.
    """

    alpha: float | None
    divisors: torch.Tensor
    range_variant: list[int]
    threshold: torch.Tensor
    amax: torch.Tensor
    qmax: list[int]
    error: float
    error_shared: float | None = None


def step_tables(stats: dict[tuple[int, str], LayerStats], steps: Sequence[int], name: str = "layer"):
    """``(A (T, 3, K) per-channel amax, SS (T, 3) sum of squares, N (T, 3) element count)``."""
    rows_a, rows_ss, rows_n = [], [], []
    for step in steps:
        here = {b: s for (t, b), s in stats.items() if t == step}
        if not here:
            raise ValueError(f"{name}: no calibration statistics at step {step}; recalibrate with this model")
        pooled_a = torch.stack([s.channel_amax.float() for s in here.values()]).amax(0)
        pooled = (pooled_a, sum(s.sum_sq for s in here.values()), sum(s.count for s in here.values()))
        per = [pooled]
        for branch in SLOTS[1:]:
            s = here.get(branch)
            per.append(pooled if s is None else (s.channel_amax.float(), s.sum_sq, s.count))
        rows_a.append(torch.stack([p[0] for p in per]))
        rows_ss.append([float(p[1]) for p in per])
        rows_n.append([float(p[2]) for p in per])
    return torch.stack(rows_a), torch.tensor(rows_ss, dtype=torch.float64), torch.tensor(rows_n, dtype=torch.float64)


def range_tables(a, ss, n, ranges: Sequence[tuple[int, int]], sigma: float):
    """Per range × slot: Gaussian-smoothed per-channel amax ``(R, 3, K)`` and RMS ``(R, 3)``,
    and the unsmoothed per-channel amax ``(R, 3, K)``."""
    raw = torch.stack([a[first : last + 1].amax(0) for first, last in ranges])
    ms_r = torch.stack([ss[first : last + 1].sum(0) / n[first : last + 1].sum(0).clamp_min(1) for first, last in ranges])
    return tr.gaussian_smooth(raw, sigma), tr.gaussian_smooth(ms_r, sigma).clamp_min(0).sqrt().float(), raw


def threshold(a: torch.Tensor, rms: torch.Tensor, s: torch.Tensor, k_sigma: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clip threshold, amax)`` of ``x / s`` (leading shapes of ``a``/``rms`` kept)."""
    amax = sq.smoothed_amax(a, s)
    if k_sigma is None:
        return amax, amax
    return torch.minimum(amax, k_sigma * sq.smoothed_rms(rms, a, s)), amax


def _variants(smoothing, alpha, a_all, a_r, wamax, num_ranges):
    """Smoothing vector per range for ``smoothing`` in {"none", "asq", "tsq"} (list of R tensors)."""
    if smoothing == "none":
        return [torch.ones_like(wamax)] * num_ranges
    if smoothing == "asq":
        return [sq.smoothing_factors(a_all, wamax, alpha)] * num_ranges
    return [sq.smoothing_factors(a_r[r, 0], wamax, alpha) for r in range(num_ranges)]


def _error(weight, per_range_s, a_r, rms_r, slots, k_sigma, weight_bits, qmax) -> float:
    errs = []
    for r, s in enumerate(per_range_s):
        thr, _ = threshold(a_r[r, slots], rms_r[r, slots], s, k_sigma)
        energy = sq.channel_energy(rms_r[r, slots], a_r[r, slots])
        errs.append(sq.output_error(weight, s, energy, thr / qmax[r], weight_bits))
    return float(torch.cat(errs).mean())


def _choose_smoothing(weight, a, a_r, rms_r, num_ranges, slots, qmax, *, smoothing, alpha, alpha_grid, alpha_start,
                      k_sigma, weight_bits, tsq_min_gain):
    """``(alpha, smoothing vector per range, proxy error, TSQ's shared-vector error or None)``:
    ``alpha`` as given, or the grid's lowest-error value (ties to the one closest to
    ``alpha_start``); TSQ falls back to one shared vector where per-range ones gain too little."""
    wamax = sq.weight_channel_amax(weight)
    a_all = a.amax(dim=(0, 1))

    def evaluate(al):
        per = _variants(smoothing, al, a_all, a_r, wamax, num_ranges)
        return per, _error(weight, per, a_r, rms_r, slots, k_sigma, weight_bits, qmax)

    if smoothing == "none":
        best_alpha, (per_range_s, err) = None, evaluate(0.0)
    elif alpha is not None:
        best_alpha, (per_range_s, err) = alpha, evaluate(alpha)
    else:
        best_alpha, per_range_s, err = None, None, float("inf")
        for al in sorted(alpha_grid, key=lambda v: (abs(v - alpha_start), v)):
            per, e = evaluate(al)
            if e < err:
                best_alpha, per_range_s, err = al, per, e
    err_shared = None
    if smoothing == "tsq":
        shared = [sq.smoothing_factors(a_all, wamax, best_alpha)] * num_ranges
        err_shared = _error(weight, shared, a_r, rms_r, slots, k_sigma, weight_bits, qmax)
        # Store per-range weights only where they pay: otherwise one shared copy (ASQ) is kept.
        if tsq_min_gain > 0 and (err_shared <= 0 or (err_shared - err) / err_shared < tsq_min_gain):
            per_range_s, err = shared, err_shared
    return best_alpha, per_range_s, err, err_shared


def _distinct_variants(per_range_s: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    """One stored weight per distinct smoothing vector, and the variant of each range. Vectors
    equal up to float rounding are one (a range's statistics are weighted sums over steps, whose
    last bits depend on the CPU's reduction order): they share the first one's weight."""
    divisors: list[torch.Tensor] = []
    range_variant = []
    for s in per_range_s:
        hit = next((i for i, d in enumerate(divisors) if torch.allclose(d, s, rtol=1e-6, atol=0.0)), None)
        if hit is None:
            divisors.append(s)
            hit = len(divisors) - 1
        range_variant.append(hit)
    return divisors, range_variant


def _step_rows(ranges, interpolate, divisors, range_variant, a_r, rms_r, a_raw, k_sigma):
    """Per-step threshold and amax rows ``(T, 3)``, in the domain of each step's own smoothing vector."""
    owner = tr.range_of_steps(ranges)
    thr_rows, amax_rows = [], []
    for step, (ra, rb, w) in enumerate(tr.interpolation_weights(ranges, interpolate)):
        s = divisors[range_variant[owner[step]]]
        ta, aa = threshold(a_r[ra], rms_r[ra], s, k_sigma)
        tb, ab = threshold(a_r[rb], rms_r[rb], s, k_sigma)
        thr_rows.append((1 - w) * ta + w * tb)
        # The side path's ceiling never drops below what the range really reached: smoothing
        # moves the main scale, while outliers it would cut off still land in the side path.
        raw = (1 - w) * sq.smoothed_amax(a_raw[ra], s) + w * sq.smoothed_amax(a_raw[rb], s)
        amax_rows.append(torch.maximum((1 - w) * aa + w * ab, raw))
    return torch.stack(thr_rows).float(), torch.stack(amax_rows).float()


def fit_layer(
    weight: torch.Tensor,
    stats: dict[tuple[int, str], LayerStats],
    steps: Sequence[int],
    ranges: Sequence[tuple[int, int]],
    *,
    smoothing: str = "tsq",
    alpha: float | None = None,
    alpha_grid: Sequence[float] = (0.2,),
    alpha_start: float = 0.2,
    sigma: float = 1.5,
    interpolate: bool = False,
    per_branch: bool = True,
    k_sigma: float | None = None,
    weight_bits: int = 8,
    act_bits: Sequence[int] = (8,),
    tsq_min_gain: float = 0.0,
    name: str = "layer",
) -> LayerFit:
    """Fit one layer (see the module docstring). ``alpha=None`` searches ``alpha_grid`` for the
    lowest proxy error (:func:`~sixbit.transforms.smoothquant.output_error`), ties going to
    the value closest to ``alpha_start``; ``k_sigma=None`` disables outlier clipping."""
    weight = weight.detach().float()
    a, ss, n = step_tables(stats, steps, name)
    if a.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name}: statistics have {a.shape[-1]} channels, the weight {weight.shape[1]}")
    a_r, rms_r, a_raw = range_tables(a, ss, n, ranges, sigma)
    qmax = [2 ** (b - 1) - 1 for b in act_bits]
    best_alpha, per_range_s, err, err_shared = _choose_smoothing(
        weight, a, a_r, rms_r, len(ranges), [1, 2] if per_branch else [0], qmax, smoothing=smoothing, alpha=alpha,
        alpha_grid=alpha_grid, alpha_start=alpha_start, k_sigma=k_sigma, weight_bits=weight_bits,
        tsq_min_gain=tsq_min_gain,
    )
    divisors, range_variant = _distinct_variants(per_range_s)
    thresholds, amax = _step_rows(ranges, interpolate, divisors, range_variant, a_r, rms_r, a_raw, k_sigma)
    owner = tr.range_of_steps(ranges)
    return LayerFit(
        alpha=best_alpha,
        divisors=torch.stack(divisors).float(),
        range_variant=range_variant,
        threshold=thresholds,
        amax=amax,
        qmax=[qmax[owner[step]] for step in range(len(owner))],
        error=err,
        error_shared=err_shared,
    )
