"""Row shards of a :class:`~sixbit.nn.QuantLinear` (tensor parallelism): the tensors that hold one
slice per output row, cutting a layer to a row range, and joining shards back.

The packed formats' blocks and groups run along the input dimension, so any row range holds whole
ones; per-tensor fields (NVFP4's global scale) are shared by every shard. A layer with static
activation scales is not cut: its input quantizer holds weight variants of the whole layer.
"""

from __future__ import annotations

import torch
from torch import nn

from . import execution

LORA_PREFIX = "lora_"


def row_tensors(layer) -> dict[str, torch.Tensor]:
    """Every tensor of ``layer`` holding one slice per output row, by name: the weight's per-row
    fields (``weight_<field>``: codes, block or channel scales), ``bias``, ``lowrank_up`` and each
    LoRA's up factor (``lora_<name>_up``). Per-tensor fields are not among them."""
    stored = layer.quantized_weight()
    if layer.out_features < 2:
        raise ValueError("a layer with one output row has no row shards")
    one = stored.rows(0, 1).tensors()  # a field whose shape a row range changes is per-row
    out = {f"weight_{n}": t for n, t in stored.tensors().items() if one[n].shape != t.shape}
    if layer.bias is not None:
        out["bias"] = layer.bias
    if layer.lowrank_up is not None:
        out["lowrank_up"] = layer.lowrank_up
    if layer.lora_factors is not None:
        out.update({f"{LORA_PREFIX}{n}_up": up for n, up in layer.lora_factors.up_factors().items()})
    return out


def narrow_rows(layer, start: int, stop: int) -> None:
    """Keep output rows ``start:stop`` of ``layer`` only, in place; kept conversions are dropped."""
    if not 0 <= start < stop <= layer.out_features:
        raise ValueError(f"rows {start}:{stop} are not a range of this layer's {layer.out_features} rows")
    if execution.is_static(layer):
        raise ValueError("a layer with static activation scales (static W8A8) cannot be split by rows")
    try:
        part = layer.quantized_weight().rows(start, stop).tensors()
    except NotImplementedError as e:
        raise ValueError(f"this {layer.weight_format} weight cannot be split by rows: {e}") from None
    rows = {}
    for name, t in row_tensors(layer).items():
        field = name.removeprefix("weight_")
        rows[name] = (part[field] if name.startswith("weight_") else t[start:stop]).clone()
    set_rows(layer, rows, stop - start)


def set_rows(layer, tensors: dict[str, torch.Tensor], out_features: int) -> None:
    """Replace ``layer``'s per-row tensors (:func:`row_tensors`' names, all of them) by ones holding
    ``out_features`` rows: :func:`narrow_rows`' inverse when given every shard's rows in order."""
    if set(tensors) != set(row_tensors(layer)):
        raise ValueError(f"set_rows needs exactly {sorted(row_tensors(layer))}, got {sorted(tensors)}")
    for name, t in tensors.items():
        if name.startswith(LORA_PREFIX):
            layer.lora_factors.set_up(name.removeprefix(LORA_PREFIX).removesuffix("_up"), t)
        else:
            setattr(layer, name, nn.Parameter(t, requires_grad=False) if name == "bias" else t)
    layer.out_features = out_features
    if "shape" in layer._weight_meta:
        layer._weight_meta = {**layer._weight_meta, "shape": [out_features, layer.in_features]}
    layer.drop_converted()
