"""Calibration runs that repeat: every method that compares or accumulates re-runs of a user's
calibration callable (DMPQ, GPTQ, static W8A8 through :func:`sixbit.convert_model`) runs it seeded."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

#: The global seed each calibration run starts from (:func:`seeded`).
CALIBRATION_SEED = 0


def seeded(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` made repeatable: every call runs under ``torch.manual_seed(CALIBRATION_SEED)`` inside
    ``torch.random.fork_rng``, so what it draws from the global RNG (a pipeline's noise when no
    ``generator`` is passed) is the same on every call, and the caller's RNG state is left as it
    was. Explicit generators are untouched. Wrapping twice is the same as once.
    """
    if getattr(run, "_sixbit_seeded", False):
        return run

    @functools.wraps(run)
    def repeatable(*args, **kwargs):
        # the CUDA devices already in use; torch.manual_seed also seeds the others (lazily)
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(CALIBRATION_SEED)
            return run(*args, **kwargs)

    repeatable._sixbit_seeded = True
    return repeatable
