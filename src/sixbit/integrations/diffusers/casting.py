"""``.to(dtype)``, ``.half()`` and ``.float()`` on transformers loaded through the sixbit backend.

diffusers refuses these on every model loaded with a quantizer (it sets ``is_quantized``),
because most backends' packed weights cannot be cast. A sixbit layer keeps its stored form
through any cast (:class:`~sixbit.nn.QuantLinear` moves to the device and leaves its dtypes), so a
cast is well defined: the full-precision parameters take the dtype, the packed layers keep theirs
— what ``torch_dtype=`` does while loading a converted folder, and what a transformer converted
in memory by :func:`sixbit.convert_model` (which diffusers never flagged) does. The transformers
that ``from_pretrained`` makes with :class:`~.config.SixbitConfig` or from a converted folder get
the three methods back, so the three ways to a converted model behave alike. ``is_quantized``
stays ``True`` for everything else that reads it.

Example:
    >>> model = WanTransformer3DModel.from_pretrained(folder)   # a converted folder  # doctest: +SKIP
    >>> model.to("cuda", torch.bfloat16)                       # norms, embeddings → bf16  # doctest: +SKIP
"""

from __future__ import annotations

import types

from torch import nn


def _cast(name: str):
    def method(self, *args, **kwargs):
        flagged = self.__dict__.get("is_quantized")
        self.is_quantized = False  # the flag diffusers' refusal reads; sixbit layers keep their form
        try:
            return getattr(type(self), name)(self, *args, **kwargs)
        finally:
            self.is_quantized = flagged

    method.__name__ = name
    method.__doc__ = (f"``nn.Module.{name}`` through diffusers' ``ModelMixin.{name}``: full-precision parameters "
                      "cast, packed sixbit layers keep their stored dtypes "
                      "(see :mod:`sixbit.integrations.diffusers.casting`).")
    return method


_CASTS = {name: _cast(name) for name in ("to", "half", "float")}


def attach_casts(model: nn.Module) -> None:
    """Give ``model`` (loaded by the sixbit backend) ``to``, ``half`` and ``float`` that cast as a
    converted model casts, instead of diffusers' refusal for quantized models."""
    for name, fn in _CASTS.items():
        setattr(model, name, types.MethodType(fn, model))
