"""Which transformer is split by which :class:`~sixbit.parallel.TensorParallelWrapper`.

Kept low, apart from the wrapper, so that :mod:`sixbit.checkpoint` and :mod:`sixbit.lora` can ask "is this model split
across processes?" without importing the wrapper, which itself saves through the checkpoint.
"""

from __future__ import annotations

from torch import nn

_ATTRIBUTE = "_sixbit_parallel"  # set on the transformer while a wrapper splits it


def wrapper_of(model: nn.Module):
    """The :class:`~sixbit.parallel.TensorParallelWrapper` a transformer is split by, or ``None``."""
    return getattr(model, _ATTRIBUTE, None)


def mark(model: nn.Module, wrapper) -> None:
    """Record that ``wrapper`` splits ``model``."""
    setattr(model, _ATTRIBUTE, wrapper)


def unmark(model: nn.Module) -> None:
    """Forget the wrapper of ``model`` (it runs whole again)."""
    delattr(model, _ATTRIBUTE)


__all__ = ["mark", "unmark", "wrapper_of"]
