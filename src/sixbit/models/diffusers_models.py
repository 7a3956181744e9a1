"""Registered metadata of the diffusers video transformers.

Block I/O comes from each block class's ``forward`` in diffusers; role patterns beyond
:data:`~sixbit.models.registry.DEFAULT_ROLES` are listed per model.
"""

from __future__ import annotations

from ..config import Role
from .registry import BlockIO, ModelSpec, register_model

# Blocks that update both the video and the text stream and return them in this order.
_JOINT = BlockIO(hidden="hidden_states", encoder="encoder_hidden_states", returns=("hidden", "encoder"))
# Blocks that read the text tokens (cross-attention) but return only the video stream.
_VIDEO_ONLY = BlockIO(hidden="hidden_states", encoder=None, returns=("hidden",))



def _patch_sizes(config) -> tuple[int, int, int]:
    """(temporal, height, width) patch sizes from a diffusers transformer config."""
    p = config.patch_size
    if isinstance(p, (tuple, list)):
        return int(p[0]), int(p[1]), int(p[2])
    return int(getattr(config, "patch_size_t", None) or 1), int(p), int(p)


def _grid_5d(layout: str):
    """Token grid of a model whose ``hidden_states`` are a ``layout`` (BFCHW or BCFHW) latent."""

    def grid(model, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        if x is None or x.ndim != 5:
            return None
        f, h, w = (x.shape[1], x.shape[3], x.shape[4]) if layout == "BFCHW" else tuple(x.shape[2:])
        pt, ph, pw = _patch_sizes(model.config)
        return f // pt, (h // ph) * (w // pw)

    return grid


register_model(
    ModelSpec(
        name="cogvideox",  # 1.0 and 1.5 configs share the class and the block layout
        classes=("CogVideoXTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_JOINT,),
        video_grid=_grid_5d("BFCHW"),
        text_tokens="first",  # joint attention and FF run on cat([text, video])
    )
)
register_model(
    ModelSpec(
        name="wan",
        classes=("WanTransformer3DModel",),
        block_lists=("blocks",),
        block_io=(_VIDEO_ONLY,),
        video_grid=_grid_5d("BCFHW"),
    )
)
register_model(
    ModelSpec(
        name="hunyuanvideo",
        classes=("HunyuanVideoTransformer3DModel",),
        block_lists=("transformer_blocks", "single_transformer_blocks"),
        block_io=(_JOINT, _JOINT),
        # single-stream blocks fuse attention output and MLP in one projection
        roles=((Role.FEEDFORWARD, r"single_transformer_blocks\.\d+\.proj_out"),),
        video_grid=_grid_5d("BCFHW"),
        text_tokens="last",  # single-stream blocks run on cat([video, text])
    )
)
register_model(
    ModelSpec(
        name="ltx-video",
        classes=("LTXVideoTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_VIDEO_ONLY,),
    )
)
register_model(
    ModelSpec(
        name="mochi",
        classes=("MochiTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_JOINT,),
        video_grid=_grid_5d("BCFHW"),
    )
)
register_model(
    ModelSpec(
        name="allegro",
        classes=("AllegroTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_VIDEO_ONLY,),
        video_grid=_grid_5d("BCFHW"),
    )
)
register_model(
    ModelSpec(
        name="latte",
        classes=("LatteTransformer3DModel",),
        block_lists=("transformer_blocks", "temporal_transformer_blocks"),
        block_io=(_VIDEO_ONLY,),
        interleaved=True,
    )
)
