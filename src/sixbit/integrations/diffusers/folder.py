"""Converted models as diffusers folders: ``save_pretrained`` and the streamed conversion write
one, ``from_pretrained`` (:mod:`.quantizer`) and ``sixbit info`` read it back.

A folder holds what :func:`sixbit.save` writes to one file, in diffusers' layout:

- ``diffusion_pytorch_model.safetensors``, or shards ``diffusion_pytorch_model-00001-of-0000N.safetensors``
  with ``diffusion_pytorch_model.safetensors.index.json``: the same tensors under the same
  names (packed ``QuantLinear`` buffers, ``"<extension>::<key>"`` for the runtime methods' state);
- ``config.json``: the model's diffusers config plus ``quantization_config``
  (:class:`~.config.SixbitConfig`): ``quant_method: "sixbit"``, the sixbit version, the
  conversion config, the checkpoint header (layers, runtime methods, sha256 over every tensor
  and the header) and the table of tensor dtypes and shapes.

Both writers go through one :class:`FolderWriter` behind :class:`~sixbit.checkpoint.CheckpointWriter`
(so the header and its checksum are the single-file checkpoint's, byte for byte): a converted
model's ``save_pretrained`` (:func:`save_folder`) adds the whole model, and
:func:`sixbit.convert_pretrained` one block after another (:func:`checkpoint_writer`). Every file
is written atomically, the shards first and ``config.json`` last; the checksum refuses a folder
whose shards and config do not belong together.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import torch
from torch import nn

from ...checkpoint import CheckpointWriter, warn_loras_not_stored
from ...methods.record import NAME as CONVERSION
from ...files.atomic import copy_file_atomic, missing_folders, write_text_atomic
from ...files.safetensors import SafetensorsWriter
from ...memory import resident_weights
from ...runtime.wrapped import wrapper_of
from .config import SixbitConfig

WEIGHTS_NAME = "diffusion_pytorch_model"
_SHARD = re.compile(r"-\d{5}-of-\d{5}$")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _size(text: int | str) -> int:
    """Bytes of diffusers' ``max_shard_size`` (``"10GB"``, ``"500MB"`` or an int), refused unless
    positive (0 or less wrote one shard per tensor)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)\s*", str(text), re.IGNORECASE)
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    elif isinstance(text, str) and match:
        unit = match.group(2).upper()
        scale = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
        size = int(float(match.group(1)) * scale)
    else:
        raise ValueError(f"max_shard_size={text!r} is not a size: give a positive size, bytes or e.g. '10GB', '500MB'")
    if size <= 0:
        raise ValueError(f"max_shard_size={text!r} is {size} bytes: give a positive size, e.g. '10GB' or '500MB'")
    return size


def check_save_arguments(safe_serialization: bool = True, max_shard_size: int | str = "10GB",
                         push_to_hub: bool = False) -> None:
    """Refuse, before anything is written, what a converted folder cannot be saved with (its
    ``save_pretrained``, and a pipeline's ``save_pretrained`` before it writes any component:
    :mod:`sixbit.integrations.guards`)."""
    if push_to_hub:
        raise ValueError("save the folder first, then upload it: huggingface_hub.upload_folder(folder_path=..., "
                         "repo_id=...); sixbit does not push while saving")
    if not safe_serialization:
        raise ValueError("a sixbit folder is written as safetensors only (no pickle): drop safe_serialization=False")
    _size(max_shard_size)


