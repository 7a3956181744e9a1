"""What the caller hands its worker processes (:mod:`.driver`): the model, pickled, and a record
of it as handed, so that a change made here afterwards is refused instead of silently not run.

- :func:`write` saves the transformer for the workers (``torch.save`` with ``cloudpickle``, hooks
  and attributes included). Something that cannot be pickled (a hook holding a lock, an open
  file) is named with its module and the fix, instead of pickle's bare ``TypeError``.
- :class:`Handed` records every parameter and buffer (name, dtype, shape, storage, in-place
  version) and every submodule (name, type) as handed. sixbit's own calls that change a model are
  refused while workers run it (:func:`sixbit.runtime.wrapped.changes_model`); the record catches
  the others — a cast (``.to(torch.bfloat16)``), diffusers' own PEFT LoRA, a layer replaced or a
  weight edited in place — at the next call and at ``sixbit.save``, whose file would otherwise
  hold a model the workers never ran. Moving the caller's copy to another device changes
  nothing the workers run and is not refused. Not seen: an edit that keeps every tensor's dtype,
  shape and version counter (through ``param.data``), or a tensor replaced by one of its kind
  after a move (its values are not compared: that would read every weight at every call).
"""

from __future__ import annotations

import dataclasses
import types

import cloudpickle
import torch
from torch import nn

_HOOKS = "_hooks"  # nn.Module keeps its hooks in attributes ending so (_forward_hooks, _forward_pre_hooks…)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor: no version counter (it cannot be changed in place either)
        return None


def _name(kind: type, other: type) -> str:
    """``kind``'s name, with its module where ``other`` has the same name (PEFT's ``Linear``)."""
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__name__ == other.__name__ else kind.__name__


@dataclasses.dataclass(frozen=True)
class Handed:
    """The model as it was handed to the workers (see the module doc)."""

    tensors: dict[str, tuple]
    modules: dict[str, type]

    @classmethod
    def of(cls, model: nn.Module) -> Handed:
        tensors = {name: (t.dtype, tuple(t.shape), t.data_ptr(), _version(t))
                   for name, t in (*model.named_parameters(remove_duplicate=False),
                                   *model.named_buffers(remove_duplicate=False))}
        return cls(tensors, {name: type(m) for name, m in model.named_modules(remove_duplicate=False)})

    def change(self, model: nn.Module) -> str | None:
        """What differs in ``model`` now from what the workers were handed (``None``: nothing)."""
        now = Handed.of(model)
        for name in (*self.modules, *now.modules):
            was, is_ = self.modules.get(name), now.modules.get(name)
            if was is not is_:
                return (f"module {name!r} was added ({is_.__name__})" if was is None else
                        f"module {name!r} was removed" if is_ is None else
                        f"module {name!r} was replaced ({_name(was, is_)} → {_name(is_, was)})")
        for name in (*self.tensors, *now.tensors):
            was, is_ = self.tensors.get(name), now.tensors.get(name)
            if was is None or is_ is None:
                return f"tensor {name!r} was {'added' if was is None else 'removed'}"
            if was[0] != is_[0]:
                return f"the model was cast: {name} is {is_[0]} here and {was[0]} in the workers"
            if was[1] != is_[1]:
                return f"{name} changed shape ({list(was[1])} → {list(is_[1])})"
            if was[2] == is_[2] and was[3] != is_[3]:
                return f"{name} was changed in place"
        return None

    def check(self, model: nn.Module, doing: str) -> None:
        """Refuse ``doing`` when ``model`` changed since it was handed; nothing runs or changes."""
        change = self.change(model)
        if change is not None:
            raise ValueError(f"cannot {doing}: this model changed after it was wrapped ({change}), and its worker "
                             "processes run it as it was: call wrapper.close() to run the changed model in this "
                             "process, or close(), change it and wrap it again (change the model before wrapping)")


def _parts(obj) -> list[tuple[str, object]]:
    """What ``obj`` holds, to look for the part that cannot be pickled: entries, closure variables, attributes."""
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    if isinstance(obj, types.MethodType):
        return [(".__self__", obj.__self__)]
    if isinstance(obj, types.FunctionType):
        return [(f" (closure variable {n!r})", c.cell_contents) for n, c in zip(obj.__code__.co_freevars,
                                                                              obj.__closure__ or ())]
    return [(f".{k}", v) for k, v in vars(obj).items()] if hasattr(obj, "__dict__") else []


def _unpicklable(obj, path: str, depth: int = 4) -> tuple[str, str] | None:
    """``(path, error)`` of the innermost part of ``obj`` that cannot be pickled, or ``None``."""
    try:
        cloudpickle.dumps(obj)
        return None
    except Exception as e:  # noqa: BLE001 - pickling fails in many ways (TypeError, PicklingError, …)
        error = f"{type(e).__name__}: {e}"
    for name, part in (_parts(obj) if depth else []):
        found = _unpicklable(part, path + name, depth - 1)
        if found is not None:
            return found
    return path, error


def culprit(model: nn.Module) -> str | None:
    """The first hook or attribute of ``model``'s modules that cannot be pickled, named, or ``None``."""
    for name, module in model.named_modules():
        where = f"module {name!r}" if name else f"the {type(module).__name__} itself"
        for attribute, value in vars(module).items():
            if attribute in ("_parameters", "_buffers", "_modules"):
                continue
            hooks = attribute.endswith(_HOOKS) and isinstance(value, dict)
            for key, entry in (value.items() if hooks else [(None, value)]):
                found = _unpicklable(entry, "")
                if found is None:
                    continue
                path, error = found
                what = (f"attribute {attribute}{path}" if key is None else  # _forward_pre_hooks: "forward pre hook"
                        f"{attribute.strip('_').removesuffix('s').replace('_', ' ')} "
                        f"{getattr(entry, '__qualname__', type(entry).__name__)}{path}")
                return f"the {what} of {where} cannot be pickled ({error})"
    return None


def write(model: nn.Module, extra, path: str) -> None:
    """``torch.save((model, extra), path)`` for the workers; what cannot be pickled is named, with the fix."""
    try:
        torch.save((model, extra), path, pickle_module=cloudpickle)
    except Exception as e:
        found = culprit(model)
        if found is None:
            raise
        raise TypeError(f"the worker processes get the model pickled, hooks and attributes included, and {found}: "
                        "remove it before wrapping (a hook: handle.remove()) and add it in the workers with "
                        "wrapper.on_workers(fn), or make it picklable (e.g. create a lock on first use, or give "
                        "its object __getstate__)") from e


__all__ = ["Handed", "culprit", "write"]
