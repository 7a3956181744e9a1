"""Tiny builders of the video transformers whose blocks carry two streams — the video tokens and
the text tokens, each updated and returned (see :mod:`tiny_base`): HunyuanVideo 1.5 and
FramePack, Motif-Video, EasyAnimate, ConsisID and JoyImage-Edit (and Plus).

Hidden size 32 (2 heads × 16), text width 32, 2 blocks per block list; ConsisID uses 48 (its
face cross-attention projects to ``2/3`` of the hidden size).
"""

from __future__ import annotations

import torch

from tiny_base import HEADS, TEXT_LEN, TinyModel, first, gens, noise, seeded, text_mask, timestep

C = 4  # latent channels


def _text(gt: torch.Generator, batch: int, length: int = TEXT_LEN, dim: int = 32) -> torch.Tensor:
    return torch.randn(batch, length, dim, generator=gt)


def hunyuanvideo_15(seed: int = 0) -> TinyModel:
    """HunyuanVideo 1.5 (t2v): Qwen and ByT5 text streams; zero image tokens without an input image."""
    from diffusers import HunyuanVideo15Transformer3DModel

    model = seeded(seed, lambda: HunyuanVideo15Transformer3DModel(
        in_channels=C, out_channels=C, num_attention_heads=HEADS, attention_head_dim=16, num_layers=2,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=32, text_embed_2_dim=32,
        image_embed_dim=32, rope_axes_dim=(4, 6, 6), target_size=16, task_type="t2v",
    ))

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, 2, 4, 4, generator=g)
        return dict(
            hidden_states=x if latents is None else latents,
            timestep=timestep(t, batch, torch.float32),
            encoder_hidden_states=_text(gt, batch),
            encoder_attention_mask=text_mask(batch),
            encoder_hidden_states_2=_text(gt, batch, 4),
            encoder_attention_mask_2=text_mask(batch, 4, 1),
            image_embeds=torch.zeros(batch, 3, 32),
        )

    return TinyModel("hunyuanvideo-1.5", model, inputs, first, ("transformer_blocks",))


def hunyuanvideo_framepack(seed: int = 0) -> TinyModel:
    """FramePack: the next section plus clean / 2× / 4× history latents, each with frame indices."""
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    model = seeded(seed, lambda: HunyuanVideoFramepackTransformer3DModel(
        in_channels=C, out_channels=C, num_attention_heads=HEADS, attention_head_dim=16, num_layers=2,
        num_single_layers=2, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=32, pooled_projection_dim=32, rope_axes_dim=(4, 6, 6), image_condition_type=None,
        has_image_proj=True, image_proj_dim=32, has_clean_x_embedder=True,
    ))
    f, h, w = 2, 8, 8

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, f, h, w, generator=g)
        return dict(
            hidden_states=x if latents is None else latents,
            timestep=timestep(t, batch, torch.float32),
            encoder_hidden_states=_text(gt, batch),
            encoder_attention_mask=text_mask(batch),
            pooled_projections=torch.randn(batch, 32, generator=gt),
            image_embeds=torch.randn(batch, TEXT_LEN, 32, generator=g),
            indices_latents=torch.arange(1, 1 + f),
            guidance=torch.full((batch,), 10.0) * 1000.0,
            latents_clean=torch.randn(batch, C, 1, h, w, generator=g),
            indices_latents_clean=torch.tensor([0]),
            latents_history_2x=torch.randn(batch, C, 2, h, w, generator=g),
            indices_latents_history_2x=torch.tensor([3, 4]),
            latents_history_4x=torch.randn(batch, C, 4, h, w, generator=g),
            indices_latents_history_4x=torch.tensor([5, 6, 7, 8]),
        )

    return TinyModel("hunyuanvideo-framepack", model, inputs, first,
                     ("transformer_blocks", "single_transformer_blocks"))


def motif_video(seed: int = 0) -> TinyModel:
    """Motif-Video (t2v): latents, image-condition latents and a mask concatenated on channels;
    the last single-stream block is a decoder block (the video from the encoder blocks as context)."""
    from diffusers import MotifVideoTransformer3DModel

    model = seeded(seed, lambda: MotifVideoTransformer3DModel(
        in_channels=2 * C + 1, out_channels=C, num_attention_heads=HEADS, attention_head_dim=16, num_layers=2,
        num_single_layers=2, num_decoder_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=32,
        image_embed_dim=None, rope_axes_dim=(4, 6, 6),
    ))
    shape = (2, 4, 4)

    def latents(batch):
        return noise(seed, batch, C, *shape)

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, *shape, generator=g)
        x = x if latents is None else latents
        cond = torch.zeros(batch, C + 1, *shape)  # no conditioning image: zero latents and mask
        return dict(
            hidden_states=torch.cat([x, cond], dim=1),
            timestep=timestep(t, batch, torch.float32),
            encoder_hidden_states=_text(gt, batch),
            encoder_attention_mask=text_mask(batch),
        )

    return TinyModel("motif-video", model, inputs, first, ("transformer_blocks", "single_transformer_blocks"),
                     latents=latents)


