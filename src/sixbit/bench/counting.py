"""Count the work a generation really did: GEMM FLOPs per activation precision, attention
FLOPs, and which block calls ran — the same way for our methods and for every peer.

Linears are counted by a diffusers hook installed *innermost* on each ``nn.Linear`` /
:class:`~sixbit.nn.QuantLinear`, so it sees the precision a call actually ran at (after the
delta cache's PDR switched a refresh to full precision, say). Attention is counted where it
happens, at ``torch.nn.functional.scaled_dot_product_attention`` (a ``TorchFunctionMode``):
a cache that skips attention (PAB, FasterCache) or whole blocks (FirstBlockCache, MagCache,
TDC) simply never reaches it. A block call "ran" when any linear inside it ran.

The counters add Python work to every call: install them for an untimed run only.

Example:
    >>> counter = WorkCounter(pipe.transformer, precision_of=default_precision)  # doctest: +SKIP
    >>> with counter:                                                             # doctest: +SKIP
    ...     pipe(prompts, num_inference_steps=20)
    >>> counter.totals().gemm_flops                                                # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable

import torch
from diffusers.hooks import HookRegistry, ModelHook
from torch import nn
from torch.overrides import TorchFunctionMode

from ..models.registry import iter_blocks
from ..nn import QuantLinear
from ..runtime.context import tracker_of

HOOK_NAME = "sixbit_bench_counter"

#: Activation bits of each precision label, for the FLOP-weighted average (NVFP4 with its
#: E4M3 scales: 4.5). "fp" is the 16-bit activation a GPU deployment would use; this CPU
#: computes it in fp32, but counting 32 would make every method look better than on a GPU.
ACT_BITS = {"fp": 16.0, "int8": 8.0, "nvfp4": 4.5}


def default_precision(layer: nn.Module) -> str:
    """Activation precision of a linear's current call: a QuantLinear's mode, else ``"fp"``."""
    if isinstance(layer, QuantLinear):
        return layer.act_mode.value
    return "fp"


@dataclasses.dataclass
class WorkTotals:
    """Summed work of one counted generation."""

    gemm_flops: dict[str, float]  # precision label → FLOPs (2·M·K·N per linear call)
    attention_flops: float  # QKᵀ and PV of every scaled_dot_product_attention call
    block_calls: int
    blocks_skipped: int  # block calls in which no linear ran

    @property
    def total_gemm_flops(self) -> float:
        return float(sum(self.gemm_flops.values()))

    @property
    def skip_share(self) -> float:
        return self.blocks_skipped / self.block_calls if self.block_calls else 0.0

    def average_act_bits(self) -> float:
        """GEMM-FLOP-weighted activation bits (see :data:`ACT_BITS`)."""
        total = self.total_gemm_flops
        return sum(ACT_BITS[p] * f for p, f in self.gemm_flops.items()) / total if total else float("nan")

    def to_dict(self) -> dict:
        return {
            "gemm_flops": dict(self.gemm_flops),
            "attention_flops": self.attention_flops,
            "block_calls": self.block_calls,
            "blocks_skipped": self.blocks_skipped,
        }


class _LinearHook(ModelHook):
    def __init__(self, counter: "WorkCounter"):
        super().__init__()
        self.counter = counter

    def pre_forward(self, module, *args, **kwargs):
        if self.counter.active and args:
            x = args[0]
            tokens = x.numel() // max(x.shape[-1], 1)
            self.counter._linear(module, 2.0 * tokens * module.in_features * module.out_features)
        return args, kwargs


class _SDPAMode(TorchFunctionMode):
    def __init__(self, counter: "WorkCounter"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            q, k, v = (list(args[:3]) + [kwargs.get(n) for n in ("query", "key", "value")[len(args[:3]):]])
            # (…, Lq, d) @ (…, d, Lk) and (…, Lq, Lk) @ (…, Lk, dv): 2 FLOPs per multiply-add
            batch_heads = q.numel() // (q.shape[-2] * q.shape[-1])
            self.counter._attention(2.0 * batch_heads * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1]))
        return func(*args, **kwargs)


class WorkCounter:
    """Hooks that count one model's work while active (a context manager).

    Args:
        model: the transformer (diffusers model with registered block metadata).
        precision_of: maps a linear module to its precision label for this call
            (``"fp"``, ``"int8"``, ``"nvfp4"``); default :func:`default_precision`.

    Per block call the counter records ``(step, branch, block) → (ran, {precision: FLOPs})``;
    step and branch come from sixbit's step tracker when one is installed, else from the
    order of transformer calls.
    """

    def __init__(self, model: nn.Module, precision_of: Callable[[nn.Module], str] = default_precision):
        self.model = model
        self.precision_of = precision_of
        self.active = False
        self.gemm = defaultdict(float)
        self.attention = 0.0
        self.calls: dict[tuple[int, str, int], tuple[bool, dict[str, float]]] = {}
        self._block: int | None = None
        self._block_flops: dict[str, float] | None = None
        self._mode = _SDPAMode(self)
        self._model_calls = 0
        self._handles = []
        self._hooked: list[nn.Module] = []
        self.n_blocks = 0
        for index, _, block, _ in iter_blocks(model):
            self.n_blocks += 1
            self._handles.append(block.register_forward_pre_hook(self._block_pre(index)))
            self._handles.append(block.register_forward_hook(self._block_post(index)))
        self._handles.append(model.register_forward_pre_hook(self._model_pre))
        for layer in model.modules():
            if isinstance(layer, (nn.Linear, QuantLinear)):
                _register_innermost(layer, _LinearHook(self), HOOK_NAME)
                self._hooked.append(layer)

    # ---------------------------------------------------------------- hooks
    def _model_pre(self, module, args):
        self._model_calls += 1

    def _where(self) -> tuple[int, str]:
        tracker = tracker_of(self.model)
        if tracker is not None and tracker.info is not None:
            return tracker.info.step, tracker.info.branch
        return self._model_calls - 1, "call"

    def _block_pre(self, index):
        def hook(module, args):
            if self.active:
                self._block, self._block_flops = index, defaultdict(float)

        return hook

    def _block_post(self, index):
        def hook(module, args, output):
            if self.active and self._block == index:
                flops = dict(self._block_flops)
                step, branch = self._where()
                self.calls[(step, branch, index)] = (bool(flops), flops)
                self._block, self._block_flops = None, None

        return hook

    def _linear(self, layer, flops: float) -> None:
        precision = self.precision_of(layer)
        self.gemm[precision] += flops
        if self._block_flops is not None:
            self._block_flops[precision] += flops

    def _attention(self, flops: float) -> None:
        if self.active:
            self.attention += flops

    # ---------------------------------------------------------------- use
    def __enter__(self) -> "WorkCounter":
        self.active = True
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self.active = False

    def totals(self) -> WorkTotals:
        skipped = sum(1 for ran, _ in self.calls.values() if not ran)
        return WorkTotals(dict(self.gemm), self.attention, len(self.calls), skipped)

    def grid(self, branch: str | None = None) -> tuple[list[int], list[list[str]]]:
        """``(steps, map[step][block])``: ``"skip"`` or the precision with most GEMM FLOPs in that call.

        ``branch`` defaults to ``"cond"`` when recorded, else the first recorded branch.
        """
        branches = sorted({b for _, b, _ in self.calls})
        if not branches:
            return [], []
        if branch is None:
            branch = "cond" if "cond" in branches else branches[0]
        steps = sorted({s for s, b, _ in self.calls if b == branch})
        rows = []
        for s in steps:
            row = []
            for block in range(self.n_blocks):
                ran, flops = self.calls.get((s, branch, block), (None, {}))
                row.append("" if ran is None else ("skip" if not ran else max(flops, key=flops.get)))
            rows.append(row)
        return steps, rows

    def remove(self) -> None:
        """Remove every hook (the model runs as before)."""
        for h in self._handles:
            h.remove()
        for layer in self._hooked:
            registry = getattr(layer, "_diffusers_hook", None)
            if registry is not None and registry.get_hook(HOOK_NAME) is not None:
                registry.remove_hook(HOOK_NAME, recurse=False)
        self._handles, self._hooked = [], []


def _register_innermost(module: nn.Module, hook: ModelHook, name: str) -> None:
    """Register ``hook`` under every hook already on ``module`` (diffusers wraps later hooks
    around earlier ones), so its ``pre_forward`` sees the state the other hooks set up."""
    registry = HookRegistry.check_if_exists_or_initialize(module)
    existing = [(n, registry.get_hook(n)) for n in list(registry._hook_order)]
    for n, _ in reversed(existing):
        registry.remove_hook(n, recurse=False)
    registry.register_hook(hook, name)
    for n, h in existing:
        registry.register_hook(h, n)
