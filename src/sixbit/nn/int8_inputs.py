"""The per-token INT8 inputs of :class:`~sixbit.nn.QuantLinear`'s dynamic INT8 path: codes and
scales of a layer's input (rotated by a Hadamard block first where the layer rotates late), shared
between the layers that take one input (attention's q, k and v) or handed from a layer that made
them in its epilogue to the next one (a feed-forward's second linear), and the reused scratch
buffer of large rotations."""

from __future__ import annotations

import threading
import weakref

import torch

from .. import kernels
from ..transforms import hadamard

_SHARED = threading.local()  # the last input quantized per token, and its codes (one per thread)


def quantized_input(x: torch.Tensor, source: torch.Tensor | None,
                     block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token INT8 codes and scales of ``x`` (2-D), rotated first by the Hadamard ``block`` if
    given; when ``source`` (the tensor ``x`` was reshaped from) is the input the previous call
    quantized with the same ``block``, unchanged since, its codes — a diffusers attention passes
    one tensor to ``to_q``, ``to_k`` and ``to_v`` — or the output of a call that quantized it
    (``quantize_output``; unrotated: ``block`` None). The codes live as long as
    ``source`` does. Not remembered: inference-mode tensors (no version counter tells an in-place
    change) and anything inside a ``torch.compile`` graph (the graph fuses it)."""
    if source is None or torch.compiler.is_compiling() or source.is_inference():  # inference tensors: no version
        return _quantize_rows(x, block)
    last = getattr(_SHARED, "entry", None)
    if last is not None and last[0]() is source and last[1] == source._version and last[2] == block:
        return last[3], last[4]
    codes, scale = _quantize_rows(x, block)
    _remember(source, block, codes, scale)
    return codes, scale


def _remember(source: torch.Tensor, block: int | None, codes: torch.Tensor, scale: torch.Tensor) -> None:
    _SHARED.entry = (weakref.ref(source, _forget), source._version, block, codes, scale)


def can_remember() -> bool:
    """Whether outputs made now can carry codes to the next layer: not in inference mode (its
    tensors have no version counter) nor inside a ``torch.compile`` graph."""
    return not torch.is_inference_mode_enabled() and not torch.compiler.is_compiling()


def remembered(out: torch.Tensor, codes: list | None) -> torch.Tensor:
    """``out``, its per-token codes (if the call made them, which it does only where
    :func:`can_remember`: ``codes`` holds one pair) remembered for the next layer that takes it as
    input (:func:`quantized_input`, unrotated)."""
    if codes:
        _remember(out, None, *codes[0])
    return out


def _quantize_rows(x: torch.Tensor, block: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    if block is None:
        return kernels.quantize_rows(x)
    codes, scale = kernels.quantize_rows(hadamard.rotate_unnormalized(x, block, _scratch(x)))
    return codes, scale * block ** -0.5


_SCRATCH = threading.local()  # one reused buffer per thread for the rotated input of a large layer


def _scratch(x: torch.Tensor) -> torch.Tensor | None:
    """A reused contiguous buffer of ``x``'s shape and dtype for a temporary that dies within the
    call (None for small, non-CPU or compiled inputs): a fresh (tokens, 7680) bf16 tensor at
    CogVideoX-2B size is 38 MB of new pages from the OS on every call (glibc maps allocations
    above 32 MiB on its own), and faulting them in took longer than the rotation written into them.
    The buffer grows to the largest such input seen (38 MB there) and stays."""
    if not kernels.fused_cpu(x) or torch.compiler.is_compiling():
        return None
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.dtype != x.dtype or buf.numel() < x.numel():
        buf = _SCRATCH.buf = torch.empty(x.numel(), dtype=x.dtype)
    return buf[:x.numel()].view(x.shape)


def _forget(ref: weakref.ref) -> None:
    """The remembered input is gone: drop its codes with it."""
    if getattr(_SHARED, "entry", (None,))[0] is ref:
        _SHARED.entry = None
