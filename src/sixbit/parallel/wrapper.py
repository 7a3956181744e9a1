"""The :class:`TensorParallelWrapper` itself (the package docstring, :mod:`sixbit.parallel`, says how to use it)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .. import checkpoint
from ..memory.weights import check_not_offloaded
from ..models import transformer_of
from . import driver, feed_forward, sequence, tensor
from ..runtime.wrapped import mark, unmark, wrapper_of

MODES = ("tensor", "sequence")


def _release(transformer: nn.Module, workers: driver.Driver) -> None:
    """Stop the workers; ``transformer`` runs in this process again (at ``close()``, garbage
    collection of the wrapper, or exit)."""
    workers.close()
    driver.detach(transformer)
    unmark(transformer)


class TensorParallelWrapper:
    """A diffusers video transformer (or the pipeline holding it) split across processes; calls
    and attributes go to the wrapped object.

    Args:
        model: a pipeline or its transformer, full precision or converted, with its runtime
            methods (delta cache, DMPQ) and LoRAs already installed.
        device_ids: in a process with no process group, the device of each worker to start:
            CUDA indices (``[0, 1]``; CPU workers on a machine without GPUs), or device names
            (``["cpu", "cpu"]``). Under torchrun, the CUDA index of each rank (``device_ids[rank]``);
            ``None`` keeps the model where it is (the CPU with gloo).
        mode: ``"tensor"`` (default) or ``"sequence"`` (see :mod:`sixbit.parallel`).
        group: under torchrun, the process group (default: every rank).
        chunk_size: tokens per feed-forward call on each worker (:mod:`.feed_forward`): bounds
            the largest activations of a block; ``None`` (default) runs whole calls. Refused for
            models with NVFP4 activations or DMPQ, whose one scale per call chunks would change.

    In sequence mode each rank holds an equal, contiguous slice of every call's video tokens:
    their number must divide by the world size (a clear error says so). Tensor mode needs the
    attention heads to divide by it.

    Example:
        >>> model = TensorParallelWrapper(model, device_ids=[0, 1], chunk_size=32)   # doctest: +SKIP
        >>> out = model(latents, timestep=t, encoder_hidden_states=text)            # doctest: +SKIP
        >>> model.close()                                                           # doctest: +SKIP
    """

    def __init__(self, model, device_ids: list | None = None, mode: str = "tensor", group=None,
                 chunk_size: int | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        chunk_size = feed_forward.check_size(chunk_size)
        transformer = transformer_of(model)
        if wrapper_of(transformer) is not None:
            raise ValueError("this model is already wrapped by a TensorParallelWrapper: use that wrapper, or call its "
                             "close() (unwrap() under torchrun) and wrap the model again")
        check_not_offloaded(transformer, "the TensorParallelWrapper",
                            "and leave the weights where they are (each rank holds its share of them)")
        self._model, self.mode, self.chunk_size = model, mode, chunk_size
        self.shards = self.driver = None
        if dist.is_available() and dist.is_initialized():
            self._split(transformer, device_ids, group)
        elif device_ids is None:
            raise RuntimeError("TensorParallelWrapper needs devices or a process group: give device_ids=[0, 1] "
                               "(GPUs, or CPU workers on a machine without them) to start one worker process per "
                               "device from here, or launch the script with `torchrun --nproc-per-node N script.py` "
                               "and call torch.distributed.init_process_group('gloo') (CPUs) or ('nccl') (GPUs) "
                               "before wrapping")
        else:
            if group is not None:
                raise ValueError("group names a process group, and this process has none: leave it None to start "
                                 "workers from device_ids")
            found = driver.devices(device_ids)
            (tensor if mode == "tensor" else sequence).check(transformer, len(found))  # refused before any start
            if chunk_size is not None:
                feed_forward.check_chunkable(transformer)
            self.group, self.rank, self.world = None, None, len(found)
            self.driver = driver.Driver(transformer, found, mode, chunk_size, TensorParallelWrapper)
            driver.attach(transformer, self.driver)
            # the model marks this wrapper weakly: dropping the wrapper stops the workers (garbage collection)
            self._release = weakref.finalize(self, _release, transformer, self.driver)
        mark(transformer, self, weak=self.driver is not None)

    def _split(self, transformer: nn.Module, device_ids, group) -> None:
        """Under torchrun: split this rank's copy in place."""
        group = dist.group.WORLD if group is None else group
        self.group, self.rank, self.world = group, dist.get_rank(group), dist.get_world_size(group)
        if device_ids is not None:
            if len(device_ids) != self.world:
                raise ValueError(f"device_ids names {len(device_ids)} devices for {self.world} ranks: give one per rank")
            if not torch.cuda.is_available():
                raise ValueError("device_ids names CUDA devices, and this machine has none: leave it None on CPUs")
        if self.chunk_size is not None:
            feed_forward.check_chunkable(transformer)
        if self.world == 1:
            pass  # one rank: nothing to split (the script runs as it would unwrapped)
        elif self.mode == "tensor":
            self.shards = tensor.shard(transformer, group)
        else:
            self.shards = sequence.enable(transformer, group)
        if self.chunk_size is not None:
            feed_forward.chunk(transformer, self.chunk_size)
        if device_ids is not None:
            transformer.to(torch.device("cuda", device_ids[self.rank]))

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
        """The model whole again (returned). With workers: they stop and the model runs in this
        process, which kept it whole (:meth:`close`). Under torchrun, sequence mode: whole on
        every rank again; a tensor-parallel rank holds a slice of every weight and cannot be
        unwrapped: load the model again to run it whole."""
        if self.driver is not None:
            return self.close()
        if self.mode == "tensor" and self.shards is not None:
            raise ValueError("a tensor-parallel model holds 1/N of its weights on each rank and cannot be unwrapped: "
                             "save it (sixbit.save writes the whole model) and load it into a fresh model")
        transformer = self.transformer
        if self.chunk_size is not None:
            feed_forward.unchunk(transformer)
        if self.shards is not None:
            sequence.disable(transformer, self.shards)
        unmark(transformer)
        return self._model

    def close(self):
        """Stop the worker processes; the model (returned) runs whole in this process again.
        Garbage collection of the wrapper (the model does not keep it alive) and interpreter exit
        stop them too. Under torchrun: nothing to stop (see :meth:`unwrap`)."""
        if self.driver is not None:
            self._release()
        return self._model

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def on_workers(self, fn, *args) -> list:
        """``fn(wrapper, *args)`` in every worker (``wrapper``: that worker's TensorParallelWrapper
        of its shard), each one's result in rank order; e.g. the delta cache's report, or what
        each worker holds. ``fn`` and its results travel pickled (``cloudpickle``: a lambda
        will do). Under torchrun: ``[fn(self, *args)]``."""
        if self.driver is None:
            return [fn(self, *args)]
        return self.driver.run(fn, *args)

    # ---------------------------------------------------------------- reporting and saving

    def weight_bytes(self) -> int:
        """Bytes of the parameters and buffers this rank holds (packed weights as stored); with
        workers, the most any worker holds."""
        if self.driver is not None:
            return max(self.driver.run(TensorParallelWrapper.weight_bytes))
        return sum(t.numel() * t.element_size() for t in (*self.transformer.parameters(), *self.transformer.buffers()))

    def describe(self) -> str:
        """One line: mode, ranks and what each rank holds."""
        if self.driver is not None:
            where = ", ".join(str(d) for d in self.driver.devices)
            return f"{self.driver.run(TensorParallelWrapper.describe)[0]}; {self.world} worker processes ({where})"
        chunks = "" if self.chunk_size is None else f", feed-forwards over {self.chunk_size} tokens at a time"
        if self.shards is None:
            held = "nothing split (one rank)"
        elif self.mode == "tensor":
            held = (f"{len(self.shards.cut)} layers cut by rows, {len(self.shards.heads)} attention modules by heads"
                    + (f", {len(self.shards.whole)} linears whole (rows do not divide)" if self.shards.whole else ""))
        else:
            held = f"1/{self.world} of each call's tokens, Ulysses attention"
        return (f"{self.mode} parallel over {self.world} ranks: {held}{chunks}; "
                f"{self.weight_bytes() / 2**20:.2f} MiB of weights on rank {self.rank}")

    @contextlib.contextmanager
    def writing(self) -> Iterator[bool]:
        """For a checkpoint: yields whether this rank writes it (rank 0, holding the whole
        weights inside); every rank must enter it, and all leave together. With workers, this
        process holds the whole model and writes it."""
        if self.driver is not None:  # what this process holds is what the workers run, unless it changed since
            self.driver.handed.check(self.transformer, "save it")
            yield True
            return
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
