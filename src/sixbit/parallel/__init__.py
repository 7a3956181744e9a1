"""Multi-process inference on ``torch.distributed``: :class:`TensorParallelWrapper`.

Launch one process per device with ``torchrun --nproc-per-node N script.py``; in the script,
initialize the default process group (``"gloo"`` on CPUs, ``"nccl"`` on GPUs), build or load the
model as usual (converted or not, runtime methods installed), then wrap it last::

    import torch.distributed as dist, sixbit
    from sixbit.parallel import TensorParallelWrapper
    from sixbit.zoo.shapes import load_pipeline

    dist.init_process_group("gloo")
    pipe = load_pipeline("wan")
    sixbit.convert_model(pipe, prompts, "w4a8")             # same calibration on every rank
    pipe = TensorParallelWrapper(pipe, mode="tensor")      # or mode="sequence"
    video = pipe("a red circle moving right", generator=torch.Generator().manual_seed(0)).frames

Every rank runs the same script with the same inputs and seeds, and every rank gets the whole
video. Two modes:

- ``"tensor"`` (:mod:`.tensor`): each rank keeps ``1/N`` of every linear's rows (attention
  heads, feed-forward hidden units) — the weight memory per rank drops to about ``1/N``;
  all-gathers between layers.
- ``"sequence"`` (:mod:`.sequence`): each rank keeps the whole model and ``1/N`` of every
  call's tokens; diffusers' Ulysses attention exchanges them — activation memory and attention
  work per rank drop to about ``1/N``.

Both reproduce the single process (every quantization scale and runtime decision is taken over
the whole call, identically on every rank); ``sixbit.save`` of a wrapped model writes one
checkpoint (rank 0 writes it; every rank must call it), which loads into an unwrapped model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .. import checkpoint
from ..models import transformer_of
from . import sequence, tensor
from .wrapped import mark, unmark, wrapper_of

MODES = ("tensor", "sequence")


class TensorParallelWrapper:
    """A diffusers video transformer (or the pipeline holding it) split across the ranks of a
    process group, in place; calls and attributes go to the wrapped object.

    Args:
        model: a pipeline or its transformer, full precision or converted, with its runtime
            methods (delta cache, DMPQ) already installed.
        device_ids: the device of each rank (``device_ids[rank]``, CUDA indices); ``None``
            (default) keeps the model where it is (the CPU with gloo).
        mode: ``"tensor"`` (default) or ``"sequence"`` (see :mod:`sixbit.parallel`).
        group: the process group (default: every rank).

    In sequence mode each rank holds an equal, contiguous slice of every call's video tokens:
    their number must divide by the world size (a clear error says so). Tensor mode needs the
    attention heads to divide by it.

    Example:
        >>> transformer = TensorParallelWrapper(transformer, mode="tensor")   # doctest: +SKIP
        >>> out = transformer(latents, timestep=t, encoder_hidden_states=text)  # doctest: +SKIP
    """

    def __init__(self, model, device_ids: list[int] | None = None, mode: str = "tensor", group=None):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("TensorParallelWrapper needs a process group: launch the script with "
                               "`torchrun --nproc-per-node N script.py` and call "
                               "torch.distributed.init_process_group('gloo') (CPUs) or ('nccl') (GPUs) before wrapping")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        group = dist.group.WORLD if group is None else group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        transformer = transformer_of(model)
        if wrapper_of(transformer) is not None:
            raise ValueError("this model is already wrapped by a TensorParallelWrapper")
        if device_ids is not None:
            if len(device_ids) != self.world:
                raise ValueError(f"device_ids names {len(device_ids)} devices for {self.world} ranks: give one per rank")
            if not torch.cuda.is_available():
                raise ValueError("device_ids names CUDA devices, and this machine has none: leave it None on CPUs")
        self._model, self.mode, self.group = model, mode, group
        self.shards = None
        if self.world == 1:
            pass  # one rank: nothing to split (the script runs as it would unwrapped)
        elif mode == "tensor":
            self.shards = tensor.shard(transformer, group)
        else:
            self.shards = sequence.enable(transformer, group)
        if device_ids is not None:
            transformer.to(torch.device("cuda", device_ids[self.rank]))
        mark(transformer, self)

    # ---------------------------------------------------------------- delegation

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._model, name)

    @property
    def transformer(self) -> nn.Module:
        """The split transformer (this rank's part of it)."""
        return transformer_of(self._model)

    def unwrap(self):
        """Sequence mode: the model whole on every rank again (returned). A tensor-parallel model
        holds a slice of every weight and cannot be unwrapped: load it again to run it whole."""
        if self.mode == "tensor" and self.shards is not None:
            raise ValueError("a tensor-parallel model holds 1/N of its weights on each rank and cannot be unwrapped: "
                             "save it (sixbit.save writes the whole model) and load it into a fresh model")
        transformer = self.transformer
        if self.shards is not None:
            sequence.disable(transformer, self.shards)
        unmark(transformer)
        return self._model

    # ---------------------------------------------------------------- reporting and saving

    def weight_bytes(self) -> int:
        """Bytes of the parameters and buffers this rank holds (packed weights as stored)."""
        return sum(t.numel() * t.element_size() for t in (*self.transformer.parameters(), *self.transformer.buffers()))

    def describe(self) -> str:
        """One line: mode, ranks and what each rank holds."""
        if self.shards is None:
            held = "nothing split (one rank)"
        elif self.mode == "tensor":
            held = (f"{len(self.shards.cut)} layers cut by rows, {len(self.shards.heads)} attention modules by heads"
                    + (f", {len(self.shards.whole)} linears whole (rows do not divide)" if self.shards.whole else ""))
        else:
            held = f"1/{self.world} of each call's tokens, Ulysses attention"
        return f"{self.mode} parallel over {self.world} ranks: {held}; {self.weight_bytes() / 2**20:.2f} MiB of weights on rank {self.rank}"

    @contextlib.contextmanager
    def writing(self) -> Iterator[bool]:
        """For a checkpoint: yields whether this rank writes it (rank 0, holding the whole
        weights inside); every rank must enter it, and all leave together."""
        try:
            if self.mode == "tensor" and self.shards is not None:
                with tensor.whole_on_rank0(self.transformer, self.shards):
                    yield self.rank == 0
            else:
                yield self.rank == 0
        finally:  # a failed write raises on rank 0 and leaves the others waiting no longer
            dist.barrier(group=self.group)

    def save(self, path) -> Path:
        """``sixbit.save`` of the whole model: one checkpoint, written by rank 0."""
        return checkpoint.save(self.transformer, path)


__all__ = ["MODES", "TensorParallelWrapper", "wrapper_of"]
