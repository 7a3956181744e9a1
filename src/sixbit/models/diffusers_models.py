"""Registered metadata of the diffusers video transformers.

Block I/O comes from each block class's ``forward`` in diffusers; role patterns beyond
:data:`~sixbit.models.registry.DEFAULT_ROLES` are listed per model.
"""

from __future__ import annotations

import torch

from .registry import BlockIO, ModelSpec, register_model
from .roles import Role

# Blocks that update both the video and the text stream and return them in this order.
_JOINT = BlockIO(hidden="hidden_states", encoder="encoder_hidden_states", returns=("hidden", "encoder"))
# Blocks that read the text tokens (cross-attention) but return only the video stream.
_VIDEO_ONLY = BlockIO(hidden="hidden_states", encoder=None, returns=("hidden",))
# Audio-video blocks: the audio tokens are a second residual stream, returned after the video.
_AUDIO_VIDEO = BlockIO(hidden="hidden_states", encoder="audio_hidden_states", returns=("hidden", "encoder"))


def _patch_sizes(config) -> tuple[int, int, int]:
    """(temporal, height, width) patch sizes from a diffusers transformer config."""
    p = config.patch_size
    if isinstance(p, (tuple, list)):
        return int(p[0]), int(p[1]), int(p[2])
    return int(getattr(config, "patch_size_t", None) or 1), int(p), int(p)


def _shape_5d(layout: str):
    """Token grid (frames, rows, columns) of a model whose ``hidden_states`` are a ``layout``
    (BFCHW or BCFHW) latent."""

    def shape(model, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        if x is None or x.ndim != 5:
            return None
        f, h, w = (x.shape[1], x.shape[3], x.shape[4]) if layout == "BFCHW" else tuple(x.shape[2:])
        pt, ph, pw = _patch_sizes(model.config)
        return f // pt, h // ph, w // pw

    return shape


def _grid_5d(layout: str):
    """Token grid (frames, tokens per frame) of a ``layout`` latent."""
    shape = _shape_5d(layout)

    def grid(model, args, kwargs):
        found = shape(model, args, kwargs)
        return None if found is None else (found[0], found[1] * found[2])

    return grid


def _cogvideox_encode(vae, video):
    return vae.encode(video).latent_dist.mode() * vae.config.scaling_factor


def _wan_encode(vae, video):
    latents = vae.encode(video).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean, dtype=latents.dtype).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=latents.dtype).view(1, -1, 1, 1, 1)
    return (latents - mean) / std


