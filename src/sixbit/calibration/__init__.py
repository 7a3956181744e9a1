"""Calibration: running activation statistics per layer × step × CFG branch, data sources, time ranges."""

from .collector import calibrate
from .data import TAIL_QUANTILES, BlockStats, CalibrationData, LayerStats
from .seeding import seeded

__all__ = ["TAIL_QUANTILES", "BlockStats", "CalibrationData", "LayerStats", "calibrate", "seeded"]
