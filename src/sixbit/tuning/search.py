"""Stage 2: per-layer formats under a constraint — a greedy assignment from the sensitivity
ranking, and a genetic search seeded with it (seed 000 §2.1, step 2).

An assignment (*genome*) gives each tuned layer one of its variants. The constraint is one of:
average weight bits ≤ ``max_bits``, transformer bytes ≤ ``max_bytes`` (both *budgets*), or
calibration PSNR ≥ ``min_psnr`` at the fewest bits. Budgets maximize the mean per-video PSNR
(:func:`~sixbit.calibration.quality.psnr_of`); ``min_psnr`` is checked against its lower bound,
the mean minus one standard error (:func:`~sixbit.calibration.quality.psnr_bound`): a margin for
prompts the tuning has not seen, which more calibration videos shrink (:meth:`Constraint.psnr`).

- :func:`greedy` starts every layer at its fewest bits and repeatedly upgrades the layer whose
  upgrade removes the most predicted error per added bit, until the budget is spent (or the
  predicted PSNR reaches ``min_psnr``). Predictions add the layers' measured errors
  (:meth:`~sixbit.tuning.sensitivity.Sensitivity.predict`).
- :func:`genetic` keeps a population seeded from the sensitivity ranking (greedy assignments
  at nearby targets, uniform ones, mutations of them); each generation breeds children by
  tournament selection, uniform crossover and ±1-format mutations, repairs them into the
  budget (downgrade the cheapest-to-lose layer, then spend what is left greedily), ranks
  twice as many children as it keeps by predicted fitness (the proxy prunes) and **runs**
  the survivors: fitness is the measured calibration PSNR (true runs decide: with
  ``calibration_inputs="full_precision"`` an assignment converts to exactly the candidates that
  were run, :mod:`sixbit.tuning.library`). Elites survive.
  Reproducible for a seed: every draw comes from ``random.Random(seed)`` and every run is
  seeded.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time

from ..config.validate import show
from .library import Library
from ..calibration.quality import psnr_bound, psnr_of
from .sensitivity import Evaluator, Sensitivity


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past float's range: no budget can be compared with it
        return False


@dataclasses.dataclass(frozen=True)
class Constraint:
    """Exactly one of: ``max_bits`` (average stored bits per tuned weight), ``max_bytes``
    (transformer bytes), ``min_psnr`` (dB on the calibration videos — their mean PSNR minus one
    standard error — at the fewest bits)."""

    max_bits: float | None = None
    max_bytes: int | None = None
    min_psnr: float | None = None

    def __post_init__(self):
        given = [n for n in ("max_bits", "max_bytes", "min_psnr") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of max_bits, max_bytes, min_psnr (got {given or 'none'})")
        value = getattr(self, given[0])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value <= 0:
            raise ValueError(f"{given[0]} must be a finite number > 0, got {show(value)}")

    @property
    def budget(self) -> bool:
        return self.min_psnr is None

    def fits(self, library: Library, genome: tuple[int, ...]) -> bool:
        if self.max_bits is not None:
            return library.bits(genome) <= self.max_bits + 1e-9
        if self.max_bytes is not None:
            return library.bytes(genome) <= self.max_bytes
        return True

    def psnr(self, mse) -> float:
        """The PSNR (dB) this constraint judges per-video MSEs by: under ``min_psnr`` the lower
        bound :func:`~sixbit.calibration.quality.psnr_bound` (mean − one standard error), under a budget the
        mean :func:`~sixbit.calibration.quality.psnr_of`."""
        return psnr_of(mse) if self.budget else psnr_bound(mse)

    def describe(self) -> str:
        if self.max_bits is not None:
            return f"≤ {self.max_bits:g} bits per weight"
        if self.max_bytes is not None:
            return f"≤ {self.max_bytes / 2**20:.2f} MiB"
        return f"≥ {self.min_psnr:g} dB (mean − 1 SE) at the fewest bits"


def _upgrades(library: Library, sens: Sensitivity, genome: list[int]):
    """(error removed per added bit, layer, variant) of every upgrade that removes error."""
    for i, layer in enumerate(library.layers):
        now_cost, now_bits = sens.cost(i, genome[i]), layer.variants[genome[i]].bits
        for j in range(genome[i] + 1, len(layer.variants)):
            gain = now_cost - sens.cost(i, j)
            added = (layer.variants[j].bits - now_bits) * layer.numel
            if gain > 0 and added > 0:
                yield gain / added, i, j


def _fill(library: Library, sens: Sensitivity, constraint: Constraint, genome: list[int],
          target_psnr: float | None = None) -> list[int]:
    """Upgrade greedily (most error removed per bit first) while the budget allows, or until
    the predicted PSNR's lower bound (:func:`~sixbit.calibration.quality.psnr_bound`) reaches ``target_psnr``."""
    while True:
        if target_psnr is not None and psnr_bound(sens.predict(tuple(genome))) >= target_psnr:
            return genome
        for _, i, j in sorted(_upgrades(library, sens, genome), reverse=True):
            trial = genome[:i] + [j] + genome[i + 1:]
            if constraint.fits(library, tuple(trial)):
                genome = trial
                break
        else:
            return genome


