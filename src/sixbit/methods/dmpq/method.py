"""Dynamic mixed-precision quantization (DMPQ): NVFP4 or INT8 activations per block and step.

Each block's relative L1 change from input to output at its previous computed step,
``Γ_{t−1} = ‖out − in‖₁ / ‖in‖₁``, predicts how much error NVFP4 activations would add at
step ``t`` through a linear model ``E = α·Γ_{t−1} + β`` fitted on calibration runs
(:func:`sixbit.methods.dmpq.fit_dmpq`): one line per block and step range, so a step range can
be cheap or costly for the video whatever its Γ. Step ranges are counted in the calibration
runs' steps; the predictor keeps their step count and timesteps, and a run with another step
count or schedule uses, at each step, the line of the calibration step nearest its timestep.
A block whose predicted error is at most the
threshold runs every linear with NVFP4 activations (``low``); otherwise, and whenever ``Γ_{t−1}`` is
unknown (first step, after a skip), with INT8 (``high``). The threshold is set on calibration
data so the GEMM-FLOP-weighted average activation width meets ``target_bits``.

Batches: each sample's error is predicted from its own Γ; a block goes low only if *every*
sample in the call is predicted stable, so one prompt never lowers another's precision. Each CFG
branch called on its own (Wan, HunyuanVideo) has its own Γ history and its own decisions; a
batched cond+uncond call (CogVideoX, LTX) is one GEMM per linear, so when its halves disagree
it runs INT8 — the higher precision — for both.

The method rides on the shared block hook (:mod:`sixbit.runtime.blocks`, inside the delta
cache, so a skipped block leaves the Γ history untouched) and answers the precision scope at
:attr:`~sixbit.nn.precision.Level.STEP` for the linears of the block that is running.

NVFP4 activations are emulated on hardware without FP4 matmuls (see :class:`~sixbit.nn.QuantLinear`).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections import defaultdict

import torch
from torch import nn

from ...models import iter_blocks
from ...nn.precision import ActMode, Level, average_bits, gemm_flops
from ...runtime import blocks
from ...runtime.context import RunReports, StepTracker, track_steps
from ...runtime.wrapped import changes_model

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DMPQPredictor:
    """Linear error model ``E = α·Γ_{t−1} + β`` per block (and step range), and the switching threshold.

    ``alpha[b]`` and ``beta[b]`` hold one value per step range; range ``r`` starts at step
    ``step_starts[r]`` (default one range, ``[0]``: one line per block). A plain number is one
    range.

    ``num_steps`` and ``timesteps`` are the calibration runs' step count and the timestep of
    each of their steps (``None`` in predictors saved before they were kept). With
    ``timesteps``, a run on another schedule — another step count — is mapped onto the
    calibration steps by timestep (:meth:`fitted_step`).
    """

    blocks: list[str]
    alpha: list
    beta: list
    threshold: float
    pearson_r: float = float("nan")  # correlation of Γ_{t−1} and the block-output error at t, on calibration
    step_starts: list[int] = dataclasses.field(default_factory=lambda: [0])
    # the (Γ_{t−1}, E_t) calibration pairs, kept for plots; not serialized
    pairs: tuple[torch.Tensor, torch.Tensor] | None = dataclasses.field(default=None, repr=False, compare=False)
    num_steps: int | None = None  # steps of the calibration runs
    timesteps: list[float] | None = None  # the timestep of each calibration step (num_steps of them)

    def __post_init__(self):
        self.alpha = [list(a) if isinstance(a, (list, tuple)) else [a] for a in self.alpha]
        self.beta = [list(b) if isinstance(b, (list, tuple)) else [b] for b in self.beta]
        self.step_starts = list(self.step_starts)
        ranges = len(self.step_starts)
        if (
            not ranges or self.step_starts[0] != 0 or self.step_starts != sorted(set(self.step_starts))
            or len(self.alpha) != len(self.blocks) or len(self.beta) != len(self.blocks)
            or any(len(v) != ranges for v in self.alpha + self.beta)
        ):
            raise ValueError(
                f"inconsistent DMPQ predictor: {len(self.blocks)} blocks, step_starts {self.step_starts} "
                "(must start at 0 and increase), and alpha/beta need one value per block and step range"
            )
        if self.num_steps is not None and (
            not isinstance(self.num_steps, int) or isinstance(self.num_steps, bool) or self.num_steps < 1
        ):
            raise ValueError(f"DMPQ predictor num_steps must be an integer ≥ 1 or None, got {self.num_steps!r}")
        if self.timesteps is not None:
            self.timesteps = [float(t) for t in self.timesteps]
            if len(self.timesteps) != self.num_steps:
                raise ValueError(
                    f"DMPQ predictor has {len(self.timesteps)} timesteps for num_steps={self.num_steps!r}: "
                    "give one timestep per calibration step, or timesteps=None"
                )

    def fitted_step(self, step: int, timestep: float | None = None) -> int:
        """The calibration step whose line serves run-time ``step`` at ``timestep``.

        ``step`` itself on the calibration schedule (or when the predictor has no timesteps);
        otherwise the calibration step whose timestep is nearest ``timestep``, so a run with
        another step count meets the step ranges at the same noise levels.
        """
        ts = self.timesteps
        if ts is None or timestep is None or (step < len(ts) and _same_timestep(ts[step], timestep)):
            return step
        return min(range(len(ts)), key=lambda k: (abs(ts[k] - timestep), k))

    def predict(self, block: int, gamma: torch.Tensor, step: int = 0) -> torch.Tensor:
        r = step_range(self.step_starts, step)
        return self.alpha[block][r] * gamma.double() + self.beta[block][r]  # float64: exact against the threshold

    def choose(self, block: int, gamma: torch.Tensor, step: int = 0) -> ActMode:
        """NVFP4 when every sample's predicted error is within the threshold, else INT8."""
        return ActMode.NVFP4 if bool((self.predict(block, gamma, step) <= self.threshold).all()) else ActMode.INT8

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "pairs"}

    @classmethod
    def from_dict(cls, data: dict) -> DMPQPredictor:
        return cls(**data)


