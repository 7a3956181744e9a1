"""The feed-forward networks of a diffusers transformer, and ``chunk_size``: each one run over
``chunk_size`` tokens at a time.

A video transformer's feed-forward widens every token 4× (CogVideoX: 1920 → 7680, Wan-14B:
5120 → 13824) before it narrows it again, so its hidden activations are the largest tensor of a
block: at 17,776 tokens (CogVideoX-5B, 49 frames at 480×720) with a CFG batch of 2, 1 GiB in
bf16, the GELU's output as much again. Run over ``chunk_size`` tokens at a time, that peak is
``chunk_size / tokens`` of it (what diffusers' ``enable_forward_chunking`` does for the UNet-era
blocks that support it; CogVideoX's and Wan's blocks do not). A tensor-parallel rank holds
``1/N`` of the hidden units, and gathers each chunk's output in turn.

Each token's output is computed alone in a feed-forward (per-token activation scales, per-token
INT8 codes), so the chunks reproduce the unchunked call bit for bit. The exceptions are an
activation quantized with one scale over all of a call's tokens (NVFP4 activations, and DMPQ,
which picks NVFP4 per block and step) and the frame stabilizer, which splits a call's tokens by
video frame: :func:`check_chunkable` refuses those models.

Bit for bit also needs GEMM kernels that give a row the same bits whatever the row count, and
for a few row counts they do not: a LoRA's rank-2 product over 16 rows differs from the same
rows inside a 272-row call in fp32 (seen here). So every chunk runs on the same row count: the
last one is padded with zero tokens to ``chunk_size``, and the padded rows' outputs are dropped.
"""

from __future__ import annotations

import torch
from diffusers.hooks import ModelHook
from torch import nn

from ..methods.record import conversion_of
from ..methods.registry import unable
from ..nn import QuantLinear, QuantPointwiseConv, QuantUnfoldedConv
from ..nn.precision import ActMode
from ..runtime import hooks

HOOK_NAME = "sixbit_chunked_feed_forward"
ELEMENTWISE = ("GELU", "ApproximateGELU", "LinearActivation")  # diffusers FeedForward inputs: element-wise


def is_linear(module) -> bool:
    """A linear whose output features are its last dimension (a quantized conv's are not)."""
    return isinstance(module, (nn.Linear, QuantLinear)) and not isinstance(module, (QuantPointwiseConv, QuantUnfoldedConv))


def last_linear(net: nn.ModuleList) -> int | None:
    """The index of a feed-forward's second linear in its ``net``: the one linear after the first
    module, with only dropouts or identities beside it (CogVideoX: ``[GELU, Dropout, Linear,
    Dropout]``); ``None`` when ``net`` is not that."""
    rest = [i for i, m in enumerate(net) if i > 0 and not isinstance(m, (nn.Dropout, nn.Identity))]
    return rest[0] if len(rest) == 1 and is_linear(net[rest[0]]) else None


def feed_forwards(model: nn.Module) -> dict[str, nn.Module]:
    """The diffusers ``FeedForward`` modules of ``model`` by name: ``net`` = a projection inside an
    element-wise activation, then a linear (:func:`last_linear`), dropouts aside."""
    found = {}
    for name, m in model.named_modules():
        net = getattr(m, "net", None)
        if (isinstance(net, nn.ModuleList) and len(net) >= 2 and type(net[0]).__name__ in ELEMENTWISE
                and is_linear(getattr(net[0], "proj", None)) and last_linear(net) is not None):
            found[name] = m
    return found


def check_size(chunk_size) -> int | None:
    """``chunk_size`` as given, when it is ``None`` or a positive number of tokens."""
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size is the number of tokens each feed-forward runs at a time: a positive integer "
                         f"(e.g. 32), or None for whole calls; got {chunk_size!r}")
    return chunk_size


def check_chunkable(model: nn.Module) -> None:
    """Refuse a model whose feed-forwards chunks would change (nothing changes)."""
    if not feed_forwards(model):
        raise ValueError(f"{type(model).__name__} has no diffusers FeedForward module for chunk_size to chunk: "
                         "leave chunk_size None")
    for name, why in unable("chunkable", model):  # runtime methods that decide over a whole call's tokens
        raise ValueError(f"chunk_size runs each feed-forward over a few tokens at a time, and {why}. Leave chunk_size "
                         f"None, or convert without the runtime method {name!r}")
    conversion = conversion_of(model)
    if conversion is not None and conversion.config.activations == ActMode.NVFP4.value:
        raise ValueError("this model quantizes its activations to NVFP4 with one scale over all of a call's tokens, "
                         "so chunks (chunk_size) would change the video: leave chunk_size None")
    for name, ff in feed_forwards(model).items():
        for sub, m in ff.named_modules():
            if isinstance(m, QuantLinear) and not m.weight_only and m.act_mode is ActMode.NVFP4:
                raise ValueError(f"{name}.{sub} quantizes its input to NVFP4 with one scale over all of a call's "
                                 "tokens, so chunks (chunk_size) would change the video: leave chunk_size None")


class _Chunked(ModelHook):
    """Around a feed-forward: its input split along the tokens (dimension -2), each piece run
    alone, the outputs concatenated."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def new_forward(self, module, hidden_states, *args, **kwargs):
        forward = self.fn_ref.original_forward
        tokens = hidden_states.shape[-2] if hidden_states.dim() >= 3 else 0
        if tokens <= self.size:
            return forward(hidden_states, *args, **kwargs)
        parts = list(hidden_states.split(self.size, dim=-2))
        short = tokens % self.size
        if short:  # the last piece padded with zero tokens: every GEMM runs on the same row count
            parts[-1] = torch.nn.functional.pad(parts[-1], (0, 0, 0, self.size - short))
        out = torch.cat([forward(part.contiguous(), *args, **kwargs) for part in parts], dim=-2)
        return out[..., :tokens, :] if short else out


def chunk(model: nn.Module, size: int) -> list[str]:
    """Run every feed-forward of ``model`` over ``size`` tokens at a time (see the module doc);
    the names of the modules chunked."""
    check_chunkable(model)
    found = feed_forwards(model)
    for m in found.values():
        hooks.register(m, _Chunked(size), HOOK_NAME)
    return list(found)


def unchunk(model: nn.Module) -> None:
    """Whole calls again: undo :func:`chunk`."""
    for m in feed_forwards(model).values():
        hooks.remove(m, HOOK_NAME)


__all__ = ["ELEMENTWISE", "HOOK_NAME", "check_chunkable", "check_size", "chunk", "feed_forwards", "is_linear", "last_linear",
           "unchunk"]
