"""What was passed to :mod:`sixbit.memory`: the model or pipeline, where blocks compute and where weights wait.

Every check here runs before anything changes, and a bad value raises a ``ValueError`` naming the
argument, what it accepts and the fix.

**Device or folder (``offload_device``).** A ``torch.device`` is a device and a ``pathlib.Path``
is a folder. A string is a device when torch parses it as one (``"cpu"``, ``"cuda:0"``), and a
folder when it contains a path separator (``"/tmp/offload"``, ``"./cpu0"``, ``"offload/"``),
starts with ``~`` or ``.``, or names an existing directory. Any other string (a typo such as
``"cpu0"`` or ``"gpu"``) is refused rather than taken as a new folder in the working directory.
A folder must be a directory, or not exist yet under a writable directory: an existing file is
refused. A relative folder is made absolute at once (a later ``os.chdir`` moves nothing).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from .offload import GROUP_ARGS

_SEPARATORS = tuple(s for s in (os.sep, os.altsep, "/") if s)
_VALID_OFFLOAD = ('a device ("cpu") or a folder path for disk offload (a directory, or a path that does not '
                  'exist yet, e.g. "/tmp/offload" or "./offload")')


def compute_device(value, what: str, accepts: str = "give 'cpu' or a CUDA device ('cuda', 'cuda:N')") -> torch.device:
    """``value`` (a string or a ``torch.device``) as a device this machine computes on: the CPU or
    one of its CUDA devices, with its index (``"cuda"``: the current one). Anything else raises a
    ``ValueError`` that starts with ``what`` (the argument and its value) and says what it
    ``accepts``: the one parser of a device to compute on (a conversion's, each parallel worker's).

    Example:
        >>> compute_device("cpu", "device='cpu'")
        device(type='cpu')
    """
    try:
        found = torch.device(value) if isinstance(value, (str, torch.device)) else None
    except (RuntimeError, TypeError):
        found = None
    if found is None or found.type not in ("cpu", "cuda"):
        raise ValueError(f"{what}: {accepts}")
    if found.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{what}, and this machine has no CUDA device (or this PyTorch build has no CUDA): use 'cpu'")
        if (found.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"{what}, and this machine has {torch.cuda.device_count()} CUDA device(s)")
        found = torch.device("cuda", torch.cuda.current_device() if found.index is None else found.index)
    return found


def split(obj, who: str = "enable_memory_optimization") -> tuple[object | None, nn.Module | None, nn.Module | None]:
    """``(pipeline, transformer, vae)`` of a diffusers pipeline or a bare model."""
    from diffusers import DiffusionPipeline

    if isinstance(obj, DiffusionPipeline):
        transformer = getattr(obj, "transformer", None)
        return obj, transformer if isinstance(transformer, nn.Module) else None, getattr(obj, "vae", None)
    if isinstance(obj, nn.Module):
        return None, obj, None
    raise ValueError(
        f"{who} needs a diffusers pipeline or a transformer (torch.nn.Module), "
        f"got {type(obj).__name__}; pass e.g. `pipe` or `pipe.transformer`"
    )


def accelerator() -> torch.device | None:
    if torch.accelerator.is_available():
        return torch.accelerator.current_accelerator()
    return None


def total_memory(device: torch.device) -> int:
    """Bytes of memory on ``device``: the GPU's own, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _as_folder(value: str | Path) -> Path:
    """``value`` as a disk-offload folder, refused when it is a file or cannot be created."""
    folder = Path(value).expanduser().absolute()  # absolute: a later chdir must not move the offloaded weights
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"offload_device={str(value)!r} is an existing file, not a folder; pass {_VALID_OFFLOAD}")
    ancestor = folder
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"offload_device={str(value)!r} cannot be created as a folder: {str(ancestor)!r} is a file; "
                         f"pass {_VALID_OFFLOAD}")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"offload_device={str(value)!r}: the folder {str(ancestor)!r} is not writable; pass a folder "
                         "you can write to (e.g. under tempfile.gettempdir())")
    return folder


def device_or_folder(value) -> torch.device | Path:
    """``offload_device`` → a ``torch.device`` or a folder (the rule is in the module docstring)."""
    if isinstance(value, torch.device):
        return value
    if isinstance(value, Path):
        return _as_folder(value)
    if not isinstance(value, str):
        raise ValueError(  # noqa: TRY004 — user input: ValueError, as everywhere in sixbit (DESIGN style 5)
            f"offload_device must be {_VALID_OFFLOAD}, got {type(value).__name__} {value!r}")
    try:
        return torch.device(value)
    except RuntimeError:
        pass
    if any(s in value for s in _SEPARATORS) or value.startswith(("~", ".")) or Path(value).is_dir():
        return _as_folder(value)
    raise ValueError(
        f"offload_device={value!r} is neither a device nor a folder path; valid: {_VALID_OFFLOAD}; "
        f"for a folder of that name write {'./' + value!r}, for CPU memory \"cpu\""
    )


def check_available(device: torch.device) -> None:
    """Refuse an ``onload_device`` this torch cannot compute on (it would fail deep inside torch)."""
    if device.type == "cpu":
        return
    if device.type == "meta":
        raise ValueError("onload_device='meta' holds no data, so blocks cannot compute there; pass \"cpu\" or an "
                         "accelerator such as \"cuda\" (or None: the accelerator torch sees, else the CPU)")
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if not callable(is_available) or not is_available():
        if device.type == "cuda" and torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            why = "this torch is a CPU-only build (torch.version.cuda is None), so it has no CUDA"
        else:
            why = f"torch sees no {device.type} device on this machine"
        raise ValueError(f"onload_device={str(device)!r}: {why}; pass onload_device=\"cpu\" (or None: the accelerator "
                         f"torch sees, else the CPU), or install a torch build with {device.type} support")
    count = getattr(backend, "device_count", None)
    if device.index is not None and callable(count) and device.index >= count():
        raise ValueError(f"onload_device={str(device)!r}: torch sees {count()} {device.type} device(s) "
                         f"(indices 0–{count() - 1}); pass one of them")


def parse_devices(onload_device, offload_device) -> tuple[torch.device, torch.device | Path, Path | None]:
    """(onload device, offload device or folder, the folder for disk offload or None), checked."""
    offload = device_or_folder(offload_device)
    folder = offload if isinstance(offload, Path) else None
    if folder is not None and "offload_to_disk_path" not in GROUP_ARGS:
        raise ValueError("disk offload needs a diffusers release whose group offloading writes to disk "
                         "(offload_to_disk_path); upgrade diffusers (`pip install -U diffusers`) or offload to \"cpu\"")
    if folder is None and offload.type != "cpu":
        raise ValueError(f"offload_device must be \"cpu\" or a folder path (disk), got {str(offload)!r}: weights wait "
                         "there and an accelerator is where they compute (onload_device)")
    try:
        onload = torch.device(onload_device) if onload_device is not None else (accelerator() or torch.device("cpu"))
    except (RuntimeError, TypeError):
        raise ValueError(f"onload_device must be a device such as \"cuda\" or \"cpu\", got {onload_device!r}") from None
    check_available(onload)
    return onload, offload, folder
