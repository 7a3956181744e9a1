"""DMPQ's video-cost runs share the base run's first steps instead of computing them again.

Each cell of the ``"video"`` cost map (:mod:`.fit`) repeats the calibration run with NVFP4
activations in one range of steps and blocks, INT8 elsewhere: before the range's first step it
computes exactly what the base run (INT8 everywhere) computed. :class:`Prefix` records, in the
base run, every transformer call's last-block output and first-block input; in a cell run the
calls before the cell's first step (in each generation of the run) take the recorded output
instead of running the blocks (the first block returns it, the others pass their input on), and
the first call that runs after them is checked against the base run's input there:
bit-identical, or the cell runs again in full (the reuse then stays off). The pipeline's own work (text encoder, scheduler, VAE) still runs every time.

Recording costs ``calls × (hidden + text tokens) × width`` values twice; past ``budget`` bytes
(a quarter of the device's memory by default) the reuse is off, as for a model with more than
one block list, code between its blocks, or blocks handed objects that hold state across calls
(WanAnimate2's KV cache, filled by a reference pass), all checked on the base run's first call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ...models import iter_blocks, spec_for
from ...runtime import blocks
from ...runtime.context import track_steps


class Diverged(Exception):
    """A cell run's first computed call did not get the base run's inputs."""


class Prefix(blocks.BlockMethod):
    """Records the base run's calls (:meth:`recording`), then hands them to the cell runs
    (:meth:`from_step`). ``problem`` says why the reuse is off (``None``: on)."""

    order = blocks.OBSERVER_ORDER + 1  # innermost: the calibration's other observers still see every call

    def __init__(self, model: nn.Module, budget: int):
        self.model, self.budget = model, budget
        self.tracker = track_steps(model)
        found = list(iter_blocks(model))
        self.last, self.io = len(found) - 1, found[0][3]
        self.problem = (f"{type(model).__name__} has {len(spec_for(model).block_lists)} block lists"
                        if len(spec_for(model).block_lists) != 1 else None)
        self.inputs: list[torch.Tensor] = []  # the first block's hidden input, per call of the base run
        self.outputs: list = []  # the last block's output, per call
        self.steps: list[int] = []
        self.nbytes = 0
        self.start: int | None = None  # replaying: the first step that runs (None: recording)
        self.calls, self.skipping = 0, False
        self.seen: dict[int, torch.Tensor] = {}  # the base run's first call: block outputs / next inputs

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Inside: the base run, recorded."""
        self.start = None
        with self._attached():
            yield
        pairs = [(self.seen.get(i), self.seen.get(-i - 1)) for i in range(self.last)]
        if self.problem is None and not all(a is not None and b is not None and torch.equal(a, b) for a, b in pairs):
            self.problem = f"{type(self.model).__name__} changes the hidden states between its blocks"
        if self.problem is not None or not self.inputs:
            self.problem = self.problem or "the base run never called the transformer"
            self.inputs, self.outputs = [], []
        self.seen.clear()

    @contextlib.contextmanager
    def from_step(self, start: int) -> Iterator[None]:
        """Inside: a run that equals the base run before step ``start``; its calls before that
        step take the recorded outputs. :class:`Diverged` if its first computed call differs."""
        if self.problem is not None or start <= 0:
            yield
            return
        self.start, self.calls, self.skipping = start, 0, False
        with self._attached():
            yield

    @contextlib.contextmanager
    def _attached(self) -> Iterator[None]:
        blocks.attach(self.model, self)
        try:
            yield
        finally:
            blocks.detach(self.model, self)

    def before(self, call: blocks.BlockCall):
        if self.start is None:
            return self._record_input(call) if call.index == 0 else None
        if call.index == 0:
            k, self.calls = self.calls, self.calls + 1
            was, self.skipping = self.skipping, k < len(self.steps) and self.steps[k] < self.start
            if self.skipping:
                return _copy(self.outputs[k])
            if was and (k >= len(self.inputs) or not torch.equal(call.input(), self.inputs[k])):
                raise Diverged(f"call {k + 1} of the run differs from the base run's")
        if self.skipping:  # the others pass the last block's output on
            values = {stream: call.input(stream) for stream in self.io.returns}
            return values["hidden"] if self.io.returns == ("hidden",) else tuple(values[r] for r in self.io.returns)
        return None

    def after(self, call: blocks.BlockCall, output) -> None:
        if self.start is not None or self.problem is not None:
            return
        if len(self.inputs) == 1:  # the first call: what each block returns, what the next one gets
            held = [type(v).__name__ for v in (*call.args, *call.kwargs.values()) if not _plain(v)]
            if held:  # e.g. a KV cache a reference pass fills: a skipped call would leave it empty
                self.problem = f"{type(self.model).__name__}'s blocks are handed state ({held[0]}) that skipped calls would not update"
                return
            if call.index < self.last:
                self.seen[call.index] = call.output(output).detach().clone()
            if call.index > 0:
                self.seen[-call.index] = call.input().detach().clone()
        if call.index == self.last:
            self.outputs.append(_copy(output))
            self.nbytes += sum(t.numel() * t.element_size() for t in _tensors(output))
            if self.nbytes > self.budget:
                self.problem = f"the recorded calls pass {self.budget / 2**30:.1f} GiB"

    def _record_input(self, call: blocks.BlockCall) -> None:
        if self.problem is None:
            x = call.input()
            self.inputs.append(x.detach().clone())
            self.steps.append(self.tracker.info.step)
            self.nbytes += x.numel() * x.element_size()


def _plain(value) -> bool:
    """Whether ``value`` is data (tensors, numbers, strings, None, or containers of them)."""
    if value is None or isinstance(value, (torch.Tensor, int, float, bool, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, dict) and all(_plain(v) for v in value.values())


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _tensors(v)] if isinstance(value, (list, tuple)) else []


def _copy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return type(value)(_copy(v) for v in value) if isinstance(value, (list, tuple)) else value


__all__ = ["Diverged", "Prefix"]
