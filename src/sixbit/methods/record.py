"""The conversion record: what :func:`sixbit.convert_model` did to a model, and its checkpoint state.

A :class:`Conversion` is remembered per model (``sixbit.conversion_of(model)``). Installing,
removing and storing it are loops over the method registry (:mod:`sixbit.methods.registry`):
no method is named here. The record is the checkpoint extension ``"conversion"``; its meta is

    {"version": 1, "config": ConvertConfig.to_dict(), "calibration": {...} | null,
     <each method's state_key>: <its dump()> | null, ..., "hardware": "..." | null}

(today: ``"predictor"``, DMPQ's, and ``"stabilize_frames"``, the stabilizer's dead zone). It is
restored after every method's own extension (static W8A8's rebuilds layers first). Importing
:mod:`sixbit.methods` (as this module does) registers every built-in method.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .registry import CheckpointExtension, methods, register_extension
from ..models import transformer_of
from ..nn.precision import ACT_BITS, ActMode, average_bits
from ..config import Activations, ConvertConfig

logger = logging.getLogger(__name__)

NAME = "conversion"  # the record's checkpoint extension
ORDER = 1000  # restored after every method's own checkpoint extension


@dataclasses.dataclass
class Conversion:
    """What :func:`convert_model` did to a model (``sixbit.conversion_of(model)``).

    Attributes:
        config: the resolved :class:`~sixbit.presets.ConvertConfig`.
        calibration: where calibration came from (``{"source": ..., "count": ...}``), or ``None``.
        hardware: what the preset's intent became on the device it was converted on
            (:func:`sixbit.presets.for_device`), or ``None`` when it runs as configured.
        methods: every installed method's state by registered name.
        applied: what each installed method was applied with, by name (its config, or what
            its fit returned), as stored in checkpoints.

    Each method's state is also an attribute under the name its spec gives (``attribute``), and
    what its fit returned under ``fitted``; ``None`` when the method is not installed. The
    built-in ones: ``dmpq`` (``.report()``: precision map, average bits) and ``predictor`` (the
    fitted DMPQ predictor), ``cache`` (the delta cache; ``.report()``: skip map, skip share,
    cache bytes), ``stabilizer``, ``attention`` (its ``path``, real or emulated, and counts of
    quantized calls), ``default`` (the fixed activation precision's policy).
    """

    config: ConvertConfig
    calibration: dict | None = None
    hardware: str | None = None
    methods: dict[str, Any] = dataclasses.field(default_factory=dict)
    applied: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __getattr__(self, name: str):
        if not name.startswith("_"):  # dataclass machinery and copies ask for dunder and private names
            for spec in methods():
                if spec.attribute == name:
                    return self.methods.get(spec.name)
                if spec.fitted == name:
                    return self.applied.get(spec.name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def average_act_bits(self) -> float:
        """GEMM-FLOP-weighted activation bits of the last run where a method decides the precision
        per call (DMPQ; PDR's full-precision refreshes counted at 16 bits): each installed
        method's state with ``activation_flops(flops)`` adds its count, in install order; else
        the configured width."""
        flops = None
        for spec in methods():
            state = self.methods.get(spec.name)
            if hasattr(state, "activation_flops"):
                flops = state.activation_flops(flops)
        if flops is not None:
            return average_bits(flops)
        if self.config.activations == Activations.STATIC:
            bits = self.config.static.act_bits
            return float(sum(bits) / len(bits)) if isinstance(bits, (list, tuple)) else float(bits)
        return ACT_BITS[ActMode(self.config.activations)]


_CONVERSIONS: weakref.WeakKeyDictionary[nn.Module, Conversion] = weakref.WeakKeyDictionary()


def conversion_of(model_or_pipe) -> Conversion | None:
    """The :class:`Conversion` of a converted model (or of a pipeline's transformer), else ``None``."""
    return _CONVERSIONS.get(transformer_of(model_or_pipe))


def selected(config: ConvertConfig, extra: Mapping[str, Any]) -> dict[str, Any]:
    """Each registered method ``config`` (and the per-call ``extra`` configs) runs, with its config."""
    chosen = {}
    for spec in methods():
        method_config = spec.chosen(config, extra)
        if method_config is not None:
            chosen[spec.name] = method_config
    return chosen


def check(model: nn.Module, config: ConvertConfig, chosen: Mapping[str, Any]) -> None:
    """Every chosen method's own check: refuse what cannot run, before anything changes."""
    for spec in methods():
        if spec.name in chosen and spec.check is not None:
            spec.check(model, chosen[spec.name], config)


def install(model: nn.Module, config: ConvertConfig, applied: Mapping[str, Any], calibration: dict | None,
            hardware: str | None = None) -> Conversion:
    """Apply each method of ``applied`` (what its fit returned, or its config) in registry order,
    and remember the conversion. A method without ``state_key`` whose fit returned another config
    of its type (the delta cache's calibrated budget) is recorded in ``config`` as fitted."""
    for spec in methods():
        fitted = applied.get(spec.name)
        if spec.fit is not None and spec.state_key is None and isinstance(fitted, spec.config_type):
            config = spec.recorded(config, fitted) or config
    conversion = Conversion(config, calibration, hardware=hardware)
    _CONVERSIONS[model] = conversion  # first: a failure below is undone through it
    for spec in methods():
        if spec.name not in applied:
            continue
        conversion.applied[spec.name] = applied[spec.name]
        if spec.apply is not None:
            conversion.methods[spec.name] = spec.apply(model, applied[spec.name])
    return conversion


def remove_methods(model: nn.Module) -> None:
    """Remove every registered runtime method from ``model`` (last installed first), and forget
    its conversion."""
    _CONVERSIONS.pop(model, None)
    for spec in reversed(methods()):
        if spec.remove is not None:
            spec.remove(model)


def conversion_state(conversion: Conversion) -> tuple[dict, dict]:
    """The checkpoint extension's ``(meta, tensors)`` for ``conversion``."""
    meta = {"version": 1, "config": conversion.config.to_dict(), "calibration": conversion.calibration}
    for spec in methods():
        if spec.state_key is not None:
            applied = conversion.applied.get(spec.name)
            meta[spec.state_key] = None if applied is None else spec.dump(applied)
    meta["hardware"] = conversion.hardware
    return meta, {}


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except (RuntimeError, TypeError, ValueError):  # e.g. configs holding tensors: not the same object
        return False


def _restored(spec, config: ConvertConfig, applied: Mapping[str, Any]) -> Any:
    """What :func:`sixbit.load` applies ``spec`` with from a record of ``config`` and ``applied``."""
    return applied.get(spec.name) if spec.state_key is not None else spec.chosen(config)


def as_running(model: nn.Module, conversion: Conversion) -> Conversion:
    """``conversion`` with each method as it runs on ``model`` now (its ``installed``): one
    applied (``apply_x``) or removed after :func:`convert_model` is recorded through its
    ``state_key`` or ``record``. A change the record cannot express, or one that
    :func:`sixbit.load` would refuse, raises ``ValueError`` (nothing is written)."""
    config, applied = conversion.config, dict(conversion.applied)
    running = {spec.name: spec.installed(model) for spec in methods() if spec.installed is not None}
    for spec in methods():
        if spec.name not in running or _same(running[spec.name], applied.get(spec.name)):
            continue
        if running[spec.name] is None:
            applied.pop(spec.name, None)
        else:
            applied[spec.name] = running[spec.name]
        if spec.state_key is None:
            config = spec.recorded(config, running[spec.name]) or config
    for spec in methods():
        if spec.name not in running:
            continue
        stored = _restored(spec, config, applied)
        lost = spec.state_key is not None and stored is None and spec.fit is not None and spec.chosen(config) is not None
        try:
            storable = stored is None or spec.state_key is None or spec.dump(stored) is not None
        except (AttributeError, TypeError, ValueError):
            storable = False
        if lost or not storable or not _same(stored, running[spec.name]):
            raise ValueError(f"the runtime method {spec.name!r} was applied or removed after convert_model in a way a "
                             "checkpoint cannot store: save before changing it, or convert with it in the ConvertConfig")
    try:
        check(model, config, applied)
    except ValueError as e:
        raise ValueError(f"this model's runtime methods, as they run now, would not load back: {e}") from None
    return dataclasses.replace(conversion, config=config, applied=applied)


def _export(model: nn.Module):
    conversion = _CONVERSIONS.get(model)
    if conversion is None:
        running = [spec.name for spec in methods() if spec.installed is not None and spec.installed(model) is not None]
        if running:  # a checkpoint restores runtime methods from a conversion record only
            logger.warning("the runtime method(s) %s of this model, which convert_model did not convert, are not "
                           "stored: apply them again after sixbit.load, or convert with them (ConvertConfig)", running)
        return None
    return conversion_state(as_running(model, conversion))


def _stored(model: nn.Module, modules: dict[str, nn.Module], meta: dict, config: ConvertConfig) -> dict[str, Any]:
    """What each method of a stored conversion is applied with, checked against ``modules``."""
    known = {"version", "config", "calibration", "hardware"} | {s.state_key for s in methods() if s.state_key}
    unknown = sorted(set(meta) - known)
    if unknown:
        raise ValueError(f"the conversion stores state {unknown} of runtime methods this sixbit does not know: "
                         "load it with the sixbit version (and the method packages) that wrote it")
    applied = {}
    for spec in methods():
        if spec.state_key is None:
            if spec.apply is not None and spec.chosen(config) is not None:
                applied[spec.name] = spec.chosen(config)
            continue
        value = meta.get(spec.state_key)
        if value is None:
            if spec.fit is not None and spec.chosen(config) is not None:
                raise ValueError(f"the conversion runs {spec.name} but stores no {spec.state_key!r}")
            continue
        try:
            applied[spec.name] = spec.load(value, model, modules)
        except (KeyError, TypeError) as e:
            raise ValueError(f"the conversion state's {spec.state_key!r} is incomplete or malformed: {e}") from None
    return applied


def _prepare(model: nn.Module, modules: dict[str, nn.Module], meta: dict, tensors: dict[str, torch.Tensor]):
    """Check a stored conversion against the model it will be installed on; the installer."""
    if meta.get("version") != 1:
        raise ValueError(f"unsupported conversion state version {meta.get('version')!r}")
    try:
        config = ConvertConfig.from_dict(meta["config"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"the conversion state is incomplete or malformed: {e}") from None
    calibration, hardware = meta.get("calibration"), meta.get("hardware")
    malformed = [key for key, value, kind in (("calibration", calibration, dict), ("hardware", hardware, str))
                 if value is not None and not isinstance(value, kind)]
    if malformed:
        raise ValueError(f"the conversion state's {' and '.join(malformed)} entry is malformed")
    applied = _stored(model, modules, meta, config)
    check(model, config, applied)

    return lambda: install(model, config, applied, calibration, hardware)


EXTENSION = register_extension(CheckpointExtension(NAME, _export, _prepare, clear=remove_methods), ORDER)

__all__ = ["EXTENSION", "Conversion", "as_running", "check", "conversion_of", "conversion_state", "install", "remove_methods",
           "selected"]
