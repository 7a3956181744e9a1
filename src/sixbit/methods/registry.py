"""The method registry: one :class:`MethodSpec` per runtime method, registered by its package.

:func:`sixbit.convert_model`, the conversion record (:mod:`sixbit.methods.record`) and the
checkpoint (:mod:`sixbit.checkpoint`) loop over :func:`methods` and :func:`extensions`; none of
them names a method. Adding a method is one package plus one :func:`register_method` call::

    register_method(MethodSpec(
        name="my_method", config_type=MyConfig, order=60,
        apply=apply_my_method, remove=remove_my_method,
    ))
    sixbit.convert_model(pipe, None, ConvertConfig(activations="int8", methods=(MyConfig(),)))

What a spec says, in the order a conversion uses it:

1. Whether this conversion runs the method, and with what: by default, the instance of
   ``config_type`` the :class:`~sixbit.ConvertConfig` holds (its ``dmpq``, ``static``,
   ``cache`` or ``attention`` field for the built-in methods, else its ``methods``; stored in
   JSON and checkpoints under the method's name). ``select(convert_config, extra) -> method config
   | None`` decides instead where the choice is not a config of its own (the fixed activation
   precision; ``extra``: per-call method configs by method name, e.g.
   ``convert_model(stabilize_frames=...)``).
2. ``check(model, method_config, convert_config)``: refuse what cannot run, before anything
   changes (also when a checkpoint is loaded).
3. ``fit(model, method_config, run, calibration) -> applied config`` (``needs_calibration``:
   ``True``, or a function of the method config saying whether this one needs it): after the
   weights are quantized; ``run()`` runs the calibration generations, ``calibration``
   describes their source. Its result is what ``apply`` takes (e.g. DMPQ's predictor), kept
   on the :class:`~sixbit.Conversion` as ``fitted``. With ``reference=True`` the fit also gets
   ``reference=``: the calibration videos of the full-precision model (run before the weights
   are quantized; ``None`` when no weights are), so what it fits holds for the combined model
   (the delta cache's ``min_psnr``). A method without ``state_key`` whose fit returns another
   config of its ``config_type`` is recorded in the conversion's :class:`~sixbit.ConvertConfig`
   as fitted, so checkpoints store and reload what was fitted.
4. ``apply(model, applied_config) -> state``, in ``order``; the state is kept on the
   conversion (``conversion.methods[name]``, and ``conversion.<attribute>`` when named).
   ``remove(model)`` undoes it (a no-op when it is not installed).
5. ``installed(model) -> applied config | None``: what the method runs with on ``model`` now
   (``None``: not installed), read from the model itself. A method applied (its ``apply_x``)
   or removed after ``convert_model`` is then saved as it runs: through ``state_key`` where it
   has one, else through the :class:`~sixbit.ConvertConfig` that selects it (its config of
   ``config_type`` replaced; ``record(convert_config, applied) -> convert_config`` where the
   method has a ``select``); a change neither can express is refused at save.

Capabilities, which other packages ask instead of naming methods:

- ``chunkable`` (default ``True``): its per-call decisions hold when a call's tokens run a few
  at a time (``TensorParallelWrapper(chunk_size=...)``); ``False`` names why not.
- ``sequence_parallel`` (default ``True``): it runs when a call's tokens are split across
  processes (``mode="sequence"``); ``False`` names why not.
- ``describe(model) -> str | None``: one line :func:`sixbit.summary` shows while the method is
  installed on ``model`` (what it runs with, what it did), ``None`` when it is not.
- ``attention_kernel`` (default ``False``): it replaces the kernel of the model's attention
  calls (quantized attention, sparse attention). Two such methods cannot both run (each would
  take the calls the other expects): :func:`attention_kernel_clash` names the other one.

Checkpoint state, beside the method, in one of two places:

- ``state_key`` with ``dump(applied) -> JSON`` and ``load(value, model, modules) -> applied``:
  a JSON value in the conversion record (``header["extensions"]["conversion"][state_key]``).
  ``load`` validates against ``modules`` (the model's modules as they will be once the file's
  layers are in) and raises ``ValueError`` naming the problem. Methods whose applied config is
  the :class:`~sixbit.ConvertConfig`'s own need none: the record stores the config.
- ``export(model) -> (meta, tensors) | None`` and ``prepare(model, modules, meta, tensors) ->
  installer``: a checkpoint extension of its own, named after the method (see
  :mod:`sixbit.checkpoint`), for state that holds tensors (static W8A8's per-range parameters).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..config.method_types import register_config_type, unregister_config_type


@dataclasses.dataclass(frozen=True)
class CheckpointExtension:
    """Extra state a runtime method stores in checkpoints (see :mod:`sixbit.checkpoint`).

    ``prepare(model, modules, meta, tensors)`` validates the stored state against ``modules``
    (the model's modules as they will be once the file's layers are in) without changing
    anything, raises ``ValueError`` on a problem, and returns the function that installs it.
    ``clear(model)`` (optional) removes the method from a model a checkpoint is loaded into.
    """

    name: str
    export: Callable[[nn.Module], tuple[dict, dict[str, torch.Tensor]] | None]
    prepare: Callable[[nn.Module, dict[str, nn.Module], dict, dict[str, torch.Tensor]], Callable[[], None]]
    clear: Callable[[nn.Module], None] | None = None


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """How a runtime method is chosen, fitted, installed, removed and stored (module docstring)."""

    name: str
    config_type: type | None
    order: int
    attribute: str | None = None
    select: Callable[[Any, Mapping[str, Any]], Any] | None = None
    apply: Callable[[nn.Module, Any], Any] | None = None
    remove: Callable[[nn.Module], None] | None = None
    needs_calibration: bool | Callable[[Any], bool] = False
    fit: Callable[..., Any] | None = None
    reference: bool = False
    fitted: str | None = None
    check: Callable[[nn.Module, Any, Any], None] | None = None
    state_key: str | None = None
    dump: Callable[[Any], Any] | None = None
    load: Callable[[Any, nn.Module, dict[str, nn.Module]], Any] | None = None
    export: Callable[[nn.Module], tuple[dict, dict[str, torch.Tensor]] | None] | None = None
    prepare: Callable[[nn.Module, dict[str, nn.Module], dict, dict[str, torch.Tensor]], Callable[[], None]] | None = None
    installed: Callable[[nn.Module], Any] | None = None
    record: Callable[[Any, Any], Any] | None = None
    chunkable: bool | str = True
    sequence_parallel: bool | str = True
    attention_kernel: bool = False
    describe: Callable[[nn.Module], str | None] | None = None

    def __post_init__(self):
        problems = []
        if self.select is None and self.config_type is None:
            problems.append("without select it is chosen by its config_type: give one")
        if (self.apply is None) != (self.remove is None):
            problems.append("apply and remove go together (one installs what the other removes)")
        if self.apply is None and self.fit is None and self.export is None:
            problems.append("it does nothing: give apply/remove, fit or export/prepare")
        if self.needs_calibration and self.fit is None:
            problems.append("needs_calibration without a fit")
        if self.reference and self.fit is None:
            problems.append("reference=True without a fit (the reference videos are its argument)")
        if self.state_key is not None and (self.dump is None or self.load is None):
            problems.append("state_key needs dump and load")
        if (self.export is None) != (self.prepare is None):
            problems.append("export and prepare go together")
        if self.installed is not None and self.apply is None:
            problems.append("installed reads what apply installed: give apply/remove")
        if self.record is not None and (self.installed is None or self.state_key is not None or self.select is None):
            problems.append("record writes what installed reads into the ConvertConfig, for a method with select and "
                            "without state_key (one chosen by its config_type is recorded through it)")
        if problems:
            raise ValueError(f"method {self.name!r}: " + "; ".join(problems))

    def chosen(self, config, extra: Mapping[str, Any] | None = None) -> Any:
        """What the :class:`~sixbit.ConvertConfig` ``config`` (and the per-call ``extra``) runs this
        method with, or ``None`` when it does not run it."""
        if self.select is not None:
            return self.select(config, extra or {})
        return config.method_config(self.config_type)

    def calibrates(self, method_config) -> bool:
        """Whether fitting ``method_config`` runs calibration generations."""
        needs = self.needs_calibration
        return bool(needs(method_config) if callable(needs) else needs)

    def recorded(self, config, applied) -> Any:
        """``config`` selecting this method as ``applied`` (``None``: not at all), or ``None`` when
        the config cannot say it (a method chosen otherwise, without ``record``)."""
        if self.record is not None:
            return self.record(config, applied)
        return config.with_method(self.config_type, applied) if self.select is None else None


_METHODS: dict[str, MethodSpec] = {}
_EXTENSIONS: dict[str, tuple[int, CheckpointExtension]] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Register ``spec`` (replacing a spec of the same name: a reloaded module registers again).
    A method with ``export``/``prepare`` is also a checkpoint extension named ``spec.name``,
    restored in ``order``."""
    taken = {s.state_key for s in _METHODS.values() if s.name != spec.name and s.state_key is not None}
    if spec.state_key in taken:
        raise ValueError(f"method {spec.name!r}: state_key {spec.state_key!r} is already used by another method")
    if spec.select is None:  # chosen by its config's type: a ConvertConfig stores that under its name
        register_config_type(spec.name, spec.config_type)
    _METHODS[spec.name] = spec
    if spec.export is not None:
        register_extension(CheckpointExtension(spec.name, spec.export, spec.prepare), spec.order)
    return spec