def _same_timestep(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a))


def step_range(step_starts: list[int], step: int) -> int:
    """Index of the step range (ranges start at ``step_starts``, the first at 0) that holds ``step``."""
    return bisect.bisect_right(step_starts, step) - 1


class FixedAssignment:
    """Policy: NVFP4 exactly at the ``(step, block)`` pairs in ``cells``, INT8 elsewhere, whatever Γ says.

    Used by calibration to measure what NVFP4 costs in one part of the run, and as an ablation
    (DMPQ's own map, fixed).
    """

    def __init__(self, cells):
        self.cells = set(cells)

    def choose(self, block: int, gamma: torch.Tensor, step: int = 0) -> ActMode:
        return ActMode.NVFP4 if (step, block) in self.cells else ActMode.INT8


class RandomAssignment:
    """Baseline policy: NVFP4 with probability ``low_share`` wherever DMPQ could choose, ignoring Γ.

    With the same average bits as a DMPQ run it isolates what the predictor contributes.
    """

    def __init__(self, low_share: float, seed: int = 0):
        if not 0 <= low_share <= 1:
            raise ValueError(f"low_share must be within [0, 1], got {low_share!r}")
        self.low_share = low_share
        self.generator = torch.Generator().manual_seed(seed)

    def choose(self, block: int, gamma: torch.Tensor, step: int = 0) -> ActMode:
        draw = float(torch.rand((), generator=self.generator))
        return ActMode.NVFP4 if draw < self.low_share else ActMode.INT8


class DMPQState:
    """Per run and branch: the last Γ of every block (one value per sample) and its step."""

    def __init__(self):
        self.gamma: dict[int, tuple[int, torch.Tensor]] = {}


@dataclasses.dataclass
class DMPQReport:
    """What DMPQ chose in one run: ``decisions[(branch, step, block)]`` and GEMM FLOPs per mode."""

    blocks: list[str]
    decisions: dict[tuple[str, int, int], str] = dataclasses.field(default_factory=dict)
    flops: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    # (predicted error, GEMM FLOPs) of every call where the predictor had a Γ_{t−1} to use
    candidates: list[tuple[float, float]] = dataclasses.field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return sorted({s for _, s, _ in self.decisions})

    @property
    def average_bits(self) -> float:
        """GEMM-FLOP-weighted average activation bits (NVFP4 counted as 4.5: its scales included)."""
        return average_bits(self.flops)

    def flop_share(self) -> dict[str, float]:
        total = sum(self.flops.values())
        return {m: f / total for m, f in self.flops.items()} if total else {}

    def precision_map(self, branch: str | None = None) -> list[list[str]]:
        """``map[step][block]`` = act mode (``branch`` default: the first one recorded)."""
        branch = branch or min(b for b, _, _ in self.decisions)
        return [[self.decisions.get((branch, s, b), "") for b in range(len(self.blocks))] for s in self.steps]


