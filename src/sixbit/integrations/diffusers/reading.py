"""Diffusers folders read outside diffusers' loading: a source model folder's transformer built on
the meta device and its shards checked against it (:func:`sixbit.convert_pretrained`), and a
converted folder's checkpoint header (``sixbit info``) and transformer (``sixbit generate
--quantized FOLDER``).

A converted folder is a model folder whose ``config.json`` holds a sixbit
``quantization_config`` (:mod:`.folder`), or a pipeline folder whose ``transformer/`` is one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import accelerate
import diffusers
from torch import nn

from ...checkpoint import check_header
from ...files.safetensors import SafetensorsFolder
from ..guards import packed_names
from .config import QuantMethod


def model_folder(path: str | os.PathLike) -> Path:
    """The transformer's folder in ``path``: a diffusers model folder (``config.json`` and
    safetensors weights) or a pipeline folder with a ``transformer/`` subfolder."""
    path = Path(path)
    for folder in (path / "transformer", path):
        if (folder / "config.json").is_file():
            return folder
    raise ValueError(
        f"{str(path)!r} is neither a diffusers model folder (config.json + *.safetensors) nor a pipeline "
        "folder with a transformer/ subfolder: write one with save_pretrained"
    )


def empty_model(path: str | os.PathLike) -> nn.Module:
    """The transformer of ``path`` (see :func:`model_folder`) built on the meta device from its
    ``config.json``: no weights are read or allocated (buffers computed at construction, such as
    positional tables, are real)."""
    folder = model_folder(path)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{str(folder / 'config.json')!r} is not valid JSON: {e}") from None
    name = config.get("_class_name")
    cls = getattr(diffusers, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module) and hasattr(cls, "from_config")):
        raise ValueError(f"{str(folder / 'config.json')!r} names class {name!r}, which is not a diffusers model class")
    with accelerate.init_empty_weights():
        return cls.from_config(config)


def check_layout(folder: Path, model: nn.Module, shards: SafetensorsFolder) -> list[str]:
    """The state keys of ``model``, checked against the shards (names and shapes)."""
    state = model.state_dict()
    missing = sorted(set(state) - set(shards.layout))
    unexpected = sorted(set(shards.layout) - set(state))
    wrong = [f"{k}: file {shards.layout[k][0]} vs model {tuple(state[k].shape)}"
             for k in state if k in shards.layout and shards.layout[k][0] != tuple(state[k].shape)]
    peft = [k for k in unexpected if ".base_layer." in k or ".lora_A." in k]  # PEFT's wrapped names
    if peft:
        raise ValueError(f"the weights in {str(folder)!r} were saved with a PEFT LoRA loaded (e.g. {peft[0]!r}): "
                         "save the full-precision model again after fusing the LoRA into it (fuse_lora(), then "
                         "unload_lora()) or after removing it (unload_lora()), and convert that folder")
    if missing or unexpected or wrong:
        problems = [f"missing {k}" for k in missing[:5]] + [f"unexpected {k}" for k in unexpected[:5]] + wrong[:5]
        raise ValueError(f"the weights in {str(folder)!r} do not fit its config.json: {problems}")
    return list(state)


def converted_folder(path: str | os.PathLike) -> tuple[Path, dict]:
    """``(model folder, its quantization_config)`` of the converted folder ``path`` (a model
    folder, or a pipeline folder: its ``transformer/``), the header checked."""
    path = Path(path)
    folder = next((f for f in (path, path / "transformer") if (f / "config.json").is_file()), None)
    if folder is None:
        raise ValueError(f"{str(path)!r} is a folder without config.json or transformer/config.json: give a sixbit "
                         "checkpoint file or a folder written by `sixbit convert` (or a converted model's save_pretrained)")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{str(folder / 'config.json')!r} is not valid JSON: {e}") from None
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if not (isinstance(quant, dict) and quant.get("quant_method") == QuantMethod.SIXBIT.value and "checkpoint" in quant):
        packed = _packed_tensors(folder)
        if packed:
            raise ValueError(f"{str(folder)!r} holds a sixbit-converted model (packed weights such as {packed[0]!r}) "
                             "but its config.json has no sixbit quantization_config (removed or replaced): put back "
                             "the config.json that save_pretrained (or `sixbit convert`) wrote beside these weight "
                             "files, or convert the full-precision model again")
        raise ValueError(f"{str(folder)!r} holds no sixbit-converted model (its config.json has no quantization_config "
                         "with quant_method 'sixbit'): convert it with `sixbit convert`")
    check_header(quant["checkpoint"], str(folder / "config.json"))
    return folder, quant


def _packed_tensors(folder: Path) -> list[str]:
    """The names of ``folder``'s tensors that only a sixbit-converted model stores (none where
    its weight files cannot be read)."""
    try:
        return packed_names(SafetensorsFolder(folder).layout)
    except ValueError:
        return []


def read_folder_header(path: str | os.PathLike) -> tuple[dict, Path]:
    """``(header, model folder)`` of the converted folder ``path``: the checkpoint header its
    ``config.json`` carries, after checking that its weight files hold every tensor of the table
    with the shape it gives (their headers only are read; the checksum is verified on load)."""
    folder, quant = converted_folder(path)
    table = quant.get("tensors")
    if not isinstance(table, dict):
        raise ValueError(f"{str(folder / 'config.json')!r} has no tensor table in its quantization_config: save the model again")
    layout = SafetensorsFolder(folder).layout
    wrong = sorted(n for n, entry in table.items() if n not in layout or not isinstance(entry, list) or len(entry) != 2
                   or not isinstance(entry[1], list) or list(layout[n][0]) != entry[1])
    extra = sorted(set(layout) - set(table))
    if wrong or extra:
        raise ValueError(f"{str(folder)!r}: the weight files do not match config.json (e.g. {(wrong + extra)[:3]}): "
                         "they are from another save; copy or convert the whole folder again")
    return quant["checkpoint"], folder


def load_folder(path: str | os.PathLike, **kwargs) -> nn.Module:
    """The converted transformer of the folder ``path`` (see :func:`converted_folder`), restored
    by its diffusers class's ``from_pretrained(folder, **kwargs)``."""
    folder, quant = converted_folder(path)
    name = quant["checkpoint"]["model_class"]
    cls = getattr(diffusers, name, None)
    if not (isinstance(cls, type) and hasattr(cls, "from_pretrained")):
        raise ValueError(f"{str(folder)!r} holds a converted {name}, which is not a diffusers model class: "
                         "load it with its own class's from_pretrained")
    return cls.from_pretrained(folder, local_files_only=True, **kwargs)
