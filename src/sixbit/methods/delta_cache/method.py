"""Temporal Delta Cache (TDC) with Purified Delta Refresh (PDR): skip blocks whose residual is stable.

Every computed call of a block stores its residual ``Δ_t = out − in`` (for two-stream blocks,
one per stream), its *slope* ``(Δ_t − Δ_prev) / gap`` and its *stability*: the relative L1
change from the previous computed residual, ``s = ‖Δ_t − Δ_prev‖₁ / ‖Δ_prev‖₁`` per step
between them. A skipped call returns ``out = in + (Δ_t + drift · age · slope)`` (``age``: steps
since ``Δ_t`` was computed; ``drift=0`` replays it as is), summed into one new tensor in place
(:meth:`Entry.replay`): the skip's whole cost.

**Blocks decide together** (default): at each step the mean stability of all blocks — the
last two computed residuals of each — decides whether the step's blocks skip. A step is skipped when

- it is past the warm-up (``max(warmup_steps, warmup_fraction × steps)``) and before the last
  ``max(final_steps, final_fraction × steps)`` steps (those always compute),
- the accumulated error estimate stays within ``error_budget``, the one knob: each skip adds
  ``s·k²`` (``age_exponent``; 1 in configs stored before issue 62), ``s`` the worst sample's
  stability (batch-wide: one prompt never makes another skip), ``k`` the age of the cached
  residual in steps, and a compute resets it — error-guided switching; a streak of ``n`` skips
  costs ``s·(1 + 4 + … + n²)``, and
- where set, ``s ≤ threshold``, fewer than ``max_skips`` consecutive skips and at most
  ``max_skip_share`` of the run's steps skipped (optional gates; off by default; a ``min_psnr``
  calibration sets the last, see :mod:`.calibrate`).

Why the budget alone, and why ``k²``: with the earlier rule (a stability threshold, at most two
skips in a row, and a budget of 3× the threshold, each skip adding ``s·k``) the cap set the skip
share and the threshold only moved the phase of the skip pattern: at the same skip share PSNR
changed with it, the default below its neighbours (35.6 / 35.6 / 37.5 dB at thresholds 0.17 /
0.2 / 0.25 on shapes-wan, each skipping half of the block calls). With the budget alone and
``s·k`` per skip, the phase still moved: a skip in the last tenth of the steps, which nothing
after it corrects, cost ≈ 2 dB (hence ``final_fraction``), and a long streak placed just before
them cost more than the same skips earlier, so PSNR rose with the budget once (by 0.09 dB on
shapes-wan between 1.6 and 2). A replayed residual is off by ≈ ``s·k`` and feeds every later
step, so its error grows faster than its age: with ``s·k²`` streaks stay even. Over 25 budgets
from 0.1 to 10 on 4 held-out pairs of each shipped model (the benchmark's), the skip share never
fell and PSNR never rose as the budget grew (BENCHMARKS ``cache-pareto``); on 8 pairs it rose
once, by 0.25 dB on shapes-cogvideox, where budgets 0.2 and 0.25 skip the same 7 steps one step apart.

The last tenth of the steps (``tail_fraction``) skips only right after a compute: a replay there
is one step old at most. Until issue 62's last change that tenth always computed
(``final_fraction`` 0.1), but with ``s·k²`` a single skip there is cheap and the streak it
replaced was not: at half of the steps skipped, on 16 calibration and 16 held-out prompts of each
shipped model, budget 1.0 with the tail rule (its tenth skip is step 18 of 20, one step after a
compute) gave 37.3 / 38.1 dB on shapes-cogvideox and 37.3 / 37.8 dB on shapes-wan, against
36.4 / 36.6 and 34.9 / 35.6 dB at budget 1.3 with the last tenth computed (the tenth skip
lengthens a streak instead). Letting the tail skip freely (``tail_fraction`` 0) broke the order
instead: budget 3 ended on a streak of three skips up to step 18 and gave 0.35 dB less than
budget 5, whose streaks sit earlier. Budget 1.0, the default, is the smallest that skips half of
the steps of both models on every prompt set measured.

Why together: on the shipped models, skipping alternate blocks at alternate steps (so every
step mixes fresh and replayed residuals) lost several dB of PSNR against skipping all blocks at
the same steps, at the same skip share: a replayed residual stays consistent with its
neighbours only if they are replayed from the same step. Nor is part of a step a finer unit of
skipping: on top of budget 1's ten skipped steps (of 20; 4 held-out pairs), an eleventh skipped
by the last block alone cost about as much as skipping it whole (at steps 5, 8, 11, 14, 17:
30.2 / 31.4 / 32.4 / 34.3 / 32.6 dB against 29.4 / 31.6 / 32.6 / 33.1 / 31.4 on shapes-cogvideox,
from 38.1; on shapes-wan 30.3 / 31.3 / 34.3 / 34.8 / 34.2 against 30.7 / 32.1 / 33.9 / 33.6 /
31.8, from 39.2), and the first two blocks alone still 2–5 dB. ``decide_per_block=True`` lets each
block decide alone from its own stability (the same rules per block). The drift term is a
damped first-order forecast of the residual. At budget 1.3 with ``final_fraction`` 0.1 on 4 held-out pairs, drift
0.5 / 0.7 / 0.75 / 1 gave 33.4 / 36.0 / 36.6 / 35.7 dB on shapes-cogvideox and 37.5 / 37.6 /
37.3 / 34.5 dB on shapes-wan: 0.7 is the one setting above both 0.5 and 1 on both models (0.75
fell below 0.5 on shapes-wan; 1 overshoots). The ``tdc-perblock`` and ``tdc-nodrift`` rows of
BENCHMARKS.md measure both choices against ``tdc``.

Relative L1 is the stability measure because the skip error is an L1-type drift of the
residual and the measure is scale-free across blocks (the same choice as TeaCache/MagCache).

**PDR**, for quantized models: when a block computes a residual that skips are expected to
replay — its last stability was within the budget for one skip, so the next steps may skip — each of its
``QuantLinear`` s whose input outlier ratio ``max|X| / mean|X|`` exceeds ``pdr_outlier_ratio``
runs in full precision for that call (a precision policy at
:attr:`~sixbit.nn.precision.Level.REFRESH`, above DMPQ and the configured default), so the cache stores a clean residual instead of
quantization noise that every skip would replay. Computes of unstable blocks (warm-up, or a
residual still changing) are not purified: no skip will reuse them before they are replaced,
and purifying every compute sent a fifth of the GEMM work to full precision on the shipped
models. The report counts the calls and the GEMM FLOPs moved to full precision. The first computed step after skips has no
``Γ_{t−1}``, so DMPQ runs it INT8.

Cached residuals can be stored compressed: ``cache_format="int8"`` (per
token) or ``"int4-g64"`` (groups of 64 along the hidden size; 32 or 16 where 64 does not divide
it, else per token); stability and drift are then measured against the stored residual.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ... import kernels
from ...nn.token_stats import token_max, token_mean_of_sum
from ...config.delta_cache import DeltaCacheConfig
from ...models import iter_blocks
from ...nn.precision import ActMode, Level, gemm_flops
from ...runtime import blocks, hooks
from ...runtime.blocks import relative_l1
from ...runtime.context import RunReports, StepTracker, track_steps
from ...runtime.wrapped import changes_model
from .state import DeltaCacheReport, DeltaCacheState, Entry, Stored, Streak

logger = logging.getLogger(__name__)

#: diffusers caches that reuse nothing approximately (exact text K/V reuse): they may run beside this one
LOSSLESS_DIFFUSERS_CACHES = frozenset({"TextKVCacheConfig"})


def check_no_diffusers_cache(model: nn.Module) -> None:
    """Refuse the delta cache beside a diffusers cache (``model.enable_cache``) that reuses outputs
    (First Block Cache, Pyramid Attention Broadcast, FasterCache, MagCache, TaylorSeer, …): both
    skip computation, each would measure stability on and replay the other's approximations, and
    the delta cache's error budget would not count the other's skips."""
    name = hooks.diffusers_cache(model)
    if name is not None and name not in LOSSLESS_DIFFUSERS_CACHES:
        raise ValueError(
            f"{type(model).__name__} has diffusers' cache {name} (enable_cache) and sixbit's delta cache: both skip "
            "computation and would replay each other's approximations; keep one: model.disable_cache() or "
            "sixbit.disable_delta_cache(model)"
        )


class DeltaCache(blocks.BlockMethod):
    """The installed method: skips or computes each block call. Get the run's report with :meth:`report`."""

    order = blocks.CACHE_ORDER

    def __init__(self, model: nn.Module, config: DeltaCacheConfig, tracker: StepTracker):
        self.model, self.config, self.tracker = model, config, tracker
        self.blocks = [name for _, name, _, _ in iter_blocks(model)]
        self.refreshing = False  # a block whose residual skips will replay is computing: PDR is live
        self.reports = RunReports(tracker, lambda: DeltaCacheReport(self.blocks), self._finished)
        self._peak_skip_share = 0.0  # the most any finished run skipped
        self._pending: tuple | None = None  # (x, encoder input, state, entry) of the computing block
        self.pdr: PurifiedRefresh | None = None

    def report(self) -> DeltaCacheReport:
        """The current run's decisions, or the last finished run's when none is in progress."""
        return self.reports.get()

    def _finished(self, report: DeltaCacheReport) -> None:
        self._peak_skip_share = max(self._peak_skip_share, report.most_skipped)

    def peak_skip_share(self) -> float:
        """The most any block skipped in any run since the cache was applied (its share of the
        block's calls; :attr:`DeltaCacheReport.most_skipped`)."""
        return max(self._peak_skip_share, self.reports.current.most_skipped)

    def _over_share(self, streak: Streak) -> bool:
        """Whether one more skipped step of a decision unit would pass ``max_skip_share`` of the
        run's steps (of the steps so far when the pipeline does not say how many it runs)."""
        share, info = self.config.max_skip_share, self.tracker.info
        if share is None:
            return False
        steps = info.num_steps if info.num_steps is not None else info.step + 1
        return streak.skipped + 1 > share * steps + 1e-9

    def activation_flops(self, flops: dict | None) -> dict | None:
        """``flops`` (GEMM FLOPs per activation mode, counted by a method that chose them) with
        PDR's refreshes moved to full precision, which they ran in (``Conversion.average_act_bits``)."""
        if flops is not None:
            for mode, f in self.report().pdr_flops.items():
                flops[mode] -= f
                flops[ActMode.FP.value] += f
        return flops

    def state(self) -> DeltaCacheState:
        return self.tracker.state(self, DeltaCacheState)

    def _warmup(self) -> int:
        cfg, num_steps = self.config, self.tracker.info.num_steps
        if num_steps is None:
            return cfg.warmup_steps
        return max(cfg.warmup_steps, round(cfg.warmup_fraction * num_steps))

    def _final(self) -> int:
        """How many of the last steps always compute (only known when the pipeline gives its steps)."""
        cfg, num_steps = self.config, self.tracker.info.num_steps
        return max(cfg.final_steps, round(cfg.final_fraction * num_steps))

    def _tail(self) -> int:
        """How many of the last steps skip only right after a compute (steps known, as for :meth:`_final`)."""
        return round(self.config.tail_fraction * self.tracker.info.num_steps)

    def _stability(self, unit: int | None) -> torch.Tensor | None:
        """Per-sample stability of a unit (its block's, or the mean over all blocks), worst over branches."""
        found = []
        for state in self.tracker.branch_states(self):
            if unit is not None:
                entry = state.entries.get(unit)
                values = [None if entry is None else entry.stability]
            else:
                values = [e.stability for e in state.entries.values()]
                if len(values) < len(self.blocks):
                    return None
            if any(v is None for v in values) or len({v.shape for v in values}) > 1:
                return None
            found.append(torch.stack(values).mean(0))
        if not found or len({f.shape for f in found}) > 1:
            return None
        return torch.stack(found).amax(0)

    def _unit(self, index: int) -> int | None:
        """What decides for block ``index``: the block itself, or all blocks together (``None``)."""
        return index if self.config.decide_per_block else None

    def _streak(self, index: int) -> Streak:
        return self.tracker.shared_state(self, dict).setdefault(self._unit(index), Streak())

    def _decide(self, unit: int | None, streak: Streak) -> bool:
        info, cfg = self.tracker.info, self.config
        if info.step < self._warmup() or (cfg.max_skips is not None and streak.skips >= cfg.max_skips):
            return False
        if self._over_share(streak):
            return False
        if info.num_steps is not None and info.step >= info.num_steps - self._final():
            return False
        if streak.skips and info.num_steps is not None and info.step >= info.num_steps - self._tail():
            return False  # the tail skips only right after a compute
        stability = self._stability(unit)
        if stability is None:
            return False
        worst = float(stability.max())
        age = info.step - streak.computed_step
        error = worst * age ** cfg.age_exponent  # s·k²: the replay is off by ≈ s·k, and feeds later steps (module doc)
        if (cfg.threshold is not None and worst > cfg.threshold) or streak.error + error > cfg.error_budget:
            return False
        streak.error += error
        streak.skips += 1
        streak.skipped += 1
        return True

    def should_skip(self, state: DeltaCacheState, index: int, x: torch.Tensor) -> bool:
        """This step's decision for block ``index``: taken once per step and unit, for every branch."""
        entry = state.entries.get(index)
        if entry is None or entry.stability is None or entry.hidden.shape != tuple(x.shape):
            return False
        streak, step = self._streak(index), self.tracker.info.step
        if streak.decided_step != step:
            streak.decided_step, streak.skip = step, self._decide(self._unit(index), streak)
        return streak.skip

    def reusable(self, index: int) -> bool:
        """Whether a compute of block ``index`` now is expected to be replayed: it was stable
        enough for one skip (within the budget, and the threshold where one is set)."""
        stability = self._stability(self._unit(index))
        if stability is None:
            return False
        cfg, worst = self.config, float(stability.max())
        return worst <= cfg.error_budget and (cfg.threshold is None or worst <= cfg.threshold)

    def computed(self, index: int) -> None:
        streak = self._streak(index)
        streak.computed_step, streak.skips, streak.error = self.tracker.info.step, 0, 0.0

    def record(self, index: int, decision: str) -> None:
        info = self.tracker.info
        current = self.reports.current
        current.decisions[(info.branch, info.step, index)] = decision
        if decision == "compute":
            current.cache_bytes = max(current.cache_bytes, self.state().held_bytes)


    def before(self, call: blocks.BlockCall):
        if call.index == 0:  # once per call: a diffusers cache enabled after this one is refused here
            check_no_diffusers_cache(self.model)
        io, cfg = call.io, self.config
        x = call.input()
        enc = call.input("encoder")
        state = self.state()
        entry = state.entries.get(call.index)
        if self.should_skip(state, call.index, x):
            self.record(call.index, "skip")
            age = self.tracker.info.step - entry.step
            outs = {"hidden": entry.replay(x, "hidden", cfg.drift, age)}
            if "encoder" in io.returns:
                outs["encoder"] = None if enc is None else entry.replay(enc, "encoder", cfg.drift, age)
            return outs["hidden"] if io.returns == ("hidden",) else tuple(outs[r] for r in io.returns)
        # purify only residuals that skips will replay: the block was stable at its last compute
        self.refreshing = cfg.pdr and self.reusable(call.index)
        self._pending = (x, enc, state, entry)
        return None

    def after(self, call: blocks.BlockCall, output) -> None:
        self.refreshing = False
        x, enc, state, entry = self._pending
        self._pending = None
        cfg, step = self.config, self.tracker.info.step
        y, y_enc = call.output(output), call.output(output, "encoder")
        delta = (y - x).detach()
        enc_delta = None if enc is None or y_enc is None or y_enc.shape != enc.shape else (y_enc - enc).detach()
        gap = max(step - entry.step, 1) if entry is not None else 1
        stability, slopes = None, {}
        for stream, new in (("hidden", delta), ("encoder", enc_delta)):
            old = None if entry is None else getattr(entry, stream).get()
            if new is None or old is None or old.shape != new.shape:
                continue
            change = new - old
            if stream == "hidden":
                stability = relative_l1(change, old) / gap
            if cfg.drift:  # in place: nothing else holds the change (x / 1 is x: no pass)
                slopes[stream] = change.div_(gap) if gap > 1 else change
        fmt = cfg.cache_format
        state.store(call.index, Entry(
            Stored(delta, fmt), Stored(enc_delta, fmt),
            Stored(slopes.get("hidden"), fmt), Stored(slopes.get("encoder"), fmt), step, stability,
        ))
        self.computed(call.index)
        self.record(call.index, "compute")


