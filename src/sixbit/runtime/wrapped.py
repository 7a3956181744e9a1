"""Which transformer is split by which :class:`~sixbit.parallel.TensorParallelWrapper`, and the
one check of every public call that changes a model (:func:`changes_model`).

Kept low, apart from the wrapper, so that :mod:`sixbit.checkpoint`, :mod:`sixbit.lora`, the
runtime methods and the conversion can ask "is this model split across processes?" without
importing the wrapper, which itself saves through the checkpoint.

Under ``torchrun`` the mark holds the wrapper (the split is this process's model itself). With
worker processes (``device_ids=...``) it holds a weak reference: the model does not keep the
wrapper, so dropping the wrapper stops its workers (garbage collection) and the model runs here.
"""

from __future__ import annotations

import functools
import inspect
import weakref

from torch import nn

_ATTRIBUTE = "_sixbit_parallel"  # set on the transformer while a wrapper splits it


def wrapper_of(model: nn.Module):
    """The :class:`~sixbit.parallel.TensorParallelWrapper` a transformer is split by, or ``None``."""
    found = getattr(model, _ATTRIBUTE, None)
    return found() if isinstance(found, weakref.ref) else found


def mark(model: nn.Module, wrapper, weak: bool = False) -> None:
    """Record that ``wrapper`` splits ``model`` (``weak``: without keeping the wrapper alive)."""
    setattr(model, _ATTRIBUTE, weakref.ref(wrapper) if weak else wrapper)


def unmark(model: nn.Module) -> None:
    """Forget the wrapper of ``model`` (it runs whole again)."""
    if hasattr(model, _ATTRIBUTE):
        delattr(model, _ATTRIBUTE)


def check_not_wrapped(model: nn.Module, job: str) -> None:
    """Refuse ``job`` (``"convert the model"``: a change to its layers, which a wrapper has cut into
    per-rank shards and hooked to split each call) on a wrapped model, before anything changes."""
    wrapper = wrapper_of(model)
    if wrapper is not None:
        raise ValueError(f"{job} before wrapping it in a TensorParallelWrapper (under torchrun every rank does it "
                         "the same way, then wraps; with worker processes, call wrapper.close() first, then wrap "
                         "the model again)")


def check_not_driven(model_or_pipe, what: str) -> None:
    """Refuse ``what`` (a change to the model) while worker processes started by a
    TensorParallelWrapper run it: they hold their own copy, which a change here never reaches."""
    for candidate in (model_or_pipe, getattr(model_or_pipe, "transformer", None)):
        wrapper = wrapper_of(candidate) if isinstance(candidate, nn.Module) else None
        if wrapper is not None and getattr(wrapper, "driver", None) is not None:
            raise ValueError(f"this model runs in {wrapper.world} worker processes started by a TensorParallelWrapper, "
                             f"which hold their own copy and would never see this change: {what} before wrapping, or "
                             f"call wrapper.close(), {what}, and wrap the model again")


def changes_model(what: str):
    """Decorator of a public call (``what``: its name) whose first argument is the model, or its
    pipeline, that it changes: refused by :func:`check_not_driven` before anything changes."""
    def decorate(fn):
        first = next(iter(inspect.signature(fn).parameters))

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            check_not_driven(args[0] if args else kwargs.get(first), what)
            return fn(*args, **kwargs)
        return checked
    return decorate


__all__ = ["changes_model", "check_not_driven", "check_not_wrapped", "mark", "unmark", "wrapper_of"]
