"""The delta cache's state: per run and CFG branch, one entry per block (its last computed
residuals, their drift and stability, stored in full precision or compressed), the skip
bookkeeping of each decision unit, and the report of a run's decisions."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch

from ... import formats


def storage_format(fmt: str, width: int) -> str:
    """``int4-g64`` needs widths divisible by 64: smaller groups (32, 16), else per token."""
    if fmt != "int4-g64" or width % 64 == 0:
        return fmt
    return next((f"int4-g{g}" for g in (32, 16) if width % g == 0), "int4")


class Stored:
    """A residual kept in full precision or compressed with a sixbit integer format."""

    def __init__(self, delta: torch.Tensor | None, fmt: str):
        self.dtype = None if delta is None else delta.dtype
        self.shape = None if delta is None else tuple(delta.shape)
        if delta is None or fmt == "fp":
            self.value, self.packed = (None if delta is None else delta.detach()), None
        else:
            self.value = None
            self.packed = formats.get(storage_format(fmt, delta.shape[-1])).quantize(delta.detach())

    def get(self) -> torch.Tensor | None:
        if self.packed is not None:
            return self.packed.dequantize(self.dtype)
        return self.value

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.nbytes
        return 0 if self.value is None else self.value.numel() * self.value.element_size()


@dataclasses.dataclass
class Entry:
    """One block's last computed residuals (per stream), their drift and its stability."""

    hidden: Stored
    encoder: Stored
    hidden_slope: Stored  # per-step change of the hidden residual (None inside when unknown)
    encoder_slope: Stored
    step: int
    stability: torch.Tensor | None = None  # per sample; None until two residuals were seen

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in (self.hidden, self.encoder, self.hidden_slope, self.encoder_slope))

    def replay(self, x: torch.Tensor, stream: str, drift: float, age: int) -> torch.Tensor | None:
        """``x + (Δ + drift · age · slope)`` (``None`` without a residual): one new tensor, summed
        into in place — the same sums as written, bit for bit, without two temporaries."""
        delta = getattr(self, stream).get()
        slope = getattr(self, f"{stream}_slope").get()
        if delta is None:
            return None
        if slope is None or drift == 0:
            return x + delta
        return (slope * (drift * age)).add_(delta).add_(x)


@dataclasses.dataclass
class Streak:
    """Skip bookkeeping of one decision unit (all blocks, or one block with ``decide_per_block``)."""

    computed_step: int = -1  # the step of the unit's last compute
    decided_step: int = -1
    skip: bool = False  # the decision taken at ``decided_step``
    skips: int = 0
    error: float = 0.0
    skipped: int = 0  # steps skipped in this run (``skips`` restarts at every compute)


class DeltaCacheState:
    """Per run and branch: one cache entry per block."""

    def __init__(self):
        self.entries: dict[int, Entry] = {}
        self.held_bytes = 0  # bytes of all cached residuals and drifts, kept up to date on every store

    def store(self, index: int, entry: Entry) -> None:
        old = self.entries.get(index)
        if old is not None:
            self.held_bytes -= old.nbytes
        self.entries[index] = entry
        self.held_bytes += entry.nbytes


@dataclasses.dataclass
class DeltaCacheReport:
    """What the cache did in one run: ``decisions[(branch, step, block)]`` is "compute" or "skip"."""

    blocks: list[str]
    decisions: dict[tuple[str, int, int], str] = dataclasses.field(default_factory=dict)
    cache_bytes: int = 0  # peak bytes of cached residuals
    pdr_full_precision_calls: int = 0
    # GEMM FLOPs PDR ran in full precision, by the activation mode they would have used
    pdr_flops: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))

    @property
    def skip_share(self) -> float:
        values = list(self.decisions.values())
        return values.count("skip") / len(values) if values else 0.0

    @property
    def most_skipped(self) -> float:
        """The largest share of its calls any one block skipped (with blocks deciding together,
        :attr:`skip_share`): what ``max_skip_share`` caps."""
        calls, skips = defaultdict(int), defaultdict(int)
        for (_, _, block), decision in self.decisions.items():
            calls[block] += 1
            skips[block] += decision == "skip"
        return max((skips[b] / calls[b] for b in calls), default=0.0)

    def skip_map(self, branch: str | None = None) -> list[list[str]]:
        branch = branch or min(b for b, _, _ in self.decisions)
        steps = sorted({s for _, s, _ in self.decisions})
        return [[self.decisions.get((branch, s, b), "") for b in range(len(self.blocks))] for s in steps]


__all__ = ["DeltaCacheReport", "DeltaCacheState", "Entry", "Stored", "Streak", "storage_format"]