def easyanimate(seed: int = 0) -> TinyModel:
    """EasyAnimate V5: an MMDiT block (separate text and video weights), then one sharing its
    projections over cat([text, video]); the pipeline calls the model positionally."""
    from diffusers import EasyAnimateTransformer3DModel

    model = seeded(seed, lambda: EasyAnimateTransformer3DModel(
        num_attention_heads=HEADS, attention_head_dim=16, in_channels=C, out_channels=C, patch_size=2,
        sample_width=8, sample_height=8, num_layers=2, mmdit_layers=1, time_embed_dim=32, text_embed_dim=32,
        time_position_encoding_type="3d_rope", timestep_activation_fn="silu",
    ))

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, 2, 8, 8, generator=g)
        return dict(
            hidden_states=x if latents is None else latents,
            timestep=timestep(t, batch, torch.long),
            encoder_hidden_states=_text(gt, batch),
        )

    return TinyModel("easyanimate", model, inputs, first, ("transformer_blocks",))


def consisid(seed: int = 0) -> TinyModel:
    """ConsisID: CogVideoX blocks plus face features (ArcFace + ViT) injected after each block."""
    from diffusers import ConsisIDTransformer3DModel

    model = seeded(seed, lambda: ConsisIDTransformer3DModel(
        num_attention_heads=HEADS, attention_head_dim=24, in_channels=C, out_channels=C, time_embed_dim=32,
        text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
        max_text_seq_length=TEXT_LEN, cross_attn_interval=1, is_kps=False, is_train_face=True,
        cross_attn_dim_head=16, cross_attn_num_heads=HEADS, LFE_id_dim=32, LFE_vit_dim=32, LFE_depth=1,
        LFE_dim_head=16, LFE_num_heads=HEADS, LFE_num_id_token=1, LFE_num_querie=2, LFE_output_dim=32,
        LFE_ff_mult=1, LFE_num_scale=1,
    ))

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, 2, C, 8, 8, generator=g)  # (B, F, C, H, W)
        return dict(
            hidden_states=x if latents is None else latents,
            encoder_hidden_states=_text(gt, batch),
            timestep=timestep(t, batch, torch.long),
            id_vit_hidden=[torch.randn(batch, 2, 32, generator=g)],
            id_cond=torch.randn(batch, 32, generator=g),
        )

    return TinyModel("consisid", model, inputs, first, ("transformer_blocks",))


def _joyimage(cls_name: str, name: str, seed: int) -> TinyModel:
    import diffusers

    model = seeded(seed, lambda: getattr(diffusers, cls_name)(
        patch_size=[1, 2, 2], in_channels=C, hidden_size=32, num_attention_heads=HEADS, text_dim=32, num_layers=2,
        rope_dim_list=[4, 6, 6], theta=256,
    ))
    plus = name.endswith("plus")
    # JoyImage-Edit: (B, C, F, H, W) with the reference image as a frame; Edit-Plus: patchified
    # (B, patches, C, 1, 2, 2) for the target and one reference, each 2 × 2 patches
    shape = (8, C, 1, 2, 2) if plus else (C, 2, 8, 8)

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, *shape, generator=g)
        kw = dict(
            hidden_states=x if latents is None else latents,
            encoder_hidden_states=_text(gt, batch, 6),  # not 8: the streams' shapes tell them apart
            timestep=timestep(t, batch, torch.float32),
        )
        if plus:
            kw["shape_list"] = [[(1, 2, 2), (1, 2, 2)]] * batch
        return kw

    return TinyModel(name, model, inputs, first, ("double_blocks",))


def joyimage_edit(seed: int = 0) -> TinyModel:
    return _joyimage("JoyImageEditTransformer3DModel", "joyimage-edit", seed)


def joyimage_edit_plus(seed: int = 0) -> TinyModel:
    return _joyimage("JoyImageEditPlusTransformer3DModel", "joyimage-edit-plus", seed)


BUILDERS = {
    "hunyuanvideo-1.5": hunyuanvideo_15,
    "hunyuanvideo-framepack": hunyuanvideo_framepack,
    "motif-video": motif_video,
    "easyanimate": easyanimate,
    "consisid": consisid,
    "joyimage-edit": joyimage_edit,
    "joyimage-edit-plus": joyimage_edit_plus,
}
