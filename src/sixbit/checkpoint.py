"""Checkpoints: one ``.safetensors`` file with the packed tensors and a JSON header.

The file holds the model's whole ``state_dict`` (packed ``QuantLinear`` buffers included), so
loading into a freshly built model of the same architecture reproduces its outputs
bit-exactly. The safetensors metadata key ``"sixbit"`` carries a JSON header::

    {"format": "sixbit", "format_version": 1, "sixbit_version": "...",
     "model_class": "CogVideoXTransformer3DModel",
     "layers": {"blocks.0.attn1.to_q": {in_features, out_features, weight_format,
                                       hadamard_block, bias, weight_meta, input_divisor,
                                       lowrank_rank, lowrank_dtype, weight_only,
                                       act_mode (absent before issue 48: "fp")}, ...},
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
import types
from pathlib import Path

import torch
from torch import nn

from .checkpoint_layers import LAYER_FIELDS, OPTIONAL_LAYER_FIELDS, build_layers
from .io import (
    SafetensorsWriter,
    file_chunks,
    read_safetensors,
    read_safetensors_header,
)
from .lora import check_no_loras, loras
from .memory import resident_weights
from .methods.registry import extensions
from .models import transformer_of
from .nn import QuantLinear
from .parallel.wrapped import wrapper_of
from .validate import field_problems
from .version import __version__

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: the checksum covers the header
_META_KEY = "sixbit"
_EXT_SEP = "::"


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
    """

    def __init__(self, path: str | os.PathLike, model_class: str):
        self.model_class = model_class
        self.layers: dict[str, dict] = {}
        self._writer = SafetensorsWriter(path)

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

    def finish(self, stored: dict[str, tuple[dict, dict[str, torch.Tensor]]]) -> Path:
        """Add the runtime methods' state (``{extension: (meta, tensors)}``), the header and the
        checksum; move the file into place."""
        for name, (_, extra) in stored.items():
            for key, t in extra.items():
                self._writer.add(f"{name}{_EXT_SEP}{key}", t)
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
        return self._writer.finish({_META_KEY: json.dumps(header)})


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
    if loras(model):  # LoRA factors are 16-bit side branches, never part of the packed checkpoint
        logger.warning("the LoRA(s) %s are not stored in %s: load them again after sixbit.load", loras(model), path)
    wrapper = wrapper_of(model)  # split across processes: rank 0 writes the whole model
    with resident_weights(model), (wrapper.writing() if wrapper else contextlib.nullcontext(True)) as writes:
        if not writes:
            return Path(path)
        stored = {}
        for name, ext in extensions().items():
            payload = ext.export(model)
            if payload is not None:
                stored[name] = payload
        with CheckpointWriter(path, type(model).__name__) as writer:
            writer.add(model)
            return writer.finish(stored)


def read_header(path: str | os.PathLike) -> dict:
    """The JSON header of a sixbit checkpoint, validated, reading nothing but the header (the
    tensors' checksum is verified by :func:`load`)."""
    return _read_header(Path(path))[0]


_HEADER_FIELDS = {"format": str, "format_version": int, "sixbit_version": str, "model_class": str,
                  "layers": dict, "sha256": str}


def _read_header(path: Path) -> tuple[dict, dict, int]:
    """``(header, entries, data_start)``: the sixbit header, checked field by field, and the
    file's tensor table (:func:`sixbit.io.read_safetensors_header`)."""
    metadata, entries, data_start = read_safetensors_header(path, "checkpoint")
    if _META_KEY not in metadata:
        raise ValueError(f"{str(path)!r} is a safetensors file but not a sixbit checkpoint (no 'sixbit' header)")
    try:
        header = json.loads(metadata[_META_KEY])
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{str(path)!r} has a corrupted sixbit header: {str(e)[:100]}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{str(path)!r} has a corrupted sixbit header: not a JSON object")
    version = header.get("format_version")
    if header.get("format") != "sixbit" or version != FORMAT_VERSION:
        raise ValueError(f"{str(path)!r} has checkpoint format version {repr(version)[:40]}; this sixbit "
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
        raise ValueError(f"{str(path)!r} has a malformed sixbit header: {'; '.join(problems[:5])}"
                         + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))
    return header, entries, data_start


