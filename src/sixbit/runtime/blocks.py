"""Shared block plumbing: one hook per transformer block that every method rides on.

Runtime methods and calibration that act per block (the delta cache, DMPQ, DMPQ's fit, the
statistics collector) do not install hooks of their own. Each registers a :class:`BlockMethod`
with :func:`attach`; one diffusers ``ModelHook`` per block (:data:`HOOK_NAME`) captures the
call — its hidden (and text) input, its output — and runs the methods in a fixed order, by
their ``order`` (lower: outer), whatever order they were attached in:

1. ``before(call)`` of each method, outer first. A method may return the block's output
   instead of computing it (the delta cache's skip): the block and the inner methods then do
   not run, and only the outer methods that already ran see ``after``.
2. the block itself;
3. ``after(call, output)`` of each method, inner first.

The methods' own work reads tensors back to the host (decisions, statistics), so it runs
behind ``torch.compiler.disable``; the block's computation between them stays compilable.

Example:
    >>> class Count(BlockMethod):                      # doctest: +SKIP
    ...     order = 50
    ...     def after(self, call, output): print(call.index)
    >>> attach(transformer, Count())                   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from diffusers.hooks import ModelHook
from torch import nn

from .. import kernels
from ..nn.token_stats import token_sum, tokens_split
from ..models import BlockIO, iter_blocks, spec_for
from ..nn import QuantLinear
from . import hooks

HOOK_NAME = "sixbit_blocks"

#: ``order`` of the built-in methods: the cache is outermost (a skipped block must leave the
#: inner methods' history untouched), then DMPQ, then observers.
CACHE_ORDER, PRECISION_ORDER, OBSERVER_ORDER = 0, 10, 20


def relative_l1(diff: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-sample ``‖diff‖₁ / ‖ref‖₁`` over all but the first (batch) dimension, in fp32 (over
    every rank's tokens when a sequence-parallel model splits them: :mod:`sixbit.nn.token_stats`)."""
    num, den = kernels.abs_sum_per_sample(diff), kernels.abs_sum_per_sample(ref)  # one pass each
    if tokens_split():
        num, den = token_sum(torch.stack([num, den])).unbind(0)
    return num / den.clamp_min(1e-12)


def quant_linears(module: nn.Module) -> list[QuantLinear]:
    """Every :class:`QuantLinear` inside ``module``."""
    return [m for m in module.modules() if isinstance(m, QuantLinear)]


class BlockCall:
    """One call of a block: where it is, its inputs, and how to run it again."""

    __slots__ = ("index", "name", "module", "io", "args", "kwargs", "_forward")

    def __init__(self, index: int, name: str, module: nn.Module, io: BlockIO, args: tuple, kwargs: dict, forward):
        self.index, self.name, self.module, self.io = index, name, module, io
        self.args, self.kwargs, self._forward = args, kwargs, forward

    def input(self, stream: str = "hidden") -> torch.Tensor | None:
        """The ``"hidden"`` (video) or ``"encoder"`` (text) input, ``None`` if the block has none."""
        if stream == "encoder" and self.io.encoder is None:
            return None
        return self.io.stream_input(self.module, self.args, self.kwargs, stream)

    def output(self, output: Any, stream: str = "hidden") -> torch.Tensor | None:
        """The ``stream`` part of ``output`` (``None`` if the block does not return it)."""
        return self.io.stream_output(output, stream)

    def rerun(self) -> Any:
        """Run the block again on the same inputs, without any method (calibration probes)."""
        return self._forward(*self.args, **self.kwargs)


class BlockMethod:
    """Something that acts on every block call. Subclasses set ``order`` and override hooks."""

    order: int = OBSERVER_ORDER

    def before(self, call: BlockCall) -> Any:
        """Called before the block runs; return an output to replace the computation."""
        return None

    def after(self, call: BlockCall, output: Any) -> None:
        """Called after the block ran (or after an inner method replaced it)."""


@torch.compiler.disable
def _before(method: BlockMethod, call: BlockCall):
    return method.before(call)


@torch.compiler.disable
def _after(method: BlockMethod, call: BlockCall, output) -> None:
    method.after(call, output)


class _BlockHook(ModelHook):
    def __init__(self, index: int, name: str, io: BlockIO):
        super().__init__()
        self.index, self.name, self.io = index, name, io
        self.methods: list[BlockMethod] = []

    def new_forward(self, module, *args, **kwargs):
        forward = self.fn_ref.original_forward
        call = BlockCall(self.index, self.name, module, self.io, args, kwargs, forward)
        ran = []
        for method in self.methods:
            output = _before(method, call)
            if output is not None:
                break
            ran.append(method)
        else:
            output = forward(*args, **kwargs)
        for method in reversed(ran):
            _after(method, call, output)
        return output


def _hook(block: nn.Module) -> _BlockHook | None:
    return hooks.get(block, HOOK_NAME)


def attach(model: nn.Module, method: BlockMethod) -> list[tuple[int, str, nn.Module, BlockIO]]:
    """Run ``method`` on every block call of ``model``; returns the blocks
    ``(index, name, block, io)``. Attaching the same method twice is a no-op."""
    blocks = list(iter_blocks(model, spec_for(model)))
    for index, name, block, io in blocks:
        hook = _hook(block)
        if hook is None:
            hook = _BlockHook(index, name, io)
            hooks.register(block, hook, HOOK_NAME)
        if method not in hook.methods:
            hook.methods = sorted([*hook.methods, method], key=lambda m: m.order)
    return blocks


def detach(model: nn.Module, method: BlockMethod) -> None:
    """Stop running ``method``; the shared hook goes when no method is left."""
    for block in _hooked(model):
        hook = _hook(block)
        if hook is None:
            continue
        hook.methods = [m for m in hook.methods if m is not method]
        if not hook.methods:
            hooks.remove(block, HOOK_NAME)


def attached(model: nn.Module, kind: type) -> Iterator[BlockMethod]:
    """The distinct methods of class ``kind`` attached to ``model``'s blocks."""
    seen: list[BlockMethod] = []
    for block in _hooked(model):
        for method in _hook(block).methods:
            if isinstance(method, kind) and all(method is not s for s in seen):
                seen.append(method)
    return iter(seen)


def _hooked(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that carry the block hook, in module order. Found by the hooks,
    not by the model's block metadata: a model without recognizable blocks (a plain
    ``nn.Sequential`` a checkpoint is loaded into) has none, and removing methods from it is a
    no-op rather than an error."""
    return [module for module in model.modules() if _hook(module) is not None]
