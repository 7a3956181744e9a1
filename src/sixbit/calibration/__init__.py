"""Calibration: running activation statistics per layer × step × CFG branch."""

from .collector import calibrate
from .data import TAIL_QUANTILES, BlockStats, CalibrationData, LayerStats
from .dmpq_fit import fit_dmpq

__all__ = ["TAIL_QUANTILES", "BlockStats", "CalibrationData", "LayerStats", "calibrate", "fit_dmpq"]