def _open(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
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


def load(path: str | os.PathLike, model: nn.Module) -> nn.Module:
    """Restore a checkpoint written by :func:`save` into ``model`` (same architecture).

    ``model`` may be freshly built in full precision: its ``nn.Linear`` layers named in the
    file are replaced by ``QuantLinear``. Every check runs before anything changes, so on any
    error (missing, truncated or corrupted file, unknown format version, another
    architecture) ``model`` is left untouched. The runtime methods' state stored in the file
    (:func:`extensions`: static W8A8's parameters, the conversion) is restored last; a file
    naming an extension this sixbit does not know is refused up front. Returns ``model``.

    ``model`` may be a pipeline (its ``.transformer`` is loaded; the pipeline is returned), and
    it may have been built on the meta device (``accelerate.init_empty_weights()``): its
    parameters are then materialized from the file on the CPU.

    Example:
        >>> sixbit.load("6bit_model.safetensors", pipe)   # doctest: +SKIP
    """
    target = model
    model = transformer_of(model)
    if wrapper_of(model) is not None:
        raise ValueError("load the checkpoint into the model before wrapping it in a TensorParallelWrapper "
                         "(every rank loads the whole file, then wraps)")
    check_no_loras(model, "sixbit.load")
    path = Path(path)
    header, tensors = _open(path)
    stored, ext_tensors = _extension_parts(path, header, tensors)
    if header["model_class"] != type(model).__name__:
        raise ValueError(
            f"{str(path)!r} was saved from a {header['model_class']}, not a {type(model).__name__}"
        )
    new_layers = build_layers(path, header["layers"], dict(model.named_modules()), tensors)
    own = _check_remaining(path, model, new_layers, tensors)
    known = extensions()
    modules = {**dict(model.named_modules()), **new_layers}
    installs = []
    for name in [n for n in known if n in stored]:
        try:
            installs.append(known[name].prepare(model, modules, stored[name], ext_tensors[name]))
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            raise ValueError(f"{str(path)!r}: the stored {name} state is malformed: {e}") from None
        except ValueError as e:
            raise ValueError(f"{str(path)!r}: {e}") from None
    _swap_in(model, new_layers, own)
    for ext in known.values():  # the file's runtime methods replace the model's
        if ext.clear is not None:
            ext.clear(model)
    for install in installs:
        install()
    attach_save(model)
    if target is not model:
        attach_save(target)
    return target


def attach_save(obj) -> None:
    """Give a model (or its pipeline) ``.save(path)``: :func:`save` of the transformer."""
    transformer = transformer_of(obj)

    def save_method(self, path: str | os.PathLike) -> Path:
        """Write the transformer (weights and the runtime methods' state) to ``path``."""
        return save(transformer, path)

    obj.save = types.MethodType(save_method, obj)


def _extension_parts(path: Path, header: dict, tensors: dict[str, torch.Tensor]):
    """(meta, tensors) per extension the file stores; its tensors are taken out of ``tensors``."""
    stored = header.get("extensions", {})
    unknown = [n for n in stored if n not in extensions()]
    if unknown:
        raise ValueError(
            f"{str(path)!r} stores state of runtime method(s) {unknown} that this sixbit ({__version__}) does not "
            "know: load it with the sixbit version that wrote it, or upgrade"
        )
    ext_tensors = {n: {} for n in stored}
    for key in [k for k in tensors if _EXT_SEP in k]:
        ext, _, sub = key.partition(_EXT_SEP)
        if ext not in ext_tensors:
            raise ValueError(f"{str(path)!r} holds tensor {key!r} of no declared extension")
        ext_tensors[ext][sub] = tensors.pop(key)
    return stored, ext_tensors


def _check_remaining(path: Path, model: nn.Module, new_layers: dict, tensors) -> dict[str, torch.Tensor]:
    """The file's full-precision tensors, checked to fit ``model`` exactly (names, shapes, dtypes)."""
    expected = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 1)[0] not in new_layers}
    own = {k: v for k, v in tensors.items() if k.rsplit(".", 1)[0] not in new_layers}
    problems = [f"missing {k}" for k in sorted(set(expected) - set(own))]
    problems += [f"unexpected {k}" for k in sorted(set(own) - set(expected))]
    # a model built on the meta device takes the file's dtypes (an empty model is fp32 whatever
    # dtype its checkpoint was converted from); a materialized one must match them
    problems += [
        f"{k}: file {tuple(v.shape)} {v.dtype} vs model {tuple(expected[k].shape)} {expected[k].dtype}"
        for k, v in own.items()
        if k in expected and (v.shape != expected[k].shape
                              or (v.dtype != expected[k].dtype and expected[k].device.type != "meta"))
    ]
    if problems:
        wrong_dtype = [v.dtype for k, v in own.items() if k in expected and v.shape == expected[k].shape
                       and v.dtype != expected[k].dtype and expected[k].device.type != "meta"]
        hint = ""
        if len(wrong_dtype) == len(problems) and len(set(wrong_dtype)) == 1:  # only the dtype differs
            dtype = str(wrong_dtype[0]).removeprefix("torch.")
            hint = (f": the file holds {dtype} tensors; build the model in {dtype} "
                    f"(from_pretrained(..., torch_dtype=torch.{dtype}) or model.to(torch.{dtype})) and load again")
        raise ValueError(f"{str(path)!r} does not fit this model: {problems[:10]}{hint}")
    left_on_meta = [
        n for n, t in [*model.named_parameters(), *model.named_buffers()]
        if t.device.type == "meta" and n not in own and n.rsplit(".", 1)[0] not in new_layers
    ]
    if left_on_meta:
        raise ValueError(
            f"{left_on_meta[:5]} are on the meta device and {str(path)!r} does not hold them (non-persistent "
            "buffers): build the model with accelerate.init_empty_weights(), which keeps buffers, not under "
            "torch.device('meta')"
        )
    return own


def _swap_in(model: nn.Module, new_layers: dict[str, QuantLinear], own: dict[str, torch.Tensor]) -> None:
    """Everything checked: swap the layers in, then copy (or, on meta, assign) the remaining tensors."""
    modules = dict(model.named_modules())
    for name, layer in new_layers.items():
        old = modules[name]
        ref = next(iter(old.parameters()), None)
        if ref is None:
            ref = next(iter(old.buffers()), None)
        if ref is not None and ref.device.type != "meta":
            layer.to(ref.device)
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child, layer)
    with torch.no_grad():
        state = model.state_dict()
        on_meta = {k: v for k, v in own.items() if state[k].device.type == "meta"}
        for k, v in own.items():
            if k not in on_meta:
                state[k].copy_(v)
        if on_meta:  # built with empty weights: take the file's tensors as the parameters
            # Copied out of the file's mapping into ordinary (aligned) memory: a mapped tensor
            # starts wherever the file puts it, and CPU matmul kernels round differently on
            # unaligned inputs. The packed weights stay mapped (read when used, never copied).
            model.load_state_dict({k: v.clone() for k, v in on_meta.items()}, strict=False, assign=True)
