"""``sixbit.optimize``: the public path of :mod:`sixbit.memory` (VAE tiling, block offloading and
prefetch), as seed 000 writes it:

    >>> from sixbit.optimize import enable_memory_optimization
"""

from .memory import (
    HOOK_NAME,
    MemoryMode,
    MemoryOptimization,
    OffloadedWeightsLost,
    OffloadStats,
    disable_memory_optimization,
    enable_memory_optimization,
    offload_problem,
    resident_weights,
)

__all__ = [
    "HOOK_NAME", "MemoryMode", "MemoryOptimization", "OffloadStats", "OffloadedWeightsLost",
    "disable_memory_optimization", "enable_memory_optimization", "offload_problem", "resident_weights",
]
