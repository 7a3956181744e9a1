"""Safetensors files written atomically and read with clear errors (no pickle anywhere)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def save_safetensors_atomic(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str]) -> Path:
    """Write ``tensors`` to ``path`` through a temporary file in the same folder, fsync, rename.

    A failure at any point leaves no partial file and any previous file at ``path`` intact.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"path must end in .safetensors, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_safetensors(path: str | os.PathLike, what: str = "file") -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """``(metadata, tensors)`` of a safetensors file; unreadable files raise ``ValueError``."""
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
