"""A streamed conversion's finished parts kept on disk, so that an interrupted conversion (a
crash, Ctrl-C, SIGTERM, SIGKILL, a full disk) resumes after its last finished block when it
runs again with the same arguments.

The progress folder ``<output>.sixbit-progress`` (beside the output) holds:

- ``part-NNNNN.safetensors``: each finished part (the layers outside the blocks, then each
  block), a sixbit checkpoint of that part alone (:class:`~sixbit.checkpoint.CheckpointWriter`:
  its tensors and its layers' header entries);
- ``inputs-NNNNN.safetensors``: for calibrated presets (GPTQ), the kept calls' inputs to block
  ``NNNNN``, the next one to convert (only the latest is kept);
- ``progress.json``: the conversion's arguments, the sha256 of every file above and the seconds
  each part took (and the calibration runs), rewritten atomically after each part, once that
  part's files are in place: a resumed conversion reports every part's time, the interrupted
  runs' included.

On a resume every recorded file is hashed again and used only if its bytes match: a finished
part is verified, not trusted, and one that does not match is converted again. Arguments that
differ from the interrupted run's are refused before anything changes. Once the output is
written the folder is removed. Every file here is written atomically, so a kill leaves either
the previous state or the new one (and temporary files a later write to the same path removes).

Why the kept inputs are saved rather than rebuilt: rebuilding them means running the
calibration generations again on the full-precision model and replaying every finished block,
which costs as much as the conversion up to that block; saving them costs one write of
``calls × tokens × width`` values per block (the memory the kept calls already take), a few
seconds against GPTQ's tens of seconds per block at real size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from torch import nn

from .file import CheckpointWriter, read_header
from ..files.atomic import CHUNK, write_text_atomic
from ..files.safetensors import read_safetensors, read_safetensors_header, save_safetensors_atomic
from ..version import __version__

logger = logging.getLogger(__name__)

VERSION = 1
_PROGRESS = "progress.json"


def progress_folder(output: str | os.PathLike) -> Path:
    """Where the conversion into ``output`` keeps its finished parts: ``<output>.sixbit-progress``."""
    output = Path(output)
    return output.with_name(output.name + ".sixbit-progress")


def file_sha256(path: Path) -> str:
    """sha256 of the file's bytes, read in pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def conversion_arguments(model_folder: Path, shard_files, config: dict, calibration, output, max_shard_size,
                         dtype, device) -> dict:
    """What a streamed conversion's checkpoint depends on, as the JSON object a resume compares:
    the model (its folder, ``config.json``'s sha256, each weight file's size and modification
    time: hashing 28 GB of shards would cost minutes), the conversion config, the calibration
    callable (its qualified name and a hash of its code and constants: values it reads from
    outside, such as a prompt list it closes over, are not seen), the output and its shard size,
    the dtype and device it computes in, and the sixbit and torch versions (kernels round
    differently across them)."""
    def stat(file: Path) -> list[int]:
        info = file.stat()
        return [info.st_size, info.st_mtime_ns]

    described = None
    if calibration is not None:
        code = getattr(calibration, "__code__", None)
        consts = [c for c in code.co_consts if isinstance(c, (str, bytes, int, float, bool, tuple, type(None)))] if code else []
        described = {"callable": f"{getattr(calibration, '__module__', '')}."
                                 f"{getattr(calibration, '__qualname__', type(calibration).__qualname__)}",
                     "code": hashlib.sha256(code.co_code + repr(consts).encode()).hexdigest() if code else None}
    return {
        "model": str(model_folder.resolve()),
        "model config.json sha256": file_sha256(model_folder / "config.json"),
        "model weight files": {f: stat(model_folder / f) for f in sorted(shard_files)},
        "config": config,
        "calibration": described,
        "output": str(Path(output).resolve()),
        "max_shard_size": max_shard_size,
        "torch_dtype": None if dtype is None else str(dtype),
        "device": str(device),
        "versions": {"sixbit": __version__, "torch": torch.__version__},
    }