def unregister_method(name: str) -> None:
    """Forget the method ``name`` (and its checkpoint extension); a no-op when unknown."""
    spec = _METHODS.pop(name, None)
    unregister_config_type(name)
    if spec is not None and spec.export is not None:
        _EXTENSIONS.pop(name, None)


def methods() -> list[MethodSpec]:
    """Every registered method, in install order."""
    return sorted(_METHODS.values(), key=lambda s: (s.order, s.name))


def method(name: str) -> MethodSpec:
    """The registered method ``name``."""
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}: registered are {sorted(_METHODS)}")
    return _METHODS[name]


def unable(capability: str, model: nn.Module) -> list[tuple[str, str]]:
    """``(name, why)`` of each method installed on ``model`` that lacks ``capability``
    (``"chunkable"`` or ``"sequence_parallel"``; ``why`` from the spec, or a generic reason)."""
    found = []
    for spec in methods():
        value = getattr(spec, capability)
        if value is not True and spec.installed is not None and spec.installed(model) is not None:
            why = value if isinstance(value, str) else f"the runtime method {spec.name!r} does not allow it"
            found.append((spec.name, why))
    return found


def attention_kernel_clash(name: str, model: nn.Module, convert_config=None) -> str | None:
    """The name of another ``attention_kernel`` method than ``name`` that is installed on ``model``
    or that ``convert_config`` also selects, or ``None``."""
    for spec in methods():
        if not spec.attention_kernel or spec.name == name:
            continue
        if (spec.installed is not None and spec.installed(model) is not None) or (
                convert_config is not None and spec.chosen(convert_config) is not None):
            return spec.name
    return None


def register_extension(extension: CheckpointExtension, order: int) -> CheckpointExtension:
    """Store ``extension`` in checkpoints, restored in ``order`` (lower first)."""
    _EXTENSIONS[extension.name] = (order, extension)
    return extension


def extensions() -> dict[str, CheckpointExtension]:
    """The checkpoint extensions by name, in restore order."""
    ordered = sorted(_EXTENSIONS.items(), key=lambda item: (item[1][0], item[0]))
    return {name: ext for name, (_, ext) in ordered}


__all__ = [
    "CheckpointExtension",
    "MethodSpec",
    "attention_kernel_clash",
    "extensions",
    "method",
    "methods",
    "register_extension",
    "register_method",
    "unable",
    "unregister_method",
]