def _repair(library: Library, sens: Sensitivity, constraint: Constraint, genome: list[int]) -> list[int]:
    """Downgrade the layer that adds the least predicted error per saved bit until ``genome`` fits."""
    while not constraint.fits(library, tuple(genome)):
        best = None
        for i, layer in enumerate(library.layers):
            for j in range(genome[i]):
                saved = (layer.variants[genome[i]].bits - layer.variants[j].bits) * layer.numel
                if saved > 0:
                    rate = (sens.cost(i, j) - sens.cost(i, genome[i])) / saved
                    if best is None or rate < best[0]:
                        best = (rate, i, j)
        if best is None:
            raise ValueError("no assignment fits the constraint: even the fewest bits exceed it")
        genome[best[1]] = best[2]
    return genome


def lowest(library: Library) -> tuple[int, ...]:
    return tuple(0 for _ in library.layers)


def greedy(library: Library, sens: Sensitivity, constraint: Constraint, target_psnr: float | None = None) -> tuple[int, ...]:
    """The greedy assignment from the sensitivity ranking (see the module docstring)."""
    start = list(lowest(library))
    if not constraint.fits(library, tuple(start)):
        raise ValueError(f"the constraint {constraint.describe()} is below the fewest bits any assignment has "
                         f"({library.bits(tuple(start)):.2f} bits, {library.bytes(tuple(start)) / 2**20:.2f} MiB)")
    target = target_psnr if target_psnr is not None else constraint.min_psnr
    return tuple(_fill(library, sens, constraint, start, target))


@dataclasses.dataclass
class SearchResult:
    """The best assignment found, what every measured one scored, and the search's history."""

    best: tuple[int, ...]
    measured: dict[tuple[int, ...], tuple[float, float]]  # genome → (bits, Constraint.psnr), every one scored
    history: list[dict]  # per generation: evaluations, best bits, best PSNR, seconds
    seconds: float
    stopped: str  # "generations" or "time budget"


def rank_key(constraint: Constraint, bits: float, psnr: float) -> tuple:
    """Larger is better: the PSNR under a budget; under ``min_psnr`` the fewest bits among the
    assignments that reach it, then the closest to reaching it. ``psnr``: :meth:`Constraint.psnr`
    (under ``min_psnr``, the lower bound)."""
    if constraint.budget:
        return (psnr, -bits)
    if psnr >= constraint.min_psnr:
        return (1, -bits, psnr)
    return (0, psnr, -bits)


