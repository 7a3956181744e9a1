"""Block offloading for :mod:`sixbit.memory`: a scheduler that keeps a window of block groups resident.

Moving tensors is diffusers' ``ModuleGroup`` (parameters and buffers); the schedule — which
groups are resident, which are prefetched on a background thread — is ours (see the package
docstring for what ``prefetch_depth`` does).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
from diffusers.hooks import ModelHook
from diffusers.hooks.group_offloading import ModuleGroup
from safetensors import SafetensorError
from torch import nn

from ..models import iter_blocks, spec_for

# The installed MemoryOptimization of each model (sixbit.optimize), weakly keyed: one per model.
HANDLES: weakref.WeakKeyDictionary[nn.Module, object] = weakref.WeakKeyDictionary()

# ModuleGroup is diffusers' internal unit of group offloading; older releases lack some arguments.
GROUP_ARGS = inspect.signature(ModuleGroup.__init__).parameters


@dataclasses.dataclass
class OffloadStats:
    """What the block scheduler did since it was installed."""

    groups: int
    prefetched: int = 0  # loads queued ahead of need on the background thread
    prefetch_hits: int = 0  # entered groups that were already resident or queued
    sync_loads: int = 0  # entered groups loaded on the spot (no prefetch covered them)
    offloads: int = 0
    max_resident_groups: int = 0


def load_group(group: ModuleGroup) -> None:
    """Onload ``group`` and make its bytes really resident.

    safetensors maps files lazily: a group "loaded" from disk to the CPU would only be read by
    page faults when its block computes, on the compute thread, and a prefetch would read
    nothing. Copying into ordinary memory here does the read now, on the prefetch thread.
    """
    group.onload_()
    if group.offload_to_disk_path is not None and group.onload_device.type == "cpu":
        for tensor in group.tensor_to_key:
            tensor.data = tensor.data.clone()


def release(group: ModuleGroup) -> None:
    """Offload ``group``; disk-backed tensors keep their shape on a 1-element zero placeholder.

    diffusers leaves ``torch.empty_like`` placeholders, which the allocator may serve from the
    pages just freed, so the resident memory would not drop (nor could a stray read be told
    from real weights); an expanded zero holds no memory and reads as zeros.

    Only the tensors in the group's file are released: a tensor its blocks gained after the file
    was written (a LoRA's factors loaded onto the offloaded model) has no copy there, so it stays
    resident instead of being lost.
    """
    group.offload_()
    if group.offload_to_disk_path is not None:
        for tensor in group.tensor_to_key:
            tensor.data = torch.zeros((), dtype=tensor.dtype, device=tensor.device).expand(tensor.shape)


class OffloadedWeightsLost(RuntimeError):
    """The files holding offloaded block weights are gone or unreadable: the model cannot compute.

    Raised by every later call of the model (it never computes on the zero placeholders) and by
    ``disable()`` unless the files are back; the only fix is to reload the model.
    """


def group_file(group: ModuleGroup) -> Path | None:
    """The safetensors file a disk-offloaded group reads back from (``None`` for memory offload)."""
    path = getattr(group, "safetensors_file_path", None) if group.offload_to_disk_path is not None else None
    return None if path is None else Path(path)


class Scheduler:
    """Keeps the window ``{current, next depth groups}`` resident; everything else offloaded.

    Disk offload trusts the folder to keep its files until ``disable()``. When a group cannot be
    read back (a deleted or emptied folder, a truncated file) the scheduler is *lost*: the group
    stays on its zero placeholders and every later :meth:`enter` raises
    :class:`OffloadedWeightsLost`, so the model fails on every call instead of computing garbage.
    """

    def __init__(self, groups: list[ModuleGroup], depth: int, folder: Path | None = None):
        self.groups, self.depth = groups, min(depth, len(groups) - 1)
        self.state = ["offloaded"] * len(groups)  # "offloaded" | "queued" | "resident"
        self.futures: dict[int, concurrent.futures.Future] = {}
        self.current: int | None = None
        self.stats = OffloadStats(groups=len(groups))
        self.folder = folder
        self.lost: str | None = None  # why the offloaded weights are gone; set once, never cleared by a forward
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def missing(self) -> list[int]:
        """Offloaded (or still loading) disk groups whose file is no longer there."""
        return [g for g, group in enumerate(self.groups)
                if self.state[g] != "resident" and (path := group_file(group)) is not None and not path.is_file()]

    def _lost_message(self, failed: list[int], error: BaseException | None) -> str:
        failed = sorted(set(failed) | set(self.missing()))
        name = getattr(self.groups[failed[0]], "group_id", None) or f"group {failed[0]}"
        path = group_file(self.groups[failed[0]])
        cause = f"{path.name} is missing" if path is not None and not path.is_file() else \
            f"{path.name if path else 'its file'} is unreadable ({type(error).__name__}: {error})"
        return (f"the offloaded weights are gone: {len(failed)} of {len(self.groups)} block groups cannot be read back "
                f"from the offload folder {self.folder} (e.g. blocks {name}: {cause}; was the folder deleted or "
                "emptied?); the model holds zero placeholders for them, so it cannot compute or be saved: reload "
                "the model, and leave the offload folder alone until disable()")

    def _fail(self, failed: list[int], error: BaseException | None) -> OffloadedWeightsLost:
        if self.lost is None:
            self.lost = self._lost_message(failed, error)
        return OffloadedWeightsLost(self.lost)

    def _failed_load(self, g: int, error: Exception) -> Exception:
        """The error to raise for group ``g``'s failed load; the group stays on its placeholders.

        A disk group whose file is missing or unreadable is lost for good (:meth:`_fail`); any
        other failure (out of memory on the onload device, …) is raised as it is and the next
        entry tries again — either way no block computes on placeholders."""
        self.state[g] = "offloaded"  # whatever was assigned before the failure is not the group's weights
        path = group_file(self.groups[g])
        if path is not None and (not path.is_file() or isinstance(error, (OSError, SafetensorError, KeyError))):
            return self._fail([g], error)
        return error

    def _resident_after(self, g: int, load: Callable[[], object]) -> None:
        """Run ``load`` (which brings group ``g`` in) and mark the group resident, or fail as
        :meth:`_failed_load` says."""
        try:
            load()
        except Exception as error:
            failure = self._failed_load(g, error)
            if failure is error:
                raise
            raise failure from error
        self.state[g] = "resident"

    def _load(self, g: int) -> None:
        self._resident_after(g, lambda: load_group(self.groups[g]))

    def _settle(self, g: int) -> None:
        future = self.futures.pop(g, None)
        if future is not None:
            self._resident_after(g, future.result)  # re-raises a failed load here, in the caller's thread

    def _offload(self, g: int) -> None:
        self._settle(g)
        if self.state[g] == "resident":
            path = group_file(self.groups[g])
            if path is not None and not path.is_file():
                # diffusers writes a group's file once and would now drop the only copy: keep it resident.
                raise self._fail([g], None)
            release(self.groups[g])
            self.state[g] = "offloaded"
            self.stats.offloads += 1

    def _queue(self, g: int) -> None:
        if self.state[g] != "offloaded":
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sixbit-prefetch")
        self.futures[g] = self._pool.submit(load_group, self.groups[g])
        self.state[g] = "queued"
        self.stats.prefetched += 1

    @torch.compiler.disable
    def enter(self, g: int) -> None:
        """Called before any block of group ``g`` computes."""
        if self.lost is not None:
            raise OffloadedWeightsLost(self.lost)
        if g == self.current:
            return
        self.current = None  # until g is resident: after a failed load, the next entry must load, not skip
        ahead = [(g + k) % len(self.groups) for k in range(1, self.depth + 1)]
        window = {g, *ahead}
        for h in range(len(self.groups)):
            if h not in window and self.state[h] != "offloaded":
                self._offload(h)
        if self.state[g] == "offloaded":
            self._load(g)
            self.stats.sync_loads += 1
        else:
            self.stats.prefetch_hits += 1
        for h in ahead:
            self._queue(h)
        self._settle(g)
        resident = sum(s != "offloaded" for s in self.state)
        self.stats.max_resident_groups = max(self.stats.max_resident_groups, resident)
        self.current = g

    def load_all(self) -> None:
        """Make every group resident (real weights everywhere), or raise :class:`OffloadedWeightsLost`.

        Loads whatever can still be read before raising, and clears :attr:`lost` when every group
        loads (the files were put back)."""
        failed, first = [], None
        for g in list(self.futures):
            try:
                self._settle(g)
            except OffloadedWeightsLost as error:
                failed.append(g)
                first = first or error.__cause__
        for g in range(len(self.groups)):
            if self.state[g] == "offloaded":
                try:
                    self._load(g)
                except OffloadedWeightsLost as error:
                    failed.append(g)
                    first = first or error.__cause__
        if failed:
            self.lost = self._lost_message(failed, first)
            raise OffloadedWeightsLost(self.lost)
        self.lost = None

    def offload_outside_window(self) -> None:
        """Offload every resident group outside ``{current, next depth groups}`` (after :meth:`load_all`)."""
        window = set() if self.current is None else {(self.current + k) % len(self.groups) for k in range(self.depth + 1)}
        for g in range(len(self.groups)):
            if g not in window:
                self._offload(g)

    def close(self, load_all: bool) -> None:
        """Finish pending loads; then load every group (weights back in place) or offload every group."""
        if load_all:
            self.load_all()
        else:
            for g in list(self.futures):
                self._settle(g)
            for g, group in enumerate(self.groups):
                if self.state[g] == "resident":
                    release(group)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class OffloadHook(ModelHook):
    def __init__(self, scheduler: Scheduler, group: int):
        super().__init__()
        self.scheduler, self.group = scheduler, group

    def pre_forward(self, module, *args, **kwargs):
        self.scheduler.enter(self.group)
        return args, kwargs


def block_groups(model: nn.Module, blocks_per_group: int, onload: torch.device, offload: torch.device,
                  folder: Path | None) -> tuple[list[list[nn.Module]], list[ModuleGroup], ModuleGroup]:
    named = [(name, block) for _, name, block, _ in iter_blocks(model, spec_for(model))]
    chunks = [named[i:i + blocks_per_group] for i in range(0, len(named), blocks_per_group)]
    groups = [
        ModuleGroup(
            modules=[b for _, b in chunk], offload_device=offload, onload_device=onload,
            offload_leader=chunk[-1][1], onload_leader=chunk[0][1], onload_self=True,
            **({} if folder is None else {"offload_to_disk_path": str(folder)}),
            **({"group_id": f"{chunk[0][0]}..{chunk[-1][0]}"} if "group_id" in GROUP_ARGS else {}),
        )
        for chunk in chunks
    ]
    in_blocks = {id(t) for _, b in named for t in (*b.parameters(), *b.buffers())}
    rest = ModuleGroup(
        modules=[], offload_device=offload, onload_device=onload, offload_leader=model, onload_leader=model,
        parameters=[p for p in model.parameters() if id(p) not in in_blocks],
        buffers=[b for b in model.buffers() if id(b) not in in_blocks],
    )
    return [[b for _, b in chunk] for chunk in chunks], groups, rest
