"""A converted diffusers folder read back outside diffusers' loading: its checkpoint header
(``sixbit info``) and its transformer (``sixbit generate --quantized FOLDER``).

A converted folder is a model folder whose ``config.json`` holds a sixbit
``quantization_config`` (:mod:`.folder`), or a pipeline folder whose ``transformer/`` is one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import diffusers
from torch import nn

from ...checkpoint import check_header
from ...files.safetensors import SafetensorsFolder
from ..guards import packed_names
from .config import QuantMethod


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
