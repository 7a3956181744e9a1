"""DMPQ: NVFP4 or INT8 activations per block and step, predicted from the block's last Γ.

Registered as the method ``"dmpq"``: chosen by ``activations="dynamic"`` (its
:class:`DMPQConfig`), fitted on the calibration runs into a :class:`DMPQPredictor`, which the
conversion record stores as ``"predictor"``.
"""

from ...config.dmpq import DMPQConfig
from .fit import fit_dmpq
from .method import DMPQ, DMPQPredictor, DMPQReport, FixedAssignment, RandomAssignment, apply_dmpq, remove_dmpq
from .spec import SPEC  # registers the method

__all__ = [
    "SPEC", "DMPQ", "DMPQConfig", "DMPQPredictor", "DMPQReport", "FixedAssignment", "RandomAssignment", "apply_dmpq",
    "fit_dmpq", "remove_dmpq"
]
