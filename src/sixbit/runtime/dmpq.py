"""Dynamic mixed-precision quantization (DMPQ): NVFP4 or INT8 activations per block and step.

Each block's relative L1 change from input to output at its previous computed step,
``Γ_{t−1} = ‖out − in‖₁ / ‖in‖₁``, predicts how much error NVFP4 activations would add at
step ``t`` through a linear model ``E = α·Γ_{t−1} + β`` fitted on calibration runs
(:func:`sixbit.calibration.fit_dmpq`): one line per block and step range, so a step range can
be cheap or costly for the video whatever its Γ (step ranges are the calibration runs' steps:
calibrate with the step count you generate with). A block whose predicted error is at most the
threshold runs every linear with NVFP4 activations (``low``); otherwise, and whenever ``Γ_{t−1}`` is
unknown (first step, after a skip), with INT8 (``high``). The threshold is set on calibration
data so the GEMM-FLOP-weighted average activation width meets ``target_bits``.

Batches: each sample's error is predicted from its own Γ; a block goes low only if *every*
sample in the call is predicted stable, so one prompt never lowers another's precision.

NVFP4 activations are emulated on hardware without FP4 matmuls (see :class:`~sixbit.nn.QuantLinear`).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict

import torch
from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

from ..models import iter_blocks, spec_for
from ..nn import ActMode
from .context import RunReports, StepTracker, track_steps
from .delta_cache import HOOK_NAME as CACHE_HOOK_NAME
from .measure import quant_linears, relative_l1

HOOK_NAME = "sixbit_dmpq"
ACT_BITS = {ActMode.NVFP4: 4.5, ActMode.INT8: 8.0, ActMode.FP: 16.0}  # incl. NVFP4's E4M3 scales


@dataclasses.dataclass
class DMPQConfig:
    """Settings of DMPQ.

    Args:
        target_bits: GEMM-FLOP-weighted average activation bits that calibration aims for
            (between 4.5 = all NVFP4 and 8 = all INT8; default 6.0). Lower: faster on FP4
            hardware, more error.
        threshold: an explicit predicted-error threshold; overrides ``target_bits`` when set.
        hadamard_block: online Hadamard block for the NVFP4 weights (default 128; layers whose
            input size it does not divide use the largest smaller block that does).
        error_at: where calibration measures the error the predictor learns.
            ``"video"`` (default): what NVFP4 activations in a block and step cost the final
            video, measured by re-running the calibration with NVFP4 in one cell of a
            ``step_groups`` × ``block_groups`` grid at a time (that many extra runs; ``run``
            must return the videos). ``"block"``: the error at the block's own output (the
            paper's target; two runs, but a small early error can cost the video more than a
            large late one).
        step_groups: contiguous step ranges of the ``"video"`` grid (default 5).
        block_groups: contiguous block ranges of the ``"video"`` grid (default 4; models with
            fewer blocks use one per block).
    """

    target_bits: float = 6.0
    threshold: float | None = None
    hadamard_block: int | None = 128
    error_at: str = "video"
    step_groups: int = 5
    block_groups: int = 4

    def __post_init__(self):
        problems = []
        if not ACT_BITS[ActMode.NVFP4] <= self.target_bits <= ACT_BITS[ActMode.INT8]:
            problems.append(f"target_bits must be within [4.5, 8], got {self.target_bits!r}")
        if self.threshold is not None and not self.threshold >= 0:
            problems.append(f"threshold must be ≥ 0 or None, got {self.threshold!r}")
        if self.error_at not in ("video", "block"):
            problems.append(f'error_at must be "video" or "block", got {self.error_at!r}')
        for name in ("step_groups", "block_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be an integer ≥ 1, got {value!r}")
        if problems:
            raise ValueError("invalid DMPQConfig:\n  - " + "\n  - ".join(problems))


@dataclasses.dataclass
class DMPQPredictor:
    """Linear error model ``E = α·Γ_{t−1} + β`` per block (and step range), and the switching threshold.

    ``alpha[b]`` and ``beta[b]`` hold one value per step range; range ``r`` starts at step
    ``step_starts[r]`` (default one range, ``[0]``: one line per block). A plain number is one
    range.
    """

    blocks: list[str]
    alpha: list
    beta: list
    threshold: float
    pearson_r: float = float("nan")  # correlation of Γ_{t−1} and the block-output error at t, on calibration
    step_starts: list[int] = dataclasses.field(default_factory=lambda: [0])
    # the (Γ_{t−1}, E_t) calibration pairs, kept for plots; not serialized
    pairs: tuple[torch.Tensor, torch.Tensor] | None = dataclasses.field(default=None, repr=False, compare=False)

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

    def predict(self, block: int, gamma: torch.Tensor, step: int = 0) -> torch.Tensor:
        r = step_range(self.step_starts, step)
        return self.alpha[block][r] * gamma.double() + self.beta[block][r]  # float64: exact against the threshold

    def choose(self, block: int, gamma: torch.Tensor, step: int = 0) -> ActMode:
        """NVFP4 when every sample's predicted error is within the threshold, else INT8."""
        return ActMode.NVFP4 if bool((self.predict(block, gamma, step) <= self.threshold).all()) else ActMode.INT8

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "pairs"}

    def plot_correlation(self, path, title: str = "DMPQ predictor"):
        """Scatter of the calibration pairs (Γ_{t−1}, E_t) with the fitted lines' range (PNG)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        if self.pairs is None:
            raise ValueError("this predictor carries no calibration pairs (it was loaded, not fitted)")
        g, e = (t.numpy() for t in self.pairs)
        fig, ax = plt.subplots(figsize=(4.5, 3.5))
        ax.scatter(g, e, s=6, alpha=0.5)
        ax.set_xlabel("Γ(t−1) of the block")
        ax.set_ylabel("E(t): NVFP4 activation error")
        ax.set_title(f"{title}: Pearson r = {self.pearson_r:.3f}", fontsize=9)
        if self.threshold < float("inf"):
            ax.axhline(self.threshold, color="#d7191c", lw=1, label="threshold")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path

    @classmethod
    def from_dict(cls, data: dict) -> "DMPQPredictor":
        return cls(**data)


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

    def reset(self) -> None:
        self.gamma.clear()


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
        total = sum(self.flops.values())
        return sum(ACT_BITS[ActMode(m)] * f for m, f in self.flops.items()) / total if total else float("nan")

    def flop_share(self) -> dict[str, float]:
        total = sum(self.flops.values())
        return {m: f / total for m, f in self.flops.items()} if total else {}

    def precision_map(self, branch: str | None = None) -> list[list[str]]:
        """``map[step][block]`` = act mode (``branch`` default: the first one recorded)."""
        branch = branch or min(b for b, _, _ in self.decisions)
        return [[self.decisions.get((branch, s, b), "") for b in range(len(self.blocks))] for s in self.steps]

    def plot(self, path, branch: str | None = None, title: str = "DMPQ activation precision"):
        """Save the step × block precision map as a PNG (needs matplotlib)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap

        modes = [m.value for m in (ActMode.NVFP4, ActMode.INT8, ActMode.FP)]
        grid = [[modes.index(m) if m in modes else float("nan") for m in row] for row in self.precision_map(branch)]
        fig, ax = plt.subplots(figsize=(max(5.0, 1.5 + 0.35 * len(self.blocks)), max(2.5, 1.2 + 0.25 * len(grid))))
        ax.imshow(grid, cmap=ListedColormap(["#2b83ba", "#fdae61", "#d7191c"]), vmin=0, vmax=2, aspect="auto")
        ax.set_xlabel("block")
        ax.set_ylabel("denoising step")
        ax.set_title(f"{title}\nblue NVFP4 (emulated) · orange INT8 · avg {self.average_bits:.2f} bits", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


class DMPQ:
    """The installed method: shared by the block hooks. Get the run's report with :meth:`report`."""

    def __init__(self, model: nn.Module, policy: "DMPQPredictor | RandomAssignment", tracker: StepTracker):
        self.model = model
        self.policy = policy
        self.tracker = tracker
        self.blocks = [name for _, name, _, _ in iter_blocks(model)]
        self.reports = RunReports(tracker, lambda: DMPQReport(self.blocks))

    def report(self) -> DMPQReport:
        """The current run's decisions, or the last finished run's when none is in progress."""
        return self.reports.get()

    def decide(self, index: int, batch: int) -> tuple[ActMode, float | None]:
        """The block's mode for this call, and the predicted error it was based on (if any)."""
        state = self.tracker.state(self, DMPQState)
        step, gamma = state.gamma.get(index, (None, None))
        # Γ must come from the step just before: after a skipped step (delta cache) it is unknown
        if gamma is None or step != self.tracker.info.step - 1 or gamma.shape[0] != batch:
            return ActMode.INT8, None
        step = self.tracker.info.step
        predicted = float(self.policy.predict(index, gamma, step).max()) if hasattr(self.policy, "predict") else None
        return self.policy.choose(index, gamma, step), predicted

    def record(self, index: int, mode: ActMode, gamma: torch.Tensor, flops: float, predicted: float | None) -> None:
        info = self.tracker.info
        self.tracker.state(self, DMPQState).gamma[index] = (info.step, gamma)
        current = self.reports.current
        current.decisions[(info.branch, info.step, index)] = mode.value
        current.flops[mode.value] += flops
        if predicted is not None:
            current.candidates.append((predicted, flops))


class _BlockHook(ModelHook):
    def __init__(self, method: DMPQ, index: int, io, layers):
        super().__init__()
        self.method, self.index, self.io, self.layers = method, index, io, layers
        self._pending = None

    def pre_forward(self, module, *args, **kwargs):
        x = self.io.stream_input(module, args, kwargs)
        mode, predicted = self.method.decide(self.index, x.shape[0])
        for layer in self.layers:
            layer.act_mode = mode
        self._pending = (x, mode, predicted)
        return args, kwargs

    def post_forward(self, module, output):
        x, mode, predicted = self._pending
        self._pending = None
        y = self.io.stream_output(output)
        tokens = x.numel() // x.shape[-1]
        flops = sum(2.0 * tokens * layer.in_features * layer.out_features for layer in self.layers)
        self.method.record(self.index, mode, relative_l1(y - x, x), flops, predicted)
        return output


def apply_dmpq(model: nn.Module, policy: "DMPQPredictor | RandomAssignment") -> DMPQ:
    """Switch every block's activation precision per step with ``policy``; returns the method.

    ``policy`` is a fitted :class:`DMPQPredictor` (:func:`sixbit.calibration.fit_dmpq`) or the
    :class:`RandomAssignment` baseline. ``model`` must already be quantized
    (``sixbit.quantize``; NVFP4 weights recommended).

    Example:
        >>> dmpq = apply_dmpq(transformer, predictor)      # doctest: +SKIP
        >>> pipe("a red circle moving right")               # doctest: +SKIP
        >>> dmpq.report().average_bits                      # doctest: +SKIP
    """
    n_blocks = len(list(iter_blocks(model)))
    if isinstance(policy, DMPQPredictor) and len(policy.blocks) != n_blocks:
        raise ValueError(
            f"the predictor covers {len(policy.blocks)} blocks but the model has {n_blocks}: "
            "was it fitted on another model?"
        )
    remove_dmpq(model)
    tracker = track_steps(model)
    method = DMPQ(model, policy, tracker)
    for index, name, block, io in iter_blocks(model, spec_for(model)):
        layers = quant_linears(block)
        if not layers:
            raise ValueError(f"block {name!r} has no QuantLinear: run sixbit.quantize(model, ...) first")
        registry = HookRegistry.check_if_exists_or_initialize(block)
        # the delta cache must stay outermost: a skipped block must not touch DMPQ's Γ history
        cache_hook = registry.get_hook(CACHE_HOOK_NAME)
        if cache_hook is not None:
            registry.remove_hook(CACHE_HOOK_NAME, recurse=False)
        registry.register_hook(_BlockHook(method, index, io, layers), HOOK_NAME)
        if cache_hook is not None:
            registry.register_hook(cache_hook, CACHE_HOOK_NAME)
    return method


def remove_dmpq(model: nn.Module) -> None:
    """Remove DMPQ's hooks (activation modes stay as last set)."""
    for _, _, block, _ in iter_blocks(model):
        registry = getattr(block, "_diffusers_hook", None)
        hook = registry.get_hook(HOOK_NAME) if registry is not None else None
        if hook is not None:
            hook.method.reports.detach()
            registry.remove_hook(HOOK_NAME, recurse=False)
