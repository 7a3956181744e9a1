"""Frame stabilization: quantize each token's temporal mean and its per-frame deviation apart."""

from .method import DEFAULT_DEADZONE, FrameStabilizer, apply_stabilizer, remove_stabilizer

__all__ = ["DEFAULT_DEADZONE", "FrameStabilizer", "apply_stabilizer", "remove_stabilizer"]
