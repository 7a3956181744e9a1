"""Time ranges of the denoising process: grouping steps, smoothing and interpolating parameters.

Activation statistics of a video DiT drift over the denoising steps (the source measured 3–7×
wider ranges in the middle steps than at the start), so static quantization parameters are
fitted per *time range* — a run of consecutive steps — instead of once for the whole process:

* :func:`group_steps` splits ``num_steps`` steps into ranges: a count (near-equal runs, the
  longer ones first: 20 steps in 4 ranges are steps 0–4, 5–9, 10–14, 15–19), explicit
  ``(first, last)`` pairs, or ``"per_step"`` (one range per step).
* :func:`gaussian_smooth` averages each range's parameters with its neighbours' using Gaussian
  weights over the range index (``σ`` in ranges; the source found σ = 1.5 best), so one badly
  calibrated range cannot make the schedule jump.
* :func:`interpolation_weights` gives, per step, the two ranges to blend and the weight of the
  second: parameters vary linearly between the *centres* of adjacent ranges instead of jumping
  at the boundary (the source's fix for flicker between time ranges).

All functions are pure (tensors and integers in, tensors and integers out).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

PER_STEP = "per_step"

RangesSpec = int | str | Sequence[Sequence[int]]


def group_steps(num_steps: int, ranges: RangesSpec = 4) -> list[tuple[int, int]]:
    """Split steps ``0 … num_steps-1`` into consecutive ``(first, last)`` ranges (inclusive).

    Args:
        num_steps: denoising steps (≥ 1).
        ranges: a count (default 4; more ranges follow the statistics more closely at the cost
            of more stored parameters), ``"per_step"``, or explicit ``(first, last)`` pairs
            that must cover every step exactly once, in order.

    Example:
        >>> group_steps(20, 4)
        [(0, 4), (5, 9), (10, 14), (15, 19)]
        >>> group_steps(10, 3)
        [(0, 3), (4, 6), (7, 9)]
    """
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an integer ≥ 1, got {num_steps!r}")
    if ranges == PER_STEP:
        return [(s, s) for s in range(num_steps)]
    if isinstance(ranges, int) and not isinstance(ranges, bool):
        if not 1 <= ranges <= num_steps:
            raise ValueError(f"the number of time ranges must be 1…{num_steps} for {num_steps} steps, got {ranges}")
        base, extra = divmod(num_steps, ranges)
        out, first = [], 0
        for r in range(ranges):
            size = base + (1 if r < extra else 0)
            out.append((first, first + size - 1))
            first += size
        return out
    if isinstance(ranges, str):
        raise ValueError(f"ranges={ranges!r}: pass a count, {PER_STEP!r} or a list of (first, last) step pairs")
    out = [tuple(int(v) for v in pair) for pair in ranges]
    expected = 0
    for pair in out:
        if len(pair) != 2 or pair[0] != expected or pair[1] < pair[0]:
            raise ValueError(
                f"explicit time ranges {[list(p) for p in out]} must be (first, last) pairs covering steps "
                f"0…{num_steps - 1} in order without gaps or overlaps (problem at {list(pair)})"
            )
        expected = pair[1] + 1
    if expected != num_steps:
        raise ValueError(f"explicit time ranges cover steps 0…{expected - 1}, but the process has {num_steps} steps")
    return out


def range_of_steps(ranges: Sequence[tuple[int, int]]) -> list[int]:
    """Per step, the index of its range. Example: ``range_of_steps([(0, 1), (2, 2)]) == [0, 0, 1]``."""
    return [r for r, (first, last) in enumerate(ranges) for _ in range(first, last + 1)]


def gaussian_weights(num_ranges: int, sigma: float) -> torch.Tensor:
    """``(R, R)`` row-normalised weights ``w[r, q] ∝ exp(-(r - q)² / 2σ²)``; σ = 0 gives the identity.

    Rows are normalised after truncation at the ends, so edge ranges average over fewer
    neighbours rather than being pulled towards zero.

    Example:
        >>> gaussian_weights(2, 1.0)[0]  # exp(-1/2) = 0.6065…: weights 1/1.6065 and 0.6065/1.6065
        tensor([0.6225, 0.3775], dtype=torch.float64)
    """
    if not sigma >= 0 or math.isinf(sigma):
        raise ValueError(f"sigma must be a finite number ≥ 0, got {sigma!r}")
    if sigma == 0:
        return torch.eye(num_ranges, dtype=torch.float64)
    idx = torch.arange(num_ranges, dtype=torch.float64)
    w = torch.exp(-((idx[:, None] - idx[None, :]) ** 2) / (2 * sigma**2))
    return w / w.sum(dim=1, keepdim=True)


def gaussian_smooth(values: torch.Tensor, sigma: float) -> torch.Tensor:
    """Smooth per-range parameters ``values`` (range axis first, any trailing shape) across ranges."""
    w = gaussian_weights(values.shape[0], sigma).to(values.dtype if values.is_floating_point() else torch.float64)
    return torch.tensordot(w, values.to(w.dtype), dims=([1], [0])).to(values.dtype)


def interpolation_weights(ranges: Sequence[tuple[int, int]], interpolate: bool = True) -> list[tuple[int, int, float]]:
    """Per step, ``(range a, range b, w)``: the step's parameter is ``(1 - w)·p[a] + w·p[b]``.

    With ``interpolate`` the parameters are piecewise linear between range centres
    ``c_r = (first + last) / 2`` and constant before the first and after the last centre;
    without it each step takes its own range's value (``(r, r, 0.0)``).

    Example:
        >>> interpolation_weights([(0, 1), (2, 3)])   # centres 0.5 and 2.5
        [(0, 0, 0.0), (0, 1, 0.25), (0, 1, 0.75), (1, 1, 0.0)]
    """
    owner = range_of_steps(ranges)
    if not interpolate:
        return [(r, r, 0.0) for r in owner]
    centres = [(first + last) / 2 for first, last in ranges]
    out = []
    for step in range(len(owner)):
        if step <= centres[0]:
            out.append((0, 0, 0.0))
            continue
        if step >= centres[-1]:
            last = len(centres) - 1
            out.append((last, last, 0.0))
            continue
        b = next(i for i, c in enumerate(centres) if c >= step)
        a = b - 1
        if centres[b] == step:
            out.append((b, b, 0.0))
        else:
            out.append((a, b, (step - centres[a]) / (centres[b] - centres[a])))
    return out


def nearest_step(timesteps: Sequence[float], timestep: float) -> int:
    """Index of the calibrated timestep closest to ``timestep`` (ties: the earlier step).

    Runtime calls are matched to calibrated steps by timestep, so a schedule with a different
    step count still finds the parameters of the nearest point of the process.
    """
    if not timesteps:
        raise ValueError("no calibrated timesteps")
    return min(range(len(timesteps)), key=lambda i: (abs(timesteps[i] - timestep), i))
