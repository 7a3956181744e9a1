"""sixbit: low-bit weights, per-step activation precision and delta caching for video DiTs.

Example:
    >>> import torch, sixbit
    >>> from sixbit.nn import QuantLinear
    >>> layer = QuantLinear.from_linear(torch.nn.Linear(64, 64), weight_format="nvfp4")
    >>> sixbit.formats.get("nvfp4").bits_per_element
    4.5
"""

from .version import __version__  # noqa: E402
from . import formats, reports  # noqa: E402
from .builder import quantize  # noqa: E402
from .calibration import CalibrationData, calibrate  # noqa: E402
from .checkpoint import load, read_header, save  # noqa: E402
from .config import QuantConfig, Role  # noqa: E402
from .convert import Conversion, conversion_of, convert_model  # noqa: E402
from .footprint import keep_int8_weights, summary  # noqa: E402
from .lora import load_lora, loras, set_lora_scale, unload_lora  # noqa: E402
from .methods.attention import AttentionQuantConfig, apply_attention_quant, remove_attention_quant  # noqa: E402
from .methods.delta_cache import DeltaCacheConfig, disable_delta_cache, enable_delta_cache  # noqa: E402
from .methods.dmpq import DMPQConfig, apply_dmpq, fit_dmpq  # noqa: E402
from .methods.static_w8a8 import StaticW8A8Config, apply_static_w8a8, range_parameters, static_w8a8_info  # noqa: E402
from .nn import ActMode, QuantLinear, debug_checks  # noqa: E402
from .presets import PRESETS, ConvertConfig  # noqa: E402
from .streaming import StreamedConversion, convert_pretrained, load_pretrained  # noqa: E402
from .runtime import track_steps  # noqa: E402
from .tuning import tune, tune_model  # noqa: E402
from .integrations.diffusers import SixbitConfig  # noqa: E402  (registers the diffusers backend)

__all__ = [
    "ActMode",
    "AttentionQuantConfig",
    "CalibrationData",
    "Conversion",
    "ConvertConfig",
    "DMPQConfig",
    "DeltaCacheConfig",
    "PRESETS",
    "QuantConfig",
    "QuantLinear",
    "Role",
    "SixbitConfig",
    "StaticW8A8Config",
    "StreamedConversion",
    "__version__",
    "apply_attention_quant",
    "apply_dmpq",
    "apply_static_w8a8",
    "calibrate",
    "conversion_of",
    "convert_model",
    "convert_pretrained",
    "debug_checks",
    "disable_delta_cache",
    "enable_delta_cache",
    "fit_dmpq",
    "formats",
    "keep_int8_weights",
    "load",
    "load_lora",
    "load_pretrained",
    "loras",
    "quantize",
    "range_parameters",
    "read_header",
    "remove_attention_quant",
    "save",
    "set_lora_scale",
    "static_w8a8_info",
    "summary",
    "track_steps",
    "tune",
    "tune_model",
    "unload_lora",
]
