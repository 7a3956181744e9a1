"""A block's computation before a priced layer, computed once and reused for every variant
priced there (:func:`~.blocks.price_blocks`).

Pricing replays the block once per tuned layer and candidate format, on the same kept calls,
and a variant of layer ``L`` changes nothing the block computed before ``L`` first runs. So a pass
over the kept calls is traced first (:meth:`Prefix.tracing`: which module calls end before each
tuned layer starts), the full-precision reference pass (:meth:`Prefix.recording`) records, per
kept call, the outputs of the outermost of those calls, and while a variant of ``L`` is priced
(:meth:`Prefix.reused`) they return their recorded outputs instead of computing: e.g. for the
feed-forward layers, the attention modules before them. The block's own code between its
modules still runs, on the same values, so the priced errors are bit-identical to a full
replay's (``tests/tuning/test_prefix.py``).

Kept: single-tensor outputs no larger than the block's largest input (no FFN-wide
intermediates), only of the calls some tuned layer reuses; a module whose ``forward`` is already
wrapped on the instance (a hook registry) is never stubbed. The call structure is read from the
first kept call and the same for every call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

Call = tuple[str, int]  # (module name inside the block, its k-th call within one block call)


class Prefix:
    """The reusable prefix of ``block`` for each of ``layers`` (names inside the block)."""

    def __init__(self, block: nn.Module, layers: list[str]):
        self.block, self.layers = block, layers
        self.modules = {name: m for name, m in block.named_modules() if name and "forward" not in m.__dict__}
        self.outputs: dict[tuple[int, str, int], torch.Tensor] = {}  # (kept call, name, k) → output
        self.reuse: dict[str, set[Call]] = {}  # layer → the outermost calls before it that return recorded outputs

    def _plan(self, trace: list[tuple[str, int, int, int]], recordable: set[Call]) -> None:
        """Each layer's reused calls from the first kept call's ``trace`` ``(name, k, start, end)``."""
        for layer in self.layers:
            starts = [s for name, _, s, _ in trace if name == layer]
            if not starts:
                continue
            before = sorted((s, e, name, k) for name, k, s, e in trace
                            if e < min(starts) and (name, k) in recordable
                            and not layer.startswith(name + "."))  # an ancestor of the layer runs it
            chosen, covered = set(), -1
            for s, e, name, k in before:  # calls nest: keep the outermost
                if s > covered:
                    chosen.add((name, k))
                    covered = e
            self.reuse[layer] = chosen

    @contextlib.contextmanager
    def _calls(self, block_call, module_call) -> Iterator[None]:
        """Inside: ``block_call(index, args, kwargs)`` before each call of the block, and
        ``module_call(index, name, k, start, end, output)`` after each call of a module inside it
        (its ``k``-th in that block call; ``start``/``end``: its place in the call order)."""
        state = {"call": -1, "seq": 0}
        counts: dict[str, int] = {}
        stack: list[tuple[str, int, int]] = []

        def block_pre(module, args, kwargs):
            state["call"] += 1
            counts.clear()
            block_call(state["call"], args, kwargs)

        def pre(name):
            def hook(module, args):
                state["seq"] += 1
                stack.append((name, counts.get(name, 0), state["seq"]))
                counts[name] = counts.get(name, 0) + 1
            return hook

        def post(module, args, out):
            name, k, start = stack.pop()
            state["seq"] += 1
            module_call(state["call"], name, k, start, state["seq"], out)

        handles = [self.block.register_forward_pre_hook(block_pre, with_kwargs=True)]
        for name, module in self.block.named_modules():
            if name:
                handles += [module.register_forward_pre_hook(pre(name)), module.register_forward_hook(post)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Inside: the block's first call is traced and each layer's reused calls planned
        (nothing is kept): run it around any pass over the kept calls, e.g. the Hessians' replay."""
        trace, recordable, limit = [], set(), [0]

        def block_call(index, args, kwargs):
            if index == 0:
                limit[0] = max(t.numel() for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))

        def module_call(index, name, k, start, end, out):
            if index == 0:
                trace.append((name, k, start, end))
                if isinstance(out, torch.Tensor) and name in self.modules and out.numel() <= limit[0]:
                    recordable.add((name, k))

        with self._calls(block_call, module_call):
            yield
        self._plan(trace, recordable)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Inside: the block's calls (the reference pass over the priced kept calls, after
        :meth:`tracing`) record what :meth:`reused` returns."""
        kept: set[Call] = set().union(*self.reuse.values())

        def module_call(index, name, k, start, end, out):
            if (name, k) in kept and isinstance(out, torch.Tensor):
                self.outputs[(index, name, k)] = out.detach()

        with self._calls(lambda *a: None, module_call):
            yield

    @contextlib.contextmanager
    def reused(self, layer: str) -> Iterator[None]:
        """Inside: the block's calls (in the recorded order) take ``layer``'s reused calls from
        the record instead of computing them."""
        calls = self.reuse.get(layer, set())
        names = {name for name, _ in calls}
        state = {"call": -1}
        counts: dict[str, int] = {}

        def block_pre(module, args):
            state["call"] += 1
            counts.clear()

        def stub(name: str, module: nn.Module):
            def forward(*args, **kwargs):
                k = counts.get(name, 0)
                counts[name] = k + 1
                out = self.outputs.get((state["call"], name, k)) if (name, k) in calls else None
                return out.clone() if out is not None else type(module).forward(module, *args, **kwargs)
            return forward

        handle = self.block.register_forward_pre_hook(block_pre)
        for name in names:
            self.modules[name].forward = stub(name, self.modules[name])
        try:
            yield
        finally:
            handle.remove()
            for name in names:
                del self.modules[name].forward


__all__ = ["Prefix"]
