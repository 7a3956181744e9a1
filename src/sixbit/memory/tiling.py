"""VAE tiling for :func:`sixbit.memory.enable_memory_optimization`: decoding memory then grows with
the tile, not the video. Applies on any machine, with or without an accelerator."""

from __future__ import annotations

import inspect


def tile_vae(vae, tile_size: int) -> tuple[str, dict | None]:
    """Turn on ``vae``'s tiling with ``tile_size``-pixel tiles: (what was done, the attributes to restore)."""
    if vae is None:
        return "VAE tiling skipped: no VAE (a bare transformer or a pixel-space pipeline)", None
    if not callable(getattr(vae, "enable_tiling", None)):
        return f"VAE tiling skipped: {type(vae).__name__} has no enable_tiling", None
    accepted = inspect.signature(vae.enable_tiling).parameters
    # Overlap: CogVideoX keeps its default overlap factors (1/6, 1/5); VAEs that take a stride get
    # 3/4 of the tile, diffusers' Wan default ratio (256 → 192).
    wanted = {
        "tile_sample_min_height": tile_size,
        "tile_sample_min_width": tile_size,
        "tile_sample_stride_height": tile_size * 3 // 4,
        "tile_sample_stride_width": tile_size * 3 // 4,
    }
    kwargs = {k: v for k, v in wanted.items() if k in accepted}
    saved = {k: v for k, v in vars(vae).items() if k == "use_tiling" or k.startswith("tile_")}
    vae.enable_tiling(**kwargs)
    if not kwargs:
        return f"VAE tiling on {type(vae).__name__} at its default tile size (its enable_tiling takes no size)", saved
    sizes = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    return f"VAE tiling on {type(vae).__name__}: {sizes}", saved
