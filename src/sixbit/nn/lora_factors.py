"""The LoRA adapters of one :class:`~sixbit.nn.QuantLinear`: 16-bit side branches on its input.

A layer holds a :class:`LoraFactors` child (``lora_factors``) only while it has adapters. Each
adapter is ``y += scale · up · (down · x)`` on the layer's original input (not rotated or
divided), added before the bias. The factors are fp16, non-persistent buffers
(``<name>_down`` ``(r, in)``, ``<name>_up`` ``(out, r)``): they follow device moves (a dtype cast
of the model leaves them fp16, see ``QuantLinear._apply``) and are counted in ``summary()``, but
checkpoints never hold them (load the LoRA file again).
"""

from __future__ import annotations

import torch
from torch import nn

from . import lowrank


class LoraFactors(nn.Module):
    """Named LoRA factors and scales for a ``in_features → out_features`` layer."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scales: dict[str, float] = {}  # adapter name → scale

    def add(self, name: str, down: torch.Tensor, up: torch.Tensor, scale: float = 1.0) -> None:
        """Add adapter ``name`` (``down`` ``(r, in)``, ``up`` ``(out, r)``)."""
        if name in self.scales:
            raise ValueError(f"this layer already has a LoRA called {name!r}: unload it first")
        r = down.shape[0]
        if down.dim() != 2 or up.dim() != 2 or down.shape[1] != self.in_features or up.shape != (self.out_features, r):
            raise ValueError(f"a LoRA for this {self.in_features}→{self.out_features} layer needs down (r, {self.in_features}) "
                             f"and up ({self.out_features}, r), got {tuple(down.shape)} and {tuple(up.shape)}")
        down, up = lowrank.branch_factors(down, up)
        self.register_buffer(f"{name}_down", down, persistent=False)
        self.register_buffer(f"{name}_up", up, persistent=False)
        self.scales[name] = float(scale)

    def set_scale(self, name: str, scale: float) -> None:
        """Change adapter ``name``'s scale (0 switches it off: no term at all, not even rounding)."""
        self._check(name)
        self.scales[name] = float(scale)

    def remove(self, name: str) -> None:
        """Remove adapter ``name`` and free its factors."""
        self._check(name)
        del self.scales[name]
        delattr(self, f"{name}_down")
        delattr(self, f"{name}_up")

    def _check(self, name: str) -> None:
        if name not in self.scales:
            raise ValueError(f"no LoRA called {name!r} on this layer (it has {sorted(self.scales)})")

    def extra_repr(self) -> str:
        return ", ".join(f"{name}: rank {getattr(self, f'{name}_down').shape[0]}, scale {scale:g}"
                         for name, scale in self.scales.items())

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``y`` plus every adapter's term on ``x`` (2-D, the layer's input as given), in ``y``'s dtype."""
        xo = x.to(y.dtype)
        for name, scale in self.scales.items():
            if scale:  # a LoRA at scale 0 adds nothing, not even rounding
                y = y + scale * lowrank.low_rank(xo, getattr(self, f"{name}_down"), getattr(self, f"{name}_up"))
        return y

    def up_factors(self) -> dict[str, torch.Tensor]:
        """Each adapter's up factor (one row per output row), by adapter name."""
        return {name: getattr(self, f"{name}_up") for name in self.scales}

    def set_up(self, name: str, up: torch.Tensor) -> None:
        """Replace adapter ``name``'s up factor (a row shard's or the joined rows)."""
        setattr(self, f"{name}_up", up)
        self.out_features = up.shape[0]
