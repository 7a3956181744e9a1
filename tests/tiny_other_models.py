"""Tiny builders of the other video transformers diffusers ships (see :mod:`tiny_base`).

Hidden size 32 (2 heads × 16) unless noted, text width 32, 2 blocks per block list.
ConsisID uses 48 (its face cross-attention projects to ``2/3`` of the hidden size).
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


def cosmos(seed: int = 0) -> TinyModel:
    """Cosmos-Predict 2.5 (video2world): a condition-mask channel, sigma as the timestep.

    ``concat_padding_mask=False``: resizing the padding mask needs torchvision, which is not
    installed here; the blocks are the same either way.
    """
    from diffusers import CosmosTransformer3DModel

    model = seeded(seed, lambda: CosmosTransformer3DModel(
        in_channels=C + 1, out_channels=C, num_attention_heads=HEADS, attention_head_dim=16, num_layers=2, mlp_ratio=2,
        text_embed_dim=32, adaln_lora_dim=16, max_size=(4, 16, 16), patch_size=(1, 2, 2), rope_scale=(2.0, 1.0, 1.0),
        concat_padding_mask=False, extra_pos_embed_type="learnable",
    ))
    shape = (2, 8, 8)

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, *shape, generator=g)
        mask = torch.zeros(batch, 1, *shape)
        mask[:, :, 0] = 1.0  # the first latent frame is the conditioning frame
        return dict(
            hidden_states=x if latents is None else latents,
            condition_mask=mask,
            timestep=timestep(t, batch, torch.float32, scale=1e-3),
            encoder_hidden_states=_text(gt, batch),
            fps=24,
        )

    return TinyModel("cosmos", model, inputs, first, ("transformer_blocks",))


def _kandinsky_rope_pos(frames: int, height: int, width: int) -> list[torch.Tensor]:
    return [torch.arange(frames), torch.arange(height // 2), torch.arange(width // 2)]


def kandinsky5(seed: int = 0) -> TinyModel:
    """Kandinsky 5 (t2v): (B, F, H, W, C) latents with the conditioning latents and mask appended.

    diffusers zero-initializes the modulation projections (every gate 0: blocks would be the
    identity, ignoring text and timestep); they get nn.Linear's default init here."""
    from diffusers import Kandinsky5Transformer3DModel
    from diffusers.models.transformers.transformer_kandinsky import Kandinsky5Modulation

    def build():
        model = Kandinsky5Transformer3DModel(
            in_visual_dim=C, in_text_dim=32, in_text_dim2=32, time_dim=32, out_visual_dim=C, patch_size=(1, 2, 2),
            model_dim=32, ff_dim=64, num_text_blocks=1, num_visual_blocks=2, axes_dims=(4, 6, 6), visual_cond=True,
        )
        for m in model.modules():
            if isinstance(m, Kandinsky5Modulation):
                m.out_layer.reset_parameters()
        return model

    model = seeded(seed, build)
    f, h, w = 2, 8, 8

    def latents(batch):
        return noise(seed, batch, f, h, w, C)

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, f, h, w, C, generator=g)
        x = x if latents is None else latents
        return dict(
            hidden_states=torch.cat([x, torch.zeros(batch, f, h, w, C + 1)], dim=-1),  # no visual condition
            encoder_hidden_states=_text(gt, batch),
            timestep=timestep(t, batch, torch.float32),
            pooled_projections=torch.randn(batch, 32, generator=gt),
            visual_rope_pos=_kandinsky_rope_pos(f, h, w),
            text_rope_pos=torch.arange(TEXT_LEN),
            scale_factor=(1.0, 2.0, 2.0),
        )

    return TinyModel("kandinsky5", model, inputs, first, ("visual_transformer_blocks",), latents=latents)


def kandinsky6(seed: int = 0) -> TinyModel:
    """Kandinsky 6 (ti2va): fused video/audio blocks; the audio latents stay fixed in this loop."""
    from diffusers import Kandinsky6Transformer3DModel

    model = seeded(seed, lambda: Kandinsky6Transformer3DModel(
        in_visual_dim=C, out_visual_dim=C, in_text_dim=32, in_text_dim2=32, time_dim=32, patch_size=(1, 2, 2),
        model_dim=32, ff_dim=64, num_text_blocks=1, num_visual_blocks=2, axes_dims=(4, 6, 6), visual_cond=True,
        in_audio_dim=16, out_audio_dim=16,
    ))
    f, h, w = 2, 8, 8

    def latents(batch):
        return noise(seed, batch, f, h, w, C)

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, f, h, w, C, generator=g)
        x = x if latents is None else latents
        return dict(
            hidden_states=torch.cat([x, torch.zeros(batch, f, h, w, C + 1)], dim=-1),
            audio_hidden_states=torch.randn(batch, 5, 16, generator=g),
            encoder_hidden_states=_text(gt, batch),
            pooled_projections=torch.randn(batch, 32, generator=gt),
            timestep=timestep(t, batch, torch.float32),
            visual_rope_pos=_kandinsky_rope_pos(f, h, w),
        )

    return TinyModel("kandinsky6", model, inputs, first, ("visual_transformer_blocks",), latents=latents)


