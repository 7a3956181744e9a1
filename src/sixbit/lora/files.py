"""LoRA files and state dicts in diffusers / PEFT layout, read and checked (:mod:`sixbit.lora` loads them).

Keys are ``<module>.lora_A.weight`` (down, ``(r, in)``) and ``<module>.lora_B.weight`` (up,
``(out, r)``), optionally with an adapter name before ``.weight`` and a ``transformer.``,
``unet.`` or ``base_model.model.`` prefix; ``<module>.alpha`` entries give a module's alpha.
The scale of a module is ``alpha / r``, from those entries or PEFT's ``lora_adapter_metadata``
(``lora_alpha``, ``r``, ``alpha_pattern``, ``rank_pattern``), else 1.

Everything a hostile or damaged file can hold is refused here with a ``ValueError`` (a
``TypeError`` for a value of the wrong kind) that names the entry, before any layer changes:
keys that are not strings, values that are not dense tensors with data, factors that are not
real floating point, of the wrong rank or whose ranks disagree, a module given twice, NaN or
inf, values or scales past the 16-bit branch's range, metadata that is not a JSON object.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re

import torch

from ..files.safetensors import read_safetensors
from ..config.validate import show

_PREFIX = r"(?:(?:transformer|unet|base_model\.model)\.)?"
_KEY = re.compile(_PREFIX + r"(?P<module>.+?)\.lora_(?P<part>A|B)(?:\.[\w-]+)?\.weight")
_ALPHA = re.compile(_PREFIX + r"(?P<module>.+?)\.alpha")
FP16_MAX = torch.finfo(torch.float16).max  # the branches keep their factors in fp16


def read(lora) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, PEFT adapter metadata or {}) of a LoRA file or state dict."""
    if isinstance(lora, (str, os.PathLike)):
        metadata, tensors = read_safetensors(lora, "LoRA file")
        try:
            meta = json.loads(metadata.get("lora_adapter_metadata", "{}"))
        except json.JSONDecodeError:
            raise ValueError(f"{str(lora)!r} has a corrupted lora_adapter_metadata entry (not JSON)") from None
        return tensors, own_metadata(meta)
    if not isinstance(lora, dict):
        raise TypeError(f"a LoRA is a .safetensors file or a state dict of tensors, got {type(lora).__name__}")
    check_entries(lora)
    return dict(lora), {}


