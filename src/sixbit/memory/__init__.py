"""Memory optimization for inference: VAE tiling and block offloading with prefetch.

Its public path is :mod:`sixbit.optimize`, as the seed writes it (``from sixbit.optimize import
enable_memory_optimization``); the package is named for its job.

:func:`enable_memory_optimization` does two independent things to a diffusers pipeline or a bare
video transformer:

1. **VAE tiling.** Where the pipeline has a VAE, ``vae.enable_tiling`` with tiles of
   ``tile_size`` pixels (CogVideoX: ``tile_sample_min_height/width``, default overlap; Wan and
   VAEs that take strides: stride ``3/4·tile_size``, diffusers' own 256 → 192 ratio). Decoding
   memory then grows with the tile, not the video. A bare transformer or a VAE-less pipeline
   (the shipped shapes models are pixel-space) has nothing to tile: the report says so.
2. **Weights off the compute device** (``mode``):

   ``"group"`` (default)
       The transformer's blocks (in execution order, from :mod:`sixbit.models`) are split into
       groups of ``blocks_per_group``. Each group lives on the offload side — CPU memory, or a
       safetensors file under ``offload_device=<folder>`` — and is loaded just before its first
       block runs. Moving the tensors is diffusers' group offloading (its ``ModuleGroup``:
       parameters *and* buffers, so ``QuantLinear``'s packed weights travel in their 4.5-bit
       form); sixbit adds the schedule. Weights outside the blocks stay on the onload device.

       **What ``prefetch_depth`` does.** When group ``g`` is entered, groups ``g+1 … g+depth``
       (wrapping round to the first groups, which the next transformer call needs) are queued
       for loading on one background thread, in order, and every group outside
       ``{g, …, g+depth}`` is offloaded: at most ``depth + 1`` groups are resident, and a load
       overlaps the compute of up to ``depth`` groups before it is needed. (diffusers' own
       ``use_stream`` prefetch looks one group ahead, with CUDA streams and one block per group.)
       From disk to the CPU a load really reads the file on that thread (safetensors would
       otherwise map it lazily and fault it in during compute). To CUDA the copies run on the
       default stream — ordered with the kernels, so the copy itself is not overlapped; only
       host-side work is. The accelerator paths are not exercised on the CPU test machine.

       A skipped block (delta cache) never needs its weights: whichever block *computes* makes
       its group resident first, so correctness does not depend on hook order — unlike
       diffusers' group offloading with ``num_blocks_per_group > 1``, where a cache skipping a
       group's first block leaves the group on placeholder weights for its other blocks.

       On a CPU-only machine offloading to ``"cpu"`` would move nothing. With the device
       defaults (the seed's ``enable_memory_optimization(model, tile_size=256,
       prefetch_depth=4)``) offloading is skipped with one logged warning and tiling still
       applies; ``onload_device="cpu", offload_device="cpu"`` asked for explicitly is refused.
       For disk offload pass a folder (``offload_device="/data/offload"``): weights are written
       once to a fresh subfolder. Disk is not the CPU default: it writes the whole transformer
       out (the only copy of its weights, see below) and reads every block back on every call,
       trading memory for disk traffic on a disk the user should choose (``/tmp`` is often
       memory-backed, which would save nothing).
       What counts as a folder: a ``pathlib.Path``, or a string with a path separator, a
       leading ``~`` or ``.``, or naming an existing directory; a string torch reads as a
       device is a device, and anything else (``"cpu0"``) or an existing *file* is refused
       (:mod:`sixbit.memory.devices`).

       **The folder is the only copy of the offloaded weights** until ``disable()``: the
       offloaded blocks hold zero placeholders in memory. Deleting or emptying it breaks the
       model for good — every later call raises :class:`OffloadedWeightsLost` (never computes
       on the placeholders), ``disable()`` raises it too, and :func:`offload_problem` says so;
       reload the model. For the same reason ``state_dict()`` (and ``sixbit.save``) of a
       disk-offloaded model must run inside :func:`resident_weights`, which reads every group
       back first.

   ``"cpu_offload"`` / ``"sequential_cpu_offload"``
       diffusers' ``pipe.enable_model_cpu_offload()`` / ``enable_sequential_cpu_offload()``
       (whole components, or every leaf, moved to the accelerator when used). Pipelines only,
       and only with an accelerator: without one they would change nothing, so they raise.

   ``"none"``
       Tiling only.

``QuantLinear`` weights travel packed (they are buffers, which diffusers' ``ModuleGroup`` moves
with the parameters); copies kept by ``cache_converted=True`` are not buffers and stay resident.

Quantize (or load) before enabling this: a conversion (``convert_model``, ``sixbit.quantize``,
``tune``) or ``sixbit.load`` of an offloaded model is refused (it would read the placeholders), and
so are diffusers' ``fuse_lora`` / ``unfuse_lora`` of a disk-offloaded one (they change weights in
place, which the group files, written once, would undo).
DMPQ, the delta cache and LoRAs (sixbit's and PEFT's) may come before or after; a LoRA loaded
onto a disk-offloaded model stays resident (its factors are not in the group files, which are
written once).
Outputs are bit-identical to the same model without offloading in the same layout
(:mod:`sixbit.memory.fast_path`): the weights make an exact round trip (memory copy or safetensors
file) and every block computes on the same device and dtype. ``layout="auto"`` keeps no operands
while the weights are offloaded ("compact": they would undo the saving) and is decided again at
the next call when offloading is switched on or off, so ``disable()`` gives it back the layout it
had; "compact" and "fast" differ by rounding, which a diffusion loop carries into the video
(README, "Less memory"). ``layout="fast"`` under disk offload builds its operands from the real
weights (read back once) and keeps them resident.
"""

from .optimization import (
    HOOK_NAME,
    MemoryMode,
    MemoryOptimization,
    OffloadStats,
    OffloadedWeightsLost,
    disable_memory_optimization,
    enable_memory_optimization,
    offload_problem,
    resident_weights,
)

__all__ = ["HOOK_NAME", "MemoryMode", "MemoryOptimization", "OffloadStats", "OffloadedWeightsLost", "disable_memory_optimization", "enable_memory_optimization", "offload_problem", "resident_weights"]
