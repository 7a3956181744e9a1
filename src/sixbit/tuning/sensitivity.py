"""Stage 1: how much each layer in each format costs the videos (seed 000 §2.1, step 1).

:class:`Evaluator` runs the calibration generations with an assignment swapped in and returns
each video's mean squared error against the full-precision videos (pixels in [0, 1]); results
are remembered per assignment. :func:`measure` quantizes one layer at a time — every other
tuned layer in full precision, the fixed ones in their formats — and records the error it adds
to the fixed layers' own, per layer and format: the measured sensitivity. Beside it, a cheap
proxy: the layer's output error energy on its calibration inputs, ``E‖x·(Ŵ − W)ᵀ‖²`` from the
input Hessian (GPTQ's objective), whose Spearman rank correlation with the measured error is
reported.

Errors of different layers are treated as adding up (:meth:`Sensitivity.predict`): the proxy
that ranks assignments before they are run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from ..calibration import hessians
from ..nn import QuantLinear
from ..nn.pointwise_conv import features, weight_2d
from ..nn.precision import ActMode
from ..calibration.quality import PSNR_CAP, as_videos, psnr_bound, psnr_of, video_mse
from .library import Library

class Scores:
    """What the search reads of a scorer called on an assignment (per-video MSE, kept in
    ``results``): its PSNR, its PSNR bound (mean − 1 SE), how many assignments were scored."""

    results: dict

    def psnr(self, genome: tuple[int, ...]) -> float:
        return psnr_of(self(genome))

    def psnr_bound(self, genome: tuple[int, ...]) -> float:
        return psnr_bound(self(genome))

    @property
    def count(self) -> int:
        return len(self.results)


class Evaluator(Scores):
    """Per-video MSE of the calibration videos under an assignment, against full precision
    (``reference``: the full-precision videos when a run already made them, else one run here)."""

    def __init__(self, library: Library, run: Callable[[], object], reference=None):
        self.library, self.run = library, run
        self.library.restore()
        self.reference = as_videos(run() if reference is None else reference)
        self.results: dict[tuple[int, ...], torch.Tensor] = {}
        self.seconds = 0.0

    def __call__(self, genome: tuple[int, ...]) -> torch.Tensor:
        genome = tuple(genome)
        if genome not in self.results:
            start = time.perf_counter()
            self.library.apply(genome)
            try:
                result = self.run()
            finally:
                self.library.restore()
            self.results[genome] = self.error(result)
            self.seconds += time.perf_counter() - start
        return self.results[genome]

    def error(self, result) -> torch.Tensor:
        """Per-video MSE of a calibration run's videos against the full-precision ones."""
        return video_mse(result, self.reference, "a tuned assignment")



@dataclasses.dataclass
class Sensitivity:
    """What one layer in one format costs: ``mse[i][j]`` the per-video MSE that layer ``i`` in its
    variant ``j`` adds when it is the only tuned layer quantized (zero for full precision; at
    least zero), ``proxy[i][j]`` its output error energy on the calibration inputs, their
    Spearman rank correlation over all quantized variants, and ``base`` the per-video MSE with
    every tuned layer in full precision (the fixed layers' own; 0 without them)."""

    mse: list[list[torch.Tensor]]
    proxy: list[list[float]]
    spearman: float
    seconds: float
    base: torch.Tensor | float = 0.0

    def predict(self, genome: tuple[int, ...]) -> torch.Tensor:
        """Per-video MSE of ``genome`` if the layers' errors add up."""
        return self.base + sum(self.mse[i][j] for i, j in enumerate(genome))

    def cost(self, layer: int, variant: int) -> float:
        """Summed MSE over the videos of one layer in one variant."""
        return float(self.mse[layer][variant].sum())


def proxy_error(variant: torch.nn.Module, original: torch.nn.Module, stats: hessians.InputStats | None) -> float:
    """``E‖x·(Ŵ − W)ᵀ‖²`` over the recorded inputs (``nan`` without them; 0 for the original)."""
    if variant is original:
        return 0.0
    if stats is None or not isinstance(variant, QuantLinear):
        return math.nan
    eye = torch.eye(features(original)[0], device=original.weight.device)
    with torch.no_grad():
        # (K, N): x·Ŵᵀ (+ b) for each basis vector; QuantLinear's own forward takes rows whatever
        # layout the layer takes (a conv's forward: channels first, which it would also unfold)
        effective = QuantLinear.forward(variant, eye, mode=ActMode.FP).float()
        if variant.bias is not None:
            effective = effective - variant.bias.float()
        delta = effective - weight_2d(original).float().T
        return float(((stats.hessian.float() @ delta) * delta).sum())


def measure(evaluator: Evaluator, stats: dict[str, hessians.InputStats], progress: bool = True) -> Sensitivity:
    """Stage 1: each tuned layer quantized alone to each of its formats, run and measured."""
    from tqdm.auto import tqdm

    library = evaluator.library
    full = library.uniform(None)
    start = time.perf_counter()
    library.restore()
    again = evaluator.error(evaluator.run()) if library.fixed else evaluator(full)
    if psnr_of(again) < PSNR_CAP:  # the same model twice: the runs must agree
        raise ValueError("two calibration runs of the unchanged model generated different videos: make the run "
                         "repeatable (a fixed generator or seed per video) so that errors can be measured")
    base = evaluator(full)  # the fixed layers' error
    mse, proxy = [], []
    total = sum(len(layer.variants) - 1 for layer in library.layers)
    bar = tqdm(total=total, desc="sensitivity", disable=not progress, leave=False)
    for i, layer in enumerate(library.layers):
        original = library.originals[layer.name]
        row_mse, row_proxy = [], []
        for j, variant in enumerate(layer.variants):
            if variant.module is original:
                row_mse.append(torch.zeros_like(base))
            else:
                row_mse.append((evaluator(full[:i] + (j,) + full[i + 1:]) - base).clamp_min(0))
                bar.update()
            row_proxy.append(proxy_error(variant.module, original, stats.get(layer.name)))
        mse.append(row_mse)
        proxy.append(row_proxy)
    bar.close()
    if total and not any(float(m.sum()) for row in mse for m in row):
        raise ValueError("the calibration videos do not change when any tuned layer is quantized: the run's "
                         "output does not depend on this model (does it return another model's videos?)")
    pairs = [(p, float(m.sum())) for row_p, row_m in zip(proxy, mse) for p, m in zip(row_p, row_m)
             if p == p and p > 0]
    return Sensitivity(mse, proxy, spearman([p for p, _ in pairs], [m for _, m in pairs]), time.perf_counter() - start,
                       base)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (``nan`` for fewer than 3 pairs)."""
    if len(a) < 3:
        return math.nan
    ra, rb = (np.argsort(np.argsort(np.asarray(x))) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


__all__ = ["Evaluator", "Scores", "Sensitivity", "measure", "proxy_error", "spearman"]