def check_entries(tensors: dict) -> None:
    """Refuse a state dict whose keys are not strings or whose values are not dense tensors with data."""
    for key, t in tensors.items():
        if not isinstance(key, str):
            raise TypeError(f"a LoRA state dict's keys are names (strings), got {show(key)}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"a LoRA state dict holds tensors, but {show(key)} is a {type(t).__name__}")
        if t.layout != torch.strided or t.device.type == "meta":
            where = "on the meta device (no data)" if t.device.type == "meta" else f"a {t.layout} tensor"
            raise ValueError(f"LoRA entry {show(key)} is {where}: give dense tensors holding the weights")


def own_metadata(meta, prefix: str | None = "transformer") -> dict:
    """The transformer's PEFT config: a pipeline's LoRA file prefixes each key with its component
    (``transformer.lora_alpha``), as diffusers' ``save_lora_weights`` writes it."""
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise ValueError(f"the LoRA's adapter metadata must be a JSON object, got {show(meta)}")
    if prefix and any(k.startswith(f"{prefix}.") for k in meta):
        meta = {k.removeprefix(f"{prefix}."): v for k, v in meta.items() if k.startswith(f"{prefix}.")}
    for key in ("alpha_pattern", "rank_pattern"):
        if not isinstance(meta.get(key, {}), dict):
            raise ValueError(f"the LoRA's adapter metadata {key} must be an object of module → number, "
                             f"got {show(meta[key])}")
    return meta


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _alpha(key: str, t: torch.Tensor) -> float:
    if t.numel() != 1 or t.dtype == torch.bool or t.dtype.is_complex:
        raise ValueError(f"LoRA entry {show(key)} must hold one real number (the module's alpha), "
                         f"got {t.numel()} {t.dtype} value(s)")
    return float(t.reshape(()).to(torch.float64))


def _split(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, float]]:
    """``({module: {"A": down, "B": up}}, {module: alpha})``; anything else is refused."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    alphas: dict[str, float] = {}
    unknown, twice = [], []
    for key, t in tensors.items():
        if m := _KEY.fullmatch(key):
            if m["part"] in parts.setdefault(m["module"], {}):
                twice.append(f"{m['module']}.lora_{m['part']}")
            parts[m["module"]][m["part"]] = t
        elif m := _ALPHA.fullmatch(key):
            if m["module"] in alphas:
                twice.append(f"{m['module']}.alpha")
            alphas[m["module"]] = _alpha(key, t)
        else:
            unknown.append(key)
    if unknown or not parts:
        raise ValueError(
            f"not a LoRA in diffusers / PEFT layout (<module>.lora_A.weight, <module>.lora_B.weight): "
            f"{'no such keys' if not parts else f'unexpected keys {show(unknown[:3], 200)}'}; convert other layouts (kohya "
            "lora_down/lora_up) with diffusers' pipe.lora_state_dict first"
        )
    if twice:
        raise ValueError(f"this LoRA gives {show(twice[:3], 200)} more than once (with and without a prefix, or under two "
                         "adapter names): keep one LoRA per file")
    half = [m for m, p in parts.items() if set(p) != {"A", "B"}]
    if half:
        raise ValueError(f"LoRA modules {show(half[:3], 200)} lack their lora_A or lora_B weight: is the file complete?")
    return parts, alphas


def _factor_shapes(module: str, down: torch.Tensor, up: torch.Tensor) -> None:
    for part, t in (("lora_A", down), ("lora_B", up)):
        if not t.is_floating_point():
            raise ValueError(f"LoRA {show(module)}.{part} is {t.dtype}: LoRA factors are real floating-point weights "
                             "(float32, float16, bfloat16, …); is it another kind of file?")
        if t.dim() != 2:
            raise ValueError(f"LoRA {show(module)}.{part} has shape {show(tuple(t.shape))}: a LoRA factor is a matrix "
                             "(lora_A: rank × in, lora_B: out × rank)")
    if down.shape[0] != up.shape[1]:
        raise ValueError(f"LoRA module {show(module)} has lora_A of rank {down.shape[0]} but lora_B of rank "
                         f"{up.shape[1]}: the two factors come from different LoRAs; is the file damaged?")


def pairs(tensors: dict[str, torch.Tensor], meta: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """``{module: (down, up, alpha/r)}`` of a LoRA state dict (see the module doc), checked."""
    parts, alphas = _split(tensors)
    out = {}
    for module, p in parts.items():
        down, up = p["A"], p["B"]
        _factor_shapes(module, down, up)
        rank = down.shape[0]
        alpha = alphas.get(module, meta.get("alpha_pattern", {}).get(module, meta.get("lora_alpha", rank)))
        rank_of = meta.get("rank_pattern", {}).get(module, meta.get("r", rank))
        if rank < 1 or not _number(rank_of) or not rank_of >= 1:
            raise ValueError(f"LoRA module {show(module)} has rank {rank} (r={show(rank_of)}): a LoRA needs rank ≥ 1; "
                             "is the file complete?")
        if not _number(alpha):
            raise ValueError(f"LoRA module {show(module)} has alpha {show(alpha)}: it must be a finite number")
        if abs(alpha / rank_of) > FP16_MAX:
            raise ValueError(f"LoRA module {show(module)} has alpha / r = {alpha / rank_of:.3g}, beyond the 16-bit "
                             "branch's range (65504): the file's alpha is damaged")
        out[module] = (down, up, float(alpha) / float(rank_of))
    return out


def factor_problems(name: str, down: torch.Tensor, up: torch.Tensor) -> list[str]:
    """What keeps a LoRA's factors from running as a 16-bit branch: NaN/inf, or fp16 overflow."""
    for part, t in (("lora_A", down), ("lora_B", up)):
        values = t.float() if t.element_size() == 1 else t  # FP8: no isfinite of its own
        if not torch.isfinite(values).all():
            return [f"{name}.{part} holds NaN or inf"]
        if values.numel() and values.abs().max() > FP16_MAX:
            return [f"{name}.{part} holds {values.abs().max().item():.3g}, beyond the 16-bit branch's range (65504)"]
    return []


__all__ = ["FP16_MAX", "check_entries", "factor_problems", "own_metadata", "pairs", "read"]
