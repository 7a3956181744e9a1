"""Runtime methods, one package each: config → state → hook → ``apply_x`` / ``remove_x``, with
their fit and checkpoint state beside them, each registered in :mod:`~sixbit.methods.registry`.

- :mod:`~sixbit.methods.default_precision` — the fixed activation precision of a conversion;
- :mod:`~sixbit.methods.dmpq` — activation precision (NVFP4 or INT8) per block and step;
- :mod:`~sixbit.methods.delta_cache` — skip blocks whose residual is stable (TDC + PDR);
- :mod:`~sixbit.methods.static_w8a8` — static, timestep-aware W8A8 scales;
- :mod:`~sixbit.methods.stabilize` — quantize each token's temporal mean and deviation apart;
- :mod:`~sixbit.methods.attention` — INT8 Q·Kᵀ attention per block and step;
- :mod:`~sixbit.methods.sparse_attention` — block-sparse attention over the video's token grid.

Importing this package registers every method (as :mod:`sixbit.models` registers the models).
"""

from . import attention, default_precision, delta_cache, dmpq, sparse_attention, stabilize, static_w8a8  # noqa: F401  (registers them)
from .registry import MethodSpec, methods, register_method

__all__ = ["MethodSpec", "methods", "register_method"]
