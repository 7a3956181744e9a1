"""Small measurements shared by the runtime methods and calibration."""

from __future__ import annotations

import torch
from torch import nn

from ..nn import QuantLinear


def relative_l1(diff: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-sample ``‖diff‖₁ / ‖ref‖₁`` over all but the first (batch) dimension, in fp32."""
    num = diff.detach().float().abs().reshape(diff.shape[0], -1).sum(1)
    den = ref.detach().float().abs().reshape(ref.shape[0], -1).sum(1)
    return num / den.clamp_min(1e-12)


def quant_linears(module: nn.Module) -> list[QuantLinear]:
    """Every :class:`QuantLinear` inside ``module``."""
    return [m for m in module.modules() if isinstance(m, QuantLinear)]
