"""Whether Triton kernels can run here, and on which device."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def installed() -> bool:
    """Whether the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    """Whether Triton kernels run in the interpreter (``TRITON_INTERPRET=1``): CPU tensors allowed."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def runs_on(device: torch.device | str) -> bool:
    """Whether sixbit's Triton kernels can run on ``device`` here."""
    device = torch.device(device)
    if not installed():
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreted()


def require(device: torch.device | str) -> None:
    """A clear error when Triton kernels cannot run on ``device``."""
    if not installed():
        raise RuntimeError("this kernel needs Triton: pip install triton (or call its *_reference twin)")
    if not runs_on(device):
        raise RuntimeError(f"Triton kernels run on CUDA tensors (got {torch.device(device)}); on CPU set "
                           "TRITON_INTERPRET=1 before importing Triton, or call the *_reference twin")


def jit():
    """The ``@triton.jit`` kernels (:mod:`._jit`), imported on first use."""
    from . import _jit

    return _jit


__all__ = ["installed", "interpreted", "jit", "require", "runs_on"]
