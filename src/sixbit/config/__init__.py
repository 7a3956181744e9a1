"""Every configuration of sixbit in one place, validated on construction.

- :class:`QuantConfig` — how :func:`sixbit.quantize` replaces linear layers;
- :class:`ConvertConfig` — a whole conversion: weights, :class:`Activations`, and the runtime
  methods' configs (:class:`DMPQConfig`, :class:`StaticW8A8Config`, :class:`DeltaCacheConfig`,
  :class:`AttentionQuantConfig`; further methods' configs such as :class:`SparseAttentionConfig`
  go in its ``methods``), which :meth:`ConvertConfig.method_configs` yields so a method
  is chosen by its config's type;
- :mod:`~sixbit.config.presets` — the named conversions; :mod:`~sixbit.config.io` — reading
  preset names, JSON files and the seed's short JSON shape;
- :mod:`~sixbit.config.serialize` — the one dataclass ↔ dict serializer behind every
  ``to_dict`` / ``from_dict``.

Every problem in a config is reported at once, in one ``ValueError``, before anything changes.
The package imports nothing above :mod:`sixbit.nn` and :mod:`sixbit.models` (``Role`` lives
there: it is the model side's name of a layer's job), so every other package may import it.
"""

from ..models.roles import Role
from .attention import AttentionQuantConfig
from .convert import Activations, ConvertConfig
from .delta_cache import CACHE_FORMATS, DeltaCacheConfig
from .dmpq import DMPQConfig
from .sparse_attention import SparseAttentionConfig
from .quant import CALIBRATION_INPUTS, DEFAULT_QUANTIZED_ROLES, QuantConfig, pattern_problems
from .static_w8a8 import Outliers, Smoothing, StaticW8A8Config

__all__ = [
    "CACHE_FORMATS",
    "CALIBRATION_INPUTS",
    "DEFAULT_QUANTIZED_ROLES",
    "Activations",
    "AttentionQuantConfig",
    "ConvertConfig",
    "DMPQConfig",
    "DeltaCacheConfig",
    "Outliers",
    "QuantConfig",
    "Role",
    "Smoothing",
    "SparseAttentionConfig",
    "StaticW8A8Config",
    "pattern_problems",
]
