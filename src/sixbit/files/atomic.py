"""Files written atomically: a temporary file beside the target, fsync, rename; on any failure
(an exception, SIGINT, SIGTERM: :mod:`sixbit.files.tempfiles`) no partial file and the previous
one intact. Errors name the file being written (a full disk's bare ``[Errno 28]`` named none).
:mod:`sixbit.files.safetensors` writes its files through these."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from . import tempfiles

CHUNK = 64 << 20  # bytes per read/copy when streaming a file through user space


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first (what a write there creates)."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    return missing


@contextlib.contextmanager
def naming_errors(path: Path):
    """An ``OSError`` while writing ``path`` (its temporary files included) raised again with
    ``path`` and what to do in its message: a full disk's bare ``[Errno 28]`` named no file."""
    try:
        yield
    except OSError as e:
        if str(path) in str(e):  # already named (an inner write)
            raise
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        fix = (f"no space left on the device: free space in {str(path.parent)!r} or write elsewhere" if full
               else f"{e.strerror or e}")
        raise OSError(e.errno, f"cannot write {str(path)!r} ({fix})") from None


def temp_prefix(path: Path) -> str:
    """Temporary files of a save to ``path`` are ``.<name>.<pid>.<random>.data|tmp`` beside it."""
    return f".{path.name}.{os.getpid()}."


def remove_orphans(path: Path) -> None:
    """Delete the temporary files of saves to ``path`` whose process is gone (killed mid-save)."""
    head = f".{path.name}."
    for tmp in path.parent.iterdir():
        parts = tmp.name[len(head):].split(".") if tmp.name.startswith(head) else []
        if len(parts) != 3 or parts[2] not in ("data", "tmp") or not parts[0].isdigit():
            continue
        pid = int(parts[0])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except OSError:  # alive, another user's process
            pass


def _mode_for(path: Path) -> int:
    """Permissions of a file written to ``path``: those of the file it replaces, else the umask's."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomically(target: Path, write: Callable[[BinaryIO], object], name: Path | None = None) -> None:
    """``write(file)`` into a temporary file beside ``target`` (``target``'s permissions), fsync,
    rename over ``target``: a failure (an exception, SIGINT or SIGTERM) leaves any previous file
    intact and no partial file; an ``OSError`` names ``name`` (default ``target``)."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=temp_prefix(target), suffix=".tmp")
    tempfiles.track(tmp)
    try:
        with naming_errors(name or target):
            out = os.fdopen(fd, "wb")
            try:
                os.fchmod(out.fileno(), _mode_for(target))
                write(out)
                out.flush()
                os.fsync(out.fileno())
            except BaseException:
                with contextlib.suppress(OSError):  # its flush fails again (a full disk): the file goes anyway
                    out.close()
                raise
            out.close()
            os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        tempfiles.untrack(tmp)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`write_atomically`)."""
    target = Path(path)
    write_atomically(target, lambda out: out.write(text.encode("utf-8")))
    return target


def copy_file_atomic(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Copy the file ``source`` to ``path`` atomically (see :func:`write_atomically`)."""
    target = Path(path)
    with open(source, "rb") as f:
        write_atomically(target, lambda out: shutil.copyfileobj(f, out, CHUNK))
    return target


__all__ = ["CHUNK", "copy_file_atomic", "missing_folders", "naming_errors", "remove_orphans", "temp_prefix",
           "write_atomically", "write_text_atomic"]
