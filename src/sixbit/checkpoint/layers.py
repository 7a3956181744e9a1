"""The quantized layers of a checkpoint: their header entries and the ``QuantLinear`` rebuilt from them.

Each quantized layer has an entry in the header's ``"layers"`` (:data:`LAYER_FIELDS`, and the
optional :data:`OPTIONAL_LAYER_FIELDS`) and its packed tensors under ``"<layer>.weight_<part>"``.
``"kind"`` says what the layer replaces: absent (every file written before pointwise convs were
quantized, and every linear since) for an ``nn.Linear``, ``"pointwise_conv2d"`` etc. for a
pointwise conv (:data:`sixbit.nn.pointwise_conv.KINDS`), rebuilt as a
:class:`~sixbit.nn.QuantPointwiseConv`, and ``"unfolded_conv2d"`` etc. for a conv with a wider
kernel, rebuilt as a :class:`~sixbit.nn.QuantUnfoldedConv` from the entry's ``"kernel_size"``
and ``"padding"`` (written for those only); ``in_features`` is then the input channels × kernel
taps. The packed tensors are the same for every kind.
:func:`build_layers` rebuilds every layer of a file, checked against the layers of the model
it replaces and against the packed layout its format implies (:func:`expected_layout`), before
the model changes.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn

from .. import formats
from ..nn import QuantLinear
from ..nn.pointwise_conv import KINDS, conv_arguments, features, is_quantizable, kind_of, quantized_layer_class
from ..nn.precision import act_mode

# every field of a layer entry and the JSON types it may take
LAYER_FIELDS = {
    "in_features": int, "out_features": int, "weight_format": str, "hadamard_block": int | None,
    "bias": bool, "source_dtype": str, "weight_meta": dict, "input_divisor": bool, "lowrank_rank": int,
    "lowrank_dtype": str | None, "weight_only": bool,
}
# fields a layer entry may hold or lack, and their types: "kind" is written for convs only, so a file
# of linears stays readable by a sixbit that predates it; an unfolded conv's geometry with its kind;
# "act_mode", the layer's own activation precision, is absent from files before issue 48, which
# loaded every layer as "fp" (so an absent one still does)
OPTIONAL_LAYER_FIELDS = {"kind": str, "kernel_size": list[int], "padding": list[int], "act_mode": str}
_GEOMETRY = ("kernel_size", "padding")


def _geometry(name: str, cfg: dict) -> dict[str, tuple[int, ...]]:
    """The entry's unfolded-conv geometry, as :func:`quantized_layer_class` takes it (``{}``
    for other kinds); present exactly when the kind is an ``unfolded_conv*``."""
    geometry = {key: tuple(cfg[key]) for key in _GEOMETRY if key in cfg}
    kind = cfg.get("kind", "linear")
    if kind.startswith("unfolded_conv") and len(geometry) != len(_GEOMETRY):
        raise ValueError(f"layer {name!r}: an {kind} entry needs kernel_size and padding")
    if geometry and not kind.startswith("unfolded_conv"):
        raise ValueError(f"layer {name!r}: kernel_size and padding belong to unfolded convs, not to a {kind}")
    return geometry


def build_layer(name: str, cfg: dict, tensors: dict[str, torch.Tensor]) -> QuantLinear:
    fmt = formats.get(cfg["weight_format"])
    if cfg.get("kind", "linear") not in KINDS:
        raise ValueError(f"layer {name!r}: unknown kind {cfg['kind']!r}; this sixbit knows {sorted(KINDS)}")
    if min(cfg["in_features"], cfg["out_features"]) < 1:
        raise ValueError(f"layer {name!r}: in_features and out_features must be ≥ 1")
    layout, meta = expected_layout(fmt.name, cfg["out_features"], cfg["in_features"])
    if cfg["weight_meta"] != meta:
        raise ValueError(f"layer {name!r}: weight_meta {str(cfg['weight_meta'])[:100]} is not {fmt.name}'s {meta}")
    prefix = f"{name}.weight_" if name else "weight_"
    parts = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    weight = fmt.container.from_parts(parts, cfg["weight_meta"])
    bias = tensors.get(f"{name}.bias" if name else "bias") if cfg["bias"] else None
    source_dtype = getattr(torch, str(cfg["source_dtype"]), None)
    if not isinstance(source_dtype, torch.dtype):
        raise ValueError(f"layer {name!r}: unknown source_dtype {cfg['source_dtype']!r}")
    divisor = None
    if cfg.get("input_divisor"):
        divisor = tensors.get(f"{name}.input_divisor")
        if divisor is None:
            raise ValueError(f"layer {name!r}: tensor 'input_divisor' is missing")
    lowrank = None
    rank = cfg.get("lowrank_rank", 0)
    if rank:
        lowrank = tuple(tensors.get(f"{name}.lowrank_{part}") for part in ("up", "down"))
        expected = ((cfg["out_features"], rank), (rank, cfg["in_features"]))
        dtype = getattr(torch, str(cfg.get("lowrank_dtype")), None)
        if any(t is None or tuple(t.shape) != e or t.dtype != dtype for t, e in zip(lowrank, expected)):
            raise ValueError(f"layer {name!r}: the rank-{rank} low-rank branch tensors are missing or malformed")
    layer = quantized_layer_class(cfg.get("kind", "linear"))(
        weight, fmt.name, bias, cfg["hadamard_block"], act_mode(cfg.get("act_mode", "fp")), source_dtype=source_dtype,
        input_divisor=divisor, lowrank=lowrank, weight_only=bool(cfg.get("weight_only", False)), **_geometry(name, cfg))
    if (layer.out_features, layer.in_features) != (cfg["out_features"], cfg["in_features"]):
        raise ValueError(f"layer {name!r}: packed weight does not match its declared shape")
    for field, ref in layout.items():
        got = parts.get(field)
        if got is None or (tuple(got.shape), got.dtype) != ref:
            raise ValueError(
                f"layer {name!r}: tensor 'weight_{field}' is "
                f"{None if got is None else (tuple(got.shape), got.dtype)}, expected {ref}"
            )
    return layer


@functools.lru_cache(maxsize=None)
def expected_layout(fmt_name: str, out_features: int, in_features: int) -> tuple[dict, dict]:
    """(shape, dtype) of each packed tensor of an ``out × in`` weight, and its format's meta
    (bits, granularity, shape...).

    From zero weights of 1, 2 and 3 rows: every format packs row by row, so each dimension
    grows linearly with the rows and the full shape follows. (Quantizing a full-size zero
    weight would cost several times the layer's fp32 size in temporaries: gigabytes for a
    14B model's feed-forward layers, at load, where memory should be the checkpoint's.)"""
    fmt = formats.get(fmt_name)
    one = fmt.quantize(torch.zeros(1, in_features))
    meta = {**one.meta(), "shape": [out_features, in_features]} if "shape" in one.meta() else one.meta()
    rows = [{k: (tuple(v.shape), v.dtype) for k, v in fmt.quantize(torch.zeros(r, in_features)).tensors().items()}
            for r in (1, 2, 3)]
    layout = {}
    for key, (shape, dtype) in rows[0].items():
        step = [b - a for a, b in zip(shape, rows[1][key][0])]
        if [a + 2 * d for a, d in zip(shape, step)] != list(rows[2][key][0]):  # not row-linear: measure it
            full = fmt.quantize(torch.zeros(out_features, in_features)).tensors()
            return {k: (tuple(v.shape), v.dtype) for k, v in full.items()}, meta
        layout[key] = (tuple(a + (out_features - 1) * d for a, d in zip(shape, step)), dtype)
    return layout, meta


def build_layers(path: Path, layers: dict, modules: dict[str, nn.Module], tensors) -> dict[str, QuantLinear]:
    """The file's quantized layers, built and checked against the model's layers they replace."""
    new_layers = {}
    for name, cfg in layers.items():
        if not name:
            raise ValueError("a bare QuantLinear cannot be loaded in place: wrap it in a module")
        old = modules.get(name)
        kind = cfg.get("kind", "linear")
        replaceable = is_quantizable(old) or isinstance(old, QuantLinear)
        if not replaceable or kind_of(old) != kind:
            found = "lacks" if old is None else f"has as a {type(old).__name__}"
            found += f" ({kind_of(old)})" if replaceable else ""
            raise ValueError(f"{str(path)!r} quantizes layer {name!r} ({kind}), which this model {found}: "
                             "was it saved from another model?")
        if features(old) != (cfg["in_features"], cfg["out_features"]):
            raise ValueError(
                f"layer {name!r} is {cfg['in_features']}→{cfg['out_features']} in {str(path)!r} but "
                f"{features(old)[0]}→{features(old)[1]} in the model: was it saved from another model config?"
            )
        geometry = {key: tuple(cfg[key]) for key in _GEOMETRY if key in cfg}
        if len(geometry) == len(_GEOMETRY) and conv_arguments(old) and geometry != conv_arguments(old):
            raise ValueError(f"layer {name!r} has kernel {geometry.get('kernel_size')} and padding "
                             f"{geometry.get('padding')} in {str(path)!r} but {conv_arguments(old).get('kernel_size')} and "
                             f"{conv_arguments(old).get('padding')} in the model: was it saved from another model config?")
        try:
            new_layers[name] = build_layer(name, cfg, tensors)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{str(path)!r} has an invalid entry for layer {name!r}: {e}") from None
    return new_layers


__all__ = ["LAYER_FIELDS", "OPTIONAL_LAYER_FIELDS", "build_layer", "build_layers", "expected_layout"]
