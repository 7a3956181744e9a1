"""What :func:`sixbit.convert_model` does to a model: the named presets and how configs are read.

A :class:`ConvertConfig` bundles the choices of a conversion — weight formats
(:class:`~sixbit.QuantConfig`), how activations are quantized (``"fp"``, ``"int8"``,
``"nvfp4"``, ``"dynamic"`` = DMPQ, ``"static"`` = static W8A8), the delta cache, and quantized
attention (off unless asked for), and nothing else. Presets are named configs; JSON is
``ConvertConfig.to_dict()``. :func:`resolve` turns a preset name, a JSON file, a dict, a
:class:`ConvertConfig` or a :class:`~sixbit.QuantConfig` into a validated config, reporting
every problem at once; :func:`for_device` says what a config runs as on a device.

The definitions live in :mod:`sixbit.config` (the configs, the preset table, the JSON shapes:
:mod:`sixbit.config.io`); this module is their public path.

Example:
    >>> from sixbit.presets import resolve
    >>> resolve("balanced").activations
    'dynamic'
    >>> resolve({"attention": {"bits": 8, "symmetric": False}}).weights.role_formats["attention"]
    'int8-asym'
"""

from __future__ import annotations

import dataclasses

import torch

from .config import (
    Activations,
    AttentionQuantConfig,
    ConvertConfig,
    DeltaCacheConfig,
    DMPQConfig,
    QuantConfig,
    StaticW8A8Config,
)
from .config.io import from_json_dict, read_json, resolve
from .config.presets import PRESETS, W4_RECIPE, calibration_free, preset
from .kernels import fp4_supported

__all__ = [
    "PRESETS",
    "W4_RECIPE",
    "Activations",
    "AttentionQuantConfig",
    "ConvertConfig",
    "DMPQConfig",
    "DeltaCacheConfig",
    "QuantConfig",
    "StaticW8A8Config",
    "calibration_free",
    "for_device",
    "from_json_dict",
    "preset",
    "read_json",
    "resolve",
]


def for_device(config: ConvertConfig, device: torch.device | str,
               capability: tuple[int, int] | None = None) -> tuple[ConvertConfig, str | None]:
    """``config`` as it runs on ``device``, and a note saying what changed (``None``: nothing).
    ``capability``: answer for a CUDA GPU of that compute capability (e.g. ``(9, 0)``) instead of
    the one present, as :func:`sixbit.kernels.available` does.

    A preset names an intent; its low-bit arithmetic takes the device's fastest real path.
    DMPQ with ``low="auto"`` (the ``balanced`` preset) chooses NVFP4 activations for speed, which
    only FP4 tensor cores deliver (:func:`sixbit.kernels.available`); on any other device NVFP4
    would be emulated — slower than INT8 — so every call runs at INT8 (a real integer GEMM) and
    no DMPQ predictor is fitted. Everything else runs as configured.

    Example:
        >>> config, note = for_device(resolve("balanced"), "cpu")
        >>> config.activations, note.startswith("DMPQ")
        ('int8', True)
        >>> for_device(resolve("balanced"), "cuda", capability=(9, 0))[0].activations   # H100: no FP4 GEMM
        'int8'
    """
    device = torch.device(device)
    if config.activations != Activations.DYNAMIC or config.dmpq.low != "auto" or fp4_supported(device, capability):
        return config, None
    note = (f"DMPQ's low precision is NVFP4, which has no real GEMM on {device.type} "
            "(sixbit.kernels.available()): every call runs at INT8, the fastest real low-bit GEMM here")
    return dataclasses.replace(config, activations=Activations.INT8, dmpq=None,
                               description=f"{config.description} [on {device.type}: INT8 activations everywhere]"), note
