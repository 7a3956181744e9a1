"""Where a conversion computes: :func:`conversion_device`.

The work of a conversion (the calibration generations, every block's Hessians, the scale
searches, GPTQ and the low-rank splits) runs on one device. A GPU does it many times faster
than a CPU (BENCHMARKS ``conversion-profile``: the rounding of one Wan2.1-14B feed-forward
weight takes 45 s on 2 CPU cores), so where there is one, conversions use it by default.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from ..memory.devices import compute_device

logger = logging.getLogger(__name__)


def conversion_device(device=None) -> torch.device:
    """``device`` checked (``"cuda"``, ``"cuda:1"``, ``"cpu"`` or a :class:`torch.device`); by
    default (``None``) the current CUDA device where this machine has one, else the CPU.

    Example:
        >>> conversion_device("cpu")
        device(type='cpu')
    """
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return compute_device(device, f"device={device!r}", "a conversion runs on 'cpu' or a CUDA device ('cuda', 'cuda:N')")


def moved_to(model, device: torch.device) -> Callable[[], None]:
    """Move ``model`` (a pipeline or a module) to ``device``; returns what moves each of its
    modules back where it was."""
    modules = getattr(model, "components", {"": model}).values()
    where = [(m, next((t.device for t in m.parameters()), None)) for m in modules if isinstance(m, nn.Module)]
    logger.info("converting on %s: %s moved there", device, type(model).__name__)
    model.to(device)

    def back() -> None:
        for module, place in where:
            if place is not None:
                module.to(place)
    return back


__all__ = ["conversion_device", "moved_to"]
