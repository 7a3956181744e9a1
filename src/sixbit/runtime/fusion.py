"""The activation after a quantized linear, applied in the linear's INT8 epilogue.

diffusers' feed-forward runs ``GELU(proj(x))`` as two passes over the (tokens, 4·hidden) output:
the linear writes it, the activation reads it and writes it again. At CogVideoX-2B size on a
CPU the activation alone took about as long as the INT8 GEMM before it (0.6 s of a 6 s call,
BENCHMARKS.md ``cpu-speed``). With
:func:`fuse_activations`, each diffusers ``GELU`` module whose ``proj`` is a :class:`QuantLinear`
calls ``proj(x, activation=…)`` instead: in INT8 mode the epilogue that scales the integer
accumulator applies the GELU in the same pass (fp32, before the one rounding to the output
dtype); in any other mode the layer applies ``F.gelu`` after itself, as the module would.

When the module sits in a diffusers ``FeedForward`` whose second linear is a :class:`QuantLinear`
that quantizes its input per token as it comes (:meth:`~sixbit.nn.QuantLinear.reads_token_codes`:
``w8a8``, and the folded 4-bit layers of :func:`sixbit.keep_int8_weights`), the first linear's
epilogue also makes those codes (``quantize_output``: each output row is quantized while it is
still in cache), and the second linear takes them instead of reading its whole input again.
Same results: the codes are of the output as rounded.

One caveat: a forward hook on such a ``proj`` sees the activated output.

Example:
    >>> fuse_activations(pipe.transformer)   # doctest: +SKIP
    30
"""

from __future__ import annotations

from diffusers.hooks import ModelHook
from diffusers.models.activations import GELU
from diffusers.models.attention import FeedForward
from torch import nn

from ..nn import QuantLinear
from . import hooks

HOOK_NAME = "sixbit_fused_activation"
_ACTIVATION = {"none": "gelu", "tanh": "gelu-tanh"}  # diffusers GELU.approximate → sixbit's names


class _FusedActivation(ModelHook):
    def __init__(self, consumer: QuantLinear | None):
        super().__init__()
        self.consumer = consumer  # the linear that takes this module's output next, if quantized

    def new_forward(self, module: GELU, hidden_states):
        return module.proj(hidden_states, activation=_ACTIVATION[module.approximate],
                           quantize_output=self.consumer is not None and self.consumer.reads_token_codes())


def _fusable(module: nn.Module) -> bool:
    return (type(module) is GELU and isinstance(module.proj, QuantLinear)
            and module.approximate in _ACTIVATION)


def _consumers(model: nn.Module) -> dict[int, QuantLinear]:
    """Each feed-forward's activation module (by id) → its second linear, where that is quantized
    and nothing but an inference-time identity (dropout) stands between them."""
    return {id(ff.net[0]): ff.net[2] for ff in model.modules()
            if isinstance(ff, FeedForward) and len(ff.net) >= 3 and isinstance(ff.net[1], (nn.Dropout, nn.Identity))
            and isinstance(ff.net[2], QuantLinear)}


def fuse_activations(model: nn.Module, enabled: bool = True) -> int:
    """Apply each diffusers ``GELU`` module's activation inside its quantized ``proj``
    (``enabled=False`` restores the two steps). Returns how many modules run fused."""
    count, consumers = 0, _consumers(model)
    for module in model.modules():
        if not _fusable(module):
            continue
        if enabled and hooks.get(module, HOOK_NAME) is None:
            hooks.register(module, _FusedActivation(consumers.get(id(module))), HOOK_NAME)
        elif not enabled:
            hooks.remove(module, HOOK_NAME)
        count += enabled
    return count