def kandinsky6_sr(seed: int = 0) -> TinyModel:
    """Kandinsky 6 video super-resolution: no text, so one call per step (no guidance)."""
    from diffusers import Kandinsky6SRTransformer3DModel

    model = seeded(seed, lambda: Kandinsky6SRTransformer3DModel(
        in_visual_dim=C, out_visual_dim=C, time_dim=32, patch_size=(1, 2, 2), model_dim=32, ff_dim=64,
        num_visual_blocks=2, axes_dims=(4, 6, 6),
    ))
    f, h, w = 2, 16, 16

    def latents(batch):
        return noise(seed, batch, f, h, w, C)

    def inputs(batch, t=None, latents=None, negative=False):
        g, _ = gens(seed, negative)
        x = torch.randn(batch, f, h, w, C, generator=g)
        x = x if latents is None else latents
        anchor = torch.randn(batch, f, h, w, C, generator=g)  # the low-resolution video's latents
        return dict(
            hidden_states=torch.cat([x, anchor, torch.ones(batch, f, h, w, 1)], dim=-1),
            timestep=timestep(t, batch, torch.float32),
        )

    return TinyModel("kandinsky6-sr", model, inputs, first, ("visual_transformer_blocks",), latents=latents,
                     guidance=False)


def ltx2(seed: int = 0) -> TinyModel:
    """LTX-2: packed video tokens and audio tokens updated by the same blocks (audio fixed here)."""
    from diffusers import LTX2VideoTransformer3DModel

    model = seeded(seed, lambda: LTX2VideoTransformer3DModel(
        in_channels=C, out_channels=C, patch_size=1, patch_size_t=1, num_attention_heads=HEADS, attention_head_dim=16,
        cross_attention_dim=32, audio_in_channels=C, audio_out_channels=C, audio_num_attention_heads=HEADS,
        audio_attention_head_dim=16, audio_cross_attention_dim=32, num_layers=2, caption_channels=32,
        rope_double_precision=False,
    ))
    f, h, w, audio_frames = 2, 4, 4, 5

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, f * h * w, C, generator=g)
        return dict(
            hidden_states=x if latents is None else latents,
            audio_hidden_states=torch.randn(batch, audio_frames, C, generator=g),
            encoder_hidden_states=_text(gt, batch),
            audio_encoder_hidden_states=_text(gt, batch),
            timestep=timestep(t, batch, torch.float32),
            encoder_attention_mask=text_mask(batch).bool(),
            num_frames=f,
            height=h,
            width=w,
            audio_num_frames=audio_frames,
            fps=24.0,
        )

    return TinyModel("ltx2", model, inputs, first, ("transformer_blocks",))


def sana_video(seed: int = 0) -> TinyModel:
    from diffusers import SanaVideoTransformer3DModel

    model = seeded(seed, lambda: SanaVideoTransformer3DModel(
        in_channels=C, out_channels=C, num_attention_heads=HEADS, attention_head_dim=16, num_layers=2,
        num_cross_attention_heads=HEADS, cross_attention_head_dim=16, cross_attention_dim=32, caption_channels=32,
        mlp_ratio=2.5, sample_size=8, patch_size=(1, 2, 2), norm_elementwise_affine=False, norm_eps=1e-6,
        rope_max_seq_len=32,
    ))

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, 2, 8, 8, generator=g)
        return dict(
            hidden_states=x if latents is None else latents,
            encoder_hidden_states=_text(gt, batch),
            encoder_attention_mask=text_mask(batch),
            timestep=timestep(t, batch, torch.float32),
        )

    return TinyModel("sana-video", model, inputs, first, ("transformer_blocks",))


def sana_wm(seed: int = 0) -> TinyModel:
    """SANA-WM: camera-controlled world model; per-frame timesteps, camera poses, Plücker rays.
    Block 0 has the gated linear attention (GDN), block 1 softmax attention. diffusers
    zero-initializes the GDN's short convolutions (the branch would return zeros); they get
    random weights here, as a checkpoint has."""
    from diffusers import SanaWMTransformer3DModel
    from diffusers.models.transformers.transformer_sana_wm import SanaWMTemporalShortConvolution

    def build():
        model = SanaWMTransformer3DModel(
            in_channels=C, num_layers=2, hidden_size=32, num_attention_heads=HEADS, patch_size=(1, 1, 1),
            softmax_every_n=2, linear_head_dim=16, t_kernel_size=3, conv_kernel_size=4, caption_channels=32,
            mlp_ratio=2.0, chunk_plucker_channels=8, chunk_plucker_post_attn_blocks=2,
        )
        for m in model.modules():
            if isinstance(m, SanaWMTemporalShortConvolution):
                torch.nn.init.normal_(m.weight, std=0.5)
        return model

    model = seeded(seed, build)
    f, h, w = 4, 4, 4
    c2w = torch.eye(4).repeat(f, 1, 1)
    c2w[:, 2, 3] = torch.arange(f) * 0.1  # moving forward
    camera = torch.cat([c2w.flatten(-2), torch.tensor([float(w), float(h), w / 2, h / 2]).expand(f, 4)], dim=-1)

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, f, h, w, generator=g)
        return dict(
            hidden_states=x if latents is None else latents,
            timestep=timestep(t, batch, torch.float32)[:, None, None].expand(batch, 1, f).contiguous(),
            encoder_hidden_states=_text(gt, batch)[:, None],
            encoder_attention_mask=text_mask(batch),
            camera_conditions=camera.expand(batch, f, 20),
            chunk_plucker=torch.randn(batch, 8, f, h, w, generator=g),
        )

    return TinyModel("sana-wm", model, inputs, first, ("blocks",))


