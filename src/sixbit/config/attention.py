"""Settings of quantized attention (:mod:`sixbit.methods.attention`): which blocks and steps."""

from __future__ import annotations

import dataclasses

from ..formats.constants import P_FORMATS
from .serialize import Serializable


@dataclasses.dataclass
class AttentionQuantConfig(Serializable):
    """Where attention is quantized, and how P enters P·V.

    Args:
        blocks: ``(start, stop)`` block indices (``stop`` excluded; ``None`` = open end), or
            ``None`` for every block.
        steps: ``(start, stop)`` denoising step indices likewise, or ``None`` for every step.
        p_format: the attention matrix P (softmax probabilities) as P·V takes it: ``"fp16"``
            (default), ``"int8"``, or seed 000's 6-bit dynamic float, ``"e2m3"`` or ``"e3m2"``,
            each low-bit one with a scale per 32 keys taken from P itself (MX-style E8M0 for the
            6-bit ones). Quality per format: BENCHMARKS.md ``attention``.
    """

    blocks: tuple[int | None, int | None] | None = None
    steps: tuple[int | None, int | None] | None = None
    p_format: str = "fp16"

    def __post_init__(self):
        if self.p_format not in P_FORMATS:
            raise ValueError(f"p_format must be one of {', '.join(P_FORMATS)}, got {self.p_format!r}")
        for name in ("blocks", "steps"):
            value = getattr(self, name)
            if value is None:
                continue
            if (not isinstance(value, (tuple, list)) or len(value) != 2
                    or not all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in value)):
                raise ValueError(f"{name} must be None or (start, stop) with integers ≥ 0 or None, got {value!r}")
            if None not in value and value[0] >= value[1]:
                raise ValueError(f"{name}=({value[0]}, {value[1]}) selects nothing (stop is excluded): "
                                 f"use ({value[0]}, {value[0] + 1}) or more, or (start, None) for every one from start")
            setattr(self, name, tuple(value))

    def to_dict(self) -> dict:
        """The JSON form; ``p_format`` only when it is not FP16 (the field came later: a config
        written before is written again unchanged, and loads in a sixbit that predates it)."""
        data = super().to_dict()
        if self.p_format == "fp16":
            del data["p_format"]
        return data

    def selects(self, block: int, step: int) -> bool:
        return _within(self.blocks, block) and _within(self.steps, step)

    def selects_step(self, step: int) -> bool:
        """Whether ``step`` is quantized in some block."""
        return _within(self.steps, step)

    def selects_block(self, block: int) -> bool:
        """Whether ``block`` is quantized on some step."""
        return _within(self.blocks, block)

    def describe(self) -> str:
        """Where attention is quantized, in words: ``"blocks all, steps 2–end"`` (and P's format
        when it is not FP16: ``"…, P in E2M3"``)."""
        p = "" if self.p_format == "fp16" else f", P in {self.p_format.upper()}"
        return f"blocks {_span(self.blocks)}, steps {_span(self.steps)}{p}"


def _span(span) -> str:
    if span is None:
        return "all"
    return f"{0 if span[0] is None else span[0]}–{'end' if span[1] is None else span[1] - 1}"


def _within(span, i: int) -> bool:
    return span is None or ((span[0] is None or i >= span[0]) and (span[1] is None or i < span[1]))