def _cogvideox_context_parallel(model) -> dict:
    """Split the video tokens from the first block to ``proj_out`` (the text stays whole on every rank)."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    plan = {
        "transformer_blocks.0": {"hidden_states": ContextParallelInput(split_dim=1, expected_dims=3)},
        "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
    }
    if model.config.use_rotary_positional_embeddings:  # the video tokens' (cos, sin) tables, split alike
        rotary = ContextParallelInput(split_dim=0, expected_dims=2)
        plan[""] = {"image_rotary_emb": (rotary, rotary)}
    return plan


register_model(
    ModelSpec(
        name="cogvideox",  # 1.0 and 1.5 configs share the class and the block layout
        classes=("CogVideoXTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_JOINT,),
        video_grid=_grid_5d("BFCHW"),
        video_shape=_shape_5d("BFCHW"),
        text_tokens="first",  # joint attention and FF run on cat([text, video])
        latent_layout="BFCHW",
        encode_video=_cogvideox_encode,
        context_parallel=_cogvideox_context_parallel,  # diffusers ships none for CogVideoX
    )
)
register_model(
    ModelSpec(
        name="wan",
        classes=("WanTransformer3DModel",),
        block_lists=("blocks",),
        block_io=(_VIDEO_ONLY,),
        video_grid=_grid_5d("BCFHW"),
        video_shape=_shape_5d("BCFHW"),
        latent_layout="BCFHW",
        encode_video=_wan_encode,
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
        video_shape=_shape_5d("BCFHW"),
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
        video_shape=_shape_5d("BCFHW"),
    )
)
register_model(
    ModelSpec(
        name="allegro",
        classes=("AllegroTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_VIDEO_ONLY,),
        video_grid=_grid_5d("BCFHW"),
        video_shape=_shape_5d("BCFHW"),
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


# Models whose blocks take the video stream first and return it alone, with every linear named
# by DEFAULT_ROLES, need nothing here: the generic fallback finds them (SkyReels-V2, ChronoEdit,
# Helios, AnyFlow and AnyFlow-FAR, Cosmos, Sana-Video).

register_model(
    ModelSpec(
        name="hunyuanvideo-1.5",
        classes=("HunyuanVideo15Transformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_JOINT,),
        roles=((Role.EMBEDDING, r"context_embedder_2\..*"),),  # the ByT5 glyph-text projection
        video_grid=_grid_5d("BCFHW"),
        video_shape=_shape_5d("BCFHW"),
    )
)
register_model(
    ModelSpec(
        name="hunyuanvideo-framepack",
        classes=("HunyuanVideoFramepackTransformer3DModel",),
        block_lists=("transformer_blocks", "single_transformer_blocks"),  # HunyuanVideo's blocks
        block_io=(_JOINT, _JOINT),
        roles=(
            (Role.FEEDFORWARD, r"single_transformer_blocks\.\d+\.proj_out"),
            (Role.EMBEDDING, r"image_projection\..*"),
        ),
        # no video_grid: the clean and history latents are packed in front of the section's tokens
        text_tokens="last",
    )
)
register_model(
    ModelSpec(
        name="motif-video",
        classes=("MotifVideoTransformer3DModel",),
        block_lists=("transformer_blocks", "single_transformer_blocks"),
        # single-stream (and decoder) blocks take and return both streams as well
        block_io=(_JOINT, _JOINT),
        roles=((Role.FEEDFORWARD, r"single_transformer_blocks\.\d+\.proj_out"),),
        video_grid=_grid_5d("BCFHW"),
        video_shape=_shape_5d("BCFHW"),
        text_tokens="last",  # single-stream blocks run on cat([video, text])
    )
)
register_model(
    ModelSpec(
        name="easyanimate",
        classes=("EasyAnimateTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_JOINT,),
        roles=(
            (Role.FEEDFORWARD, r"transformer_blocks\.\d+\.txt_ff\..*"),
            (Role.EMBEDDING, r"text_proj(_t5)?"),
        ),
        video_grid=_grid_5d("BCFHW"),
        video_shape=_shape_5d("BCFHW"),
        text_tokens="first",  # blocks past mmdit_layers share to_q/k/v over cat([text, video])
    )
)
register_model(
    ModelSpec(
        name="consisid",
        classes=("ConsisIDTransformer3DModel",),
        block_lists=("transformer_blocks",),  # CogVideoX blocks; the face cross-attention runs between them
        block_io=(_JOINT,),
        roles=(
            (Role.EMBEDDING, r"local_facial_extractor\..*"),
            (Role.ATTENTION, r"perceiver_cross_attention\.\d+\.(to_q|to_kv|to_out)"),
        ),
        video_grid=_grid_5d("BFCHW"),
        video_shape=_shape_5d("BFCHW"),
        text_tokens="first",
    )
)

# Kandinsky 5 / 6 name attention projections to_query/to_key/to_value/out_layer. Their text
# encoder blocks (*text_transformer_blocks) refine the prompt before the video blocks, like
# HunyuanVideo's token refiner: embedding, kept in full precision and outside the block lists.
_KANDINSKY_ROLES = (
    (Role.OUTPUT, r"(audio_)?out_layer\..*"),
    (Role.EMBEDDING, r"\w*(embeddings|text_transformer_blocks)\..*"),
    (Role.MODULATION, r".*_modulation\.out_layer"),
    (Role.ATTENTION, r".*\.(self_attention|cross_attention|va_cross_attention|av_cross_attention)"
                     r"\.(to_query|to_key|to_value|out_layer)"),
)
register_model(
    ModelSpec(
        name="kandinsky5",
        classes=("Kandinsky5Transformer3DModel",),
        block_lists=("visual_transformer_blocks",),
        block_io=(BlockIO(hidden="visual_embed"),),
        roles=_KANDINSKY_ROLES,
        # no video_grid: sparse attention may reorder the tokens into fractal order
    )
)
register_model(
    ModelSpec(
        name="kandinsky6",
        classes=("Kandinsky6Transformer3DModel",),
        block_lists=("visual_transformer_blocks",),
        # fused video/audio blocks: (video, audio) in and out; audio is None for video-only calls
        block_io=(BlockIO(hidden="vis", encoder="aud", returns=("hidden", "encoder")),),
        roles=_KANDINSKY_ROLES,
    )
)
register_model(
    ModelSpec(
        name="kandinsky6-sr",
        classes=("Kandinsky6SRTransformer3DModel",),
        block_lists=("visual_transformer_blocks",),
        roles=_KANDINSKY_ROLES,
    )
)

# LTX-2 and SANA-WM's refiner (built on it): audio self/cross-attention and the audio<->video
# cross-attention live in the same blocks; timestep embedders of both modalities are embeddings.
_LTX2_ROLES = (
    (Role.ATTENTION, r".*\.(audio_attn\d*|audio_to_video_attn|video_to_audio_attn)\.(to_q|to_k|to_v|to_out\.0)"),
    (Role.FEEDFORWARD, r".*\.audio_ff\..*"),
    (Role.EMBEDDING, r"(audio_proj_in|audio_caption_projection|audio_time_embed|av_cross_attn_\w+)(\..*)?"),
    (Role.OUTPUT, r"audio_proj_out|audio_norm_out\..*"),
)
register_model(
    ModelSpec(
        name="ltx2",
        classes=("LTX2VideoTransformer3DModel",),
        block_lists=("transformer_blocks",),
        block_io=(_AUDIO_VIDEO,),
        roles=_LTX2_ROLES,
    )
)
register_model(
    ModelSpec(
        name="sana-wm-refiner",
        classes=("SanaWMLTX2RefinerTransformer3DModel",),
        block_lists=("transformer_blocks",),  # video-only calls: the blocks return the video stream
        # Its forward is video-only: the audio layers (built so LTX-2 checkpoints load) never run,
        # so no calibration sees them. OTHER keeps them out of every quantization plan.
        roles=((Role.OTHER, r"(transformer_blocks\.\d+\.)?(audio_\w+|audio_to_video_attn|video_to_audio_attn"
                            r"|av_cross_attn_\w+)(\..*)?"),),
    )
)
register_model(
    ModelSpec(
        name="sana-wm",
        classes=("SanaWMTransformer3DModel",),
        block_lists=("blocks",),
        block_io=(BlockIO(hidden="x"),),
        roles=(
            (Role.ATTENTION, r"blocks\.\d+\.(attn|cross_attn)\.(qkv|proj|q_linear|kv_linear|output_gate"
                             r"|q_proj_cam|k_proj_cam|v_proj_cam|out_proj_cam)"),
            # per-head decay and write strength of the gated linear attention: scalars per token
            (Role.MODULATION, r"blocks\.\d+\.attn\.(gate_proj|beta_proj)"),
            (Role.EMBEDDING, r"(blocks\.\d+\.plucker_proj|t_block\..*|t_embedder\..*|y_embedder\..*)"),
            (Role.OUTPUT, r"final_layer\..*"),
        ),
        video_grid=_grid_5d("BCFHW"),
        video_shape=_shape_5d("BCFHW"),
    )
)
register_model(
    ModelSpec(
        name="minimax-h3",
        classes=("MiniMaxH3Transformer3DModel",),
        block_lists=("transformer_blocks",),  # one packed sequence: text, audio and video rows
        roles=(
            (Role.EMBEDDING, r"(audio_proj_in|time_embedder\..*)"),
            (Role.OUTPUT, r"audio_proj_out"),
        ),
    )
)
_JOYIMAGE_ROLES = (
    (Role.ATTENTION, r".*\.attn\.(img|txt)_attn_(qkv|proj)"),
    (Role.FEEDFORWARD, r".*\.(img|txt)_mlp\..*"),
)
register_model(
    ModelSpec(
        name="joyimage-edit",
        classes=("JoyImageEditTransformer3DModel",),
        block_lists=("double_blocks",),
        block_io=(_JOINT,),
        roles=_JOYIMAGE_ROLES,
        video_grid=_grid_5d("BCFHW"),
        video_shape=_shape_5d("BCFHW"),
    )
)
register_model(
    ModelSpec(
        name="joyimage-edit-plus",
        classes=("JoyImageEditPlusTransformer3DModel",),
        block_lists=("double_blocks",),  # inputs are padded patch lists: no frame grid
        block_io=(_JOINT,),
        roles=_JOYIMAGE_ROLES,
    )
)

# Wan derivatives whose blocks are Wan's but whose lists or extra layers need naming.
register_model(
    ModelSpec(
        name="wan-vace",
        classes=("WanVACETransformer3DModel",),
        # The control blocks (vace_blocks) run first and return (hint, control stream): no
        # BlockIO describes the hint, so only Wan's blocks are skipped and switched; the control
        # blocks' linears are still quantized by role.
        block_lists=("blocks",),
        block_io=(_VIDEO_ONLY,),
        roles=((Role.EMBEDDING, r"vace_blocks\.\d+\.proj_(in|out)"),),  # zero-initialized hint projections
        video_grid=_grid_5d("BCFHW"),
        video_shape=_shape_5d("BCFHW"),
    )
)
register_model(
    ModelSpec(
        name="wan-animate",
        classes=("WanAnimateTransformer3DModel",),
        block_lists=("blocks",),
        block_io=(_VIDEO_ONLY,),
        roles=(
            (Role.ATTENTION, r"face_adapter\.\d+\.(to_q|to_k|to_v|to_out)"),  # face cross-attention between blocks
            (Role.EMBEDDING, r"(face_encoder|motion_encoder)\..*"),
        ),
    )
)
register_model(
    ModelSpec(
        name="wan-animate-2",
        classes=("WanAnimate2Transformer3DModel",),
        block_lists=("blocks",),
        block_io=(_VIDEO_ONLY,),
        roles=(
            (Role.EMBEDDING, r"(text_embedding|time_projection|img_emb)\..*"),
            (Role.OUTPUT, r"head\..*"),
        ),
    )
)
