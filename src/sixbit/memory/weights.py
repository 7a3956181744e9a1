"""Are a model's weights really in memory? :func:`offload_problem` says, :func:`resident_weights` makes them so.

Disk offload leaves zero placeholders in the offloaded blocks (the real weights are in the
offload folder's files), so ``state_dict()`` — and anything that saves through it — would hand
out zeros; a deleted folder takes the weights with it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from diffusers.hooks.group_offloading import GroupOffloadingHook
from torch import nn

from ..runtime import hooks

from .devices import split
from .offload import HANDLES, OffloadedWeightsLost, OffloadHook, Scheduler


def _disk_scheduler(model: nn.Module | None) -> Scheduler | None:
    handle = HANDLES.get(model) if model is not None else None
    if handle is None or not handle._active or handle._folder is None:
        return None
    return handle._scheduler


def offloaded_by(model: nn.Module) -> str | None:
    """What offloads ``model``'s weights (sixbit.optimize's block offloading, diffusers' group
    offloading, accelerate's hooks: ``mode="cpu_offload"``), in words, or ``None``."""
    for name, module in model.named_modules():
        if hasattr(module, "_hf_hook"):
            return f"accelerate hooks on {name or 'the model'}"
        if any(isinstance(h, (GroupOffloadingHook, OffloadHook)) for h in hooks.hooks_of(module)):
            return f"block offloading on {name or 'the model'}"
    return None


def check_not_offloaded(model: nn.Module, action: str, then: str = "then enable it again") -> None:
    """Refuse ``action`` (one that replaces, rebuilds or copies the model's layers from their
    weights: a conversion, a checkpoint load, a TensorParallelWrapper) on a model whose weights are
    offloaded: it would read the offload's placeholders, and the offload would go on restoring the
    old tensors. ``then``: what to do after ``action``, in the message."""
    what = offloaded_by(model)
    if what is not None:
        raise ValueError(f"{type(model).__name__}'s weights are offloaded ({what}): {action} would read placeholders, "
                         "not its weights; disable the offloading first (sixbit.optimize.disable_memory_optimization"
                         f"(pipe); accelerate's: pipe.remove_all_hooks()), run {action}, {then}")


IN_PLACE = ("fuse_lora", "unfuse_lora")  # diffusers' model methods that change the weights in place


def refuse_in_place(model: nn.Module) -> dict:
    """Make ``model``'s :data:`IN_PLACE` methods refuse, while it is offloaded to disk: they would
    change the offloaded groups' placeholders, and the group files (written once) would bring the
    old weights back. Returns what :func:`allow_in_place` puts back."""
    saved = {name: model.__dict__[name] for name in IN_PLACE if name in model.__dict__}
    for name in IN_PLACE:
        if hasattr(model, name):
            setattr(model, name, functools.partial(_refused, type(model).__name__, name))
    return saved


def allow_in_place(model: nn.Module, saved: dict) -> None:
    """Undo :func:`refuse_in_place` (``saved``: what it returned)."""
    for name in IN_PLACE:
        if name in saved:
            setattr(model, name, saved[name])
        else:
            model.__dict__.pop(name, None)


def _refused(model_name: str, name: str, *args, **kwargs):
    raise ValueError(f"{name} changes the weights in place, but {model_name} is offloaded to disk: its offloaded "
                     "blocks hold placeholders and their files, written once, would bring the old weights back; "
                     f"call sixbit.optimize.disable_memory_optimization(pipe) first, then {name}, then enable it again")


