"""The one builder: which linears a conversion quantizes, how each is built, and the single
"build a part's state, then swap it in" path with its one rollback.

- :mod:`.layers`: :func:`plan_layers` (layers by role, pattern and block position; :func:`check_plan`
  refuses a config that would quantize none) and
  :func:`quantized_linear` (one ``nn.Linear`` → :class:`~sixbit.nn.QuantLinear`, rounded by
  :mod:`sixbit.rounding`);
- :mod:`.swap`: :func:`build`, the loop over a model's parts that every conversion runs (in
  memory, streamed from files by :mod:`sixbit.streaming`, static W8A8 by
  :mod:`sixbit.methods.static_w8a8`), with :class:`LayerSwap` as its rollback;
- :mod:`.in_memory`: :func:`quantize` (``sixbit.quantize``), with or without calibration;
- :mod:`.spill`: :func:`spilling`, inside which the replaced full-precision layers wait on disk
  for a rollback instead of in memory;
- :mod:`.block_inputs`: :func:`keeping`, the first block's inputs kept from one calibration run,
  which calibrated builds (in memory and streamed) replay block by block;
- :mod:`.sharded`: :class:`ShardedModel`, a model on the meta device whose blocks are read from
  its safetensors shards when they compute (the streamed conversion and tuning run on it);
- :mod:`.devices`: :func:`conversion_device`, where a conversion computes (CUDA where there is one),
  and :func:`moved_to`, which takes a model there and back.
"""

from .block_inputs import BlockInputs, default_budget, keeping
from .devices import conversion_device, moved_to
from .in_memory import quantize, quantize_layers
from .layers import branch_rank, check_plan, format_fits, plan_layers, quantized_linear, selected_layers, stored_bits
from .sharded import ShardedModel, materialize, release
from .spill import spilling
from .swap import OUTSIDE, LayerSwap, Part, Recipe, build, parts_of

__all__ = ["OUTSIDE", "BlockInputs", "LayerSwap", "Part", "Recipe", "ShardedModel", "branch_rank", "build", "check_plan", "conversion_device",
           "default_budget", "format_fits", "keeping", "materialize", "moved_to", "parts_of", "plan_layers", "quantize",
           "quantize_layers", "quantized_linear", "release", "selected_layers", "spilling", "stored_bits"]
