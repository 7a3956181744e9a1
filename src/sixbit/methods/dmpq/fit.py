"""Fit DMPQ's error predictor ``E_t = α·Γ_{t−1} + β`` per block, and its threshold.

For every block call of the calibration runs, the block is first run as usual with
full-precision activations (the reference ``y``), then once more with NVFP4 activations
(``y_low``). ``Γ`` is ``‖y − x‖₁ / ‖x‖₁``; the block-output error is
``e = ‖y_low − y‖₁ / ‖y‖₁``. Their correlation over consecutive steps, ``(Γ_{t−1}, e_t)``, is
the paper's observation (``pearson_r``).

What the predictor learns depends on ``DMPQConfig.error_at``:

- ``"video"``: the cost in the final video. The calibration runs are repeated with
  INT8 activations everywhere (the base videos), then once per cell of a step-range ×
  block-range grid with NVFP4 activations in that cell only. A cell's cost is the relative
  squared change of the videos, ``‖V_cell − V_base‖² / ‖V_base‖²``; each call in the cell gets
  an equal share of it, scaled by its block-output error relative to the cell's mean. On the
  shipped models the first steps cost the video most although their block-output error is
  smallest: an early error moves the whole trajectory. A cell's run computes only from its
  first step on: the steps before are the base run's, recorded (:mod:`.prefix`; bit-identical,
  checked), which saves 45 % of the transformer's work over the default 5 step ranges. While
  fitting, each quantized layer keeps its weight's INT8 copy after the first conversion.
- ``"steps"`` (default): the same video cost, measured once per step range with NVFP4 activations in
  all blocks of that range (``step_groups`` runs instead of ``step_groups × block_groups``);
  each call's share of its range's cost is scaled by its block-output error, so the blocks of
  a range are priced by their own error and the step ranges by what they cost the video.
  On the shipped models it closed more of the W4A4 → W4A8 gap than ``"video"`` in three of
  four measurements (4.6 points less in the fourth) in about half the fitting time
  (BENCHMARKS ``dmpq-pricing``).
- ``"block"``: ``e`` itself (one run, no video needed).

Pairs ``(Γ_{t−1}, E_t)`` of consecutive steps of one sample feed a least-squares line per
block and step range of the grid (``"video"``) or per block (``"block"``). The threshold is
then the predicted error below which blocks go NVFP4 so that the FLOP-weighted average
activation width of the calibration runs equals ``target_bits`` (steps without ``Γ_{t−1}``
count as INT8). With ``refine`` (default), the calibration runs are
repeated once with DMPQ switching for real and the threshold is picked again from the errors
predicted then: at run time Γ is measured on mixed-precision blocks, not on full-precision
ones, and this second pass makes the achieved bits match the target.

Everything above compares re-runs, so the runs must repeat exactly. Each call of ``run()``
runs under ``torch.manual_seed(0)`` in a forked RNG (:func:`sixbit.calibration.seeded`): a pipeline
called without a ``generator`` draws its noise from the global RNG and so repeats too, and the
caller's RNG state is left as it was. Every run must then feed the model the same inputs at
its first step (checked on the first block: a few thousand sampled values of each input per
call, no extra run); one that does not — e.g. a ``generator`` created once outside ``run``,
which advances from one run to the next — is refused with a ``ValueError``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from ...config.dmpq import DMPQConfig
from ...memory.devices import total_memory
from ...models import iter_blocks
from ...nn.precision import ACT_BITS, ActMode, Level, gemm_flops
from ...runtime import blocks
from ...runtime.blocks import relative_l1
from ...runtime.context import track_steps
from .prefix import Diverged, Prefix
from .repeatable import Repeatable
from ...runtime.wrapped import changes_model
from .method import (
    DMPQPredictor,
    FixedAssignment,
    apply_dmpq,
    remove_dmpq,
    step_range,
)

logger = logging.getLogger(__name__)

VIDEO_TARGETS = ("video", "steps")  # the error_at values that price NVFP4 by the videos it changes


def _line(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Least-squares ``y ≈ α·x + β`` (a flat line when x does not vary)."""
    if x.numel() < 2 or float(x.var()) == 0:
        return 0.0, float(y.mean()) if y.numel() else 0.0
    xm, ym = x.mean(), y.mean()
    alpha = ((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum()
    return float(alpha), float(ym - alpha * xm)


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.numel() < 3 or float(x.std()) == 0 or float(y.std()) == 0:
        return float("nan")
    return float(torch.corrcoef(torch.stack([x, y]))[0, 1])


class _Probe(blocks.BlockMethod):
    """Calibration: runs every block call at full precision, then once more with NVFP4
    activations, and records Γ, the NVFP4 error at the block's output and the GEMM FLOPs."""

    order = blocks.PRECISION_ORDER

    def __init__(self, tracker):
        self.tracker = tracker
        self.mode: ActMode | None = None  # precision policy: the linears of the running block
        self.calls: list[dict] = []

    def __call__(self, layer, x):
        return self.mode

    def before(self, call):
        self.mode = ActMode.FP

    def after(self, call, output):
        x, y = call.input(), call.output(output)
        self.mode = ActMode.NVFP4
        try:
            y_low = call.output(call.rerun())
        finally:
            self.mode = None
        info = self.tracker.info
        self.calls.append({
            "key": (info.generation, info.branch), "block": call.index, "step": info.step, "timestep": info.timestep,
            "gamma": relative_l1(y - x, x), "error": relative_l1(y_low - y, y),
            "flops": sum(gemm_flops(m.in_features, m.out_features, x) for m in blocks.quant_linears(call.module)),
        })


@changes_model("fit_dmpq")
def fit_dmpq(
    model: nn.Module, run: Callable[[], object], config: DMPQConfig | None = None, refine: bool = True
) -> DMPQPredictor:
    """Run ``run()`` (calibration generations) on the quantized ``model`` and fit the predictor.

    With ``error_at="steps"`` (the default) ``run()`` must return the generated videos — a
    pipeline output with ``.frames``, a tensor or an array, or a list of those — and is called
    ``2 + step_groups`` times (plus one with ``refine``); with ``"video"``,
    ``2 + step_groups × block_groups`` times (plus one). Every call must
    generate the same videos: each runs under ``torch.manual_seed(0)`` in a forked RNG (your
    RNG state is left as it was), and one that feeds the model other inputs at its first step
    than the first call did raises ``ValueError``. A DMPQ already installed on ``model`` is
    removed first (apply the new predictor with ``apply_dmpq``). The predictor keeps the
    calibration runs' step count and timesteps (``num_steps``, ``timesteps``).

    Example:
        >>> run = lambda: pipe(prompts, num_inference_steps=20, generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
        >>> predictor = fit_dmpq(pipe.transformer, run)                                                     # doctest: +SKIP
        >>> predictor.pearson_r                                                                     # doctest: +SKIP
    """
    config = config or DMPQConfig()
    found = list(iter_blocks(model))
    if not all(blocks.quant_linears(block) for _, _, block, _ in found):
        raise ValueError("fit_dmpq needs a quantized model: run sixbit.quantize(model, ...) first")
    remove_dmpq(model)
    with _converted_once(model):
        return _fit(model, Repeatable(model, run), config, refine, len(found), [name for _, name, _, _ in found])


def _fit(model: nn.Module, run: Repeatable, config: DMPQConfig, refine: bool, n_blocks: int,
         names: list[str]) -> DMPQPredictor:
    calls = _probe(model, run)
    pairs = _pairs(calls)
    if not pairs:
        raise ValueError(
            "DMPQ predicts each step's error from the step before, and the calibration runs have a single "
            "denoising step: calibrate with at least 2 steps (e.g. calibration_kwargs={'num_inference_steps': 8})"
        )
    step_starts = [0]
    num_steps = 1 + max(c["step"] for c in calls)
    if config.error_at in VIDEO_TARGETS:
        cell_of, cost, step_starts = _video_costs(model, run, n_blocks, num_steps, config)
        targets = _shares(pairs, cell_of, cost)
    else:
        targets = [c["error"] for c, _ in pairs]
    predictor = _fit_lines(names, pairs, targets, step_starts)
    predictor.num_steps, predictor.timesteps = num_steps, _schedule(calls, num_steps)
    if config.threshold is not None:
        predictor.threshold = config.threshold
    else:
        total = sum(c["flops"] for c in calls)
        candidates = [(float(predictor.predict(c["block"], gp, c["step"]).max()), c["flops"]) for c, gp in pairs]
        predictor.threshold = _threshold(candidates, total, config.target_bits)
        if refine:
            predictor.threshold = _refine(model, run, predictor, config.target_bits)
    logger.info("DMPQ predictor: r = %.3f, threshold = %.4g", predictor.pearson_r, predictor.threshold)
    return predictor


@contextlib.contextmanager
def _converted_once(model: nn.Module) -> Iterator[None]:
    """Inside: each quantized layer keeps the INT8 copy of its (NVFP4) weight after the first
    conversion (``cache_converted``) instead of re-rounding it on every call of every calibration
    run: the same values, converted once. Copies kept only for the fit are dropped after it."""
    layers = [m for m in blocks.quant_linears(model) if not m.cache_converted]
    fresh = [m for m in layers if m.converted_nbytes() == 0]
    for layer in layers:
        layer.cache_converted = True
    try:
        yield
    finally:
        for layer in layers:
            layer.cache_converted = False
        for layer in fresh:
            layer.drop_converted()


def _probe(model: nn.Module, run: Callable[[], object]) -> list[dict]:
    """One record per block call of ``run()``: Γ, NVFP4 block-output error, FLOPs."""
    tracker = track_steps(model)
    tracker.new_generation()
    probe = _Probe(tracker)
    tracker.precision.register(Level.STEP, probe)
    blocks.attach(model, probe)
    try:
        with torch.no_grad():
            run()
    finally:
        blocks.detach(model, probe)
        tracker.precision.unregister(probe)
        tracker.new_generation()
    if not probe.calls:
        raise ValueError("DMPQ calibration recorded nothing: `run` never called the model")
    return probe.calls


def _schedule(calls: list[dict], num_steps: int) -> list[float] | None:
    """The timestep of each calibration step (where first seen), or ``None`` when a step's
    timesteps disagree between generations (runs on several schedules: no single one to map onto)."""
    timesteps: dict[int, float] = {}
    for c in calls:
        t = timesteps.setdefault(c["step"], c["timestep"])
        if abs(t - c["timestep"]) > 1e-6 * max(1.0, abs(t)):
            logger.warning(
                "the DMPQ calibration runs use several step schedules (step %d at t=%g and t=%g): the predictor "
                "keeps no timesteps, so runs with other step counts are not mapped onto the calibration steps",
                c["step"], t, c["timestep"],
            )
            return None
    return [timesteps[s] for s in range(num_steps)] if len(timesteps) == num_steps else None


def _pairs(calls: list[dict]) -> list[tuple[dict, torch.Tensor]]:
    """``(call, Γ_{t−1} per sample)`` for every call whose block ran at the step before."""
    previous = {(c["key"], c["block"], c["step"]): c for c in calls}
    pairs = []
    for c in calls:
        prev = previous.get((c["key"], c["block"], c["step"] - 1))
        if prev is not None and prev["gamma"].shape == c["gamma"].shape:
            pairs.append((c, prev["gamma"]))
    return pairs


def _fit_lines(names: list[str], pairs: list, targets: list[torch.Tensor], step_starts: list[int]) -> DMPQPredictor:
    """Least-squares lines per block and step range, and Pearson r of Γ_{t−1} and the block error."""
    alpha = [[0.0] * len(step_starts) for _ in names]
    beta = [[0.0] * len(step_starts) for _ in names]
    for b in range(len(names)):
        for r in range(len(step_starts)):
            chosen = [(gp, t) for (c, gp), t in zip(pairs, targets)
                      if c["block"] == b and step_range(step_starts, c["step"]) == r]
            if chosen:
                alpha[b][r], beta[b][r] = _line(torch.cat([g for g, _ in chosen]), torch.cat([t for _, t in chosen]))
    all_g = torch.cat([gp for _, gp in pairs]) if pairs else torch.empty(0)
    all_e = torch.cat([c["error"] for c, _ in pairs]) if pairs else torch.empty(0)
    return DMPQPredictor(names, alpha, beta, float("inf"), _pearson(all_g, all_e), step_starts, (all_g, all_e))


def _video_costs(model: nn.Module, run, n_blocks: int, n_steps: int, config: DMPQConfig):
    """Cost of NVFP4 activations per grid cell: the calibration videos' relative squared change.
    With ``error_at="steps"`` a cell is a whole step range (every block).

    Returns ``cell_of[(block, step)] = cell`` for every block and every step after the first,
    ``cost[cell]``, and the first step of each step range (the first range also holds step 0).
    """
    step_sets = [r.tolist() for r in torch.arange(1, n_steps).tensor_split(min(config.step_groups, n_steps - 1))]
    block_groups = 1 if config.error_at == "steps" else min(config.block_groups, n_blocks)
    block_sets = [r.tolist() for r in torch.arange(n_blocks).tensor_split(block_groups)]
    prefix = Prefix(model, total_memory(next(model.parameters()).device) // 4)
    with prefix.recording():
        base = _videos(_run_with(model, run, FixedAssignment(()))[0])
    if prefix.problem is not None:
        logger.info("DMPQ video cost: every cell runs in full (%s)", prefix.problem)
    cell_of, cost = {}, []
    for block_set in block_sets:
        for step_set in step_sets:
            videos = _videos(_cell(model, run, prefix, [(t, b) for b in block_set for t in step_set], step_set[0]))
            if videos.shape != base.shape:
                raise ValueError(
                    f"the calibration runs returned videos of shape {tuple(videos.shape)} and {tuple(base.shape)}: "
                    "run() must generate the same videos (prompts, seeds) every time"
                )
            cost.append(float((videos - base).pow(2).sum() / base.pow(2).sum().clamp_min(1e-30)))
            cell_of.update(dict.fromkeys(((b, t) for b in block_set for t in step_set), len(cost) - 1))
            logger.info("DMPQ video cost: blocks %s, steps %s: %.3g", block_set, step_set, cost[-1])
    return cell_of, cost, [0] + [steps[0] for steps in step_sets[1:]]


def _cell(model: nn.Module, run, prefix: Prefix, cells: list, start: int):
    """A cost-map run with NVFP4 at ``cells``, from step ``start`` on: the steps before it
    reused from the base run (:mod:`.prefix`), or all of it where they cannot be."""
    try:
        with prefix.from_step(start):
            return _run_with(model, run, FixedAssignment(cells))[0]
    except Diverged as e:
        prefix.problem = str(e)
        logger.warning("DMPQ video cost: %s; this and every later cell run in full", e)
        return _run_with(model, run, FixedAssignment(cells))[0]


def _shares(pairs: list, cell_of: dict, cost: list[float]) -> list[torch.Tensor]:
    """Each call's target: an equal share of its cell's cost, scaled by its block-output error
    relative to the cell's mean."""
    members: dict[int, list[torch.Tensor]] = {}
    positions: dict[int, set] = {}
    for c, _ in pairs:
        cell = cell_of[(c["block"], c["step"])]
        members.setdefault(cell, []).append(c["error"])
        positions.setdefault(cell, set()).add((c["block"], c["step"]))
    mean = {k: float(torch.cat(v).mean()) for k, v in members.items()}
    targets = []
    for c, _ in pairs:
        cell = cell_of[(c["block"], c["step"])]
        scale = c["error"] / mean[cell] if mean[cell] > 0 else torch.ones_like(c["error"])
        targets.append(cost[cell] / len(positions[cell]) * scale)
    return targets


def _videos(result) -> torch.Tensor:
    """The videos a calibration ``run()`` returned, as one float tensor."""
    if isinstance(result, (list, tuple)) and result and not isinstance(result[0], str):
        parts = [_videos(r) for r in result]
        return torch.cat([p.reshape(-1) for p in parts])
    frames = getattr(result, "frames", result)
    if isinstance(frames, torch.Tensor):
        return frames.detach().float().cpu()
    try:
        array = None if frames is None else np.asarray(frames, dtype=np.float32)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim == 0 or array.size == 0:
        raise ValueError(
            f"DMPQConfig(error_at='video') measures what NVFP4 costs the final video, but run() returned "
            f"{type(result).__name__}: return the generated videos (a pipeline output with .frames, a tensor "
            "or an array, or a list of them), or fit to the block outputs with DMPQConfig(error_at='block')"
        )
    return torch.from_numpy(array)


def _threshold(candidates: list[tuple[float, float]], total_flops: float, target_bits: float) -> float:
    """Smallest threshold whose NVFP4 FLOP share brings the runs to ``target_bits``.

    ``candidates`` are (predicted error, FLOPs) of the calls where a Γ_{t−1} was known; the
    other calls (``total_flops`` minus theirs) always run INT8.
    """
    low, high = ACT_BITS[ActMode.NVFP4], ACT_BITS[ActMode.INT8]
    needed = total_flops * (high - target_bits) / (high - low)
    done = 0.0
    for predicted, flops in sorted(candidates):
        if done >= needed:
            return math.nextafter(predicted, -math.inf)
        done += flops
    if done < needed:
        logger.warning(
            "target_bits=%.2f is out of reach: even with NVFP4 wherever Γ_{t-1} is known the average is "
            "%.2f bits; every such block goes NVFP4", target_bits, (low * done + high * (total_flops - done)) / total_flops,
        )
    return float("inf")


def _refine(model: nn.Module, run: Callable[[], object], predictor: DMPQPredictor, target_bits: float) -> float:
    """Re-pick the threshold from the errors predicted while DMPQ really switches precision."""
    _, report = _run_with(model, run, predictor)
    return _threshold(report.candidates, sum(report.flops.values()), target_bits)


def _run_with(model: nn.Module, run: Callable[[], object], policy):
    """``run()`` with DMPQ switching by ``policy``; returns its result and DMPQ's report."""
    method = apply_dmpq(model, policy)
    try:
        with torch.no_grad():
            result = run()
        return result, method.report()
    finally:
        remove_dmpq(model)
