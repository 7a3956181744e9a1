"""What every converted or loaded model gets, whichever way it came in: one list.

:func:`sixbit.convert_model`, :func:`sixbit.load`, :func:`sixbit.load_pretrained`,
:func:`sixbit.convert_pretrained` and diffusers' ``from_pretrained`` (quantized while loading, or a
converted folder) all end in :func:`finish`:

1. ``.save(path)`` on the transformer and on its pipeline (:func:`sixbit.checkpoint.save`);
2. what integrations registered (:func:`register_save_method`): diffusers' ``save_pretrained``
   writing a converted folder, and diffusers' LoRA entry points routed to :mod:`sixbit.lora`
   (:mod:`sixbit.integrations.diffusers.lora`);
3. the layout hook that decides, at the first call on a device, what stays resident to run fast
   there (:mod:`sixbit.memory.fast_path`).
"""

from __future__ import annotations

import logging
import os
import types
from pathlib import Path

from torch import nn

from ..memory.fast_path import attach as attach_layout
from ..memory.fast_path import planned
from ..models import transformer_of
from .file import save

logger = logging.getLogger(__name__)

_SAVE_METHODS: list = []


def register_save_method(attach) -> None:
    """``attach(transformer)`` runs on every converted or loaded transformer, beside ``.save``: how
    :mod:`sixbit.integrations` gives it diffusers' ``save_pretrained`` (writing a converted folder)
    and diffusers' LoRA methods, without this package importing diffusers' side."""
    _SAVE_METHODS.append(attach)


def attach_save(obj) -> None:
    """Give a model (or its pipeline) ``.save(path)``: :func:`save` of the transformer; and the
    transformer the methods registered by integrations (:func:`register_save_method`)."""
    transformer = transformer_of(obj)

    def save_method(self, path: str | os.PathLike) -> Path:
        """Write the transformer (weights and the runtime methods' state) to ``path``."""
        return save(transformer, path)

    obj.save = types.MethodType(save_method, obj)
    for attach in _SAVE_METHODS:
        attach(transformer)


def finish(transformer: nn.Module, model=None, layout: str | None = None) -> None:
    """Give a converted ``transformer`` (and ``model``, its pipeline, when that is what the user
    holds) everything on the list above. ``layout``: ``"auto"``, ``"fast"`` or ``"compact"``
    (default ``$SIXBIT_LAYOUT`` or ``"auto"``)."""
    attach_save(transformer)
    attach_layout(transformer, layout)
    if planned(transformer) is not None:
        logger.info("%s (at its first call there)", planned(transformer).describe())
    if model is not None and model is not transformer:
        attach_save(model)


__all__ = ["attach_save", "finish", "register_save_method"]
