"""Frame stabilization: quantize each token's temporal mean and its per-frame deviation apart.

Registered as the method ``"stabilize"``: chosen by ``convert_model(stabilize_frames=...)``
(a :class:`StabilizeConfig`), its dead zone stored in the conversion record as
``"stabilize_frames"``.
"""

from .method import DEFAULT_DEADZONE, FrameStabilizer, StabilizeConfig, apply_stabilizer, remove_stabilizer
from .spec import SPEC  # registers the method

__all__ = ["SPEC", "DEFAULT_DEADZONE", "FrameStabilizer", "StabilizeConfig", "apply_stabilizer", "remove_stabilizer"]
