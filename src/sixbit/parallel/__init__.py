"""Multi-process inference on ``torch.distributed``: :class:`TensorParallelWrapper`.

From a plain script or a notebook, name the devices and the wrapper starts one worker process
per device and drives them (:mod:`.driver`)::

    import torch, sixbit
    from sixbit.parallel import TensorParallelWrapper
    from sixbit.zoo.shapes import load_pipeline

    pipe = load_pipeline("wan")
    sixbit.convert_model(pipe, None, "w8a8")                # optional: before wrapping
    pipe = TensorParallelWrapper(pipe, device_ids=[0, 1], chunk_size=32)
    video = pipe("a red circle moving right", generator=torch.Generator().manual_seed(0)).frames
    pipe.close()                                            # or garbage collection, or exit

``device_ids=[0, 1]`` means GPUs 0 and 1 (NCCL) where there are GPUs, and two CPU workers
(gloo) on a machine without them; ``["cpu", "cpu"]`` asks for CPU workers anywhere.
``chunk_size`` is the number of tokens each feed-forward runs at a time on each worker (its
activation memory: :mod:`.feed_forward`); ``None`` (default) runs whole calls.

Under a launcher, every process runs the script: launch one per device with ``torchrun
--nproc-per-node N script.py``, initialize the default process group (``"gloo"`` on CPUs,
``"nccl"`` on GPUs) before wrapping, and build or load the model as usual (converted or not,
runtime methods installed), then wrap it last::

    import torch.distributed as dist
    dist.init_process_group("gloo")
    pipe = load_pipeline("wan")
    sixbit.convert_model(pipe, prompts, "w4a8")             # same calibration on every rank
    pipe = TensorParallelWrapper(pipe, mode="tensor")      # or mode="sequence"

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
checkpoint (under torchrun rank 0 writes it and every rank must call it; with workers this
process writes the whole model it kept), which loads into an unwrapped model.
"""

from .wrapper import (
    MODES,
    TensorParallelWrapper,
    wrapper_of,
)

__all__ = ["MODES", "TensorParallelWrapper", "wrapper_of"]
