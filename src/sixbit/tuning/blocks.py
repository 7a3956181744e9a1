"""Stage 1 priced on kept block inputs: what a layer in a format costs, without a generation per
layer and format (``sixbit.tune(..., sensitivity="blocks")``, the default).

One calibration run keeps every call's inputs to the first block (:func:`~sixbit.builder.keeping`,
as the streamed GPTQ does). Then, block by block: the block's input Hessians come from a replay of
the kept inputs (GPTQ's statistics, the same as a run's: the blocks see the full-precision
trajectory), its tuned layers are built in every candidate format, and each candidate is priced
by its **block-output error**: the block replayed on the kept inputs with that one layer swapped
in, against the full-precision replay (mean squared error over :data:`PRICE_CALLS` of the kept
calls spread over the sampling steps, hidden and encoder streams); the module calls that end
before the swapped layer starts are taken from the full-precision pass, not computed again
(:mod:`.prefix`: the same errors, bit for bit). The full-precision outputs then become the next
block's inputs. One block's inputs and Hessians are held at a time.

A block-output error is mapped to video error by a factor per layer role fitted on a few whole
generations (:func:`fit`: a handful of layer × format points spread over each role's ranking, each
measured alone as :mod:`.sensitivity` measures it), ``video MSE ≈ factor[role] × block error``,
spread over the videos as those points spread (their per-video profile). One factor per role, not
one for all: on the shipped models a feed-forward layer's block error reaches the video 2.4–4.6×
less than an attention layer's (measured against a generation per layer × format; the block index
explains little beyond it), and one shared factor, fitted on whichever role its points fell on,
mispriced the other (BENCHMARKS.md ``tune-blocks``). The genetic search then scores assignments on
these predictions (:class:`Predictor`: no run), and its pick is checked with whole generations
(:meth:`~.tuner.Tuner.search`). Cost: one calibration run to keep the inputs, one replay per block
and candidate, a few generations for the fit and the checks: on the shipped models 11 whole
generations instead of 146–212, 3.8–6.0× less wall time, the candidates' GPTQ
(the same in both modes) now most of it (BENCHMARKS.md ``tune-blocks``).

Where the kept inputs cannot stand in for the generations (:attr:`~sixbit.builder.BlockInputs.problem`:
more than one block list, hidden states changed between blocks, past the memory budget), or a
tuned layer lies outside the blocks, :func:`price_blocks` says why and the tuner measures with
whole generations instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..builder import default_budget, keeping, plan_layers
from ..calibration import hessians
from ..calibration.quality import PSNR_CAP, psnr_of
from ..models import block_index_of, iter_blocks, swap_layers
from ..presets import ConvertConfig
from .prefix import Prefix
from .library import Layer, Library, assemble, build_fixed, build_layer, fixed_layers, tuned_layers, unmeasured_layers
from .sensitivity import Evaluator, Scores, Sensitivity, proxy_error, spearman

#: Layer × format points measured with whole generations to fit the factors (shared evenly by the
#: roles the tuned layers have), and the share of each role's ranking (largest block error first)
#: they are spread over: the smallest errors are left out, where a video's error is float noise
#: rather than the layer's.
FIT_POINTS, FIT_SPREAD = 4, 0.75
#: Kept calls a candidate is priced on, spread evenly over the calls (the first and the last among
#: them): the ranking of block-output errors holds across the sampling steps, and the factor
#: absorbs the scale, so pricing on every step would cost steps / this many times as much.
PRICE_CALLS = 3
#: Whether pricing reuses the block's computation before each priced layer (:mod:`.prefix`; the
#: same errors, bit for bit).
REUSE_PREFIX = True


@dataclasses.dataclass
class BlockPrices:
    """What :func:`price_blocks` found: the candidates (``library``), each tuned layer's block-output
    error per variant (``errors[i][j]``, 0 for full precision) and its weight-error proxy
    (``proxies[i][j]``, :func:`~.sensitivity.proxy_error`), the full-precision calibration videos
    of the run that kept the inputs, the tuned layers no call ran (``{name: base format}``), the
    seconds it took, and of them the calibration run's and each block's."""

    library: Library
    errors: list[list[float]]
    proxies: list[list[float]]
    videos: object
    unmeasured: dict[str, str]
    seconds: float
    calibration_seconds: float
    block_seconds: list[float]


@dataclasses.dataclass
class BlockFit:
    """The map from block-output error to video error: ``factors`` (``{role: video MSE per unit of
    block MSE}``), the ``points`` measured to fit them (``{"layer", "role", "format", "block_error",
    "video_mse"}``, the video MSE summed over the calibration videos), and how well the block
    errors times their role's factor rank and predict them (Spearman, Pearson)."""

    factors: dict[str, float]
    points: list[dict]
    spearman: float
    pearson: float


def _block_error(outputs, reference) -> tuple[float, int]:
    """Squared error summed over both streams of every call, and the element count."""
    total, count = 0.0, 0
    for out, ref in zip(outputs, reference):
        for o, r in zip(out, ref):
            if r is not None:
                total += float((o.double() - r.double()).pow(2).sum())
                count += r.numel()
    return total, count


