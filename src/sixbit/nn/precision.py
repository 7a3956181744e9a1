"""Activation precision: the modes, what each costs, and the one decision each linear call makes.

Every :class:`~sixbit.nn.QuantLinear` call asks :func:`decide` once which precision it runs
at. The answer comes from the *precision scope* of the model call in progress
(:class:`PrecisionScope`, activated by sixbit's step context around each transformer call):
runtime methods register *policies* there, consulted in a fixed precedence —

=======================  =====================================================================
:attr:`Level.REFRESH`    the delta cache's purified refresh (PDR): full precision for an
                         outlier-heavy input while a block computes a residual skips will replay
:attr:`Level.STEP`       a per-step method: DMPQ (NVFP4 or INT8 per block and step)
:attr:`Level.DEFAULT`    the conversion's configured activations (``"int8"``, ``"nvfp4"``, …)
=======================  =====================================================================

— the first policy that answers decides; the layer's own ``act_mode`` (set when it was built)
serves when none does or no scope is active (a layer called on its own). Policies never write
onto layers, so the order methods are installed in never changes a result.

A policy is a callable ``policy(layer, x) -> ActMode | None`` (``None``: no opinion). It sees
the layer's 2-D input before any rotation. A call is one GEMM, so a batched cond+uncond call
runs at one precision: a policy whose per-branch answers differ returns the higher of them
(:func:`highest`) — one branch never lowers another's precision.

The decision is plain Python on values fixed before the call (no tensor reads), so it traces
under ``torch.compile``; policies that must look at data (PDR's outlier test) do so behind
``torch.compiler.disable``.
"""

from __future__ import annotations

import contextlib
import enum
from typing import Callable, Iterator, Mapping, Protocol

import torch


class ActMode(str, enum.Enum):
    """Activation precision of a :class:`~sixbit.nn.QuantLinear` call."""

    FP = "fp"
    INT8 = "int8"
    NVFP4 = "nvfp4"


#: Bits per activation value (NVFP4 with its E4M3 scale per 16: 4.5). ``fp`` counts 16, the
#: activation width a GPU deployment uses; this CPU computes it in fp32, but counting 32 would
#: make every method look better than it would on a GPU.
ACT_BITS: dict[ActMode, float] = {ActMode.FP: 16.0, ActMode.INT8: 8.0, ActMode.NVFP4: 4.5}

#: Whether a mode emulates low-bit arithmetic (dequantize, then a floating-point matmul).
#: NVFP4 × NVFP4 needs FP4 tensor cores (Blackwell); nothing on this path has them.
EMULATED: dict[ActMode, bool] = {ActMode.FP: False, ActMode.INT8: False, ActMode.NVFP4: True}

#: Weight format each mode multiplies against (``None``: the stored weight, dequantized).
WEIGHT_FORMAT: dict[ActMode, str | None] = {ActMode.FP: None, ActMode.INT8: "int8", ActMode.NVFP4: "nvfp4"}

_RANK = {ActMode.NVFP4: 0, ActMode.INT8: 1, ActMode.FP: 2}


def act_mode(value: "ActMode | str") -> ActMode:
    """``value`` as an :class:`ActMode`; a clear error for anything else."""
    try:
        return ActMode(value)
    except ValueError:
        raise ValueError(f"unknown activation mode {value!r}; valid: {[m.value for m in ActMode]}") from None


def highest(*modes: ActMode) -> ActMode:
    """The highest precision among ``modes`` (FP > INT8 > NVFP4)."""
    return max(modes, key=_RANK.__getitem__)


def gemm_flops(in_features: int, out_features: int, x: "torch.Tensor | int") -> float:
    """FLOPs of one linear call (2·M·K·N) on input ``x``, or on ``x`` rows when it is a count."""
    rows = x if isinstance(x, int) else x.numel() // max(x.shape[-1], 1)
    return 2.0 * rows * in_features * out_features


def average_bits(flops: Mapping[str, float]) -> float:
    """GEMM-FLOP-weighted activation bits of ``{mode: FLOPs}`` (see :data:`ACT_BITS`)."""
    total = sum(flops.values())
    return sum(ACT_BITS[ActMode(m)] * f for m, f in flops.items()) / total if total else float("nan")


class Level(enum.IntEnum):
    """Precedence of a policy: the lowest level that answers decides."""

    REFRESH = 0
    STEP = 1
    DEFAULT = 2


class Policy(Protocol):
    def __call__(self, layer: torch.nn.Module, x: torch.Tensor) -> ActMode | None: ...


class PrecisionScope:
    """The policies of one model, by :class:`Level`, and observers of every decision.

    Observers (``fn(layer, x, mode)``) see each call's decision: the benchmark's work counter
    uses them. They run only when registered.
    """

    def __init__(self):
        self._policies: list[tuple[Level, Policy]] = []
        self.observers: list[Callable[[torch.nn.Module, torch.Tensor, ActMode], None]] = []

    def register(self, level: Level, policy: Policy) -> None:
        """Consult ``policy`` at ``level``; one policy per level (a method replaces its own)."""
        level = Level(level)
        if any(lv == level and p is not policy for lv, p in self._policies):
            raise ValueError(f"a {level.name} precision policy is already registered: remove its method first")
        self._policies = sorted([(lv, p) for lv, p in self._policies if p is not policy] + [(level, policy)],
                                key=lambda item: item[0])

    def unregister(self, policy: Policy) -> None:
        self._policies = [(lv, p) for lv, p in self._policies if p is not policy]

    def policy(self, level: Level) -> Policy | None:
        """The policy registered at ``level``, if any."""
        return next((p for lv, p in self._policies if lv == level), None)

    def decide(self, layer: torch.nn.Module, x: torch.Tensor, below: Level | None = None) -> ActMode | None:
        """The first answer of the policies (only those of lower precedence than ``below``,
        when given: what a call would run at without the policies from ``below`` up)."""
        for level, policy in self._policies:
            if below is not None and level <= below:
                continue
            mode = policy(layer, x)
            if mode is not None:
                return mode
        return None


_ACTIVE: list[PrecisionScope] = []


@contextlib.contextmanager
def active(scope: PrecisionScope) -> Iterator[PrecisionScope]:
    """Make ``scope`` the one consulted by linear calls inside (nests; not shared across threads
    that run models concurrently)."""
    _ACTIVE.append(scope)
    try:
        yield scope
    finally:
        _ACTIVE.pop()


def decide(layer: torch.nn.Module, x: torch.Tensor) -> ActMode:
    """The precision of this call of ``layer`` on ``x``: full precision for a ``weight_only``
    layer, else the active scope's answer, else the layer's own ``act_mode``."""
    if getattr(layer, "weight_only", False):
        return ActMode.FP
    mode = _ACTIVE[-1].decide(layer, x) if _ACTIVE else None
    return layer.act_mode if mode is None else mode


def notify(layer: torch.nn.Module, x: torch.Tensor, mode: ActMode) -> None:
    """Tell the active scope's observers that ``layer`` multiplies ``x`` at ``mode`` (one GEMM)."""
    if _ACTIVE and _ACTIVE[-1].observers:
        _notify(_ACTIVE[-1], layer, x, mode)


@torch.compiler.disable
def _notify(scope: PrecisionScope, layer, x, mode: ActMode) -> None:
    for fn in scope.observers:
        fn(layer, x, mode)
