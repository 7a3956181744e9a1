"""What every number format shares: the quantized container, input checks, block reshapes."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import torch


class Granularity(str, enum.Enum):
    """Which elements share one scale.

    ``CHANNEL`` and ``TOKEN`` both give one scale per row of the last dimension (per output
    channel of an ``(N, K)`` weight, per token of an ``(M, K)`` activation); they differ only
    in intent (static weights vs dynamic activations). ``GROUP`` gives one scale per
    ``group_size`` contiguous elements along the last dimension.
    """

    TENSOR = "tensor"
    CHANNEL = "channel"
    TOKEN = "token"
    GROUP = "group"


def parse_granularity(value: "Granularity | str") -> Granularity:
    """Parse a granularity name; an unknown one raises ``ValueError`` listing the valid ones."""
    try:
        return Granularity(value)
    except ValueError:
        raise ValueError(f"unknown granularity {value!r}; valid: {[g.value for g in Granularity]}") from None


@dataclasses.dataclass
class Quantized:
    """Base of the quantized containers: tensor fields are the payload, the rest is metadata.

    ``tensors()`` and ``meta()`` split a container into what a safetensors file stores and a
    JSON-serialisable header; ``from_parts`` rebuilds it. ``nbytes`` is the real storage.
    """

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }

    def meta(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or isinstance(value, torch.Tensor):
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_parts(cls, tensors: dict[str, torch.Tensor], meta: dict[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = (set(tensors) | set(meta)) - names
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)} for {cls.__name__}; expected {sorted(names)}")
        return cls(**tensors, **meta)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def rows(self, start: int, stop: int) -> "Quantized":
        """Rows ``start:stop`` of a 2-D quantized tensor, sharing storage (no copy, no decoding).

        Lets a consumer convert a weight a few rows at a time instead of decoding it whole.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot be sliced by rows")


def to_float32(x: torch.Tensor, what: str = "input") -> torch.Tensor:
    """``x`` as fp32; integer or boolean tensors raise ``ValueError`` (nothing to quantize)."""
    if not torch.is_floating_point(x):
        raise ValueError(f"{what} must be a floating-point tensor, got {x.dtype}")
    return x.float()


def check_finite(x: torch.Tensor, what: str = "input", stat: torch.Tensor | None = None) -> None:
    """Raise a ``ValueError`` if ``x`` holds NaN or Inf (quantization scales would be garbage).

    ``stat`` is an optional reduction of ``x`` that propagates NaN/Inf (an abs-max, a min or
    max): checking it instead of ``x`` costs nothing on the hot path; ``x`` itself is only
    scanned to count the bad values once a problem is known.
    """
    if not torch.is_floating_point(x):
        raise ValueError(f"{what} must be a floating-point tensor, got {x.dtype}")
    if bool(torch.isfinite(x if stat is None else stat).all()):
        return
    bad = ~torch.isfinite(x)
    raise ValueError(
        f"{what} contains {int(bad.sum())} NaN/Inf value(s) out of {x.numel()}; "
        "quantization needs finite values: find where they first appear (run the same input in full "
        "precision, and check each layer's output for NaN/Inf)"
    )


def split_blocks(x: torch.Tensor, block: int, what: str) -> torch.Tensor:
    """View ``(..., K)`` as ``(..., K // block, block)``; K must be a multiple of ``block``."""
    if x.dim() == 0 or x.shape[-1] % block:
        k = x.shape[-1] if x.dim() else "a scalar"
        raise ValueError(
            f"{what} needs the last dimension to be a multiple of {block}, got {k}; "
            "pad the tensor or choose a format with per-channel scales (e.g. 'int8')"
        )
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
