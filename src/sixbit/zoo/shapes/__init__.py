"""The shapes zoo: tiny text-to-video diffusion transformers that ship inside sixbit.

A procedural world of colored shapes moving over gray backgrounds (:mod:`.world`), a word
embedding text encoder (:mod:`.text_encoder`), two pixel-space video DiTs built from unmodified
diffusers architectures (:mod:`.models`: CogVideoX and Wan), their diffusers pipelines, the
training script (``python -m sixbit.zoo.shapes.train``) and ``sixbit demo`` (:mod:`.demo`).

Example:
    >>> import torch
    >>> from sixbit.zoo.shapes import load_pipeline
    >>> pipe = load_pipeline("wan")                      # shipped weights, no network
    >>> out = pipe("a red circle moving right", generator=torch.Generator().manual_seed(0))
    >>> out.frames.shape                                 # (videos, frames, H, W, RGB) in [0, 1]
    (1, 8, 32, 32, 3)
"""

from __future__ import annotations

from pathlib import Path

from .world import COLORS, DIRECTIONS, HELDOUT_PAIRS, SHAPES, VOCABULARY, all_prompts, heldout_pairs, parse_prompt

#: Folder holding the shipped weights, one ``save_pretrained`` pipeline folder per architecture.
WEIGHTS_DIR = Path(__file__).parent / "weights"

__all__ = [
    "COLORS",
    "DIRECTIONS",
    "HELDOUT_PAIRS",
    "SHAPES",
    "VOCABULARY",
    "WEIGHTS_DIR",
    "all_prompts",
    "heldout_pairs",
    "load_pipeline",
    "make_pipeline",
    "parse_prompt",
    "pipeline_class",
]


def pipeline_class(arch: str):
    """The pipeline class of ``arch`` (``"cogvideox"`` or ``"wan"``)."""
    from .models import get_arch

    get_arch(arch)
    if arch == "cogvideox":
        from .pipeline_cogvideox import ShapesCogVideoXPipeline

        return ShapesCogVideoXPipeline
    from .pipeline_wan import ShapesWanPipeline

    return ShapesWanPipeline


def make_pipeline(arch: str, transformer=None, text_encoder=None, seed: int | None = 0, **overrides):
    """A pipeline with freshly initialised weights (``seed`` fixes them) or the given modules.

    ``overrides`` change the transformer config, e.g. ``num_layers=1`` for fast tests.
    """
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    from .models import TEXT_DIM, TEXT_LENGTH, build_transformer
    from .text_encoder import ShapesTextEncoder

    if seed is not None:
        torch.manual_seed(seed)
    if text_encoder is None:
        text_encoder = ShapesTextEncoder(embed_dim=TEXT_DIM, max_length=TEXT_LENGTH)
    if transformer is None:
        transformer = build_transformer(arch, **overrides)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    return pipeline_class(arch)(text_encoder=text_encoder, transformer=transformer, scheduler=scheduler)


def load_pipeline(
    arch: str = "cogvideox",
    path: str | Path | None = None,
    torch_dtype=None,
    device="cpu",
    progress_bar: bool = False,
    **kw,
):
    """Load a shapes pipeline from the shipped weights (or from ``path``), never touching the network.

    Args:
        arch ("cogvideox" | "wan", default "cogvideox"): which shipped model.
        path (path, default None): a ``save_pretrained`` folder; defaults to the shipped weights.
        torch_dtype (default torch.float32): weights are stored in float16 and upcast exactly.
        device (default "cpu"): where to put the modules.
        progress_bar (bool, default False): show diffusers' per-step progress bar when sampling.
        kw: passed to ``DiffusionPipeline.from_pretrained``.
    """
    import torch

    cls = pipeline_class(arch)
    folder = Path(path) if path is not None else WEIGHTS_DIR / arch
    if not (folder / "model_index.json").is_file():
        raise ValueError(
            f"no shapes pipeline at {folder} (model_index.json missing); train one with "
            f"`python -m sixbit.zoo.shapes.train --arch {arch}` or pass path= to a save_pretrained folder"
        )
    from diffusers.utils import logging as diffusers_logging

    # diffusers draws a "Loading pipeline components" bar; keep it off unless bars were asked for.
    bars_were_on = diffusers_logging.is_progress_bar_enabled()
    if not progress_bar:
        diffusers_logging.disable_progress_bar()
    try:
        pipe = cls.from_pretrained(folder, dtype=torch_dtype or torch.float32, local_files_only=True, **kw)
    finally:
        if bars_were_on:
            diffusers_logging.enable_progress_bar()
    pipe.set_progress_bar_config(disable=not progress_bar)
    return pipe.to(device)