class DMPQ(blocks.BlockMethod):
    """The installed method: decides each block call's precision. Get the run's report with :meth:`report`."""

    order = blocks.PRECISION_ORDER

    def __init__(self, model: nn.Module, policy: DMPQPredictor | FixedAssignment | RandomAssignment,
                 tracker: StepTracker):
        self.model = model
        self.policy = policy
        self.tracker = tracker
        self.blocks = [name for _, name, _, _ in iter_blocks(model)]
        self.reports = RunReports(tracker, lambda: DMPQReport(self.blocks))
        self._running: tuple[ActMode, torch.Tensor, float | None] | None = None  # the block call in progress
        self._told_schedule = False  # logged once that this run's schedule is not the calibration's

    def report(self) -> DMPQReport:
        """The current run's decisions, or the last finished run's when none is in progress."""
        return self.reports.get()

    def activation_flops(self, flops: dict | None) -> dict:
        """GEMM FLOPs per activation mode of the last run (``Conversion.average_act_bits``)."""
        return defaultdict(float, self.report().flops)

    def __call__(self, layer: nn.Module, x: torch.Tensor) -> ActMode | None:
        """Precision policy: the mode chosen for the block that is running (outside blocks: no opinion)."""
        return None if self._running is None else self._running[0]

    def decide(self, index: int, batch: int) -> tuple[ActMode, float | None]:
        """The block's mode for this call, and the predicted error it was based on (if any)."""
        state = self.tracker.state(self, DMPQState)
        step, gamma = state.gamma.get(index, (None, None))
        # Γ must come from the step just before: after a skipped step (delta cache) it is unknown
        if gamma is None or step != self.tracker.info.step - 1 or gamma.shape[0] != batch:
            return ActMode.INT8, None
        step = self._fitted_step(self.tracker.info)
        predicted = float(self.policy.predict(index, gamma, step).max()) if hasattr(self.policy, "predict") else None
        return self.policy.choose(index, gamma, step), predicted

    def _fitted_step(self, info) -> int:
        """The policy's step for this call: a predictor maps another schedule onto its calibration steps."""
        policy = self.policy
        if not isinstance(policy, DMPQPredictor):
            return info.step
        step = policy.fitted_step(info.step, info.timestep)
        if self._told_schedule:
            return step
        runs = f"{info.num_steps} steps" if info.num_steps is not None else "another step schedule"
        if step != info.step:
            self._told_schedule = True
            logger.info(
                "DMPQ: the predictor was calibrated with %s steps and this run has %s: each step uses the "
                "calibration step nearest its timestep (step %d at t=%g → calibration step %d)",
                policy.num_steps, runs, info.step, info.timestep, step,
            )
        elif policy.timesteps is None and policy.num_steps is not None and (
            info.step >= policy.num_steps or info.num_steps not in (None, policy.num_steps)
        ):
            self._told_schedule = True
            logger.warning(
                "DMPQ: the predictor was calibrated with %d steps and this run has %s, but it keeps no calibration "
                "timesteps to map them by: its step ranges are applied to step indices as they are; refit it "
                "with the step count you generate with", policy.num_steps, runs,
            )
        return step

    def before(self, call: blocks.BlockCall) -> None:
        x = call.input()
        mode, predicted = self.decide(call.index, x.shape[0])
        self._running = (mode, x, predicted)

    def after(self, call: blocks.BlockCall, output) -> None:
        mode, x, predicted = self._running
        self._running = None
        info = self.tracker.info
        gamma = blocks.relative_l1(call.output(output) - x, x)
        self.tracker.state(self, DMPQState).gamma[call.index] = (info.step, gamma)
        flops = sum(gemm_flops(m.in_features, m.out_features, x) for m in blocks.quant_linears(call.module))
        current = self.reports.current
        current.decisions[(info.branch, info.step, call.index)] = mode.value
        current.flops[mode.value] += flops
        if predicted is not None:
            current.candidates.append((predicted, flops))


@changes_model("apply_dmpq")
def apply_dmpq(model: nn.Module, policy: DMPQPredictor | FixedAssignment | RandomAssignment) -> DMPQ:
    """Switch every block's activation precision per step with ``policy``; returns the method.

    ``policy`` is a fitted :class:`DMPQPredictor` (:func:`sixbit.methods.dmpq.fit_dmpq`), or
    the :class:`FixedAssignment` / :class:`RandomAssignment` baselines. ``model`` must already
    be quantized (``sixbit.quantize``; NVFP4 weights recommended).

    Example:
        >>> dmpq = apply_dmpq(transformer, predictor)      # doctest: +SKIP
        >>> pipe("a red circle moving right")               # doctest: +SKIP
        >>> dmpq.report().average_bits                      # doctest: +SKIP
    """
    found = list(iter_blocks(model))
    if isinstance(policy, DMPQPredictor) and len(policy.blocks) != len(found):
        raise ValueError(
            f"the predictor covers {len(policy.blocks)} blocks but the model has {len(found)}: "
            "was it fitted on another model?"
        )
    for _, name, block, _ in found:
        if not blocks.quant_linears(block):
            raise ValueError(f"block {name!r} has no QuantLinear: run sixbit.quantize(model, ...) first")
    remove_dmpq(model)
    tracker = track_steps(model)
    method = DMPQ(model, policy, tracker)
    tracker.precision.register(Level.STEP, method)
    blocks.attach(model, method)
    return method


@changes_model("remove_dmpq")
def remove_dmpq(model: nn.Module) -> None:
    """Remove DMPQ from ``model`` (no-op when it has none)."""
    for method in list(blocks.attached(model, DMPQ)):
        method.reports.detach()
        method.tracker.precision.unregister(method)
        blocks.detach(model, method)
