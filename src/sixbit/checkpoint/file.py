"""Checkpoints: one ``.safetensors`` file with the packed tensors and a JSON header.

The file holds the model's whole ``state_dict`` (packed ``QuantLinear`` buffers included), so
loading into a freshly built model of the same architecture reproduces its outputs
bit-exactly. The safetensors metadata key ``"sixbit"`` carries a JSON header::

    {"format": "sixbit", "format_version": 1, "sixbit_version": "...",
     "model_class": "CogVideoXTransformer3DModel",
     "layers": {"blocks.0.attn1.to_q": {in_features, out_features, weight_format,
                                       hadamard_block, bias, weight_meta, input_divisor,
                                       lowrank_rank, lowrank_dtype, weight_only,
                                       act_mode (absent before issue 48: "fp")}, ...
                "blocks.0.ff.conv_point": {..., "kind": "pointwise_conv2d"},
                "blocks.0.ff.conv_temp": {..., "kind": "unfolded_conv2d", "kernel_size": [3, 1],
                                          "padding": [1, 0]}},
     "sha256": "<digest of every tensor's name, dtype and bytes, and of the rest of this header>"}

The checksum covers every field of the header too (a hand-edited ``hadamard_block`` changes the
math, so it is refused like a flipped weight bit). Reading a header (:func:`read_header`,
``sixbit info``) reads only the header, after checking that every tensor it declares lies
inside the file. No pickle is involved at any point. Writes are atomic (temporary file in the
same folder, fsync, rename): a failed save never leaves a partial file behind, keeps the
permissions of the file it replaces and writes through a symlink.

**Extensions.** Runtime methods whose state is not in the ``state_dict`` (e.g. static W8A8's
per-time-range parameters, the conversion record) register a
:class:`~sixbit.methods.registry.CheckpointExtension` beside their code, through the method
registry; :func:`~sixbit.methods.registry.extensions` lists them in restore order. On
save, ``export(model)`` returns ``None`` (nothing to store) or ``(meta, tensors)``: ``meta`` goes
to ``header["extensions"][name]``, tensors are stored as ``"<name>::<key>"`` (covered by the
checksum). On load, before the model changes, ``prepare(model, modules, meta, tensors)`` checks
the stored state and returns the function that installs it; then the weights go in, every
extension's ``clear(model)`` removes what the model ran before, and the installers run. A file
naming an extension this sixbit does not know is refused before the model changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

import torch
from torch import nn

from .layers import LAYER_FIELDS, OPTIONAL_LAYER_FIELDS
from .restore import EXTENSION_SEPARATOR
from ..files.safetensors import SafetensorsWriter, file_chunks, read_safetensors, read_safetensors_header, tensor_bytes
from ..lora import loras
from ..runtime.wrapped import wrapper_of
from ..memory import resident_weights
from ..methods.registry import extensions
from ..models import transformer_of
from ..nn import QuantLinear
from ..config.validate import field_problems
from ..version import __version__

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: the checksum covers the header
_META_KEY = "sixbit"


def _digest(items, header: dict) -> str:
    """sha256 over every tensor's name, dtype and bytes, in name order, then over ``header``
    (all of it but the checksum itself, as sorted JSON).

    ``items``: ``(name, dtype, chunks of bytes)`` sorted by name (the tensors are read back from
    disk in pieces, so hashing a file of any size holds one piece in memory)."""
    h = hashlib.sha256()
    for name, dtype, chunks in items:
        h.update(name.encode())
        h.update(str(dtype).encode())
        for chunk in chunks:
            h.update(chunk)
    h.update(json.dumps({k: v for k, v in header.items() if k != "sha256"}, sort_keys=True).encode())
    return h.hexdigest()


class CheckpointWriter:
    """Write a checkpoint one module at a time: :func:`save` writes a whole model through it,
    :func:`sixbit.convert_pretrained` one transformer block after another, so only the block
    being written is in memory. Atomic: nothing appears at ``path`` unless :meth:`finish` succeeds.

    ``path`` is the ``.safetensors`` file to write, or the writer of another layout with
    :class:`~sixbit.files.safetensors.SafetensorsWriter`'s ``add``, ``entries``, ``chunks`` and ``__exit__``
    (a diffusers folder's shards, :mod:`sixbit.integrations.diffusers.folder`, whose writer
    stores the header :meth:`seal` returns itself).
    """

    def __init__(self, path, model_class: str):
        self.model_class = model_class
        self.layers: dict[str, dict] = {}
        self._writer = SafetensorsWriter(path) if isinstance(path, (str, os.PathLike)) else path

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, *exc) -> None:
        self._writer.__exit__(*exc)

    def add(self, module: nn.Module, prefix: str = "", keys=None) -> None:
        """Write ``module``'s state under ``prefix`` (only ``keys`` of it, if given) and record its
        quantized layers."""
        for name, t in module.state_dict(prefix=prefix).items():
            if keys is None or name in keys:
                self._writer.add(name, t)
        for name, m in module.named_modules(prefix=prefix.rstrip(".")):
            if isinstance(m, QuantLinear):
                self.layers[name] = m.config()

    def add_tensor(self, name: str, tensor: torch.Tensor) -> None:
        """Write one tensor of the model's state (a resumed conversion adds its finished parts'
        tensors this way, their layers' entries to :attr:`layers`)."""
        self._writer.add(name, tensor)

    def write(self, model: nn.Module) -> Path:
        """Add the whole ``model`` (resident weights) and its runtime methods' state; finish."""
        self.add(model)
        return self.finish(_exports(model))

    def finish(self, stored: dict[str, tuple[dict, dict[str, torch.Tensor]]]) -> Path:
        """Add the runtime methods' state (``{extension: (meta, tensors)}``), the header and the
        checksum; move the file into place."""
        return self._writer.finish({_META_KEY: json.dumps(self.seal(stored))})

    def seal(self, stored: dict[str, tuple[dict, dict[str, torch.Tensor]]]) -> dict:
        """Add the runtime methods' state (``{extension: (meta, tensors)}``); return the header,
        sealed with the checksum of every tensor written (in name order) and of the header."""
        for name, (_, extra) in stored.items():
            for key, t in extra.items():
                self._writer.add(f"{name}{EXTENSION_SEPARATOR}{key}", t)
        entries = self._writer.entries
        header = {
            "format": "sixbit",
            "format_version": FORMAT_VERSION,
            "sixbit_version": __version__,
            "model_class": self.model_class,
            "layers": self.layers,
        }
        if stored:
            header["extensions"] = {name: meta for name, (meta, _) in stored.items()}
        header = json.loads(json.dumps(header))  # hashed as it will be read back (tuples are lists)
        header["sha256"] = _digest(((n, entries[n][0], self._writer.chunks(n)) for n in sorted(entries)), header)
        return header