def sana_wm_refiner(seed: int = 0) -> TinyModel:
    """SANA-WM's LTX-2-based refiner: video tokens only, per-token timesteps, RoPE given by the caller."""
    from diffusers import SanaWMLTX2RefinerTransformer3DModel

    model = seeded(seed, lambda: SanaWMLTX2RefinerTransformer3DModel(
        in_channels=C, out_channels=C, patch_size=1, patch_size_t=1, num_attention_heads=HEADS, attention_head_dim=16,
        cross_attention_dim=32, audio_in_channels=C, audio_out_channels=C, audio_num_attention_heads=HEADS,
        audio_attention_head_dim=16, audio_cross_attention_dim=32, num_layers=2, caption_channels=32,
        rope_double_precision=False,
    ))
    f, h, w = 2, 4, 4
    n = f * h * w

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, n, C, generator=g)
        rope = model.build_rotary_emb_for_absolute_positions(
            batch_size=batch, frame_positions=list(range(f)), height=h, width=w, device=torch.device("cpu"), fps=24.0,
        )
        return dict(
            hidden_states=x if latents is None else latents,
            encoder_hidden_states=_text(gt, batch),
            timestep=timestep(t, batch, torch.float32)[:, None].expand(batch, n).contiguous(),
            video_rotary_emb=rope,
            encoder_attention_mask=text_mask(batch),
        )

    return TinyModel("sana-wm-refiner", model, inputs, first, ("transformer_blocks",))


def minimax_h3(seed: int = 0) -> TinyModel:
    """MiniMax-H3: one packed sequence of text, audio and video rows; timesteps per modality."""
    from diffusers import MiniMaxH3Transformer3DModel

    model = seeded(seed, lambda: MiniMaxH3Transformer3DModel(
        num_attention_heads=HEADS, attention_head_dim=16, hidden_size=32, num_layers=2, num_refiner_layers=1,
        ffn_dim=64, in_channels=C, audio_in_channels=16, patch_size=(1, 2, 2), text_dim=32, freq_dim=32,
        time_embed_hidden_dim=32, time_embed_dim=16, rope_freq_dim=2,
    ))
    n_text, n_audio, n_video = 4, 6, 8
    n = n_text + n_audio + n_video
    text, audio, video = torch.arange(n_text), torch.arange(n_text, n_text + n_audio), torch.arange(n_text + n_audio, n)
    tags = torch.zeros(n, dtype=torch.long)  # 0 video, 1 text, 2 audio
    tags[text], tags[audio] = 1, 2
    timestep_indices = torch.zeros(n, dtype=torch.long)
    timestep_indices[audio] = 1
    position_ids = torch.zeros(n, 3)
    position_ids[:, 0] = torch.arange(n, dtype=torch.float32)
    position_ids[video, 1] = torch.arange(n_video, dtype=torch.float32) % 4  # a 2 × 4 video grid
    position_ids[video, 2] = torch.arange(n_video, dtype=torch.float32) // 4

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, n_video, 4 * C, generator=g)
        video_t = timestep(t, 1, torch.float32, scale=1e-3)
        return dict(
            hidden_states=x if latents is None else latents,
            audio_hidden_states=torch.randn(batch, n_audio, 16, generator=g),
            encoder_hidden_states=_text(gt, batch, n_text),
            timestep=torch.cat([video_t, video_t * 0.5]),  # video, audio noise levels
            timestep_indices=timestep_indices,
            token_tags=tags,
            position_ids=position_ids,
            video_indices=video,
            audio_indices=audio,
            text_indices=text,
        )

    return TinyModel("minimax-h3", model, inputs, first, ("transformer_blocks",))


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
    "cosmos": cosmos,
    "kandinsky5": kandinsky5,
    "kandinsky6": kandinsky6,
    "kandinsky6-sr": kandinsky6_sr,
    "ltx2": ltx2,
    "sana-video": sana_video,
    "sana-wm": sana_wm,
    "sana-wm-refiner": sana_wm_refiner,
    "minimax-h3": minimax_h3,
    "joyimage-edit": joyimage_edit,
    "joyimage-edit-plus": joyimage_edit_plus,
}
