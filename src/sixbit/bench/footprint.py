"""What a benchmarked run holds: the model's stored bytes and the peak memory a generation adds."""

from __future__ import annotations

import contextlib
import ctypes
import re
from pathlib import Path

import torch


def _tensor_bytes(t: torch.Tensor, seen: set) -> int:
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n), seen) for n in names)
    key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
    if key in seen:
        return 0
    seen.add(key)
    return t.numel() * t.element_size()


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer as stored (quantized tensor subclasses: their parts)."""
    seen: set = set()
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(_tensor_bytes(t.data if isinstance(t, torch.nn.Parameter) else t, seen) for t in tensors)


def _rss_kib(field: str) -> int | None:
    try:
        match = re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(match.group(1)) if match else None


@contextlib.contextmanager
def peak_memory(out: dict):
    """``out["extra_bytes"]``: peak resident memory added while the block ran (Linux: the
    kernel's high-water mark, reset on entry; CUDA: peak allocated). ``None`` where unknown."""
    out["extra_bytes"] = None
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        yield out
        out["extra_bytes"] = torch.cuda.max_memory_allocated() - before
        return
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so reuse shows as growth
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _rss_kib("VmRSS")
    except OSError:
        before = None
    yield out
    peak = _rss_kib("VmHWM")
    if before is not None and peak is not None:
        out["extra_bytes"] = max(peak - before, 0) * 1024
