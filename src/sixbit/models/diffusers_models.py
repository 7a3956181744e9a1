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

register_model(
    ModelSpec(
        name="cogvideox",  # 1.0 and 1.5 configs share the class and the block layout
        classes=("CogVideoXTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_JOINT,),
    )
)
register_model(
    ModelSpec(
        name="wan",
        classes=("WanTransformer3DModel",),
        block_lists=("blocks",),
        block_io=(_VIDEO_ONLY,),
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
    )
)
register_model(
    ModelSpec(
        name="allegro",
        classes=("AllegroTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_VIDEO_ONLY,),
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
