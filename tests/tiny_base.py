"""What every tiny model builder shares: :class:`TinyModel`, seeding helpers and :func:`sample`.

A builder returns a :class:`TinyModel` whose ``inputs(batch, timestep, latents=..., negative=...)``
mirrors how the model's diffusers pipeline calls the transformer (latent layout, timestep dtype
and scale, masks, rotary embeddings computed outside the model). ``negative=True`` gives the
unconditional call's inputs: the same video-side tensors, other text-side ones (the negative
prompt). :func:`sample` runs the plain classifier-free-guidance loop the tests use.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn

HEADS = 2
TEXT_LEN = 8


@dataclasses.dataclass
class TinyModel:
    """A tiny transformer, an input factory and an output extractor.

    Attributes:
        inputs: ``inputs(batch, timestep=None, latents=None, negative=False) -> kwargs``; the
            timestep is on the 0…1000 scale (``None``: 500) and converted to what the pipeline
            passes; ``latents`` (shaped like ``latents(batch)``) replace the noisy latents.
        output: the prediction (shaped like the latents) from what the model returns.
        latents: ``latents(batch)``, the initial noise of a generation.
        guidance: the pipeline runs classifier-free guidance (a conditional, then an
            unconditional call per step); ``False`` for models without a text condition.
        prepare: ``prepare(model, batch) -> kwargs`` run once per generation before its steps
            (e.g. Wan-Animate-2's reference pass filling a KV cache). :func:`sample` passes its
            kwargs to every ``inputs`` call; ``inputs`` called without them (a standalone call)
            uses what ``prepare`` gave once, when the model was built.
    """

    name: str
    model: nn.Module
    inputs: Callable[..., dict]
    output: Callable[[Any], torch.Tensor]
    block_lists: tuple[str, ...]
    latents: Callable[[int], torch.Tensor] | None = None
    guidance: bool = True
    prepare: Callable[[nn.Module, int], dict] | None = None

    def __post_init__(self):
        if self.latents is None:  # the noisy latents are the model's hidden_states
            self.latents = lambda batch: self.inputs(batch)["hidden_states"]


def seeded(seed: int, ctor: Callable[[], nn.Module]) -> nn.Module:
    """Construct ``ctor()`` under a fixed seed without disturbing the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ctor()
    return model.float().eval()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed + 12345)


def gens(seed: int, negative: bool = False) -> tuple[torch.Generator, torch.Generator]:
    """Generators of one call's inputs: video-side tensors, then text-side ones (another stream
    for the negative prompt, so the unconditional call differs only in its condition)."""
    return gen(seed), gen(seed + 1 + (7919 if negative else 0))


def timestep(t: torch.Tensor | float | None, batch: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """A (batch,) timestep tensor from a 0…1000 value (``None``: 500), times ``scale``."""
    t = torch.as_tensor(500.0 if t is None else t, dtype=torch.float64) * scale
    return (t.expand(batch) if t.ndim == 0 else t).to(dtype)


def text_mask(batch: int, length: int = TEXT_LEN, pad: int = 2) -> torch.Tensor:
    """Tokenizer-style mask: last sample padded by ``pad`` tokens."""
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[-1, length - pad :] = 0
    return mask


def first(out: Any) -> torch.Tensor:
    return out[0]  # Transformer2DModelOutput.sample or tuple[0]


def noise(seed: int, batch: int, *shape: int) -> torch.Tensor:
    """The video-side noise of a builder: the first draw of its video generator."""
    return torch.randn(batch, *shape, generator=gen(seed))


def sample(tm: TinyModel, steps: int = 2, batch: int = 1, guidance_scale: float = 4.0) -> torch.Tensor:
    """A plain sampling loop: Euler steps of the flow the model predicts, timesteps decreasing
    from 900 to 300, a conditional then an unconditional call per step combined by
    classifier-free guidance (one call when the model has no text condition). Returns the
    final latents."""
    x = tm.latents(batch)
    ts = torch.linspace(900.0, 300.0, steps) if steps > 1 else torch.tensor([900.0])
    with torch.no_grad():
        extra = tm.prepare(tm.model, batch) if tm.prepare is not None else {}
        for i, t in enumerate(ts):
            pred = tm.output(tm.model(**tm.inputs(batch, t, latents=x, **extra)))
            if tm.guidance:
                uncond = tm.output(tm.model(**tm.inputs(batch, t, latents=x, negative=True, **extra)))
                pred = uncond + guidance_scale * (pred - uncond)
            t_next = ts[i + 1] if i + 1 < steps else torch.tensor(0.0)
            x = x + (t_next - t) / 1000.0 * pred
    return x
