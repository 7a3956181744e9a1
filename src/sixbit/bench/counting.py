"""Count the work a generation really did: GEMM FLOPs per activation precision, attention
FLOPs, and which block calls ran — the same way for our methods and for every peer.

A :class:`~sixbit.nn.QuantLinear` call is counted at the precision it ran at, as its forward
reports it to the precision scope's observers (after the delta cache's PDR switched a refresh
to full precision, say); other linears (``nn.Linear``, peers' quantized linears, and the convs
sixbit would quantize as linears, by their output positions) by a diffusers hook installed
*innermost* on each, labelled by ``precision_of``. Attention is counted where it happens, at
``torch.nn.functional.scaled_dot_product_attention`` (a ``TorchFunctionMode``): a cache that
skips attention (PAB, FasterCache) or whole blocks (FirstBlockCache, MagCache, TDC) simply
never reaches it. A block call "ran" when any linear inside it ran; a block not
called at all during a transformer call (cache-dit's DBCache loops over the blocks itself and
leaves out the cached ones) counts as a skipped call.

The counters add Python work to every call: install them for an untimed run only.

Example:
    >>> counter = WorkCounter(pipe.transformer)                                   # doctest: +SKIP
    >>> with counter:                                                             # doctest: +SKIP
    ...     pipe(prompts, num_inference_steps=20)
    >>> counter.totals().gemm_flops                                                # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable

import torch
from diffusers.hooks import ModelHook
from torch import nn
from torch.overrides import TorchFunctionMode

from ..nn import QuantLinear
from ..nn.pointwise_conv import features, gemm_rows, is_quantizable
from ..nn.precision import average_bits, gemm_flops
from ..runtime import blocks, hooks
from ..runtime.context import track_steps, tracker_of

HOOK_NAME = "sixbit_bench_counter"


def default_precision(layer: nn.Module) -> str:
    """Activation precision label of a linear that is not a QuantLinear: ``"fp"``."""
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
        """GEMM-FLOP-weighted activation bits (see :data:`sixbit.nn.precision.ACT_BITS`)."""
        return average_bits(self.gemm_flops)

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
            rows = gemm_rows(module, args[0])  # a conv's rows are its (output) positions
            self.counter._linear(self.counter.precision_of(module), gemm_flops(*features(module), rows))
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
        precision_of: maps a linear that is not a :class:`~sixbit.nn.QuantLinear` to its
            precision label (``"fp"``, ``"int8"``, ``"nvfp4"``); default :func:`default_precision`.

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
        self._handles = [model.register_forward_pre_hook(self._model_pre)]
        self._hooked: list[nn.Module] = []
        self._blocks = _BlockCounter(self)
        self.n_blocks = len(blocks.attach(model, self._blocks))
        self._scope = None
        if any(isinstance(m, QuantLinear) for m in model.modules()):
            self._scope = track_steps(model).precision
            self._scope.observers.append(self._observe)
        for layer in model.modules():
            if is_quantizable(layer):  # nn.Linear, or a conv quantizable as one, in full precision
                hooks.register_innermost(layer, _LinearHook(self), HOOK_NAME)
                self._hooked.append(layer)

    # ---------------------------------------------------------------- hooks
    def _model_pre(self, module, args):
        self._model_calls += 1

    def _where(self) -> tuple[int, str]:
        tracker = tracker_of(self.model)
        if tracker is not None and tracker.info is not None:
            return tracker.info.step, tracker.info.branch
        return self._model_calls - 1, "call"

    def _observe(self, layer, x, mode) -> None:
        if self.active:
            self._linear(mode.value, gemm_flops(layer.in_features, layer.out_features, x))

    def _linear(self, precision: str, flops: float) -> None:
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

    def _transformer_calls(self) -> set[tuple[int, str]]:
        """``(step, branch)`` of every transformer call in which some block ran or was skipped."""
        return {(s, b) for s, b, _ in self.calls}

    def totals(self) -> WorkTotals:
        # a block never called during a transformer call that ran is a skipped call too: cache-dit
        # swaps the block list for its own loop and does not call the blocks it serves from cache
        expected = len(self._transformer_calls()) * self.n_blocks
        skipped = sum(1 for ran, _ in self.calls.values() if not ran) + expected - len(self.calls)
        return WorkTotals(dict(self.gemm), self.attention, expected, skipped)

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
                ran, flops = self.calls.get((s, branch, block), (False, {}))  # not called: skipped
                row.append("skip" if not ran else max(flops, key=flops.get))
            rows.append(row)
        return steps, rows

    def remove(self) -> None:
        """Remove every hook (the model runs as before)."""
        blocks.detach(self.model, self._blocks)
        if self._scope is not None:
            self._scope.observers.remove(self._observe)
            self._scope = None
        for h in self._handles:
            h.remove()
        for layer in self._hooked:
            hooks.remove(layer, HOOK_NAME)
        self._handles, self._hooked = [], []


class _BlockCounter(blocks.BlockMethod):
    """Outermost on every block: sees each call, computed or skipped, and which linears ran."""

    order = blocks.CACHE_ORDER - 10

    def __init__(self, counter: WorkCounter):
        self.counter = counter

    def before(self, call):
        if self.counter.active:
            self.counter._block, self.counter._block_flops = call.index, defaultdict(float)

    def after(self, call, output):
        counter = self.counter
        if counter.active and counter._block == call.index:
            flops = dict(counter._block_flops)
            step, branch = counter._where()
            counter.calls[(step, branch, call.index)] = (bool(flops), flops)
            counter._block, counter._block_flops = None, None