def _differences(old, new, path: str = "") -> list[str]:
    """Each value that differs between the recorded arguments and these, named by its path
    (``config.weights.weight_format: "int8" then, "nvfp4" now``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for key in sorted(set(old) | set(new))
                for line in _differences(old.get(key), new.get(key), f"{path}.{key}" if path else key)]
    return [] if old == new else [f"{path}: {json.dumps(old)[:120]} then, {json.dumps(new)[:120]} now"]


class Progress:
    """The progress folder of one conversion (see the module doc).

    ``arguments``: a JSON object naming everything the checkpoint depends on (model files,
    config, calibration, output, dtype, device, versions). Building it reads the folder and
    refuses (a ``ValueError`` naming each difference and the fix) an interrupted run's whose
    arguments differ, changing nothing; with ``restart=True`` :meth:`start` discards it instead."""

    def __init__(self, folder: Path, arguments: dict, restart: bool):
        self.folder, self.arguments, self.restart = folder, json.loads(json.dumps(arguments)), restart
        self.parts: dict[str, dict] = {}
        self.inputs: dict | None = None  # {"index", "file", "sha256"} of the latest kept inputs
        self.calibration_seconds: float | None = None  # of the calibration runs the recorded blocks came from
        record = self._read()
        if record is not None and not restart:
            differ = _differences(record.get("arguments", {}), self.arguments)
            if differ:
                raise ValueError(
                    f"{str(folder)!r} holds an interrupted conversion into the same output with other arguments "
                    f"({'; '.join(differ[:4])}): run again with the interrupted run's arguments to resume it, or "
                    f"start over (restart=True, `sixbit convert --restart`), which discards its "
                    f"{len(record.get('parts', {}))} finished parts")
            self.parts, self.inputs = dict(record.get("parts", {})), record.get("inputs")
            self.calibration_seconds = record.get("calibration seconds")

    def _read(self) -> dict | None:
        path = self.folder / _PROGRESS
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            logger.warning("%s is unreadable (%s): the conversion starts over", path, e)
            return None
        if not isinstance(record, dict) or record.get("version") != VERSION:
            logger.warning("%s is not a progress record of this sixbit: the conversion starts over", path)
            return None
        return record

    def start(self) -> None:
        """Create the folder (emptied first with ``restart``) and record the arguments."""
        if self.restart and self.folder.exists():
            logger.info("restart: discarding %s", self.folder)
            shutil.rmtree(self.folder)
            self.parts, self.inputs, self.calibration_seconds = {}, None, None
        self.folder.mkdir(parents=True, exist_ok=True)
        self._save()

    def _save(self) -> None:
        record = {"version": VERSION, "arguments": self.arguments, "parts": self.parts, "inputs": self.inputs,
                  "calibration seconds": self.calibration_seconds}
        write_text_atomic(self.folder / _PROGRESS, json.dumps(record, indent=1) + "\n")

    def _matches(self, entry: dict | None) -> bool:
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            return False
        path = self.folder / entry["file"]
        return path.is_file() and file_sha256(path) == entry.get("sha256")

    def verified(self, names: list[str]) -> set[str]:
        """The parts of ``names`` recorded as finished whose files hash as recorded; the others
        are dropped from the record (they are converted again)."""
        good = {name for name in names if self._matches(self.parts.get(name))}
        bad = sorted(set(self.parts) - good)
        if bad:
            logger.warning("%d finished part(s) in %s do not match their recorded sha256 and are converted again: %s",
                           len(bad), self.folder, bad[:5])
        self.parts = {name: self.parts[name] for name in names if name in good}
        return good

    def part_seconds(self, exclude: set[str] = frozenset()) -> dict[str, float]:
        """``{part: seconds}`` of the finished parts recorded (after :meth:`verified`: those that
        verified), and ``"calibration runs"`` where the calibration that led to them is recorded;
        none named in ``exclude``."""
        seconds = {name: entry["seconds"] for name, entry in self.parts.items() if "seconds" in entry}
        if self.calibration_seconds is not None:
            seconds["calibration runs"] = self.calibration_seconds
        return {name: t for name, t in seconds.items() if name not in exclude}

    def calibrated(self, seconds: float) -> None:
        """Record that the calibration runs (of the parts from here on) took ``seconds``."""
        self.calibration_seconds = round(seconds, 3)
        self._save()

    def add_part(self, number: int, name: str, module: nn.Module, model_class: str, prefix: str = "",
                 keys=None, inputs: tuple[int, list] | None = None, started: float | None = None) -> float:
        """Write part ``name`` (``module``'s state under ``prefix``, only ``keys`` if given) and,
        for calibrated presets, ``inputs`` = ``(block index, kept calls)``: the next block's
        inputs; then record both, with the seconds since ``started`` (``time.perf_counter()`` when
        the part began: its writing included), which are returned."""
        file = f"part-{number:05d}.safetensors"
        with CheckpointWriter(self.folder / file, model_class) as writer:
            writer.add(module, prefix, keys)
            writer.finish({})
        try:
            new_inputs = self._write_inputs(*inputs) if inputs is not None else None
        except ValueError as e:  # a resume from here runs the calibration again
            logger.warning("%s", e)
            new_inputs = None
        old = self.inputs
        self.parts[name] = {"file": file, "sha256": file_sha256(self.folder / file)}
        seconds = 0.0 if started is None else time.perf_counter() - started
        if started is not None:
            self.parts[name]["seconds"] = round(seconds, 3)
        self.inputs = new_inputs
        self._save()
        if old is not None and (new_inputs is None or old["file"] != new_inputs["file"]):
            (self.folder / old["file"]).unlink(missing_ok=True)  # no longer recorded
        return seconds

    def _write_inputs(self, index: int, calls: list) -> dict:
        tensors: dict[str, torch.Tensor] = {}
        layout = [[_encode(list(args), tensors), _encode(kwargs, tensors)] for args, kwargs in calls]
        file = f"inputs-{index:05d}.safetensors"
        save_safetensors_atomic(tensors, self.folder / file, {"calls": json.dumps(layout)})
        return {"index": index, "file": file, "sha256": file_sha256(self.folder / file)}

    def kept_inputs(self, index: int, device: torch.device | None) -> list | None:
        """The kept calls saved for block ``index`` (on ``device``), or ``None`` where none are
        recorded for it or their file does not match its sha256."""
        if self.inputs is None or self.inputs.get("index") != index:
            return None
        if not self._matches(self.inputs):
            logger.warning("the kept inputs in %s do not match their recorded sha256: the calibration runs again",
                           self.folder)
            return None
        metadata, tensors = read_safetensors(self.folder / self.inputs["file"], "kept inputs")
        # copied out of the mapping (aligned as the live tensors were: CPU kernels round by alignment)
        tensors = {k: t.to(device=device, copy=True) for k, t in tensors.items()}
        return [(tuple(_decode(args, tensors)), _decode(kwargs, tensors)) for args, kwargs in json.loads(metadata["calls"])]

    def assemble(self, writer: CheckpointWriter, names: list[str]) -> None:
        """Add the finished parts ``names`` to ``writer``, in that order, each part's tensors in
        the order they were written."""
        for name in names:
            path = self.folder / self.parts[name]["file"]
            _, entries, _ = read_safetensors_header(path, "finished part")
            tensors = read_safetensors(path, "finished part")[1]
            for key in sorted(entries, key=lambda k: entries[k][2]):
                writer.add_tensor(key, tensors[key])
            writer.layers.update(read_header(path)["layers"])
            del tensors

    def remove(self) -> None:
        """The output is written: the progress folder goes."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _encode(value, tensors: dict[str, torch.Tensor]):
    """``value`` (a block call's argument) as JSON, its tensors moved to ``tensors``."""
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value
        return {"tensor": key}
    if isinstance(value, (tuple, list)):
        return {type(value).__name__: [_encode(v, tensors) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _encode(v, tensors) for k, v in value.items()}}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise ValueError(f"a block call's argument of type {type(value).__name__} cannot be kept on disk for a resume")


def _decode(data, tensors: dict[str, torch.Tensor]):
    (kind, value), = data.items()
    if kind == "tensor":
        return tensors[value]
    if kind in ("tuple", "list"):
        return (tuple if kind == "tuple" else list)(_decode(v, tensors) for v in value)
    if kind == "dict":
        return {k: _decode(v, tensors) for k, v in value.items()}
    return value


__all__ = ["Progress", "conversion_arguments", "file_sha256", "progress_folder"]
