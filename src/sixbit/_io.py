"""Safetensors files written atomically (whole or one tensor at a time) and read with clear
errors (no pickle anywhere)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

# torch dtype → the safetensors header's name for it
_DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}
_CHUNK = 64 << 20  # bytes per read/copy when streaming a file through user space


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of ``t`` (CPU, row-major) without a copy when it is already contiguous on the CPU."""
    return memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


class SafetensorsWriter:
    """Write a safetensors file one tensor at a time, atomically.

    Tensors are appended to a temporary data file as they come (only the one being written is
    in memory); :meth:`finish` writes the header and the data into a second temporary file in
    the target folder, fsyncs it and renames it over ``path``. On any error (or :meth:`abort`,
    or leaving the ``with`` block by an exception) both temporary files are removed and a file
    already at ``path`` is left as it was.

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
        if self.path.suffix != ".safetensors":
            raise ValueError(f"path must end in .safetensors, got {str(self.path)!r}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._data_path = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".data")
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
        self._data.write(data)
        self.entries[name] = (tensor.dtype, tuple(tensor.shape), self._size, self._size + data.nbytes)
        self._size += data.nbytes

    def chunks(self, name: str) -> Iterator[bytes]:
        """The bytes of an already written tensor, read back from the file in pieces."""
        _, _, start, end = self.entries[name]
        self._data.flush()
        with open(self._data_path, "rb") as f:
            f.seek(start)
            while start < end:
                piece = f.read(min(_CHUNK, end - start))
                start += len(piece)
                yield piece

    def finish(self, metadata: dict[str, str]) -> Path:
        """Write the header and the data to ``path`` (atomically); returns ``path``."""
        header = {"__metadata__": dict(metadata)}
        for name, (dtype, shape, start, end) in self.entries.items():
            header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [start, end]}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
        self._data.flush()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(struct.pack("<Q", len(raw)))
                out.write(raw)
                self._data.seek(0)
                shutil.copyfileobj(self._data, out, _CHUNK)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        finally:
            self.abort()
        return self.path

    def abort(self) -> None:
        """Discard everything written so far (idempotent)."""
        if self._data is not None:
            self._data.close()
            self._data = None
        if os.path.exists(self._data_path):
            os.unlink(self._data_path)


def save_safetensors_atomic(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str]) -> Path:
    """Write ``tensors`` to ``path`` through temporary files in the same folder, fsync, rename.

    A failure at any point leaves no partial file and any previous file at ``path`` intact.
    """
    with SafetensorsWriter(path) as writer:
        for name, t in tensors.items():
            writer.add(name, t)
        return writer.finish(metadata)


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
