"""Weight algorithms, run once at conversion: scale search, GPTQ, a 16-bit low-rank branch.

:func:`quantize_weight` turns one weight (as the layer stores it: rotated / divided already)
into its format's container and, optionally, the low-rank branch's factors. The pieces:

- :mod:`.grid`: the format's rounding grid with fixed scales; scale rules ``absmax`` (round to
  nearest), ``mse`` (searched per block, optionally weighted by the Hessian diagonal), ``4/6``;
- :mod:`.gptq`: GPTQ on that grid, with the layer's input Hessian
  (:mod:`sixbit.calibration.hessians`);
- :mod:`sixbit.transforms.lowrank`: the SVD split; here alternated with the quantizer (SVDQuant).

:mod:`sixbit.builder` runs them layer by layer (block by block when calibration is needed).
"""

from .gptq import DAMP, gptq
from .grid import SCALE_RULES, grid_for, supports
from .weight import BRANCH_DTYPE, quantize_weight

__all__ = ["BRANCH_DTYPE", "DAMP", "SCALE_RULES", "gptq", "grid_for", "quantize_weight", "supports"]
