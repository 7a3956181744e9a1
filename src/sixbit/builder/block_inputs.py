"""Every call's inputs to one transformer block, kept so that the calibration generations run
once: each later block's inputs come from running the block before it on the kept ones.

A sequential GPTQ needs each block's input Hessians from a model whose earlier blocks are
already quantized. Re-running the generations for every block costs blocks × generations
(text encoder, every block, every step, the VAE); replaying the kept inputs costs two block
calls per kept call and block. The blocks then see the full-precision sampling trajectory (the
quantized blocks' error is passed on through the hidden states, not through the sampler's
next latents). Kept inputs cost ``calls × tokens × width`` values: :func:`keeping` stops
keeping once they pass ``budget`` bytes, and says so (:attr:`BlockInputs.problem`). A replay
of a quantized block multiplies each quantized layer's input by one dense weight kept for the
replay (``QuantLinear.keep_dense``: the stored weight, its branch and rotation folded, in the
model's dtype), not by the weight dequantized, its input rotated and its branch added per call:
the same values to one rounding, at a full-precision layer's cost (16 bits per weight of the
block while it replays).

Example:
    >>> import torch
    >>> from diffusers import CogVideoXTransformer3DModel
    >>> model = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4,
    ...     time_embed_dim=32, text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=9)
    >>> call = dict(hidden_states=torch.randn(1, 3, 4, 8, 8), encoder_hidden_states=torch.randn(1, 226, 32),
    ...             timestep=torch.tensor([10]))
    >>> with keeping(model) as kept, torch.no_grad():
    ...     _ = model(**call)
    >>> kept.problem is None, len(kept.calls)
    (True, 1)
    >>> with torch.no_grad():
    ...     kept.replay(model.transformer_blocks[0], advance=True)   # now block 1's inputs
    >>> kept.index
    1
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from ..memory.devices import total_memory
from ..models import iter_blocks, spec_for
from ..nn import QuantLinear


class BlockInputs:
    """The kept calls (``(args, kwargs)`` of one block, in call order) and what replays them.

    Attributes:
        calls: ``[(args, kwargs)]``; :meth:`replay` with ``advance`` replaces them by the next
            block's inputs.
        index: the global index of the block the calls feed.
        problem: why the kept calls cannot stand in for the generations, or ``None``.
    """

    def __init__(self, io, index: int, budget: int | None = None):
        self.io, self.index, self.budget = io, index, budget
        self.calls: list[tuple[tuple, dict]] = []
        self.nbytes = 0
        self.problem: str | None = None

    def record(self, module, args, kwargs) -> None:
        """A forward pre-hook (``with_kwargs=True``): keep a copy of this call's inputs."""
        if self.problem is not None:
            return
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        self.nbytes += sum(t.numel() * t.element_size() for t in tensors)
        if self.budget is not None and self.nbytes > self.budget:
            self.calls.clear()
            self.problem = (f"the calibration's inputs to one block pass {self.budget / 2**30:.1f} GiB "
                            f"({len(tensors)} tensors per call)")
            return
        clone = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
        self.calls.append((tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()}))

    def replay(self, block: nn.Module, advance: bool) -> None:
        """Run ``block`` on every kept call; ``advance``: its outputs become the kept inputs
        (of the block after it)."""
        with torch.no_grad(), _dense_weights(block):
            for i, (args, kwargs) in enumerate(self.calls):
                out = block(*args, **kwargs)
                if advance:
                    for stream in ("hidden", "encoder"):
                        value = self.io.stream_output(out, stream)
                        if value is not None:
                            args, kwargs = self.io.with_input(block, args, kwargs, value, stream)
                    self.calls[i] = (args, kwargs)
        if advance:
            self.index += 1

    def outputs(self, block: nn.Module, which: Sequence[int] | None = None
                ) -> Iterator[tuple[torch.Tensor | None, torch.Tensor | None]]:
        """``block``'s outputs on each kept call (``which``: on those calls only), in call order:
        its ``(hidden, encoder)`` streams (``None`` where it returns none). The block runs as it is
        (its quantized layers as they compute in a generation); nothing kept changes."""
        with torch.no_grad():
            for i, (args, kwargs) in enumerate(self.calls):
                if which is not None and i not in which:
                    continue
                out = block(*args, **kwargs)
                yield self.io.stream_output(out, "hidden"), self.io.stream_output(out, "encoder")


@contextlib.contextmanager
def _dense_weights(block: nn.Module) -> Iterator[None]:
    """Inside: every quantized layer of ``block`` keeps the dense weight of its full-precision calls."""
    layers = [m for m in block.modules() if isinstance(m, QuantLinear)]
    try:
        for layer in layers:
            layer.keep_dense(layer.source_dtype)
        yield
    finally:
        for layer in layers:
            layer.keep_dense(None)


def default_budget(model: nn.Module) -> int:
    """Bytes of kept block inputs allowed by default: a quarter of the memory of the model's device."""
    return total_memory(next(model.parameters()).device) // 4


@contextlib.contextmanager
def keeping(net: nn.Module, index: int = 0, budget: int | None = None) -> Iterator[BlockInputs]:
    """Keep every call's inputs to block ``index`` of ``net`` while the ``with`` body runs the
    generations. Afterwards :attr:`BlockInputs.problem` says why they cannot stand in for them:
    more than one block list (model code between the lists), a model that changes the hidden
    states between its blocks (checked on the first call), no call at all, or ``budget`` bytes
    passed."""
    spec = spec_for(net)
    blocks = list(iter_blocks(net, spec))
    kept = BlockInputs(blocks[index][3], index, budget)
    if len(spec.block_lists) != 1:
        kept.problem = f"{type(net).__name__} has {len(spec.block_lists)} block lists, with model code between them"
        yield kept
        return
    seen: dict[int, torch.Tensor] = {}  # block index's output and the next block's input, in the first call

    def output(module, args, kwargs, out) -> None:
        seen.setdefault(0, kept.io.stream_output(out))

    def next_input(module, args, kwargs) -> None:
        seen.setdefault(1, kept.io.stream_input(module, args, kwargs))

    block = blocks[index][2]
    handles = [block.register_forward_pre_hook(kept.record, with_kwargs=True)]
    if index + 1 < len(blocks):
        handles.append(block.register_forward_hook(output, with_kwargs=True))
        handles.append(blocks[index + 1][2].register_forward_pre_hook(next_input, with_kwargs=True))
    try:
        yield kept
    finally:
        for h in handles:
            h.remove()
    if kept.problem is None and not kept.calls:
        kept.problem = "the calibration never called the transformer"
    elif kept.problem is None and index + 1 < len(blocks) and not (
            isinstance(seen.get(0), torch.Tensor) and isinstance(seen.get(1), torch.Tensor)
            and torch.equal(seen[0], seen[1])):
        kept.problem = f"{type(net).__name__} changes the hidden states between its blocks"
    if kept.problem is not None:
        kept.calls.clear()
