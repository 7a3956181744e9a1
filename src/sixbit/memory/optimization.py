"""VAE tiling and block offloading with prefetch: :func:`enable_memory_optimization` (the package docstring, :mod:`sixbit.memory`, says what each mode does)."""

from __future__ import annotations

import dataclasses
import enum
import logging
import shutil
import tempfile
from pathlib import Path

import torch
from diffusers.hooks.group_offloading import GroupOffloadingHook, ModuleGroup
from torch import nn

from ..models import iter_blocks, spec_for
from ..runtime import hooks
from ..runtime.wrapped import changes_model, wrapper_of
from .devices import accelerator as _accelerator
from .devices import parse_devices as _devices
from .devices import split as _split
from .fast_path import decide_auto_again
from .offload import HANDLES as _HANDLES
from .offload import (
    OffloadedWeightsLost,
    OffloadHook,
    OffloadStats,
    Scheduler,
    block_groups,
    release,
)
from .tiling import tile_vae
from .weights import allow_in_place, offload_problem, refuse_in_place, resident_weights

__all__ = [
    "HOOK_NAME", "MemoryMode", "MemoryOptimization", "OffloadStats", "OffloadedWeightsLost",
    "disable_memory_optimization", "enable_memory_optimization", "offload_problem", "resident_weights",
]

logger = logging.getLogger(__name__)

HOOK_NAME = "sixbit_offload"


class MemoryMode(str, enum.Enum):
    """Where the transformer's weights live between uses (see the module docstring)."""

    GROUP = "group"
    CPU_OFFLOAD = "cpu_offload"
    SEQUENTIAL_CPU_OFFLOAD = "sequential_cpu_offload"
    NONE = "none"


@dataclasses.dataclass
class MemoryOptimization:
    """What :func:`enable_memory_optimization` set up; :meth:`disable` undoes it.

    ``tiling`` and ``offload`` are one-line descriptions of what was done (or why not);
    ``stats`` counts the block scheduler's loads (``None`` outside ``mode="group"``).
    """

    mode: MemoryMode
    tiling: str
    offload: str
    groups: int = 0
    blocks_per_group: int = 0
    prefetch_depth: int = 0  # effective: at most groups − 1
    _model: nn.Module | None = dataclasses.field(default=None, repr=False)
    _pipe: object = dataclasses.field(default=None, repr=False)
    _scheduler: Scheduler | None = dataclasses.field(default=None, repr=False)
    _rest: ModuleGroup | None = dataclasses.field(default=None, repr=False)
    _vae: nn.Module | None = dataclasses.field(default=None, repr=False)
    _saved_tiling: dict | None = dataclasses.field(default=None, repr=False)
    _folder: Path | None = dataclasses.field(default=None, repr=False)
    _methods: dict | None = dataclasses.field(default=None, repr=False)  # see refuse_in_place
    _active: bool = dataclasses.field(default=True, repr=False)

    @property
    def stats(self) -> OffloadStats | None:
        return None if self._scheduler is None else self._scheduler.stats

    def __str__(self) -> str:
        return f"memory optimization ({self.mode.value}): {self.offload}; {self.tiling}"

    def disable(self) -> None:
        """Remove hooks, put every weight back in ordinary tensors, restore the VAE's tiling.

        Disk offload: block weights are read back to the onload device and the folder this
        call wrote is deleted. CPU-memory offload: the whole transformer ends on the offload
        device (move it where you want it). A layout ``"auto"`` decided while the weights were
        offloaded ("compact") is decided again at the next call, as before offloading.

        Raises:
            OffloadedWeightsLost: disk offload whose files are gone (the folder was deleted or
                emptied). Nothing else changes: the hooks stay, so every call of the model keeps
                failing with the same message instead of computing on placeholder weights, and
                :func:`offload_problem` reports it. Reload the model. (If the files are put back,
                a later ``disable()`` succeeds.)
        """
        if not self._active:
            return
        if self._scheduler is not None and self._folder is not None:
            self._scheduler.load_all()  # first, so that a lost folder changes nothing
        self._active = False
        if self._scheduler is not None:
            for _, _, block, _ in iter_blocks(self._model):
                hooks.remove(block, HOOK_NAME)
            self._scheduler.close(load_all=self._folder is not None)
            if self._folder is None and self._rest is not None:
                self._rest.offload_()
        if self.mode in (MemoryMode.CPU_OFFLOAD, MemoryMode.SEQUENTIAL_CPU_OFFLOAD):
            self._pipe.remove_all_hooks()
        if self._saved_tiling is not None:
            for key, value in self._saved_tiling.items():
                setattr(self._vae, key, value)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        if self._methods is not None:
            allow_in_place(self._model, self._methods)
        if self._model is not None and self.mode is not MemoryMode.NONE:
            decide_auto_again(self._model)  # layout="auto" keeps operands again where it did before
        if self._model is not None and _HANDLES.get(self._model) is self:
            del _HANDLES[self._model]


