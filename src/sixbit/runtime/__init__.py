"""Runtime methods on diffusers hooks: step/branch context, and (later) DMPQ and the delta cache."""

from .context import BATCHED, StepInfo, StepTracker, track_steps, tracker_of

__all__ = ["BATCHED", "StepInfo", "StepTracker", "track_steps", "tracker_of"]
