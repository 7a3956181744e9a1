"""Operands a :class:`~sixbit.nn.QuantLinear` may keep beside its stored weight, built once
instead of on every call: a weight converted to another format (``cache_converted=True``), the
INT8 GEMM operand packed for oneDNN's AMX kernel (:func:`pack_int8`, optionally folded), an
NVFP4 weight's values unpacked (:func:`unpack_nvfp4`) and the dense weight of a full-precision
call (:func:`keep_dense`). Each costs memory, counted by
:func:`converted_nbytes` and ``sixbit.summary``; moving the layer or cutting its rows drops them
(``QuantLinear.drop_converted``). Checkpoints never hold them.
"""

from __future__ import annotations

import torch

from .. import formats, kernels
from ..formats import Quantized, nvfp4
from . import execution, weight_views


def converted_nbytes(layer) -> int:
    """Bytes of weight copies converted for another activation mode and kept
    (``cache_converted=True``) or packed for the AMX INT8 kernel (:func:`pack_int8`); 0 otherwise."""
    packed = 0 if layer._packed is None else layer.out_features * (layer.in_features + 4)
    unpacked = 0 if layer._unpacked is None else layer._unpacked.numel()
    dense = 0 if layer._dense is None else layer._dense.numel() * layer._dense.element_size()
    return sum(q.nbytes for q in layer._converted.values()) + packed + unpacked + dense


def pack_int8(layer, fold: bool = False) -> None:
    """Keep the INT8 GEMM operand packed once for oneDNN's AMX INT8 kernel
    (:func:`sixbit.kernels.amx_int8`): N·K bytes and a scale per row, counted by
    :func:`converted_nbytes`; CPU calls then multiply through it, bit-identical up to the
    order of the two fp32 scale multiplies. It replaces a kept INT8 copy; moving the layer or
    cutting its rows drops it.

    ``fold``: for a layer that rotates its input or has a low-rank branch, pack instead the
    per-channel INT8 rounding of the whole function it computes, ``(W_q + U·D)·H`` (the
    stored weight plus its branch, rotated back: ``H·H = I``), so that an INT8 call is the
    plain one — the input quantized per token as it comes, one GEMM, no rotation, no branch.
    Not bit-identical: the activations are quantized unrotated, and the INT8 rounding is of
    that sum rather than of the stored weight (a layer with an input divisor or a static
    quantizer is packed unfolded)."""
    fold = (fold and layer.input_divisor is None and not execution.is_static(layer)
            and (layer.hadamard_block is not None or layer.lowrank_up is not None))
    if fold:
        codes, scale = weight_views.folded_int8(layer.quantized_weight(), layer.out_features, layer.in_features,
                                                layer.lowrank_up, layer.lowrank_down, layer.hadamard_block)
    else:
        codes, scale = int8_weight(layer)
    layer._packed, layer._folded = (kernels.pack_int8_weight(codes), scale.float().clone()), fold
    layer._converted.pop("int8", None)


def unpack_nvfp4(layer) -> bool:
    """Keep an NVFP4 weight's E2M1 values unpacked, one int8 per weight (twice each value: the
    integers −12…12, exact), for a layer that dequantizes its weight on every call (weight-only
    layers: modulation): the dequantization is then a multiply instead of a table lookup per
    nibble, bit-identical (:func:`sixbit.kernels.nvfp4_unpacked_dequantize`). N·K bytes,
    counted by :func:`converted_nbytes`; moving the layer or cutting its rows drops them.
    Returns whether the weight is NVFP4 (else nothing is kept)."""
    stored = layer.quantized_weight()
    if not isinstance(stored, nvfp4.NVFP4Quantized) or stored.codes.dim() != 2:
        return False
    layer._unpacked = (stored.element_values() * 2).to(torch.int8)
    return True


def keep_dense(layer, dtype: torch.dtype | None) -> None:
    """Keep the dense weight, in ``dtype``, of the whole function a full-precision call computes
    (:func:`sixbit.nn.weight_views.folded_dense`: the stored weight plus its branch, divided by
    the input divisor, rotated back), so that such a call is one plain GEMM: no dequantization,
    rotation or branch per call; ``None`` drops it. For passes over many calls that need the
    quantized weight's values but not its low-bit arithmetic (a conversion's replay of a
    quantized block): 16 bits per weight for a 16-bit ``dtype``, counted by
    :func:`converted_nbytes`. Not bit-identical to :attr:`~sixbit.kernels.paths.Path.FP`: one
    rounding of the folded weight to ``dtype`` instead of the rounding of each part."""
    layer._dense = None if dtype is None else weight_views.folded_dense(
        layer.quantized_weight(), layer.out_features, layer.in_features, layer.lowrank_up, layer.lowrank_down,
        layer.input_divisor, layer.hadamard_block, dtype)


def weight_as(layer, name: str) -> Quantized:
    """The weight in format ``name`` (the stored one, or a kept conversion, or a fresh one)."""
    stored = layer.quantized_weight()
    if name == layer.weight_format:
        return stored
    cached = layer._converted.get(name)
    if cached is None:
        cached = formats.get(name).quantize(stored.dequantize())
        if layer.cache_converted:
            layer._converted[name] = cached
    return cached


def int8_weight(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """The INT8 GEMM operand: per-channel codes ``(N, K)`` int8 and scales ``(N,)`` fp32.

    Integer weights of ≤ 8 bits per channel already are such codes (no re-rounding). Other
    formats are re-rounded to INT8 per output channel, a block of rows at a time so no fp32
    temporary is larger than ~1 MiB; the result is identical to converting the whole
    weight at once (each row's scale depends only on that row).
    """
    stored = layer.quantized_weight()
    if weight_views.fits_int8_gemm(stored):
        return stored.values(), stored.scale.reshape(-1)
    cached = layer._converted.get("int8")
    if cached is None:
        codes, scale = weight_views.int8_operand(stored, layer.out_features, layer.in_features)
        if not layer.cache_converted:
            return codes, scale
        cached = layer._converted["int8"] = weight_views.int8_container(codes, scale)
    return cached.values(), cached.scale.reshape(-1)