def _spread(count: int, wanted: int) -> list[int]:
    """``wanted`` indices spread evenly over ``range(count)``, the first and the last included."""
    if count <= wanted:
        return list(range(count))
    return sorted({round(k * (count - 1) / (wanted - 1)) for k in range(wanted)}) if wanted > 1 else [0]


def _price_layer(model, block, kept, layer: Layer, reference, which: list[int],
                 reused: Callable[[], contextlib.AbstractContextManager]) -> list[float]:
    """``layer``'s block-output MSE in each variant: ``block`` replayed with it swapped in, the
    calls before it taken from the reference pass inside ``reused()``."""
    original, errors = model.get_submodule(layer.name), []
    for variant in layer.variants:
        if variant.module is original:
            errors.append(0.0)
            continue
        swap_layers(model, {layer.name: variant.module})
        try:
            with reused():
                total, count = _block_error(kept.outputs(block, which), reference)
        finally:
            swap_layers(model, {layer.name: original})
        errors.append(total / max(count, 1))
    return errors


def price_blocks(model, config: ConvertConfig, candidates: tuple[str | None, ...], run, progress: bool = True,
                 hold: Callable[[nn.Module], contextlib.AbstractContextManager] | None = None) -> BlockPrices | str:
    """Build and price every candidate block by block on kept inputs (the module docstring), or
    the reason the kept inputs cannot stand in for the generations. ``hold(block)``: a context in
    which ``block`` keeps its weights (a model streamed from its files,
    :class:`~sixbit.builder.ShardedModel`; default: the model is in memory). One block's input
    Hessians are held at a time: each block's candidates, fixed layers and proxies are built from
    them before the next block's are recorded."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    hold = hold or (lambda block: contextlib.nullcontext())
    tuned, fixed = tuned_layers(model, config), fixed_layers(model, config)
    plan = plan_layers(model, config.weights)
    found = list(iter_blocks(model))
    blocks = {name: idx for idx, name, _, _ in found}
    where = {name: block_index_of(name, blocks) for name in [*tuned, *fixed]}
    outside = [name for name in tuned if where[name] is None]
    if outside:
        return f"{len(outside)} tuned layers lie outside the transformer blocks (e.g. {outside[0]})"
    videos = []
    with keeping(model, 0, default_budget(model)) as kept:
        stats = hessians.collect(model, lambda: videos.append(run()),
                                 {n: model.get_submodule(n) for n in fixed if where[n] is None})
    if kept.problem is not None:
        return kept.problem
    calibrated = time.perf_counter() - start
    built = build_fixed(model, config, {n: fixed[n] for n in fixed if where[n] is None}, stats)
    layers, errors, proxies, ran, block_seconds = [], [], [], set(stats), []
    bar = tqdm(total=len(found), desc="sensitivity", disable=not progress, leave=False)
    for idx, block_name, block, _ in found:
        bar.set_description(f"sensitivity: block {idx + 1}/{len(found)}")
        started = time.perf_counter()
        inside = {n: model.get_submodule(n) for n in [*tuned, *fixed] if where[n] == idx}
        with hold(block):
            if inside:
                prefix = Prefix(block, [n[len(block_name) + 1:] for n in tuned if where[n] == idx])
                with prefix.tracing() if REUSE_PREFIX else contextlib.nullcontext():
                    stats = hessians.collect(block, lambda b=block: kept.replay(b, advance=False), inside)
                ran.update(stats)
                which = _spread(len(kept.calls), PRICE_CALLS)
                priced = [n for n in tuned if where[n] == idx and n in stats]
                with prefix.recording() if REUSE_PREFIX else contextlib.nullcontext():
                    reference = list(kept.outputs(block, which))
                for name in priced:
                    hb, role = tuned[name]
                    layers.append(build_layer(model, config, name, hb, role, candidates, stats[name], blocks))
                    inside_name = name[len(block_name) + 1:]
                    reused = (lambda n=inside_name: prefix.reused(n)) if REUSE_PREFIX else contextlib.nullcontext
                    errors.append(_price_layer(model, block, kept, layers[-1], reference, which, reused))
                    proxies.append([proxy_error(v.module, inside[name], stats[name]) for v in layers[-1].variants])
                never = {n: plan[n] for n in tuned if where[n] == idx and n not in stats}  # built in the base format
                built.update(build_fixed(model, config, {**{n: fixed[n] for n in fixed if where[n] == idx}, **never},
                                         stats))
                del reference, stats, prefix
            if idx + 1 < len(found):
                kept.replay(block, advance=True)
        block_seconds.append(time.perf_counter() - started)
        bar.update()
    bar.close()
    kept.calls.clear()
    unmeasured = unmeasured_layers(model, config, list(tuned), ran)
    library = assemble(model, config, layers, built)
    return BlockPrices(library, errors, proxies, videos[0], unmeasured, time.perf_counter() - start, calibrated,
                       block_seconds)


def _fit_points(errors: list[list[float]], roles: list[str], points: int) -> list[tuple[float, int, int]]:
    """``points`` (block error, layer, variant) shared evenly by the roles (``roles[i]``: layer
    ``i``'s), each role's spread over the first :data:`FIT_SPREAD` of its ranking, largest error
    first."""
    ranked = sorted(((e, i, j) for i, row in enumerate(errors) for j, e in enumerate(row) if e > 0), reverse=True)
    if not ranked:
        raise ValueError("no candidate changes its block's outputs on the kept calibration inputs: the tuned "
                         "layers are not used by this model's blocks (or every format is exact)")
    present = list(dict.fromkeys(roles[i] for _, i, _ in ranked))
    chosen = []
    for n, role in enumerate(present):
        own = [r for r in ranked if roles[r[1]] == role]
        wanted = points // len(present) + (n < points % len(present))
        last = (len(own) - 1) * FIT_SPREAD
        chosen += [own[k] for k in sorted({round(k * last / max(wanted - 1, 1)) for k in range(wanted)})]
    return sorted(chosen, reverse=True)


def _factors(usable: list[tuple[str, float, torch.Tensor]], roles: list[str]) -> dict[str, float]:
    """Each role's factor: the geometric mean of its points' video (per video) over block error;
    a role without a point that changed the videos takes all the points' one."""
    def mean(points):
        return math.exp(float(np.mean([math.log(float(m.mean()) / e) for _, e, m in points])))

    return {role: mean([p for p in usable if p[0] == role] or usable) for role in dict.fromkeys(roles)}


def fit(evaluator: Evaluator, prices: BlockPrices, points: int = FIT_POINTS) -> tuple[Sensitivity, BlockFit]:
    """The factors from a few whole generations (the module docstring), and every layer ×
    format's predicted per-video MSE: a :class:`~.sensitivity.Sensitivity` as
    :func:`~.sensitivity.measure` returns, whose ``mse`` are predictions."""
    start = time.perf_counter()
    library = evaluator.library
    full = library.uniform(None)
    again = evaluator.error(evaluator.run()) if library.fixed else evaluator(full)
    if psnr_of(again) < PSNR_CAP:  # the same model twice: the runs must agree
        raise ValueError("two calibration runs of the unchanged model generated different videos: make the run "
                         "repeatable (a fixed generator or seed per video) so that errors can be measured")
    base = evaluator(full)  # the fixed layers' error
    roles, measured = [layer.role for layer in library.layers], []
    for e, i, j in _fit_points(prices.errors, roles, points):
        measured.append((e, i, j, (evaluator(full[:i] + (j,) + full[i + 1:]) - base).clamp_min(0)))
    usable = [(roles[i], e, m) for e, i, _, m in measured if float(m.sum()) > 0]
    if not usable:
        raise ValueError("the calibration videos do not change when any tuned layer is quantized: the run's "
                         "output does not depend on this model (does it return another model's videos?)")
    factors = _factors(usable, roles)
    profile = torch.stack([m / m.mean() for _, _, m in usable]).mean(0)
    mse = [[torch.zeros_like(base) if e == 0 else factors[role] * e * profile for e in row]
           for row, role in zip(prices.errors, roles)]
    pairs = [(p, float(m.sum())) for row_p, row_m in zip(prices.proxies, mse)
             for p, m in zip(row_p, row_m) if p == p and p > 0]
    sens = Sensitivity(mse, prices.proxies, spearman([p for p, _ in pairs], [m for _, m in pairs]),
                       time.perf_counter() - start, base)
    predicted, video = [factors[roles[i]] * e for e, i, _, _ in measured], [float(m.sum()) for *_, m in measured]
    pearson = float(np.corrcoef(predicted, video)[0, 1]) if len(measured) > 2 else math.nan
    points_out = [{"layer": library.layers[i].name, "role": roles[i], "format": library.layers[i].variants[j].label,
                   "block_error": e, "video_mse": float(m.sum())} for e, i, j, m in measured]
    return sens, BlockFit(factors, points_out, spearman(predicted, video), pearson)


class Predictor(Scores):
    """What the genetic search scores assignments with under ``sensitivity="blocks"``: the
    predicted per-video MSE (:meth:`~.sensitivity.Sensitivity.predict`), as an
    :class:`~.sensitivity.Evaluator` would return the measured one; nothing runs."""

    def __init__(self, library: Library, sensitivity: Sensitivity):
        self.library, self.sensitivity = library, sensitivity
        self.results: dict[tuple[int, ...], torch.Tensor] = {}
        self.seconds = 0.0

    def __call__(self, genome: tuple[int, ...]) -> torch.Tensor:
        genome = tuple(genome)
        if genome not in self.results:
            self.results[genome] = self.sensitivity.predict(genome)
        return self.results[genome]


__all__ = ["FIT_POINTS", "PRICE_CALLS", "BlockFit", "BlockPrices", "Predictor", "fit", "price_blocks"]
