"""The full-precision tensors of replaced layers, kept on disk until a conversion is final.

A conversion keeps every layer it replaces so that an error anywhere puts the model back as it
was (:class:`~sixbit.builder.swap.LayerSwap`, and ``convert_model``'s undo of the later stages).
Kept in memory, those layers are the whole full-precision model beside the quantized one being
built: CogVideoX-2B (3.15 GiB in bf16) peaked at 10.8 GiB converted in memory. Inside
:func:`spilling` (``convert_model`` runs in one), a build hands each part's replaced layers to
:meth:`Spill.keep` once nothing reads them any more: their tensors are written to an anonymous temporary file (the system deletes
it when it is closed or the process ends, however it ends) and the same tensor objects are left
holding empty data. When an error leaves the outermost :func:`spilling`, :meth:`Spill.restore`
first reads every value back into those objects, bit for bit, so the rollbacks have put back the
very modules they took out, whole. When it ends without error the file is dropped: the replaced
layers are discarded with their data.

Nothing is spilled where it would not leave memory: off the CPU, a tensor some module still in the
model uses (a bias the quantized layer shares, a tied weight), a tensor subclass, or a temporary
directory in RAM (``tmpfs``) or without room for it (``TMPDIR`` chooses the directory). Holders of
the replaced ``nn.Linear`` modules themselves see empty weights afterwards, as after any offload;
copies of their values (a ``state_dict()`` taken before) keep them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import tempfile
from collections.abc import Iterator

import torch
from torch import nn

logger = logging.getLogger(__name__)

_RAM_FILESYSTEMS = {"tmpfs", "ramfs"}
_active: contextvars.ContextVar[Spill | None] = contextvars.ContextVar("sixbit_spill", default=None)


def _filesystem(path: str) -> str:
    """The type of the filesystem holding ``path`` (``""`` where ``/proc/self/mounts`` is not there)."""
    try:
        with open("/proc/self/mounts") as mounts:
            entries = [line.split()[1:3] for line in mounts]
    except OSError:
        return ""
    path = os.path.realpath(path)
    inside = [(point, kind) for point, kind in entries
              if path == point or path.startswith(point.rstrip("/") + "/")]
    return max(inside, key=lambda e: len(e[0]))[1] if inside else ""


@functools.cache
def _disk_directory() -> str | None:
    """The temporary directory, if spilling into it takes memory off the process (not in RAM)."""
    directory = tempfile.gettempdir()
    kind = _filesystem(directory)
    if kind in _RAM_FILESYSTEMS:
        logger.info("%s is %s (memory): replaced layers stay in memory until the conversion ends; "
                    "set TMPDIR to a disk folder to spill them", directory, kind)
        return None
    return directory


class Spill:
    """Tensors moved to disk (:meth:`keep`) and put back in place (:meth:`restore`)."""

    def __init__(self, directory: str):
        self.directory = directory
        self._file = None
        self._kept: list[tuple[torch.Tensor, int, torch.Size, torch.dtype]] = []  # (tensor, offset, shape, dtype)
        self.bytes = 0

    def keep(self, modules: list[nn.Module], model: nn.Module) -> None:
        """Move the CPU tensors of ``modules`` (replaced layers, no longer in ``model``) to disk."""
        live = {id(t) for t in (*model.parameters(), *model.buffers())}
        for module in modules:
            for t in (*module.parameters(), *module.buffers()):
                if id(t) not in live and self._spillable(t):
                    live.add(id(t))  # a tensor two replaced modules share goes once
                    self._write(t)

    def _spillable(self, t: torch.Tensor) -> bool:
        if t.device.type != "cpu" or type(t) not in (torch.Tensor, nn.Parameter) or t.numel() == 0:
            return False
        free = os.statvfs(self.directory)
        return free.f_bavail * free.f_frsize > 2 * t.numel() * t.element_size()

    def _write(self, t: torch.Tensor) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self.directory)
        data = t.detach().contiguous().reshape(-1).view(torch.uint8)
        offset = self._file.seek(0, os.SEEK_END)
        self._file.write(data.numpy())
        self._kept.append((t, offset, t.shape, t.dtype))
        self.bytes += data.numel()
        t.data = torch.empty(0, dtype=t.dtype)

    def restore(self) -> None:
        """Read every kept tensor back into its object (values bit for bit, contiguous)."""
        if self._file is not None:
            self._file.flush()
        while self._kept:
            t, offset, shape, dtype = self._kept.pop()
            data = torch.empty(shape.numel() * dtype.itemsize, dtype=torch.uint8)
            self._file.seek(offset)
            if self._file.readinto(data.numpy()) != data.numel():
                raise OSError(f"the spill file of replaced layers ended early at byte {offset}")
            t.data = data.view(dtype).reshape(shape)
        self.bytes = 0

    def close(self) -> None:
        """Drop the file (the kept tensors stay empty: their layers are discarded)."""
        if self._file is not None:
            self._file.close()
        self._file, self._kept, self.bytes = None, [], 0


@contextlib.contextmanager
def spilling() -> Iterator[Spill | None]:
    """While inside, builds spill the layers they replace (:func:`active`); an error leaving it
    restores them first. Nested: the inner ones share the outer :class:`Spill`, which only the
    outermost restores or closes. Yields the spill, or ``None`` where the temporary directory is
    in memory."""
    if _active.get() is not None:
        yield _active.get()
        return
    directory = _disk_directory()
    if directory is None:
        yield None
        return
    spill = Spill(directory)
    token = _active.set(spill)
    try:
        yield spill
    except BaseException:
        try:
            spill.restore()
        except Exception:  # the original error says what went wrong
            logger.exception("could not read the replaced layers back from their spill file")
        raise
    finally:
        _active.reset(token)
        spill.close()


def active() -> Spill | None:
    """The :class:`Spill` of the enclosing :func:`spilling`, or ``None``."""
    return _active.get()
