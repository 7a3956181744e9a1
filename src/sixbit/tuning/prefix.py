"""A block's computation before a priced layer, computed once and reused for every variant
priced there (:func:`~.blocks.price_blocks`).

Pricing replays the block once per tuned layer and candidate format, on the same kept calls,
and a variant of layer ``L`` changes nothing the block computed before ``L`` first runs. So the
full-precision reference pass (:meth:`Prefix.recording`) records, per kept call, the output of
every submodule call that ends before a tuned layer starts, and while a variant of ``L`` is
priced (:meth:`Prefix.reused`) the outermost of those calls return their recorded outputs
instead of computing: e.g. for the feed-forward layers, the attention modules before them. The
block's own code between its modules still runs, on the same values, so the priced errors are
bit-identical to a full replay's (``tests/tuning/test_prefix.py``).

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
    def recording(self) -> Iterator[None]:
        """Inside: the block's calls (the reference pass over the priced kept calls) record what
        :meth:`reused` returns."""
        state = {"call": -1, "seq": 0, "limit": 0}
        counts: dict[str, int] = {}
        stack: list[tuple[str, int, int]] = []
        trace, recordable = [], set()
        kept: set[Call] = set()

        def block_pre(module, args, kwargs):
            state["call"] += 1
            counts.clear()
            if state["call"] == 0:
                state["limit"] = max(t.numel() for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))

        def block_post(module, args, kwargs, out):
            if state["call"] == 0:
                self._plan(trace, recordable)
                kept.update(*self.reuse.values())
                for key in [key for key in self.outputs if key[1:] not in kept]:
                    del self.outputs[key]

        def pre(name):
            def hook(module, args):
                state["seq"] += 1
                stack.append((name, counts.get(name, 0), state["seq"]))
                counts[name] = counts.get(name, 0) + 1
            return hook

        def post(module, args, out):
            name, k, start = stack.pop()
            state["seq"] += 1
            first = state["call"] == 0
            if first:
                trace.append((name, k, start, state["seq"]))
            if not isinstance(out, torch.Tensor) or name not in self.modules:
                return
            if (first and out.numel() <= state["limit"]) or (not first and (name, k) in kept):
                recordable.add((name, k))
                self.outputs[(state["call"], name, k)] = out.detach()

        handles = [self.block.register_forward_pre_hook(block_pre, with_kwargs=True),
                   self.block.register_forward_hook(block_post, with_kwargs=True)]
        for name, module in self.block.named_modules():
            if name:
                handles += [module.register_forward_pre_hook(pre(name)), module.register_forward_hook(post)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

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