class FolderWriter:
    """The weight files and ``config.json`` of a converted model folder, written tensor by tensor.

    It takes tensors as :class:`~sixbit.files.safetensors.SafetensorsWriter` does (``add``, ``entries``,
    ``chunks``), so a :class:`~sixbit.checkpoint.CheckpointWriter` writes through it. Shards fill
    in the order tensors arrive, up to ``limit`` bytes each (a larger tensor gets a shard of its
    own); each waits in a temporary file until :meth:`finish` knows how many there are and names
    them. A write that fails leaves no temporary file, and no folder it created.
    """

    def __init__(self, folder: str | os.PathLike, limit: int, variant: str | None = None):
        self.folder, self.limit = Path(folder), limit
        if self.folder.is_file():
            raise ValueError(f"{str(self.folder)!r} is a file: give the folder to write the model into")
        self.stem = WEIGHTS_NAME + (f".{variant}" if variant else "")
        self.made = missing_folders(self.folder)  # the folders this write creates, deepest first
        self.written: list[Path] = []  # the files it has put in place so far
        self.shards: list[SafetensorsWriter] = []
        self.sizes: list[int] = []
        self.home: dict[str, int] = {}  # tensor name → its shard
        self.done = False

    def __enter__(self) -> "FolderWriter":
        return self

    def __exit__(self, *exc) -> None:
        if not self.done:
            self.abort()

    def _new_shard(self) -> None:
        self.shards.append(SafetensorsWriter(self.folder / f"{self.stem}.safetensors"))  # named in finish
        self.sizes.append(0)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Append ``tensor`` under ``name`` (names are unique)."""
        if name in self.home:
            raise ValueError(f"tensor {name!r} was already written")
        nbytes = tensor.numel() * tensor.element_size()
        if not self.shards or (self.sizes[-1] and self.sizes[-1] + nbytes > self.limit):
            self._new_shard()
        self.shards[-1].add(name, tensor)
        self.home[name] = len(self.shards) - 1
        self.sizes[-1] += nbytes

    @property
    def entries(self) -> dict[str, tuple[torch.dtype, tuple[int, ...], int, int]]:
        return {name: self.shards[i].entries[name] for name, i in self.home.items()}

    def chunks(self, name: str):
        """The bytes of an already written tensor, read back in pieces."""
        return self.shards[self.home[name]].chunks(name)

    def finish(self, header: dict, model_config: dict) -> Path:
        """Name and write the shards, the index (several shards) and ``config.json`` (the
        diffusers ``model_config`` with the ``quantization_config`` of ``header``); weight files
        of an earlier save into the folder that this one did not write are removed."""
        if not self.shards:
            self._new_shard()
        count, entries = len(self.shards), self.entries
        names = ([f"{self.stem}.safetensors"] if count == 1 else
                 [f"{self.stem}-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)])
        for shard, file in zip(self.shards, names):
            self.written.append(shard.finish({"format": "pt"}, self.folder / file))
        index = self.folder / f"{self.stem}.safetensors.index.json"
        if count > 1:
            total = sum(end - start for _, _, start, end in entries.values())
            weight_map = {name: names[i] for name, i in sorted(self.home.items())}
            self.written.append(write_text_atomic(index, json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n"))
        _remove_stale(self.folder, self.stem, set(names), index if count == 1 else None)
        quant = SixbitConfig(config=header.get("extensions", {}).get(CONVERSION, {}).get("config"), checkpoint=header,
                             tensors={n: [dtype_name(d), list(shape)] for n, (d, shape, _, _) in sorted(entries.items())})
        config = {**model_config, "quantization_config": quant.to_dict()}
        write_text_atomic(self.folder / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
        self.done = True
        return self.folder

    def abort(self) -> None:
        """Discard the shards not yet written and the folders this write created, with the files
        it put there (a folder that was there before keeps what it holds)."""
        for shard in self.shards:
            shard.abort()
        for file in self.written if self.made else ():
            file.unlink(missing_ok=True)
        for path in self.made:
            with contextlib.suppress(OSError):  # not empty (or gone): left as it is
                path.rmdir()


class FolderCheckpointWriter(CheckpointWriter):
    """A :class:`~sixbit.checkpoint.CheckpointWriter` into the diffusers model folder ``folder``
    for ``model`` (its diffusers config; it may sit on the meta device).

    ``pipeline``: the pipeline folder ``model`` comes from; once the model folder is written, the
    pipeline's other components are copied beside it (:func:`copy_components`) and
    :meth:`finish` returns the pipeline folder written."""

    def __init__(self, folder: str | os.PathLike, model: nn.Module, max_shard_size: int | str = "10GB",
                 variant: str | None = None, pipeline: str | os.PathLike | None = None):
        limit = _size(max_shard_size)
        self.model_config = json.loads(model.to_json_string())
        self.pipeline = pipeline
        self.files = FolderWriter(folder, limit, variant)
        super().__init__(self.files, type(model).__name__)

    def finish(self, stored: dict[str, tuple[dict, dict[str, torch.Tensor]]]) -> Path:
        folder = self.files.finish(self.seal(stored), self.model_config)
        if self.pipeline is None:
            return folder
        copy_components(Path(self.pipeline), folder.parent, skip=folder.name)
        return folder.parent


def checkpoint_writer(output: str | os.PathLike, source: str | os.PathLike, model_folder: str | os.PathLike,
                      model: nn.Module, max_shard_size: int | str = "10GB") -> CheckpointWriter:
    """The writer of a conversion of ``model``, read from ``model_folder`` in ``source`` (a model
    folder, or the pipeline folder that holds it), into ``output``.

    ``output`` ending in ``.safetensors``: the single-file checkpoint (:func:`sixbit.save`'s).
    Any other path is a folder, refused where it is ``source`` or inside it: a diffusers model
    folder for a model folder, or for a pipeline a pipeline folder (the converted transformer in
    its subfolder, the other components copied). An existing folder is written into."""
    if Path(output).suffix == ".safetensors":
        return CheckpointWriter(output, type(model).__name__)
    source, model_folder = Path(source), Path(model_folder)
    check_apart(source, output)
    if model_folder.resolve() == source.resolve():
        return FolderCheckpointWriter(output, model, max_shard_size)
    return FolderCheckpointWriter(Path(output) / model_folder.name, model, max_shard_size, pipeline=source)


def check_apart(source: str | os.PathLike, output: str | os.PathLike) -> None:
    """Refuse an ``output`` folder that is the model folder ``source`` or lies inside it."""
    src, out = Path(source).resolve(), Path(output).resolve()
    if out == src or src in out.parents:
        where = "is the model folder" if out == src else "lies inside the model folder"
        raise ValueError(f"the output {str(output)!r} {where} {str(source)!r}: writing there would overwrite or mix "
                         "with the weights being converted; choose a folder outside it")


def copy_components(pipeline: Path, target: Path, skip: str) -> None:
    """Copy the pipeline folder's files and folders, but ``skip`` (the converted component) and
    hidden ones, into ``target``, each file atomically and ``model_index.json`` last: the copy
    is a pipeline only once it is complete. Symlinks (a Hub cache's) are copied as files."""
    entries = sorted((p for p in pipeline.iterdir() if p.name != skip and not p.name.startswith(".")),
                     key=lambda p: (p.name == "model_index.json", p.name))
    for entry in entries:
        if not entry.is_dir():
            copy_file_atomic(entry, target / entry.name)
            continue
        for root, dirs, files in os.walk(entry, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            here = target / Path(root).relative_to(pipeline)
            here.mkdir(parents=True, exist_ok=True)
            for name in sorted(f for f in files if not f.startswith(".")):
                copy_file_atomic(Path(root) / name, here / name)


def check_pipeline_save(arguments: dict) -> None:
    """Refuse the arguments of a pipeline's ``save_pretrained`` (by name, as bound to diffusers'
    signature) that it would pass on to a converted transformer refusing them: checked before the
    pipeline writes any component (:mod:`sixbit.integrations.guards`). A pipeline pushes to the
    Hub itself once the folder is written, so ``push_to_hub`` is its own."""
    size = arguments.get("max_shard_size")
    check_save_arguments(arguments.get("safe_serialization", True), "10GB" if size is None else size)


def save_folder(model: nn.Module, save_directory: str | os.PathLike, *, is_main_process: bool = True,
                safe_serialization: bool = True, variant: str | None = None, max_shard_size: int | str = "10GB",
                push_to_hub: bool = False, **kwargs) -> Path:
    """Write the converted transformer ``model`` as a diffusers model folder (``save_pretrained``)."""
    check_save_arguments(safe_serialization, max_shard_size, push_to_hub)  # before the model is gathered
    if kwargs:
        raise TypeError(f"save_pretrained got unexpected arguments {sorted(kwargs)}")
    folder = Path(save_directory)
    if folder.is_file():
        raise ValueError(f"{str(folder)!r} is a file: give the folder to write the model into")
    warn_loras_not_stored(model, folder, "from_pretrained")
    wrapper = wrapper_of(model)
    with resident_weights(model), (wrapper.writing() if wrapper else contextlib.nullcontext(True)) as writes:
        if not (writes and is_main_process):
            return folder
        with FolderCheckpointWriter(folder, model, max_shard_size, variant) as writer:
            return writer.write(model)


def _remove_stale(folder: Path, stem: str, written: set[str], old_index: Path | None) -> None:
    """Remove weight files of an earlier save into ``folder`` that this one did not write."""
    for path in folder.glob(f"{stem}*.safetensors"):
        base = path.name.removesuffix(".safetensors")
        if path.name not in written and (base == stem or (_SHARD.search(base) and base[:-15] == stem)):
            path.unlink()
    if old_index is not None and old_index.exists():
        old_index.unlink()