def _positive_int(name: str, value, minimum: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer ≥ {minimum} ({why}), got {value!r}")
    return value


def _check_no_foreign_offload(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if any(isinstance(h, GroupOffloadingHook) for h in hooks.hooks_of(module)):
            raise ValueError(
                f"{type(model).__name__} already has diffusers group offloading (on {name or 'the model'}); "
                "reload the model (this diffusers has no call that removes it) and enable sixbit's offloading alone"
            )
        if hasattr(module, "_hf_hook"):
            raise ValueError(
                f"{type(model).__name__} already has accelerate offloading hooks (on {name or 'the model'}); "
                "call `pipe.remove_all_hooks()` first"
            )


@changes_model("enable_memory_optimization")
def enable_memory_optimization(
    model_or_pipe,
    tile_size: int = 256,
    prefetch_depth: int = 4,
    mode: MemoryMode | str = MemoryMode.GROUP,
    onload_device: str | torch.device | None = None,
    offload_device: str | torch.device | Path = "cpu",
    blocks_per_group: int = 1,
) -> MemoryOptimization:
    """Tile the VAE and keep the transformer's blocks off the compute device until needed.

    Args:
        model_or_pipe: a diffusers pipeline (its ``transformer`` and ``vae``) or a bare video
            transformer. Quantize or load it first: layers swapped in later are not offloaded.
        tile_size (int, default 256): VAE tile edge in pixels, a multiple of 8 (VAEs compress
            8× spatially). Smaller: less decoder memory, more tiles (slower, more seams to blend).
        prefetch_depth (int ≥ 1, default 4): block groups loaded ahead of the one computing, on a
            background thread; at most ``prefetch_depth + 1`` groups are resident. Larger hides
            more load latency and holds more memory; ``≥ groups − 1`` keeps everything resident.
        mode ("group" | "cpu_offload" | "sequential_cpu_offload" | "none", default "group"): see
            the module docstring.
        onload_device (default None: the accelerator if torch sees one, else "cpu"): where blocks
            compute; a device this torch can use (``"cuda"`` on a CPU-only build is refused).
            Left at None without an accelerator, offloading to ``"cpu"`` is skipped with a warning.
        offload_device (default "cpu"): where blocks wait — ``"cpu"``, or a folder for disk
            offload: a ``Path``, or a string with a path separator, a leading ``~``/``.``, or
            naming an existing directory (``"cpu0"`` is a typo, not a folder; an existing file
            is refused). A fresh subfolder is created in it and removed by
            :meth:`~MemoryOptimization.disable`; leave it alone until then.
        blocks_per_group (int ≥ 1, default 1): blocks moved together. Larger: fewer, bigger
            transfers; more memory per resident group.

    Returns:
        a :class:`MemoryOptimization` describing what was done (``str()`` reads well).

    Raises:
        ValueError: an unknown mode, a bad size, an object that is no model or pipeline, an
            ``offload_device`` that is neither a device nor a usable folder, an ``onload_device``
            this torch lacks, a mode that would change nothing on this machine (``cpu`` → ``cpu``
            asked for explicitly; CPU offload without an accelerator) or a model already under another offloading
            scheme. Nothing is changed.
        OffloadedWeightsLost: the model's previous disk offload lost its folder (its
            ``disable()`` raises; reload the model).

    Example:
        >>> import tempfile, torch, sixbit
        >>> from sixbit.optimize import enable_memory_optimization
        >>> from sixbit.zoo.shapes import load_pipeline
        >>> pipe = load_pipeline("wan")
        >>> sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="nvfp4"))  # doctest: +ELLIPSIS
        WanTransformer3DModel(...)
        >>> folder = tempfile.mkdtemp()
        >>> memory = enable_memory_optimization(pipe, prefetch_depth=1, onload_device="cpu", offload_device=folder)
        >>> video = pipe("a red circle moving right", num_inference_steps=4,
        ...              generator=torch.Generator().manual_seed(0)).frames
        >>> memory.stats.max_resident_groups
        2
        >>> memory.disable()
    """
    mode = _mode(mode)
    _check_sizes(tile_size, prefetch_depth, blocks_per_group)
    pipe, model, vae = _split(model_or_pipe)
    onload, offload, folder = _devices(onload_device, offload_device)
    skipped = _check_mode(mode, pipe, model, onload, offload, folder, auto_onload=onload_device is None)
    if model is not None and model in _HANDLES:
        _HANDLES[model].disable()
    tiling, saved = tile_vae(vae, tile_size)
    if skipped:
        logger.warning("enable_memory_optimization: %s; %s", skipped, tiling)
    handle = MemoryOptimization(MemoryMode.NONE if skipped else mode, tiling, skipped or "no weight offloading",
                                _model=model, _pipe=pipe, _vae=vae, _saved_tiling=saved)
    try:
        _offload(handle, onload, offload, folder, blocks_per_group, prefetch_depth)
    except BaseException:
        handle.disable()
        raise
    if model is not None:
        _HANDLES[model] = handle
    logger.info("%s", handle)
    return handle


def _check_sizes(tile_size, prefetch_depth, blocks_per_group) -> None:
    _positive_int("tile_size", tile_size, 8, "VAE tile edge in pixels")
    if tile_size % 8:
        raise ValueError(f"tile_size must be a multiple of 8 (VAEs compress 8× spatially), got {tile_size}; try {tile_size // 8 * 8 or 8}")
    _positive_int("prefetch_depth", prefetch_depth, 1, "block groups loaded ahead")
    _positive_int("blocks_per_group", blocks_per_group, 1, "blocks moved together")


def _offload(handle: MemoryOptimization, onload, offload, folder, blocks_per_group: int, prefetch_depth: int) -> None:
    """Move the weights off the compute device as ``handle.mode`` says (already checked)."""
    if handle.mode is MemoryMode.GROUP:
        _install_groups(handle, handle._model, onload, offload, folder, blocks_per_group, prefetch_depth)
    elif handle.mode is MemoryMode.CPU_OFFLOAD:
        handle._pipe.enable_model_cpu_offload(device=onload)
        handle.offload = f"diffusers model CPU offload (components onloaded to {onload} when used)"
    elif handle.mode is MemoryMode.SEQUENTIAL_CPU_OFFLOAD:
        handle._pipe.enable_sequential_cpu_offload(device=onload)
        handle.offload = f"diffusers sequential CPU offload (each leaf onloaded to {onload} when used)"
    if handle.mode is not MemoryMode.NONE and handle._model is not None:
        decide_auto_again(handle._model)  # layout="auto" keeps no operands while the weights are offloaded


def _mode(mode) -> MemoryMode:
    try:
        return MemoryMode(mode)
    except ValueError:
        raise ValueError(f"unknown mode {mode!r}; valid: {[m.value for m in MemoryMode]}") from None


def _check_mode(mode: MemoryMode, pipe, model, onload, offload, folder, auto_onload: bool) -> str | None:
    """Refuse a mode that cannot apply to what was passed, or would change nothing here; return why
    offloading is skipped when the device defaults meet a machine without an accelerator."""
    accelerator = _accelerator()
    wrapper = wrapper_of(model) if model is not None else None
    if mode is not MemoryMode.NONE and wrapper is not None and (wrapper.driver is not None or wrapper.shards is not None):
        raise ValueError(f"{type(model).__name__} runs split by a TensorParallelWrapper (its worker processes or row "
                         "shards hold the weights), which offloading cannot reach: close() the wrapper to offload "
                         "here, or use mode='none' for VAE tiling only")
    if mode is MemoryMode.GROUP:
        if model is None:
            raise ValueError(f"mode='group' offloads a transformer, but this {type(pipe).__name__} has none; use mode='none' for tiling only")
        spec_for(model)  # raises a ValueError naming the fix when the blocks cannot be found
        if folder is None and offload == onload:
            if auto_onload and accelerator is None:  # the seed's call on a CPU-only machine
                return ("weight offloading and prefetch skipped: torch sees no accelerator, so blocks would wait "
                        "and compute in the same CPU memory; pass offload_device=<folder> to offload to disk")
            raise ValueError(
                f"mode='group' with onload_device={str(onload)!r} and offload_device={str(offload)!r} moves nothing "
                f"(torch sees {'no accelerator' if accelerator is None else accelerator}); pass a folder path as "
                "offload_device to offload to disk, or an accelerator as onload_device"
            )
        _check_no_foreign_offload(model)
    elif mode in (MemoryMode.CPU_OFFLOAD, MemoryMode.SEQUENTIAL_CPU_OFFLOAD):
        if pipe is None:
            raise ValueError(f"mode={mode.value!r} moves the components of a pipeline; pass the pipeline, or use mode='group' for a bare transformer")
        if accelerator is None:
            raise ValueError(
                f"mode={mode.value!r} moves models between the CPU and an accelerator, but torch sees no accelerator "
                "here, so it would change nothing; on a CPU-only machine use mode='group' with "
                "offload_device=<folder> (disk offload)"
            )
        if folder is not None:
            raise ValueError(f"mode={mode.value!r} offloads to CPU memory only; for disk offload use mode='group'")
    return None


def _install_groups(handle: MemoryOptimization, model: nn.Module, onload: torch.device, offload,
                    folder: Path | None, blocks_per_group: int, prefetch_depth: int) -> None:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        # A fresh subfolder: diffusers reuses an existing group file without checking what it holds.
        handle._folder = Path(tempfile.mkdtemp(prefix="sixbit-offload-", dir=folder))
        handle._methods = refuse_in_place(model)
        offload = torch.device("cpu")
    members, groups, rest = block_groups(model, blocks_per_group, onload, offload, handle._folder)
    handle._rest = rest
    rest.onload_()  # weights outside the blocks stay on the compute device
    scheduler = Scheduler(groups, prefetch_depth, handle._folder)
    scheduler.state = ["resident"] * len(groups)  # true until each group's first offload (disable relies on it)
    handle._scheduler = scheduler
    for index, group in enumerate(groups):
        release(group)
        scheduler.state[index] = "offloaded"
        for block in members[index]:
            hooks.register(block, OffloadHook(scheduler, index), HOOK_NAME)
    where = f"disk ({handle._folder})" if folder is not None else f"{offload} memory"
    handle.groups, handle.blocks_per_group, handle.prefetch_depth = len(groups), blocks_per_group, scheduler.depth
    handle.offload = (
        f"{len(groups)} groups of {blocks_per_group} block(s) on {where}, computed on {onload}, "
        f"{scheduler.depth} group(s) prefetched ahead"
    )
    if prefetch_depth >= len(groups) - 1:
        logger.warning("prefetch_depth=%d ≥ groups − 1 = %d: every group stays resident after the first call, "
                       "so no memory is saved; lower prefetch_depth", prefetch_depth, len(groups) - 1)


@changes_model("disable_memory_optimization")
def disable_memory_optimization(model_or_pipe) -> None:
    """Undo :func:`enable_memory_optimization` on ``model_or_pipe`` (no-op when none is installed)."""
    _, model, _ = _split(model_or_pipe, "disable_memory_optimization")
    handle = _HANDLES.get(model) if model is not None else None
    if handle is not None:
        handle.disable()
