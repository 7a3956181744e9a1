"""Static, timestep-aware W8A8: every activation scale fixed offline, per time range."""

from .layers import EXTENSION, StaticActQuantizer, StaticW8A8Info, StaticW8A8State, range_parameters, static_w8a8_info
from ...config.static_w8a8 import PRESETS, Outliers, Smoothing, StaticW8A8Config
from .method import apply_static_w8a8

__all__ = [
    "EXTENSION",
    "PRESETS",
    "Outliers",
    "Smoothing",
    "StaticActQuantizer",
    "StaticW8A8Config",
    "StaticW8A8Info",
    "StaticW8A8State",
    "apply_static_w8a8",
    "range_parameters",
    "static_w8a8_info",
]
