"""Converted models as diffusers folders: ``save_pretrained`` writes one, ``from_pretrained``
(:mod:`.quantizer`) reads it back.

A folder holds what :func:`sixbit.save` writes to one file, in diffusers' layout:

- ``diffusion_pytorch_model.safetensors``, or shards ``diffusion_pytorch_model-00001-of-0000N.safetensors``
  with ``diffusion_pytorch_model.safetensors.index.json``: the same tensors under the same
  names (packed ``QuantLinear`` buffers, ``"<extension>::<key>"`` for the runtime methods' state);
- ``config.json``: the model's diffusers config plus ``quantization_config``
  (:class:`~.config.SixbitConfig`): ``quant_method: "sixbit"``, the sixbit version, the
  conversion config, the checkpoint header (layers, runtime methods, sha256 over every tensor
  and the header) and the table of tensor dtypes and shapes.

Every file is written atomically, the shards first and ``config.json`` last; the checksum
refuses a folder whose shards and config do not belong together.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import torch
from torch import nn

from ...checkpoint import contents
from ...conversion import conversion_of
from ...io import SafetensorsWriter, write_text_atomic
from ...memory import resident_weights
from ...parallel.wrapped import wrapper_of
from .config import SixbitConfig

WEIGHTS_NAME = "diffusion_pytorch_model"
_SHARD = re.compile(r"-\d{5}-of-\d{5}$")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _size(text: int | str) -> int:
    """Bytes of diffusers' ``max_shard_size`` (``"10GB"``, ``"500MB"`` or an int)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"max_shard_size={text!r} is not a size: give bytes or e.g. '10GB', '500MB'")
    unit = match.group(2).upper()
    scale = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    return int(float(match.group(1)) * scale)


def _shards(tensors: dict[str, torch.Tensor], limit: int) -> list[list[str]]:
    """Tensor names per shard, in name order, each shard at most ``limit`` bytes (or one tensor)."""
    shards, size = [[]], 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def save_folder(model: nn.Module, save_directory: str | os.PathLike, *, is_main_process: bool = True,
                safe_serialization: bool = True, variant: str | None = None, max_shard_size: int | str = "10GB",
                push_to_hub: bool = False, **kwargs) -> Path:
    """Write the converted transformer ``model`` as a diffusers model folder (``save_pretrained``)."""
    if push_to_hub:
        raise ValueError("save the folder first, then upload it: huggingface_hub.upload_folder(folder_path=..., "
                         "repo_id=...); sixbit does not push while saving")
    if not safe_serialization:
        raise ValueError("a sixbit folder is written as safetensors only (no pickle): drop safe_serialization=False")
    if kwargs:
        raise TypeError(f"save_pretrained got unexpected arguments {sorted(kwargs)}")
    folder = Path(save_directory)
    if folder.is_file():
        raise ValueError(f"{str(folder)!r} is a file: give the folder to write the model into")
    limit = _size(max_shard_size)
    wrapper = wrapper_of(model)
    with resident_weights(model), (wrapper.writing() if wrapper else contextlib.nullcontext(True)) as writes:
        if not (writes and is_main_process):
            return folder
        header, tensors = contents(model)
        folder.mkdir(parents=True, exist_ok=True)
        stem = WEIGHTS_NAME + (f".{variant}" if variant else "")
        groups = _shards(tensors, limit)
        names = ([f"{stem}.safetensors"] if len(groups) == 1 else
                 [f"{stem}-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
        for file, group in zip(names, groups):
            with SafetensorsWriter(folder / file) as writer:
                for name in group:
                    writer.add(name, tensors[name])
                writer.finish({"format": "pt"})
        index = folder / f"{stem}.safetensors.index.json"
        if len(groups) > 1:
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            weight_map = {name: file for file, group in zip(names, groups) for name in group}
            write_text_atomic(index, json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                indent=2, sort_keys=True) + "\n")
        _remove_stale(folder, stem, set(names), index if len(groups) == 1 else None)
        conversion = conversion_of(model)
        quant = SixbitConfig(config=None if conversion is None else conversion.config.to_dict(), checkpoint=header,
                             tensors={n: [dtype_name(t.dtype), list(t.shape)] for n, t in sorted(tensors.items())})
        config = json.loads(model.to_json_string())
        config["quantization_config"] = quant.to_dict()
        write_text_atomic(folder / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder


def _remove_stale(folder: Path, stem: str, written: set[str], old_index: Path | None) -> None:
    """Remove weight files of an earlier save into ``folder`` that this one did not write."""
    for path in folder.glob(f"{stem}*.safetensors"):
        base = path.name.removesuffix(".safetensors")
        if path.name not in written and (base == stem or (_SHARD.search(base) and base[:-15] == stem)):
            path.unlink()
    if old_index is not None and old_index.exists():
        old_index.unlink()
