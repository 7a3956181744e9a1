"""DMPQ's calibration runs, checked to repeat themselves.

DMPQ fits by comparing re-runs of the same generations in different precisions, so every run
must feed the model the same inputs. :class:`Repeatable` runs the calibration callable seeded
and refuses, at the first call that differs, a run whose first step differs from the first run's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ...calibration.seeding import seeded
from ...runtime import blocks
from ...runtime.context import track_steps

_SAMPLES = 4096  # values kept per input tensor to compare runs
_TOLERANCE = 0.05  # largest |difference| allowed, relative to the largest |value|: bf16 rounding passes, other noise does not


def _fingerprint(value) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """Shape and up to ``_SAMPLES`` evenly spaced values (float64, CPU) of each tensor in ``value``."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)
        stride = max(1, flat.numel() // _SAMPLES)
        return [(tuple(value.shape), flat[::stride][:_SAMPLES].double().cpu())]
    if isinstance(value, (list, tuple)):
        return [fp for v in value for fp in _fingerprint(v)]
    if isinstance(value, dict):
        return [fp for k in sorted(value, key=str) for fp in _fingerprint(value[k])]
    return []


def _difference(a: list, b: list) -> float:
    """How far two fingerprints are apart: ``inf`` when their tensors differ in number or shape."""
    if len(a) != len(b) or any(sa != sb for (sa, _), (sb, _) in zip(a, b)):
        return math.inf
    worst = 0.0
    for (_, x), (_, y) in zip(a, b):
        if x.numel():
            worst = max(worst, float((x - y).abs().max()) / max(float(x.abs().max()), 1e-30))
    return worst


class Repeatable(blocks.BlockMethod):
    """Calls ``run`` seeded (:func:`seeded`) and checks that every call feeds the model the same
    inputs at its first step as the first call did: the first block's inputs at step 0, call by call."""

    order = blocks.OBSERVER_ORDER

    def __init__(self, model: nn.Module, run: Callable[[], object]):
        self.model, self.run = model, seeded(run)
        self.tracker = track_steps(model)
        self.reference: list | None = None
        self.seen: list = []
        self.runs = 0

    def __call__(self):
        self.runs, self.seen = self.runs + 1, []
        blocks.attach(self.model, self)
        try:
            result = self.run()
        finally:
            blocks.detach(self.model, self)
        if self.reference is None:
            self.reference = self.seen
        elif len(self.seen) != len(self.reference):
            raise ValueError(self._refusal(
                f"made {len(self.seen)} first-step calls of the first block where run 1 made {len(self.reference)}"
            ))
        return result

    def before(self, call):
        if call.index != 0 or self.tracker.info is None or self.tracker.info.step != 0:
            return
        fingerprint = _fingerprint((call.args, call.kwargs))
        if self.reference is not None:  # fail fast: at the first call that differs
            i = len(self.seen)
            if i >= len(self.reference):
                raise ValueError(self._refusal(f"made more first-step calls than run 1 ({len(self.reference)})"))
            difference = _difference(fingerprint, self.reference[i])
            if difference > _TOLERANCE:
                what = "inputs of other shapes" if math.isinf(difference) else f"other inputs (max difference {difference:.3g} of the largest value)"
                raise ValueError(self._refusal(f"gave the model {what} at its first step, call {i + 1}"))
        self.seen.append(fingerprint)

    def _refusal(self, what: str) -> str:
        return (
            f"the DMPQ calibration callable is not deterministic: run {self.runs} {what}; DMPQ compares re-runs, "
            "so `run` (convert_model's calibration_data) must generate the same videos (prompts, seeds) every time: "
            "create the generator inside it, e.g. lambda: pipe(prompts, generator=torch.Generator().manual_seed(0))"
        )


__all__ = ["Repeatable"]