class _Population:
    """The genetic search's operators over one library: measured and predicted scores, repair
    into the budget, mutation and crossover. One ``random.Random(seed)`` drives every draw."""

    def __init__(self, evaluator: Evaluator, sens: Sensitivity, constraint: Constraint, seed: int):
        self.evaluator, self.library, self.sens, self.constraint = evaluator, evaluator.library, sens, constraint
        self.rng = random.Random(seed)
        self.n = len(self.library.layers)
        self.measured: dict[tuple[int, ...], tuple[float, float]] = {}

    def score(self, genome: tuple[int, ...]) -> tuple:
        if genome not in self.measured:  # run, or remembered from an earlier search: the same either way
            self.measured[genome] = (self.library.bits(genome), self.constraint.psnr(self.evaluator(genome)))
        return rank_key(self.constraint, *self.measured[genome])

    def predicted(self, genome: tuple[int, ...]) -> tuple:
        return rank_key(self.constraint, self.library.bits(genome), self.constraint.psnr(self.sens.predict(genome)))

    def legal(self, genome: list[int]) -> tuple[int, ...]:
        if self.constraint.budget:
            genome = _fill(self.library, self.sens, self.constraint,
                           _repair(self.library, self.sens, self.constraint, genome))
        return tuple(genome)

    def mutate(self, genome: tuple[int, ...], rate: float) -> tuple[int, ...]:
        out = list(genome)
        for i in range(self.n):
            if self.rng.random() < rate:
                out[i] = min(max(out[i] + self.rng.choice((-1, 1)), 0), len(self.library.layers[i].variants) - 1)
        return self.legal(out)

    def initial(self, population: int) -> list[tuple[int, ...]]:
        """Greedy at the target (and, under min_psnr, around it), the uniform assignments
        (repaired into a budget), then mutations of the best three; greedy always runs."""
        library, constraint = self.library, self.constraint
        seeds = [greedy(library, self.sens, constraint)]
        if not constraint.budget:
            seeds += [greedy(library, self.sens, constraint, constraint.min_psnr + d) for d in (-1.0, 1.0, 2.0)]
        for fmt in dict.fromkeys(v.format for layer in library.layers for v in layer.variants):
            uniform = library.uniform(fmt)
            if uniform is not None:
                seeds.append(self.legal(list(uniform)))
        pool = list(dict.fromkeys(seeds))
        tries = 0
        while len(pool) < population and tries < 20 * population:
            pool = list(dict.fromkeys(pool + [self.mutate(self.rng.choice(pool[:3]), 2.0 / self.n)]))
            tries += 1
        return pool[:1] + sorted(pool[1:], key=self.predicted, reverse=True)[:population - 1]

    def children(self, ranked: list[tuple[int, ...]], count: int, tries: int) -> list[tuple[int, ...]]:
        """Up to ``count`` new genomes by tournament crossover and mutation (at most ``tries``
        draws), best predicted first."""
        children: list[tuple[int, ...]] = []
        for _ in range(tries):
            if len(children) >= 2 * count:
                break
            a, b = (max(self.rng.sample(ranked, min(3, len(ranked))), key=self.score) for _ in range(2))
            child = self.mutate(self.legal([x if self.rng.random() < 0.5 else y for x, y in zip(a, b)]), 1.0 / self.n)
            if child not in children and child not in ranked:
                children.append(child)
        return sorted(children, key=self.predicted, reverse=True)[:count]


#: The genetic search's size limits: a generation keeps 2 elites and breeds the rest from
#: tournaments of 3, so fewer than 4 assignments leave it nothing to breed from; each assignment
#: costs a calibration run, so more than 1000 per generation (or 1000 generations) is a mistake.
MIN_POPULATION, MAX_POPULATION, MAX_GENERATIONS = 4, 1000, 1000


def check_size(population, generations) -> None:
    """Refuse a search size :func:`genetic` cannot work with: one ``ValueError`` naming the argument."""
    for name, value, low, high, why in (
            ("population", population, MIN_POPULATION, MAX_POPULATION,
             " (the search keeps 2 elites and breeds the rest from tournaments of 3)"),
            ("generations", generations, 1, MAX_GENERATIONS, "")):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name} must be a whole number from {low} to {high}{why}, got {show(value)}")


def genetic(evaluator: Evaluator, sens: Sensitivity, constraint: Constraint, *, seed: int = 0,
            population: int = 12, generations: int = 8, time_budget_s: float | None = None,
            progress: bool = True) -> SearchResult:
    """Stage 2's genetic search (see the module docstring)."""
    from tqdm.auto import tqdm

    check_size(population, generations)
    start, before = time.perf_counter(), set(evaluator.results)
    search = _Population(evaluator, sens, constraint, seed)
    bar = tqdm(total=generations, desc="genetic search", disable=not progress, leave=False)
    history, stopped = [], "generations"

    def over_time() -> bool:
        return time_budget_s is not None and time.perf_counter() - start > time_budget_s

    ranked = sorted(search.initial(population), key=search.score, reverse=True)
    for generation in range(generations):
        if generation:
            elite, kept = ranked[:2], []
            for child in search.children(ranked, population - len(elite), 8 * population):
                if over_time():
                    break
                search.score(child)
                kept.append(child)
            ranked = sorted(dict.fromkeys(elite + kept + ranked), key=search.score, reverse=True)[:population]
        best = ranked[0]
        history.append({"generation": generation, "evaluations": evaluator.count - len(before),
                        "bits": evaluator.library.bits(best), "psnr": evaluator.psnr(best),
                        "psnr_bound": evaluator.psnr_bound(best), "seconds": time.perf_counter() - start})
        bar.set_postfix_str(f"best {history[-1]['psnr']:.2f} dB at {history[-1]['bits']:.2f} bits")
        bar.update()
        if over_time():
            stopped = "time budget"
            break
    bar.close()
    return SearchResult(ranked[0], search.measured, history, time.perf_counter() - start, stopped)


__all__ = ["MAX_GENERATIONS", "MAX_POPULATION", "MIN_POPULATION", "Constraint", "SearchResult", "check_size",
           "genetic", "greedy", "rank_key"]
