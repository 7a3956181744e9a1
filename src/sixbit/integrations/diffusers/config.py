"""``SixbitConfig``: a sixbit conversion as a diffusers ``quantization_config``.

Passed to ``from_pretrained`` it quantizes a full-precision folder while it loads; written into a
converted model's ``config.json`` (``quantization_config``) it says how the folder was made and
carries the checkpoint header that lets ``from_pretrained`` rebuild it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
from typing import Any

from diffusers.quantizers.quantization_config import QuantizationConfigMixin

from ...config import ConvertConfig, QuantConfig
from ...presets import resolve
from ...version import __version__

# the keys of a quantization_config dict besides the settings (what to_dict writes, and the preset)
_KEYS = ("quant_method", "preset_or_config", "config", "checkpoint", "tensors", "sixbit_version")
_CONVERT_FIELDS = {f.name for f in dataclasses.fields(ConvertConfig)}
_QUANT_FIELDS = {f.name for f in dataclasses.fields(QuantConfig)}


class QuantMethod(str, enum.Enum):
    """diffusers reads ``quant_method.value`` (its own ``QuantizationMethod`` is closed)."""

    SIXBIT = "sixbit"


class SixbitConfig(QuantizationConfigMixin):
    """A sixbit conversion for diffusers' ``from_pretrained(..., quantization_config=...)``.

    Args:
        preset_or_config: a preset name (``sixbit.PRESETS``), a ``.json`` path, a dict, a
            :class:`~sixbit.ConvertConfig` or a :class:`~sixbit.QuantConfig`, as
            :func:`sixbit.convert_model` takes it. Quantizing while loading needs no calibration,
            so only calibration-free configs load this way (``"w8a8"``, ``"w4a8-rtn"``,
            ``"high_quality"``, ``"tdc"``, or ``"w4a16"`` with ``gptq=False``); the others are
            refused with the command that converts them.
        overrides: fields of :class:`~sixbit.ConvertConfig` (``activations=``, ``cache=``,
            ``attention=``…) or of its weights' :class:`~sixbit.QuantConfig` (``gptq=False``,
            ``weight_format=``…), replacing the preset's.

    Example:
        >>> import sixbit
        >>> sixbit.SixbitConfig("w4a16", gptq=False).convert_config.weights.gptq
        False
        >>> # WanTransformer3DModel.from_pretrained(folder, subfolder="transformer",
        >>> #     quantization_config=sixbit.SixbitConfig("w8a8"), torch_dtype=torch.bfloat16)
    """

    def __init__(self, preset_or_config: Any = "balanced", **overrides):
        self.quant_method = QuantMethod.SIXBIT
        self.checkpoint = overrides.pop("checkpoint", None)  # set when read back from a converted folder
        self.tensors = overrides.pop("tensors", None)
        self.sixbit_version = overrides.pop("sixbit_version", __version__)
        overrides.pop("quant_method", None)
        stored = overrides.pop("config", None)
        if self.checkpoint is not None:  # a converted folder: its header says everything; the conversion, if any
            if overrides:
                raise ValueError(f"a converted folder's quantization_config takes no settings, got {sorted(overrides)}")
            self.convert_config = None if stored is None else ConvertConfig.from_dict(stored)
        else:
            if stored is not None:  # from_dict of what to_dict wrote
                preset_or_config = ConvertConfig.from_dict(stored) if isinstance(stored, dict) else stored
            self.convert_config = _with_overrides(resolve(preset_or_config), overrides)
        self._label = ", ".join([repr(preset_or_config) if isinstance(preset_or_config, str) else "custom",
                                 *(f"{k}={v!r}" for k, v in overrides.items())])

    @property
    def pre_quantized(self) -> bool:
        """Whether this config describes a converted folder (it carries its checkpoint header)."""
        return self.checkpoint is not None

    def to_dict(self) -> dict[str, Any]:
        data = {"quant_method": self.quant_method.value, "sixbit_version": self.sixbit_version,
                "config": None if self.convert_config is None else self.convert_config.to_dict()}
        if self.checkpoint is not None:
            data["checkpoint"] = self.checkpoint
            data["tensors"] = self.tensors
        return data

    def to_json_string(self, use_diff: bool = True) -> str:
        """The JSON of :meth:`to_dict` (every field: a sixbit config has no library-wide defaults to diff against)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, config_dict: dict, return_unused_kwargs: bool = False, **kwargs):
        """The config a ``quantization_config`` dict describes: what :meth:`to_dict` wrote (a
        converted folder's ``config.json``), or one written by hand with the arguments
        ``SixbitConfig(...)`` takes (``{"quant_method": "sixbit", "preset_or_config": "w8a8",
        "gptq": False}``); a key that is neither is refused by name."""
        if not isinstance(config_dict, dict):
            raise ValueError(f"a sixbit quantization_config is a JSON object, got {type(config_dict).__name__}")
        data = {**config_dict, **kwargs}
        unknown = sorted(set(data) - set(_KEYS) - _CONVERT_FIELDS - _QUANT_FIELDS)
        if unknown:
            close = difflib.get_close_matches(unknown[0], [*_KEYS, *_CONVERT_FIELDS, *_QUANT_FIELDS], n=1)
            hint = f" (did you mean {close[0]!r}?)" if len(unknown) == 1 and close else ""
            raise ValueError(f"the sixbit quantization_config has unknown key(s) {unknown}{hint}: it takes "
                             f"{list(_KEYS)} and, as settings of the conversion, fields of ConvertConfig "
                             f"({sorted(_CONVERT_FIELDS)}) or of QuantConfig ({sorted(_QUANT_FIELDS)})")
        config = cls(**data)
        return (config, {}) if return_unused_kwargs else config

    def __eq__(self, other) -> bool:
        return isinstance(other, SixbitConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        if self.pre_quantized:
            return f"SixbitConfig(converted {self.checkpoint.get('model_class')}, {len(self.checkpoint.get('layers', {}))} layers)"
        return f"SixbitConfig({self._label})"


def _with_overrides(config: ConvertConfig, overrides: dict[str, Any]) -> ConvertConfig:
    """``config`` with ``overrides`` (ConvertConfig fields, or QuantConfig fields of its weights)."""
    if not overrides:
        return config
    unknown = sorted(set(overrides) - _CONVERT_FIELDS - _QUANT_FIELDS)
    if unknown:
        raise ValueError(f"SixbitConfig got unknown setting(s) {unknown}: give fields of ConvertConfig "
                         f"({sorted(_CONVERT_FIELDS)}) or of QuantConfig ({sorted(_QUANT_FIELDS)})")
    outer = {k: v for k, v in overrides.items() if k in _CONVERT_FIELDS}
    inner = {k: v for k, v in overrides.items() if k not in _CONVERT_FIELDS}
    if inner:
        weights = outer.get("weights", config.weights)
        if weights is None:  # also weights=None given beside them (issue 61: a raw TypeError from replace())
            raise ValueError(f"SixbitConfig: {sorted(inner)} set how weights are quantized, but this config keeps "
                             "the weights in full precision (weights=None): drop one or the other")
        outer["weights"] = dataclasses.replace(weights, **inner)
    return dataclasses.replace(config, **outer)
