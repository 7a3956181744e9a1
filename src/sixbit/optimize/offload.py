"""Block offloading for :mod:`sixbit.optimize`: a scheduler that keeps a window of block groups resident.

Moving tensors is diffusers' ``ModuleGroup`` (parameters and buffers); the schedule — which
groups are resident, which are prefetched on a background thread — is ours (see the package
docstring for what ``prefetch_depth`` does).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
from pathlib import Path

import torch
from diffusers.hooks import ModelHook
from diffusers.hooks.group_offloading import ModuleGroup
from torch import nn

from ..models import iter_blocks, spec_for

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
        for module in group.modules:
            for tensor in (*module.parameters(), *module.buffers()):
                tensor.data = tensor.data.clone()


def release(group: ModuleGroup) -> None:
    """Offload ``group``; disk-backed tensors keep their shape on a 1-element zero placeholder.

    diffusers leaves ``torch.empty_like`` placeholders, which the allocator may serve from the
    pages just freed, so the resident memory would not drop (nor could a stray read be told
    from real weights); an expanded zero holds no memory and reads as zeros.
    """
    group.offload_()
    if group.offload_to_disk_path is not None:
        for module in group.modules:
            for tensor in (*module.parameters(), *module.buffers()):
                tensor.data = torch.zeros((), dtype=tensor.dtype, device=tensor.device).expand(tensor.shape)


class Scheduler:
    """Keeps the window ``{current, next depth groups}`` resident; everything else offloaded."""

    def __init__(self, groups: list[ModuleGroup], depth: int):
        self.groups, self.depth = groups, min(depth, len(groups) - 1)
        self.state = ["offloaded"] * len(groups)  # "offloaded" | "queued" | "resident"
        self.futures: dict[int, concurrent.futures.Future] = {}
        self.current: int | None = None
        self.stats = OffloadStats(groups=len(groups))
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _settle(self, g: int) -> None:
        future = self.futures.pop(g, None)
        if future is not None:
            future.result()  # re-raises a failed load here, in the caller's thread
            self.state[g] = "resident"

    def _offload(self, g: int) -> None:
        self._settle(g)
        if self.state[g] == "resident":
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
        if g == self.current:
            return
        self.current = g
        ahead = [(g + k) % len(self.groups) for k in range(1, self.depth + 1)]
        window = {g, *ahead}
        for h in range(len(self.groups)):
            if h not in window and self.state[h] != "offloaded":
                self._offload(h)
        if self.state[g] == "offloaded":
            load_group(self.groups[g])
            self.state[g] = "resident"
            self.stats.sync_loads += 1
        else:
            self.stats.prefetch_hits += 1
        for h in ahead:
            self._queue(h)
        self._settle(g)
        resident = sum(s != "offloaded" for s in self.state)
        self.stats.max_resident_groups = max(self.stats.max_resident_groups, resident)

    def close(self, load_all: bool) -> None:
        """Finish pending loads; then load every group (weights back in place) or offload every group."""
        for g in list(self.futures):
            self._settle(g)
        for g, group in enumerate(self.groups):
            if load_all and self.state[g] == "offloaded":
                load_group(group)
            elif not load_all and self.state[g] == "resident":
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
