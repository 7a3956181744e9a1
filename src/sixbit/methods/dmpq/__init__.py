"""DMPQ: NVFP4 or INT8 activations per block and step, predicted from the block's last Γ."""

from ...config.dmpq import DMPQConfig
from .fit import fit_dmpq
from .method import (
    DMPQ,
    DMPQPredictor,
    DMPQReport,
    FixedAssignment,
    RandomAssignment,
    apply_dmpq,
    remove_dmpq,
)

__all__ = [
    "DMPQ",
    "DMPQConfig",
    "DMPQPredictor",
    "DMPQReport",
    "FixedAssignment",
    "RandomAssignment",
    "apply_dmpq",
    "fit_dmpq",
    "remove_dmpq",
]
