"""sixbit: low-bit weights, per-step activation precision and delta caching for video DiTs.

Example:
    >>> import torch, sixbit
    >>> from sixbit.nn import QuantLinear
    >>> layer = QuantLinear.from_linear(torch.nn.Linear(64, 64), weight_format="nvfp4")
    >>> sixbit.formats.get("nvfp4").bits_per_element
    4.5

Names are imported when first used (PEP 562 ``__getattr__``), so ``import sixbit`` is quick and
loads neither torch nor diffusers: the ``sixbit`` command configures logging before diffusers
and torchao are imported, and a program that only reads ``sixbit.__version__`` pays nothing.
``from sixbit import quantize`` and ``sixbit.quantize`` work as with eager imports, and so does
any submodule as an attribute (``sixbit.optimize``).
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

from .version import __version__

# Every public name and the module that defines it: the one list to extend.
_EXPORTS = {
    "builder": ["quantize"],
    "calibration": ["CalibrationData", "calibrate"],
    "checkpoint": ["load", "read_header", "save"],
    "config": ["QuantConfig", "Role"],
    "convert": ["Conversion", "conversion_of", "convert_model"],
    "footprint": ["summary"],
    "integrations.diffusers": ["SixbitConfig"],
    "memory.fast_path": ["keep_int8_weights", "layout_of"],
    "lora": ["load_lora", "loras", "set_lora_scale", "unload_lora"],
    "methods.attention": ["AttentionQuantConfig", "apply_attention_quant", "remove_attention_quant"],
    "methods.delta_cache": ["DeltaCacheConfig", "disable_delta_cache", "enable_delta_cache"],
    "methods.dmpq": ["DMPQConfig", "apply_dmpq", "fit_dmpq"],
    "methods.sparse_attention": ["SparseAttentionConfig", "apply_sparse_attention", "remove_sparse_attention",
                                 "sparse_attention_of"],
    "methods.static_w8a8": ["StaticW8A8Config", "apply_static_w8a8", "range_parameters", "static_w8a8_info"],
    "nn": ["ActMode", "QuantLinear", "debug_checks"],
    "presets": ["PRESETS", "ConvertConfig"],
    "streaming": ["StreamedConversion", "convert_pretrained", "load_pretrained", "tune_pretrained"],
    "runtime": ["track_steps"],
    "tuning": ["tune", "tune_model"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

# Modules that moved in issue 59, by their old name: ``sixbit.<old>`` still works, with a warning.
_MOVED = {
    "checkpoint_layers": "checkpoint.layers",
    "checkpoint_restore": "checkpoint.restore",
    "conversion": "methods.record",
    "distributed": "nn.token_stats",
    "io": "files.safetensors",
    "layout": "memory.fast_path",
    "lora_diffusers": "integrations.diffusers.lora",
    "lora_layout": "lora.files",
    "reports": "eval.plots",
    "tempfiles": "files.tempfiles",
    "validate": "config.validate",
}

__all__ = sorted([*_MODULE_OF, "__version__", "formats"])

if TYPE_CHECKING:  # what type checkers and editors see; mirrors _EXPORTS (tests/test_lazy_import.py checks)
    from . import formats
    from .builder import quantize
    from .calibration import CalibrationData, calibrate
    from .checkpoint import load, read_header, save
    from .config import QuantConfig, Role
    from .convert import Conversion, conversion_of, convert_model
    from .footprint import summary
    from .integrations.diffusers import SixbitConfig
    from .memory.fast_path import keep_int8_weights, layout_of
    from .lora import load_lora, loras, set_lora_scale, unload_lora
    from .methods.attention import AttentionQuantConfig, apply_attention_quant, remove_attention_quant
    from .methods.delta_cache import DeltaCacheConfig, disable_delta_cache, enable_delta_cache
    from .methods.dmpq import DMPQConfig, apply_dmpq, fit_dmpq
    from .methods.sparse_attention import (
        SparseAttentionConfig,
        apply_sparse_attention,
        remove_sparse_attention,
        sparse_attention_of,
    )
    from .methods.static_w8a8 import StaticW8A8Config, apply_static_w8a8, range_parameters, static_w8a8_info
    from .nn import ActMode, QuantLinear, debug_checks
    from .presets import PRESETS, ConvertConfig
    from .streaming import StreamedConversion, convert_pretrained, load_pretrained, tune_pretrained
    from .runtime import track_steps
    from .tuning import tune, tune_model


from .integrations import register_on_import  # noqa: E402

register_on_import()  # diffusers reads sixbit folders and takes quant_backend="sixbit" (sixbit.integrations)


def __getattr__(name: str):
    """Import ``name`` on first use: a public name from its module, or a submodule."""
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _MOVED:
        warnings.warn(f"sixbit.{name} is now sixbit.{_MOVED[name]}: import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(f".{_MOVED[name]}", __name__)
    if not name.startswith("_"):
        try:
            return importlib.import_module(f".{name}", __name__)  # binds sixbit.<name> itself
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # the submodule exists but one of its imports is missing
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