def save(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write ``model``'s quantized state to ``path`` (a ``.safetensors`` file), atomically.

    ``model`` may also be a pipeline: its ``.transformer`` is saved. A model split across
    processes (:class:`sixbit.parallel.TensorParallelWrapper`) is saved whole by rank 0, as one
    file: every rank must call this.

    Example:
        >>> import torch, sixbit, tempfile, os
        >>> from sixbit.nn import QuantLinear
        >>> m = torch.nn.Sequential(QuantLinear.from_linear(torch.nn.Linear(32, 8)))
        >>> p = sixbit.save(m, os.path.join(tempfile.mkdtemp(), "m.safetensors"))
        >>> p.suffix
        '.safetensors'
    """
    model = transformer_of(model)
    if isinstance(model, QuantLinear):  # load() replaces layers inside a model, never the model itself
        raise ValueError("a bare QuantLinear could be saved but never loaded back: save the model that holds it, "
                         "or wrap it, e.g. sixbit.save(torch.nn.Sequential(layer), path)")
    warn_loras_not_stored(model, path, "sixbit.load")
    wrapper = wrapper_of(model)  # split across processes: rank 0 writes the whole model
    with resident_weights(model), (wrapper.writing() if wrapper else contextlib.nullcontext(True)) as writes:
        if not writes:
            return Path(path)
        with CheckpointWriter(path, type(model).__name__) as writer:
            return writer.write(model)


def warn_loras_not_stored(model: nn.Module, path, reload: str) -> None:
    """Say that the LoRAs loaded on ``model`` are not written to ``path``: their factors are 16-bit
    side branches, never part of the packed checkpoint (``reload``: the call after which they are
    loaded again). :func:`save` and a converted model's ``save_pretrained`` both say it."""
    if loras(model):
        logger.warning("the LoRA(s) %s are not stored in %s: load them again after %s", loras(model), path, reload)


def _exports(model: nn.Module) -> dict[str, tuple[dict, dict[str, torch.Tensor]]]:
    """``{extension: (meta, tensors)}`` of every runtime method with state on ``model``."""
    return {name: payload for name, ext in extensions().items() if (payload := ext.export(model)) is not None}


def read_header(path: str | os.PathLike) -> dict:
    """The JSON header of a sixbit checkpoint, validated, reading nothing but the header (the
    tensors' checksum is verified by :func:`load`)."""
    return _read_header(Path(path))[0]


_HEADER_FIELDS = {"format": str, "format_version": int, "sixbit_version": str, "model_class": str,
                  "layers": dict, "sha256": str}


def _read_header(path: Path) -> tuple[dict, dict, int]:
    """``(header, entries, data_start)``: the sixbit header, checked field by field, and the
    file's tensor table (:func:`sixbit.files.safetensors.read_safetensors_header`)."""
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a folder: sixbit.load reads the .safetensors file sixbit.save writes; a "
                         "folder written by save_pretrained or `sixbit convert` loads with from_pretrained(folder) "
                         "(its diffusers class's, or DiffusionPipeline's), and `sixbit info` reads either")
    metadata, entries, data_start = read_safetensors_header(path, "checkpoint")
    if _META_KEY not in metadata:
        raise ValueError(f"{str(path)!r} is a safetensors file but not a sixbit checkpoint (no 'sixbit' header)")
    try:
        header = json.loads(metadata[_META_KEY])
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{str(path)!r} has a corrupted sixbit header: {str(e)[:100]}") from None
    check_header(header, str(path))
    return header, entries, data_start


