"""Loading a checkpoint written by :func:`sixbit.save` into a model: :func:`load`."""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ..lora import check_no_loras
from ..memory.fast_path import check_choice
from ..memory.weights import check_not_offloaded
from ..models import transformer_of
from ..runtime.wrapped import check_not_wrapped
from .file import open_checkpoint
from .finishing import finish
from .restore import restore


def load(path: str | os.PathLike, model: nn.Module, *, layout: str | None = None) -> nn.Module:
    """Restore a checkpoint written by :func:`save` into ``model`` (same architecture).

    ``model`` may be freshly built in full precision: its ``nn.Linear`` layers (and convs)
    named in the file are replaced by ``QuantLinear`` (``QuantPointwiseConv``,
    ``QuantUnfoldedConv``). Every
    check runs before anything changes, so on any error (missing, truncated or corrupted file,
    unknown format version, another architecture) ``model`` is left untouched. The runtime
    methods' state stored in the file (:func:`extensions`: static W8A8's parameters, the
    conversion) is restored last; a file naming an extension this sixbit does not know is
    refused up front. Returns ``model``.

    ``model`` may be a pipeline (its ``.transformer`` is loaded; the pipeline is returned), and
    it may have been built on the meta device (``accelerate.init_empty_weights()``): its
    parameters are then materialized from the file on the CPU.

    ``layout`` (``"auto"``, ``"fast"``, ``"compact"``; default ``$SIXBIT_LAYOUT`` or ``"auto"``):
    what the model keeps resident to run fast on the device it runs on, decided at its first
    call there (:mod:`sixbit.memory.fast_path`): the file itself is device-neutral.

    Example:
        >>> sixbit.load("6bit_model.safetensors", pipe)   # doctest: +SKIP
    """
    target = model
    model = transformer_of(model)
    check_not_wrapped(model, "load the checkpoint into the model")
    check_no_loras(model, "sixbit.load")
    check_not_offloaded(model, "sixbit.load")
    layout = check_choice(layout)
    header, tensors = open_checkpoint(Path(path))
    restore(model, header, tensors, str(path))
    finish(model, target, layout)
    return target


__all__ = ["load"]