class PurifiedRefresh:
    """PDR's precision policy: full precision for an outlier-heavy input of a block that is
    computing a residual skips will replay; no opinion otherwise."""

    def __init__(self, cache: DeltaCache):
        self.cache = cache

    def __call__(self, layer: nn.Module, x: torch.Tensor) -> ActMode | None:
        if not self.cache.refreshing:
            return None
        return _purify(self.cache, layer, x)


@torch.compiler.disable
def _purify(cache: DeltaCache, layer: nn.Module, x: torch.Tensor) -> ActMode | None:
    scope = cache.tracker.precision
    mode = scope.decide(layer, x, below=Level.REFRESH) or layer.act_mode
    if mode is ActMode.FP:
        return None
    amax, total = kernels.abs_max_sum(x)  # one pass
    mean = token_mean_of_sum(total, x.numel())  # every rank's tokens
    if float(token_max(amax)) <= cache.config.pdr_outlier_ratio * float(mean):
        return None
    report = cache.reports.current
    report.pdr_full_precision_calls += 1
    report.pdr_flops[mode.value] += gemm_flops(layer.in_features, layer.out_features, x)
    return ActMode.FP


@changes_model("enable_delta_cache")
def apply_delta_cache(model: nn.Module, config: DeltaCacheConfig | None = None) -> DeltaCache:
    """Skip stable blocks of ``model`` (full precision or quantized); returns the method.

    Works inside diffusers pipelines (batched CFG and per-branch calls: state per branch) and
    in plain sampling loops. Composes with DMPQ in either install order: the cache always runs
    outside it, so a skipped block leaves DMPQ's Γ history untouched.

    Example:
        >>> cache = apply_delta_cache(pipe.transformer, DeltaCacheConfig(error_budget=1.0))  # doctest: +SKIP
        >>> video = pipe("a red circle moving right").frames                                # doctest: +SKIP
        >>> cache.report().skip_share                                                        # doctest: +SKIP
    """
    config = config or DeltaCacheConfig()
    check_no_diffusers_cache(model)
    remove_delta_cache(model)
    tracker = track_steps(model)
    cache = DeltaCache(model, config, tracker)
    if config.pdr:
        cache.pdr = PurifiedRefresh(cache)
        tracker.precision.register(Level.REFRESH, cache.pdr)
    blocks.attach(model, cache)
    return cache


@changes_model("disable_delta_cache")
def remove_delta_cache(model: nn.Module) -> None:
    """Remove the delta cache from ``model`` (no-op when it has none)."""
    for cache in list(blocks.attached(model, DeltaCache)):
        cache.reports.detach()
        cache.tracker.precision.unregister(cache.pdr)
        blocks.detach(model, cache)


def describe_delta_cache(model: nn.Module) -> str | None:
    """One line for :func:`sixbit.summary`: the knob (and what ``min_psnr`` chose) and the last
    run's skipped share; ``None`` where the delta cache is not installed."""
    cache = next(blocks.attached(model, DeltaCache), None)
    if cache is None:
        return None
    report = cache.report()
    ran = f"{100 * report.skip_share:.0f} % of the last run's block calls skipped" if report.decisions else "not run yet"
    return f"delta cache ({cache.config.describe()}): {ran}"


#: The delta cache's original names, kept public: ``enable_delta_cache`` is :func:`apply_delta_cache`,
#: ``disable_delta_cache`` is :func:`remove_delta_cache`.
enable_delta_cache = apply_delta_cache
disable_delta_cache = remove_delta_cache