def offload_problem(model_or_pipe) -> str | None:
    """One line saying why ``model_or_pipe``'s weights in memory are not all real, or ``None``.

    Not all real means: sixbit's disk offload whose files are gone (:class:`OffloadedWeightsLost`;
    the model is broken: reload it) or whose offloaded groups now hold zero placeholders (healthy,
    but ``state_dict()`` would hand out the zeros: read the weights inside
    :func:`resident_weights`); diffusers' own group offloading to disk (empty placeholders);
    tensors on the ``meta`` device. Anything that writes or copies the weights
    (``sixbit.save``) should refuse a model for which this is not ``None``.

    Example:
        >>> import tempfile
        >>> from sixbit.optimize import enable_memory_optimization, offload_problem
        >>> from sixbit.zoo.shapes import load_pipeline
        >>> model = load_pipeline("wan").transformer
        >>> offload_problem(model) is None
        True
        >>> memory = enable_memory_optimization(model, onload_device="cpu", offload_device=tempfile.mkdtemp())
        >>> offload_problem(model)  # doctest: +ELLIPSIS
        '4 of 4 block groups of WanTransformer3DModel are offloaded to disk ...'
        >>> memory.disable()
    """
    _, model, _ = split(model_or_pipe, "offload_problem")
    if model is None:
        return None
    name = type(model).__name__
    scheduler = _disk_scheduler(model)
    if scheduler is not None:
        if scheduler.lost is not None:
            return scheduler.lost
        if scheduler.missing():
            return scheduler._lost_message([], None)
        offloaded = sum(state != "resident" for state in scheduler.state)
        if offloaded:
            return (f"{offloaded} of {len(scheduler.groups)} block groups of {name} are offloaded to disk "
                    f"({scheduler.folder}) and hold zero placeholders in memory; read or save the weights inside "
                    "`with sixbit.optimize.resident_weights(model):`, or call disable_memory_optimization(model) first")
    for module_name, module in model.named_modules():
        for hook in hooks.hooks_of(module):
            group = getattr(hook, "group", None)
            if isinstance(hook, GroupOffloadingHook) and getattr(group, "offload_to_disk_path", None):
                return (f"{name} has diffusers group offloading to disk (on {module_name or 'the model'}): weights "
                        "offloaded there are empty placeholders in memory; reload the model without it, or use "
                        "sixbit.optimize.enable_memory_optimization, whose offloading resident_weights() can undo")
    meta = [k for k, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if meta:
        return (f"{len(meta)} tensors of {name} are on the meta device and hold no data (e.g. {meta[0]}); "
                "load real weights into the model first")
    return None


@contextlib.contextmanager
def resident_weights(model_or_pipe) -> Iterator[None]:
    """Inside the block, every weight of a disk-offloaded model is real (read back from its files).

    Use it around anything that reads the weights outside a forward call (``state_dict()``,
    saving): offloaded groups otherwise hold zero placeholders. Afterwards the groups outside the
    prefetch window are offloaded again. The whole model is resident meanwhile (peak memory as
    without offloading). Without disk offload it does nothing.

    Raises:
        ValueError: the weights cannot all be real (the message of :func:`offload_problem`: a
            deleted offload folder, diffusers' disk offloading, meta tensors). Groups already
            onloaded stay so; nothing else changes.

    Example:
        >>> import tempfile, sixbit
        >>> from sixbit.optimize import enable_memory_optimization, resident_weights
        >>> from sixbit.zoo.shapes import load_pipeline
        >>> model = load_pipeline("wan").transformer
        >>> memory = enable_memory_optimization(model, onload_device="cpu", offload_device=tempfile.mkdtemp())
        >>> with resident_weights(model):
        ...     path = sixbit.save(model, tempfile.mkdtemp() + "/wan.safetensors")
        >>> memory.disable()
    """
    _, model, _ = split(model_or_pipe, "resident_weights")
    scheduler = _disk_scheduler(model)
    if scheduler is not None:
        try:
            scheduler.load_all()
        except OffloadedWeightsLost:
            pass  # offload_problem reports it
    problem = offload_problem(model) if model is not None else None
    if problem is not None:
        raise ValueError(problem)
    try:
        yield
    finally:
        if scheduler is not None and scheduler.lost is None:
            scheduler.offload_outside_window()
