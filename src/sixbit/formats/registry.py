"""The registry of number formats by name (``sixbit.formats.get("nvfp4")``)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from .base import Quantized


@dataclasses.dataclass(frozen=True)
class Format:
    """A named, fully parameterised number format.

    Attributes:
        name: registry key, e.g. ``"nvfp4"``, ``"int4-g64"``, ``"mxfp6_e2m3"``.
        family: module that implements it (``integer``, ``fp8``, ``nvfp4``, ``mx``).
        element_bits: bits of one stored element.
        block_size: elements sharing one scale along the last dimension, or ``None`` when
            the scale is per row or per tensor (its cost then vanishes with the row length).
        scale_bits: bits of one scale (plus its zero point, for asymmetric integers).
        description: one line for tables.
        quantize_fn: ``x -> container``; the container's ``dequantize()`` inverts it.
        container: the container class, used to rebuild one from a checkpoint.
    """

    name: str
    family: str
    element_bits: int
    block_size: int | None
    scale_bits: int
    description: str
    quantize_fn: Callable[[torch.Tensor], Quantized] = dataclasses.field(repr=False)
    container: type[Quantized] = dataclasses.field(repr=False)

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element including block scales (per-row/tensor scales excluded)."""
        return self.element_bits + (self.scale_bits / self.block_size if self.block_size else 0.0)

    def quantize(self, x: torch.Tensor) -> Quantized:
        return self.quantize_fn(x)

    def dequantize(self, q: Quantized, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return q.dequantize(dtype)


_REGISTRY: dict[str, Format] = {}


def register_format(fmt: Format) -> Format:
    """Add ``fmt`` to the registry; names are unique."""
    if fmt.name in _REGISTRY:
        raise ValueError(f"format {fmt.name!r} is already registered")
    _REGISTRY[fmt.name] = fmt
    return fmt


def get(name: str) -> Format:
    """The format registered as ``name``; an unknown name raises ``ValueError`` listing all."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown format {name!r}; valid formats: {', '.join(available())}"
        ) from None


def available() -> list[str]:
    """All registered format names, in registration order."""
    return list(_REGISTRY)
