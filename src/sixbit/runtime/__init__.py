"""What runtime methods stand on: the step/branch context with its precision scope, and the
shared block hook (:mod:`sixbit.runtime.blocks`). The methods themselves are in :mod:`sixbit.methods`."""

from .context import BATCHED, StepInfo, StepTracker, track_steps, tracker_of

__all__ = ["BATCHED", "StepInfo", "StepTracker", "track_steps", "tracker_of"]
