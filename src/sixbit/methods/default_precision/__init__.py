"""The conversion's fixed activation precision (``activations="int8"``, ``"nvfp4"``, ``"fp"``).

Every quantized linear runs at the configured mode unless a policy of higher precedence
(PDR's refreshes) decides otherwise: a policy at :attr:`~sixbit.nn.precision.Level.DEFAULT`.
"""

from .method import FIXED, DefaultPrecision, apply_default_precision, remove_default_precision
from .spec import SPEC  # registers the method

__all__ = ["SPEC", "FIXED", "DefaultPrecision", "apply_default_precision", "remove_default_precision"]
