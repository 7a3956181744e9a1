"""Safetensors files written atomically (whole or one tensor at a time, through
:mod:`sixbit.files.atomic`) and read with clear errors (no pickle anywhere)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from . import tempfiles
from .atomic import CHUNK, missing_folders, naming_errors, remove_orphans, temp_prefix, write_atomically

# torch dtype → the safetensors header's name for it
_DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}
_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}
_MAX_HEADER = 100 << 20  # bytes: a safetensors header past this is not one sixbit wrote


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of ``t`` (CPU, row-major) without a copy when it is already contiguous on the CPU."""
    return memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


class SafetensorsWriter:
    """Write a safetensors file one tensor at a time, atomically.

    Tensors are appended to a temporary data file as they come (only the one being written is
    in memory); :meth:`finish` writes the header and the data into a second temporary file in
    the target folder, fsyncs it and renames it over ``path``. On any error (or :meth:`abort`,
    or leaving the ``with`` block by an exception, or SIGTERM: :mod:`sixbit.files.tempfiles`) both
    temporary files are removed, whatever fails while they are (a full disk fails the flush on
    close too), the folders the writer created are removed again, and a file already at ``path``
    is left as it was. A write that fails (a full disk, a quota) raises an ``OSError`` naming
    ``path``.

    Example:
        >>> import torch, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
        >>> with SafetensorsWriter(path) as w:
        ...     w.add("a", torch.ones(2, 3))
        ...     _ = w.finish({"note": "x"})
        >>> read_safetensors(path)[1]["a"].shape
        torch.Size([2, 3])
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._target = _target_of(self.path)
        self._made = missing_folders(self._target.parent)  # removed again if the write fails
        try:
            self._target.parent.mkdir(parents=True, exist_ok=True)
            remove_orphans(self._target)
            fd, self._data_path = tempfile.mkstemp(dir=self._target.parent, prefix=temp_prefix(self._target),
                                                   suffix=".data")
        except OSError as e:
            raise _unwritable(self.path, self._target.parent, e) from None
        tempfiles.track(self._data_path)  # a SIGTERM removes it (SIGINT: __exit__ does)
        self._data = os.fdopen(fd, "w+b")
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}  # dtype, shape, start, end
        self._size = 0

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self._data is not None:
            self.abort()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Append ``tensor`` under ``name`` (names are unique)."""
        if name in self.entries:
            raise ValueError(f"tensor {name!r} was already written")
        if tensor.dtype not in _DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} cannot be stored in safetensors")
        data = tensor_bytes(tensor)
        with naming_errors(self.path):
            self._data.write(data)
        self.entries[name] = (tensor.dtype, tuple(tensor.shape), self._size, self._size + data.nbytes)
        self._size += data.nbytes

    def chunks(self, name: str) -> Iterator[bytes]:
        """The bytes of an already written tensor, read back from the file in pieces."""
        _, _, start, end = self.entries[name]
        with naming_errors(self.path):
            self._data.flush()
        with open(self._data_path, "rb") as f:
            yield from file_chunks(f, start, end)

    def finish(self, metadata: dict[str, str], path: str | os.PathLike | None = None) -> Path:
        """Write the header and the data to ``path`` (atomically); returns ``path``.

        ``path``: another file of the same folder to write instead of the one given at
        construction (a shard whose name waits for the number of shards)."""
        if path is not None:
            self.path, self._target = Path(path), _target_of(Path(path))
        header = {"__metadata__": dict(metadata)}
        for name, (dtype, shape, start, end) in self.entries.items():
            header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [start, end]}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned

        def write(out) -> None:
            out.write(struct.pack("<Q", len(raw)))
            out.write(raw)
            self._data.seek(0)
            shutil.copyfileobj(self._data, out, CHUNK)

        try:
            with naming_errors(self.path):
                self._data.flush()
            write_atomically(self._target, write, self.path)
            self._made = []  # they hold the file now
        finally:
            self.abort()
        return self.path

    def abort(self) -> None:
        """Discard everything written so far, and the folders this writer created (idempotent).
        Nothing it does can fail: closing a file whose buffer cannot be flushed (a full disk)
        raises, and the file must go all the same."""
        data, self._data = self._data, None
        if data is not None:
            with contextlib.suppress(OSError):  # the flush on close: the bytes are discarded anyway
                data.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._data_path)
        tempfiles.untrack(self._data_path)
        for folder in self._made:
            with contextlib.suppress(OSError):  # not empty (another file went there meanwhile): left as it is
                folder.rmdir()
        self._made = []


