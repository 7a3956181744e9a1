"""The tuner: stage 1 and 2 run in order, :func:`tune` (the package docstring, :mod:`sixbit.tuning`, says how)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time

import torch

from ..convert import calibration_runner, convert_model
from ..preflight import check_convertible
from ..models import transformer_of
from ..config import Activations
from ..presets import ConvertConfig, resolve
from .blocks import BlockFit, Predictor, fit, price_blocks
from .library import (
    DEFAULT_FORMATS,
    Library,
    build_library,
    fixed_layers,
    input_stats,
    plan_candidates,
    tuned_layers,
    unmeasured_layers,
    unmeasured_note,
)
from .report import TuneReport
from .search import Constraint, SearchResult, check_size, genetic, greedy, lowest, rank_key
from .targets import candidates as check_candidates
from .targets import check_plan, check_seed, check_sensitivity, fit_notes, target
from ..calibration.quality import psnr_bound, psnr_of
from .sensitivity import Evaluator, measure

logger = logging.getLogger(__name__)

#: Under ``sensitivity="blocks"``, how many times a ``min_psnr`` pick is checked with whole
#: generations (and the search's target raised by the shortfall) before it is reported not reached.
CHECK_ROUNDS = 3
#: Under ``sensitivity="blocks"``, how many of the assignments the search predicts best are
#: measured with a whole generation each; the best measured is the pick.
CHECK_TOP = 3


def _base(base) -> ConvertConfig:
    config = resolve(base)
    problems = []
    if config.weights is None:
        problems.append("it quantizes no weights")
    if config.activations not in (Activations.FP, Activations.INT8, Activations.NVFP4):
        problems.append(f"its activations are {config.activations!r} (tuning measures fixed activations: fp, int8 or nvfp4)")
    if config.cache is not None or config.dmpq is not None:
        problems.append("it runs a delta cache or DMPQ (add them to the tuned config afterwards)")
    if problems:
        raise ValueError(f"the base config cannot be tuned: {'; '.join(problems)}. Use e.g. base='w4a8' or 'w4a16'")
    return config


def _with_formats(config: ConvertConfig, layer_formats: dict, calibration_inputs: str,
                  description: str | None = None) -> ConvertConfig:
    """``config`` with ``layer_formats``, calibrated on ``calibration_inputs`` (``"full_precision"``:
    as the candidates were, :mod:`.library`, so ``convert_model`` builds exactly the measured layers)."""
    weights = dataclasses.replace(config.weights, layer_formats=dict(layer_formats), calibration_inputs=calibration_inputs)
    return dataclasses.replace(config, weights=weights, description=description or config.description)


@contextlib.contextmanager
def _stand_in(model, stand_in):
    """Calls of ``model`` run ``stand_in`` instead (its hooks and layers), so a calibration run
    written for ``model`` (a pipeline's, or the user's own loop) runs a converted copy of it."""
    own = model.__dict__.get("forward")  # a diffusers hook registry wraps forward on the instance
    model.forward = stand_in.__call__  # a bound method, not a submodule: it shadows the class's forward
    try:
        yield
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


class Tuner:
    """Stage 1 once, then any number of searches: ``Tuner(...).search(max_bits=5)``.

    Building it records the input statistics, builds every candidate and prices the sensitivity
    (the expensive part; ``sensitivity`` as :func:`tune`); :meth:`search` runs stage 2 for one target. The model is
    unchanged between calls (candidates are swapped in only while a run is measured, and a
    converted copy stands in for it only while it runs). Arguments as :func:`tune`, plus
    ``target``: a :class:`~.search.Constraint` checked against the candidates before stage 1
    (a budget below every assignment they allow is refused before anything runs).

    A candidate format that fits none of the tuned layers (its block does not divide their
    ``in_features``) is refused; one that fits only some is logged as a warning naming the
    layers, and kept in ``notes`` (and the report's summary).

    ``hold``: for a model whose blocks are read from its files as they compute
    (:func:`sixbit.tune_pretrained`), ``hold(block)`` keeps a block's weights in memory for
    the body of a ``with``; such a model is priced on kept block inputs only, and its pick is
    measured as the candidates were built (``calibration_inputs="full_precision"``)."""

    def __init__(self, model, calibration_data, *, base="w4a8", formats=DEFAULT_FORMATS, pipeline=None,
                 calibration_kwargs: dict | None = None, progress: bool = True, target: Constraint | None = None,
                 sensitivity: str = "blocks", hold=None):
        check_sensitivity(sensitivity)
        self.mode, self.hold = sensitivity, hold
        self.block_seconds: list[float] = []
        transformer = transformer_of(model)
        pipe = model if transformer is not model else None
        self.transformer, self.config = transformer, _base(base)
        candidates = check_candidates(formats)
        check_convertible(self.config, transformer, empty=hold is not None)
        self.plan = plan_candidates(transformer, self.config, candidates)  # shapes only: nothing runs
        check_plan(self.plan, target)
        run, self.calibration = calibration_runner(calibration_data, pipe if pipe is not None else pipeline,
                                                    dict(calibration_kwargs or {}))
        self.run = run
        if self.calibration["source"] == "videos":
            raise ValueError("tuning compares generated videos with full precision: pass prompts or a callable "
                             "that runs the sampling loop and returns the videos, not a folder of videos")
        self.notes = []
        for note in fit_notes(self.plan):
            self._note(note)
        self.progress = progress
        self._sequential: dict[tuple[int, ...], torch.Tensor] = {}  # genome → converted_error(…, "quantized")
        self.library: Library | None = None
        self.fit: BlockFit | None = None
        try:
            with torch.no_grad():
                self._stage1(transformer, candidates, run, progress)
        finally:
            if self.library is not None:
                self.library.restore()
        self.scorer = self.evaluator if self.fit is None else Predictor(self.library, self.sensitivity)
        self.uniform = {}
        for fmt in candidates:
            genome = self.library.uniform(fmt)
            if genome is not None:
                self.uniform["16-bit" if fmt is None else fmt] = self._described(genome, measured=self.fit is None)

    def _note(self, note: str) -> None:
        self.notes.append(note)
        logger.warning("%s", note)

    def _stage1(self, transformer, candidates, run, progress: bool) -> None:
        """The candidates and their sensitivity: priced on kept block inputs (``"blocks"``,
        :mod:`.blocks`; whole generations where the kept inputs cannot stand in for them) or
        measured with a whole generation per layer and format (``"generation"``)."""
        start = time.perf_counter()
        if self.mode == "blocks":
            prices = price_blocks(transformer, self.config, candidates, run, progress, self.hold)
            if isinstance(prices, str) and self.hold is not None:
                raise ValueError(f"a streamed tuning prices each layer on kept block inputs, and here they cannot stand "
                                 f"in for the generations: {prices}. Load the model and tune it in memory (sixbit.tune)")
            if not isinstance(prices, str):
                self.library, self.unmeasured = prices.library, prices.unmeasured
                if self.unmeasured:
                    self._note(unmeasured_note(self.unmeasured, len(self.plan.bits)))
                self.evaluator = Evaluator(self.library, run, prices.videos)
                self.sensitivity, self.fit = fit(self.evaluator, prices)
                self.seconds = {"calibration run": prices.calibration_seconds,
                                "candidates and block prices": prices.seconds - prices.calibration_seconds,
                                "fit": self.sensitivity.seconds}
                self.block_seconds = prices.block_seconds
                return
            self._note(f"stage 1 measured with a whole generation per layer and format (sensitivity='generation'): "
                       f"the kept block inputs cannot stand in for the generations: {prices}")
            self.mode = "generation"
        tuned = list(tuned_layers(transformer, self.config))
        stats = input_stats(transformer, run, [*tuned, *fixed_layers(transformer, self.config)])
        self.unmeasured = unmeasured_layers(transformer, self.config, tuned, stats)
        if self.unmeasured:
            self._note(unmeasured_note(self.unmeasured, len(tuned)))
        self.library = build_library(transformer, self.config, candidates, stats, progress, self.unmeasured)
        self.seconds = {"candidates": time.perf_counter() - start}
        self.evaluator = Evaluator(self.library, run)
        self.sensitivity = measure(self.evaluator, stats, progress)
        self.seconds["sensitivity"] = self.sensitivity.seconds

    def _described(self, genome, measured: bool = True) -> dict:
        """Bits, bytes, formats and calibration PSNR of ``genome``: measured (a whole generation)
        or, under ``"blocks"`` with ``measured=False``, predicted."""
        with torch.no_grad():
            error = (self.evaluator if measured else self.scorer)(genome)
        library = self.library
        return {"bits": library.bits(genome), "psnr": psnr_of(error), "psnr_bound": psnr_bound(error),
                "bytes": library.bytes(genome), "formats": library.formats(genome),
                "measured": measured or self.fit is None}

    def converted_error(self, layer_formats: dict, calibration_inputs: str) -> torch.Tensor:
        """Per-video MSE of the calibration videos with the base config and ``layer_formats``
        converted for real with ``calibration_inputs`` (``convert_model`` on a copy of the model;
        the model itself is left as it is), against full precision."""
        self.library.restore()  # the copy starts from the original layers
        converted = copy.deepcopy(self.transformer)
        with torch.no_grad(), _stand_in(self.transformer, converted):
            convert_model(converted, self.run, _with_formats(self.config, layer_formats, calibration_inputs))
            return self.evaluator.error(self.run())

    def _calibrated(self, genome, constraint: Constraint) -> dict:
        """:meth:`_described` for the better of the two ``calibration_inputs`` by
        :meth:`Constraint.psnr`: ``"full_precision"``, measured exactly by the candidates, or
        ``"quantized"`` (GPTQ on the quantized blocks' outputs), converted for real to be measured.
        Neither wins on every model (BENCHMARKS.md ``tune``); the PSNR is the converted model's
        either way. Without calibration in the recipe the two are the same."""
        described = self._described(genome) | {"calibration_inputs": "full_precision"}
        if self.hold is not None:  # streamed: no copy of the model to convert for real (the class doc)
            return described
        if not self.config.weights.needs_calibration or not (self.library.fixed or any(described["formats"].values())):
            return described  # nothing calibrated (every layer in full precision: nothing to convert)
        genome = tuple(genome)
        if genome not in self._sequential:  # the greedy assignment is often the search's pick
            self._sequential[genome] = self.converted_error(described["formats"], "quantized")
        fp, error = self.evaluator(genome), self._sequential[genome]
        if constraint.psnr(error) > constraint.psnr(fp):
            described.update(psnr=psnr_of(error), psnr_bound=psnr_bound(error), calibration_inputs="quantized")
        return described

    def _measured_best(self, result: SearchResult, aim: Constraint, constraint: Constraint) -> tuple[int, ...]:
        """Of the :data:`CHECK_TOP` assignments the search predicted best (under ``aim``), the one
        whose whole generation scores best under ``constraint``."""
        top = sorted(result.measured, key=lambda g: rank_key(aim, *result.measured[g]), reverse=True)[:CHECK_TOP]
        return max(top, key=lambda g: rank_key(constraint, self.library.bits(g), constraint.psnr(self.evaluator(g))))

    def _picked(self, constraint: Constraint, **search) -> tuple[SearchResult, dict, dict[str, float]]:
        """The genetic search on :attr:`scorer` and its pick measured (:meth:`_calibrated`), with
        ``best["checks"]`` the measured PSNR of each round. Under ``"blocks"`` the pick is the best
        measured of the search's :data:`CHECK_TOP` best predicted (:meth:`_measured_best`); with ``min_psnr`` the
        pick is checked with whole generations: while it misses, the search runs again with its
        target on the predictions raised by the shortfall — or, where more, to the target plus how
        much the predictions overrated the pick — at most :data:`CHECK_ROUNDS` rounds."""
        aim, checks, seconds = constraint, [], {"search": 0.0, "pick": 0.0}
        for _ in range(CHECK_ROUNDS if self.fit is not None else 1):
            result = genetic(self.scorer, self.sensitivity, aim, progress=self.progress, **search)
            start = time.perf_counter()
            if self.fit is not None:
                result = dataclasses.replace(result, best=self._measured_best(result, aim, constraint))
            best = self._calibrated(result.best, constraint)
            seconds["search"] += result.seconds
            seconds["pick"] += time.perf_counter() - start
            checks.append(best["psnr"] if constraint.budget else best["psnr_bound"])
            shortfall = 0.0 if constraint.budget else constraint.min_psnr - best["psnr_bound"]
            if shortfall <= 0:
                break
            # the predictions were this optimistic about the pick: ask them for the target plus that much
            optimism = self.scorer.psnr_bound(result.best) - best["psnr_bound"]
            aim = Constraint(min_psnr=max(aim.min_psnr + shortfall, constraint.min_psnr + optimism))
            logger.info("the pick reached %.2f dB on whole generations, %.2f dB short of %.2f dB: searching again at "
                        "%.2f dB on the predictions", best["psnr_bound"], shortfall, constraint.min_psnr, aim.min_psnr)
        best["checks"] = checks
        return result, best, seconds

    def search(self, *, max_bits: float | None = None, min_psnr: float | None = None, max_bytes: int | None = None,
               seed: int = 0, time_budget_s: float | None = None, population: int = 12,
               generations: int = 8) -> TuneReport:
        """Stage 2 for one target: the :class:`TuneReport` (``.config`` is the tuned config).

        ``max_bits`` / ``max_bytes``: the best mean calibration PSNR within that budget.
        ``min_psnr``: the fewest average bits whose calibration videos' mean PSNR minus one
        standard error reaches this — a margin for prompts the tuning has not seen; more
        calibration prompts shrink it (:func:`~sixbit.calibration.quality.psnr_bound`). Other arguments as
        :func:`tune`."""
        constraint = target(max_bits, min_psnr, max_bytes, time_budget_s)
        check_size(population, generations)
        check_seed(seed)
        check_plan(self.plan, constraint)
        library, config = self.library, self.config
        fewest = lowest(library)
        if self.unmeasured and not constraint.fits(library, fewest):
            raise ValueError(f"{constraint.describe()} cannot be met once the {len(self.unmeasured)} layers the "
                             f"calibration run never ran keep the base config's format: the fewest is "
                             f"{library.bits(fewest):.2f} bits, {library.bytes(fewest) / 2**20:.2f} MiB; give a larger "
                             "budget, or calibrate with prompts or inputs that run those layers")
        with torch.no_grad():
            result, best, seconds = self._picked(constraint, seed=seed, population=population,
                                                 generations=generations, time_budget_s=time_budget_s)
            start = time.perf_counter()
            found = greedy(library, self.sensitivity, constraint)
            greedy_found = (self._calibrated(found, constraint) if self.fit is None else
                            self._described(found, measured=False) | {"calibration_inputs": "full_precision"})
        seconds["pick"] += time.perf_counter() - start
        missed = constraint.min_psnr is not None and best["psnr_bound"] < constraint.min_psnr
        if missed:
            rounds = (f" after {len(best['checks'])} check rounds (whole generations; the search's target raised on "
                      f"the predictions each time it missed)" if self.fit is not None else "")
            logger.warning("no assignment reached %.2f dB on the calibration videos (their mean PSNR minus one "
                           "standard error)%s; the best reached %.2f dB (mean %.2f dB). Add calibration prompts (a "
                           "smaller margin), 16-bit or 8-bit candidates, or lower min_psnr",
                           constraint.min_psnr, rounds, best["psnr_bound"], best["psnr"])
        calibrated = (f"; calibrated on {best['calibration_inputs'].replace('_', '-')} inputs"
                      if config.weights.needs_calibration else "")
        if self.unmeasured:
            n = len(self.unmeasured)
            calibrated += f"; {n} layer{'s' if n > 1 else ''} unmeasured (never ran), kept in the base format"
        tuned = _with_formats(
            config, best["formats"], best["calibration_inputs"],
            f"tuned to {constraint.describe()}{' (NOT reached)' if missed else ''}: {best['bits']:.2f} bits per tuned "
            f"weight, {best['psnr']:.2f} dB on the calibration videos (mean − 1 SE {best['psnr_bound']:.2f} "
            f"dB{calibrated}; base: {config.description})")
        return TuneReport(tuned, constraint, [layer.name for layer in library.layers],
                          [[v.format for v in layer.variants] for layer in library.layers],
                          [[v.bits for v in layer.variants] for layer in library.layers],
                          self.sensitivity, greedy_found, best, self.uniform, result, {**self.seconds, **seconds},
                          self.calibration, list(self.notes), dict(self.unmeasured), self.mode, self.fit,
                          list(self.block_seconds))


def tune_model(model, calibration_data, *, max_bits: float | None = None, min_psnr: float | None = None,
               max_bytes: int | None = None, seed: int = 0, time_budget_s: float | None = None,
               base="w4a8", formats=DEFAULT_FORMATS, population: int = 12, generations: int = 8,
               pipeline=None, calibration_kwargs: dict | None = None,
               progress: bool = True, sensitivity: str = "blocks") -> TuneReport:
    """Tune per-layer weight formats; the :class:`TuneReport` (its ``.config`` is what
    :func:`tune` returns). Arguments as :func:`tune`, plus ``population`` (4…1000) and
    ``generations`` (1…1000): the search's size, about ``population × generations`` assignments run.
    Every argument that can be checked without running the model is checked first, including a
    budget below every assignment the candidate formats allow and a format that fits no tuned layer.

    ``min_psnr``: the fewest average bits whose calibration videos' mean PSNR minus one standard
    error reaches this — a margin for prompts the tuning has not seen; more calibration prompts
    shrink it."""
    constraint = target(max_bits, min_psnr, max_bytes, time_budget_s)  # bad arguments fail before the expensive part
    check_size(population, generations)
    check_seed(seed)
    check_sensitivity(sensitivity)
    tuner = Tuner(model, calibration_data, base=base, formats=formats, pipeline=pipeline,
                  calibration_kwargs=calibration_kwargs, progress=progress, target=constraint, sensitivity=sensitivity)
    return tuner.search(max_bits=max_bits, min_psnr=min_psnr, max_bytes=max_bytes, seed=seed,
                        time_budget_s=time_budget_s, population=population, generations=generations)


def tune(model, calibration_data, *, max_bits: float | None = None, min_psnr: float | None = None,
         max_bytes: int | None = None, seed: int = 0, time_budget_s: float | None = None, base="w4a8",
         formats=DEFAULT_FORMATS, pipeline=None, calibration_kwargs: dict | None = None,
         progress: bool = True, sensitivity: str = "blocks") -> ConvertConfig:
    """A :class:`ConvertConfig` with per-layer weight formats tuned to one target.

    Args:
        model: a diffusers pipeline or its bare transformer (full precision, not converted). It is
            left unchanged.
        calibration_data: what the videos are generated from, as :func:`sixbit.convert_model`
            takes it: a list of prompts (with a pipeline), or a callable that runs your own
            sampling loop and **returns the videos** (arrays or tensors ``(N, F, H, W, C)`` in
            [0, 1], or a pipeline output). Every run must generate the same videos.
        max_bits: the best calibration PSNR at ≤ this many average stored bits per tuned weight
            (scales and low-rank branches included; full precision counts 16).
        min_psnr: the fewest average bits whose calibration videos' mean PSNR minus one standard
            error reaches this (dB) — a margin for prompts the tuning has not seen; more
            calibration prompts shrink it (one video: no margin).
        max_bytes: the best PSNR whose transformer fits in this many bytes (the bf16 model's
            other tensors included). Give exactly one of the three.
        seed: the search's seed (same seed, same result).
        time_budget_s: stop the search after about this many seconds (default: its generations).
        base: the preset, JSON path or config whose weight recipe and activations are tuned
            (default ``"w4a8"``); its other layers (modulation, …) keep their formats.
        formats: the candidate formats (default INT3 g64, NVFP4, INT6, INT8 and 16-bit: :data:`DEFAULT_FORMATS`).
            A format whose block (e.g. ``int4-g256``'s 256) does not divide a layer's ``in_features``
            cannot quantize that layer: one that fits none of the tuned layers is refused, one that
            fits only some is logged as a warning naming the others (and kept in the report's notes).
        pipeline, calibration_kwargs: as for :func:`sixbit.convert_model`.
        progress: show progress bars.
        sensitivity: how stage 1 prices a layer in a format. ``"blocks"`` (default): its block's
            output error on block inputs kept from one calibration run, mapped to video error
            by a factor per layer role fitted on a few whole generations; the search runs on these
            predictions and its pick is checked with whole generations (a ``min_psnr`` pick
            that misses on them is searched again with a raised target, a few rounds at most;
            :mod:`sixbit.tuning.blocks`). ``"generation"``: a whole calibration generation per
            layer and format and per assignment the search scores — exact, about 5× slower on the shipped models
            (for small models and for checking). Where the kept inputs cannot stand in for the
            generations (e.g. a model with two block lists), ``"blocks"`` measures with
            generations and says so in the report's notes.

    See :mod:`sixbit.tuning` for the method and an example; :func:`tune_model` returns the full
    report (baselines, sensitivity, history).
    """
    return tune_model(model, calibration_data, max_bits=max_bits, min_psnr=min_psnr, max_bytes=max_bytes, seed=seed,
                      time_budget_s=time_budget_s, base=base, formats=formats, pipeline=pipeline,
                      calibration_kwargs=calibration_kwargs, progress=progress, sensitivity=sensitivity).config


__all__ = ["DEFAULT_FORMATS", "Constraint", "TuneReport", "Tuner", "tune", "tune_model"]
