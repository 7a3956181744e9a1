"""A transformer built on the meta device whose tensors stay in their safetensors shards until a
part of it computes: the full-precision model runs with one block in memory.

What the streamed conversion (:mod:`sixbit.streaming`) and the streamed tuning
(:func:`sixbit.tuning.tune_pretrained`) compute on. :meth:`ShardedModel.running_from_disk`
hooks each block so that it is read from the shards just before it computes and freed after;
:meth:`ShardedModel.held` keeps one block in memory for the calls inside it (a replay of kept
inputs, the layers built from it). A layer swapped for another module (a quantized candidate)
keeps that module: its own tensors are neither read nor freed while it is out of the model.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator

import torch
from torch import nn

from ..files.safetensors import SafetensorsFolder
from ..memory import allocator


def materialize(model: nn.Module, tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None,
                device: torch.device | None = None) -> None:
    """Put the file's tensors in place of the meta ones, in ``dtype`` (``None``: the file's), on
    ``device`` (``None``: the CPU).

    Copied out of the file's mapping: a mapped tensor starts wherever the file puts it, and CPU
    kernels round differently on unaligned inputs (the streamed and the in-memory conversion
    must compute the same); the mapping is released as soon as the copies are made."""
    for key, t in tensors.items():
        t = t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else t.dtype, copy=True)
        owner, _, attr = key.rpartition(".")
        module = model.get_submodule(owner)
        if attr in module._parameters:
            module._parameters[attr] = nn.Parameter(t, requires_grad=False)
        else:
            module._buffers[attr] = t


def release(module: nn.Module) -> None:
    """Back to the meta device: the part's tensors are freed, and the allocator's free pages
    given back to the system. (Measured on CogVideoX-2B: without the trim, glibc keeps ~0.1 GB
    more per block — 3 GB over 30 blocks; with it, memory returns to the same level after
    every block.)"""
    module.to("meta")
    gc.collect()
    allocator.trim()


class ShardedModel:
    """``net`` on the meta device and its ``shards``: parts materialized on demand, in ``dtype``
    (``None``: as stored) on ``device`` (``None``: the CPU)."""

    def __init__(self, shards: SafetensorsFolder, net: nn.Module, dtype: torch.dtype | None,
                 device: torch.device | None = None):
        self.shards, self.net, self.dtype, self.device = shards, net, dtype, device
        # weak: a layer a conversion replaced and dropped is freed, not kept alive here
        self.owners = {key: weakref.ref(net.get_submodule(key.rpartition(".")[0])) for key in net.state_dict()}
        self.held_modules: set[int] = set()
        for module in net.modules() if device is not None else ():  # buffers computed at construction
            for name, buffer in module._buffers.items():  # (positional tables) join the weights there
                if buffer is not None and buffer.device.type != "meta":
                    module._buffers[name] = buffer.to(device)

    def _own(self, keys: list[str]) -> list[str]:
        """The keys whose module is still in the model (not swapped for another module)."""
        return [k for k in keys if self.net.get_submodule(k.rpartition(".")[0]) is self.owners[k]()]

    def load(self, keys: list[str]) -> None:
        """Read ``keys`` from the shards into the model (those of swapped-out modules left alone)."""
        materialize(self.net, self.shards.read(self._own(keys)), self.dtype, self.device)

    def unload(self, keys: list[str]) -> None:
        """Put ``keys`` back on the meta device (those of swapped-out modules left alone), their
        memory freed."""
        for key in self._own(keys):
            owner, _, attr = key.rpartition(".")
            module = self.net.get_submodule(owner)
            if attr in module._parameters:
                module._parameters[attr] = nn.Parameter(module._parameters[attr].to("meta"), requires_grad=False)
            else:
                module._buffers[attr] = module._buffers[attr].to("meta")
        allocator.trim()

    def running_from_disk(self, parts) -> list:
        """Hooks that map each block (``parts[1:]``, :func:`~sixbit.builder.parts_of`) from the
        shards just before it computes and free it after, unless it is :meth:`held`: the
        full-precision model runs with one block in memory. Returns the hook handles."""
        handles = []
        for part in parts[1:]:
            def before(module, args, keys=part.keys):
                if id(module) not in self.held_modules:
                    self.load(keys)

            def after(module, args, out, keys=part.keys):
                if id(module) not in self.held_modules:
                    self.unload(keys)

            handles.append(part.module.register_forward_pre_hook(before))
            handles.append(part.module.register_forward_hook(after))
        return handles

    @contextlib.contextmanager
    def held(self, part) -> Iterator[None]:
        """``part`` read from the shards for the body (its calls do not read it again), freed after."""
        self.load(part.keys)
        self.held_modules.add(id(part.module))
        try:
            yield
        finally:
            self.held_modules.discard(id(part.module))
            self.unload(part.keys)


__all__ = ["ShardedModel", "materialize", "release"]