def _target_of(path: Path) -> Path:
    """The file a save to ``path`` replaces (a symlink stays a symlink: the file it points to is
    replaced), refused when ``path`` cannot name a safetensors file."""
    if path.suffix != ".safetensors":
        raise ValueError(f"path must end in .safetensors, got {str(path)!r}")
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a folder: give a file path ending in .safetensors")
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _unwritable(path: Path, folder: Path, error: OSError) -> ValueError:
    return ValueError(f"cannot write {str(path)!r}: no file can be created in the folder {str(folder)!r} "
                      f"({error.strerror or error}); write to a folder you can write to, or make this one writable")


def check_can_write(path: str | os.PathLike) -> Path:
    """Refuse, before any work, a ``.safetensors`` ``path`` that :class:`SafetensorsWriter` could
    not write; returns ``path``. Nothing is left behind: the check creates a nameless file in
    the folder (or, where folders are missing, in the nearest existing one, where they would be
    made) and closes it, so permissions, read-only file systems and root's privileges all
    answer as they will for the write itself."""
    path = Path(path)
    target = _target_of(path)
    folder = next((p for p in (target.parent, *target.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir():
        raise ValueError(f"cannot write {str(path)!r}: {str(folder)!r} is a file, not a folder; choose another path")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise _unwritable(path, folder, e) from None
    return path


def save_safetensors_atomic(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str]) -> Path:
    """Write ``tensors`` to ``path`` through temporary files in the same folder, fsync, rename.

    A failure at any point leaves no partial file and any previous file at ``path`` intact.
    """
    with SafetensorsWriter(path) as writer:
        for name, t in tensors.items():
            writer.add(name, t)
        return writer.finish(metadata)


def read_safetensors_header(path: str | os.PathLike, what: str = "file"):
    """``(metadata, entries, data_start)`` of a safetensors file, reading only its header.

    ``entries[name] = (dtype, shape, start, end)``, the byte range counted from ``data_start``.
    Every entry is checked against the file before anything trusts it: a dtype sixbit writes,
    a shape of integers ≥ 0, a byte range that matches the shape and lies inside the file. So
    a header that declares more than the file holds is refused, and reading one allocates
    nothing beyond the header itself (≤ 100 MiB).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no {what} at {str(path)!r}")
    size = path.stat().st_size
    bad = f"{str(path)!r} is not a readable safetensors file (truncated or corrupted?)"
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{bad}: it holds {size} bytes")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise ValueError(f"{bad}: its header claims {length} bytes of a {size}-byte file")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{bad}: its header is not JSON ({str(e)[:100]})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{bad}: its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{bad}: its __metadata__ is not a map of strings")
    data_size = size - 8 - length
    entries = {}
    for name, entry in header.items():
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = tuple(entry["shape"])
            start, end = entry["data_offsets"]
            ok = all(type(d) is int and d >= 0 for d in (*shape, start, end))
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok or end - start != math.prod(shape) * dtype.itemsize or not start <= end <= data_size:
            raise ValueError(f"{bad}: tensor {name[:100]!r} has an invalid or out-of-file entry {str(entry)[:200]}")
        entries[name] = (dtype, shape, start, end)
    return metadata, entries, 8 + length


def file_chunks(f, start: int, end: int) -> Iterator[memoryview]:
    """Bytes ``start:end`` of the open binary file ``f``, in pieces of at most 64 MiB read into
    one buffer: each piece is valid until the next is asked for."""
    f.seek(start)
    view = memoryview(bytearray(min(CHUNK, end - start)))
    while start < end:
        n = f.readinto(view[: min(len(view), end - start)])
        if not n:
            raise ValueError(f"{f.name!r} ends before byte {end}: truncated?")
        start += n
        yield view[:n]


def read_safetensors(path: str | os.PathLike, what: str = "file") -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """``(metadata, tensors)`` of a safetensors file; unreadable files raise ``ValueError``.

    The tensors map the file lazily (safetensors memory-maps it): their bytes are read when
    first used, and pages not used since can be dropped by the OS, so a large file costs
    resident memory only as far as it is read.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no {what} at {str(path)!r}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for bad files
        raise ValueError(f"{str(path)!r} is not a readable safetensors file (truncated or corrupted?): {e}") from None
    return metadata, tensors


class SafetensorsFolder:
    """The tensors of a diffusers model folder, read lazily: one ``*.safetensors`` file, or the
    shards a ``*.safetensors.index.json`` lists (as ``save_pretrained`` writes them).

    :meth:`read` opens the files for each call and closes them again: the tensors it returns map
    the files, and the pages they touched are released when those tensors are freed — streaming
    a 28 GB folder through it never holds more than the tensors still alive.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        indexes = sorted(self.folder.glob("*.safetensors.index.json"))
        if len(indexes) > 1:
            raise ValueError(f"{str(self.folder)!r} holds several safetensors indexes {[p.name for p in indexes]}: keep one")
        if indexes:
            try:
                weight_map = json.loads(indexes[0].read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{str(indexes[0])!r} is not a valid safetensors index: {e}") from None
            missing = sorted({f for f in weight_map.values() if not (self.folder / f).is_file()})
            if missing:
                raise ValueError(f"{str(indexes[0])!r} names shard(s) {missing[:3]} that are not in the folder: download them again")
        else:
            files = sorted(p.name for p in self.folder.glob("*.safetensors"))
            if not files:
                pickled = sorted(p.name for p in self.folder.glob("*.bin"))
                raise ValueError(
                    f"{str(self.folder)!r} holds no .safetensors weights"
                    + (f" (only {pickled[:2]}: pickle files, which sixbit never loads; re-save with "
                       "save_pretrained(..., safe_serialization=True))" if pickled else "")
                )
            if len(files) > 1:
                raise ValueError(f"{str(self.folder)!r} holds several .safetensors files {files[:3]} and no index: keep one model per folder")
            weight_map = dict.fromkeys(self._open(files[0]).keys(), files[0])
        self.weight_map: dict[str, str] = dict(weight_map)
        self.layout: dict[str, tuple[tuple[int, ...], str]] = {}  # name → (shape, dtype name), no data read
        for file in sorted(set(self.weight_map.values())):
            f = self._open(file)
            for name in f.keys():
                if self.weight_map.get(name) == file:
                    piece = f.get_slice(name)
                    self.layout[name] = (tuple(piece.get_shape()), piece.get_dtype())
        absent = sorted(set(self.weight_map) - set(self.layout))
        if absent:
            raise ValueError(f"{str(self.folder)!r}: tensors {absent[:3]} are listed in the index but missing from their shards")

    def _open(self, file: str):
        try:
            return safe_open(str(self.folder / file), framework="pt")
        except Exception as e:  # safetensors raises its own error types for bad files
            raise ValueError(f"{str(self.folder / file)!r} is not a readable safetensors file (truncated or corrupted?): {e}") from None

    def nbytes(self) -> int:
        """Bytes of all tensors (the files' data sections)."""
        return sum((self.folder / f).stat().st_size for f in set(self.weight_map.values()))

    def read(self, names) -> dict[str, torch.Tensor]:
        """The tensors called ``names`` (mapped from the files, read when used)."""
        by_file: dict[str, list[str]] = {}
        for name in names:
            by_file.setdefault(self.weight_map[name], []).append(name)
        out = {}
        for file, group in by_file.items():
            f = self._open(file)
            try:
                out.update((name, f.get_tensor(name)) for name in group)
            except Exception as e:
                raise ValueError(f"{str(self.folder / file)!r} could not be read (truncated or corrupted?): {e}") from None
        return out
