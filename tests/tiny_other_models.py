"""Tiny builders of the other video transformers diffusers ships (see :mod:`tiny_base`): Cosmos,
Kandinsky 5 / 6 / 6-SR, LTX-2, Sana-Video, SANA-WM and its refiner, MiniMax-H3.

Hidden size 32 (2 heads × 16), text width 32, 2 blocks per block list.
"""

from __future__ import annotations

import torch

from tiny_base import HEADS, TEXT_LEN, TinyModel, first, gens, noise, seeded, text_mask, timestep

C = 4  # latent channels


def _text(gt: torch.Generator, batch: int, length: int = TEXT_LEN, dim: int = 32) -> torch.Tensor:
    return torch.randn(batch, length, dim, generator=gt)


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


BUILDERS = {
    "cosmos": cosmos,
    "kandinsky5": kandinsky5,
    "kandinsky6": kandinsky6,
    "kandinsky6-sr": kandinsky6_sr,
    "ltx2": ltx2,
    "sana-video": sana_video,
    "sana-wm": sana_wm,
    "sana-wm-refiner": sana_wm_refiner,
    "minimax-h3": minimax_h3,
}
