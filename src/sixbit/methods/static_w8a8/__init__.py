"""Static, timestep-aware W8A8: every activation scale fixed offline, per time range.

Registered as the method ``"static_w8a8"``: chosen by ``activations="static"`` (its
:class:`StaticW8A8Config`), fitted on the calibration runs (it quantizes the weights itself);
its per-range parameters are a checkpoint extension of their own, restored before the
conversion record.
"""

from ...config.static_w8a8 import Outliers, PRESETS, Smoothing, StaticW8A8Config
from .layers import StaticActQuantizer, StaticW8A8Info, StaticW8A8State, range_parameters, static_w8a8_info
from .method import apply_static_w8a8
from .spec import SPEC  # registers the method

__all__ = [
    "SPEC", "PRESETS", "Outliers", "Smoothing", "StaticActQuantizer", "StaticW8A8Config", "StaticW8A8Info",
    "StaticW8A8State", "apply_static_w8a8", "range_parameters", "static_w8a8_info"
]