def check_header(header, source: str) -> None:
    """Refuse a header that is not a valid one of this format version, naming ``source``."""
    if not isinstance(header, dict):
        raise ValueError(f"{source!r} has a corrupted sixbit header: not a JSON object")
    version = header.get("format_version")
    if header.get("format") != "sixbit" or version != FORMAT_VERSION:
        raise ValueError(f"{source!r} has checkpoint format version {repr(version)[:40]}; this sixbit "
                         f"({__version__}) reads version {FORMAT_VERSION}: {_format_fix(version)}")
    problems = field_problems("", header, _HEADER_FIELDS)
    if isinstance(header.get("layers"), dict):
        for name, cfg in header["layers"].items():
            if not isinstance(cfg, dict):
                problems.append(f"layers[{name[:100]!r}] is not an object")
                continue
            present = {k: t for k, t in OPTIONAL_LAYER_FIELDS.items() if k in cfg}
            problems += field_problems(f"layers[{name[:100]!r}].", cfg, LAYER_FIELDS | present)
            unknown = sorted(set(cfg) - set(LAYER_FIELDS) - set(OPTIONAL_LAYER_FIELDS))
            if unknown:
                problems.append(f"layers[{name[:100]!r}] has unknown fields {unknown[:5]}")
    ext = header.get("extensions", {})
    if not isinstance(ext, dict) or not all(isinstance(v, dict) for v in ext.values()):
        problems.append("extensions is not an object of objects")
    if problems:
        raise ValueError(f"{source!r} has a malformed sixbit header: {'; '.join(problems[:5])}"
                         + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))


def check_tensors(header: dict, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Refuse ``tensors`` (read from ``source``) unless they and ``header`` match its checksum."""
    if _digest(((n, tensors[n].dtype, [tensor_bytes(tensors[n])]) for n in sorted(tensors)), header) != header["sha256"]:
        raise ValueError(f"{source!r} is corrupted or was edited: its tensors or header do not match the stored checksum")


def open_checkpoint(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The validated header and the tensors (mapped lazily) of a checkpoint whose checksum holds."""
    header, entries, data_start = _read_header(path)
    with open(path, "rb") as f:
        items = ((n, entries[n][0], file_chunks(f, data_start + entries[n][2], data_start + entries[n][3]))
                 for n in sorted(entries))
        digest = _digest(items, header)
    if digest != header["sha256"]:
        raise ValueError(f"{str(path)!r} is corrupted or was edited: its tensors or header do not match the stored checksum")
    return header, read_safetensors(path, "checkpoint")[1]


def _format_fix(version) -> str:
    """What a user can do with a file of another checkpoint format version."""
    if isinstance(version, int) and not isinstance(version, bool) and version < FORMAT_VERSION:
        return ("files of older versions are not read (format 1's checksum did not cover its header); convert "
                "the model again from its full-precision weights (convert_model or `sixbit convert`) and save it")
    if isinstance(version, int) and not isinstance(version, bool):
        return "it was written by a newer sixbit: upgrade sixbit (pip install -U sixbit-diffusion)"
    return "the header is damaged or the file was not written by sixbit.save"


__all__ = ["FORMAT_VERSION", "CheckpointWriter", "check_header", "check_tensors", "open_checkpoint", "read_header", "save",
           "warn_loras_not_stored"]
