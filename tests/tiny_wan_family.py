"""Tiny builders of the Wan-derived video transformers (see :mod:`tiny_base` for the contract).

Wan VACE, Wan-Animate, Wan-Animate-2, SkyReels-V2, ChronoEdit, Helios, AnyFlow and AnyFlow-FAR
all keep Wan's block (self-attention, text cross-attention, FF; the video stream in and out).
Hidden size 32 (2 heads × 16), text width 32, FF 64, 2 blocks; latents (B, 4, F, 8, 8).
"""

from __future__ import annotations

from typing import Any

import torch

from tiny_base import HEADS, TEXT_LEN, TinyModel, first, gens, noise, seeded, timestep

_WAN = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=HEADS,
    attention_head_dim=16,
    text_dim=32,
    freq_dim=32,
    ffn_dim=64,
    num_layers=2,
)
C, F, H, W = 4, 2, 8, 8


def _text(gt: torch.Generator, batch: int, length: int = TEXT_LEN) -> torch.Tensor:
    return torch.randn(batch, length, 32, generator=gt)


def wan_vace(seed: int = 0) -> TinyModel:
    """VACE: control blocks run first on the control video and add hints after main blocks."""
    from diffusers import WanVACETransformer3DModel

    model = seeded(seed, lambda: WanVACETransformer3DModel(
        **_WAN, in_channels=C, out_channels=C, rope_max_seq_len=32, vace_layers=[0, 1], vace_in_channels=4 * C,
    ))

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, F, H, W, generator=g)
        return dict(
            hidden_states=x if latents is None else latents,
            timestep=timestep(t, batch, torch.float32),
            encoder_hidden_states=_text(gt, batch),
            # WanVACEPipeline: control video latents (inactive, reactive) and the 8×8-folded mask
            control_hidden_states=torch.randn(batch, 4 * C, F, H, W, generator=g),
        )

    return TinyModel("wan-vace", model, inputs, first, ("blocks",))


def wan_animate(seed: int = 0) -> TinyModel:
    from diffusers import WanAnimateTransformer3DModel

    model = seeded(seed, lambda: WanAnimateTransformer3DModel(
        **_WAN, in_channels=3 * C, latent_channels=C, out_channels=C, image_dim=32, rope_max_seq_len=32,
        motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16}, motion_encoder_size=16, motion_style_dim=16,
        motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=32, face_encoder_num_heads=2,
        inject_face_latents_blocks=2,
    ))
    frames = 4  # pose frames; the latents carry one more (the reference image)

    def latents(batch):
        return noise(seed, batch, C, frames + 1, H, W)

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, frames + 1, H, W, generator=g)
        x = x if latents is None else latents
        cond = torch.randn(batch, 2 * C, frames + 1, H, W, generator=g)  # reference latents + mask
        face = torch.randn(batch, 3, 13, 16, 16, generator=g)
        return dict(
            hidden_states=torch.cat([x, cond], dim=1),  # WanAnimatePipeline concatenates along channels
            timestep=timestep(t, batch, torch.float32),
            encoder_hidden_states=_text(gt, batch),
            encoder_hidden_states_image=torch.randn(batch, 4, 32, generator=g),
            pose_hidden_states=torch.randn(batch, C, frames, H, W, generator=g),
            # the pipeline blanks the face video of the unconditional call
            face_pixel_values=-torch.ones_like(face) if negative else face,
        )

    return TinyModel("wan-animate", model, inputs, first, ("blocks",), latents=latents)


def wan_animate_2(seed: int = 0) -> TinyModel:
    """Per-sample lists in and out; a reference pass fills a KV cache the denoising calls read."""
    from diffusers import WanAnimate2Transformer3DModel
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    model = seeded(seed, lambda: WanAnimate2Transformer3DModel(
        patch_size=(1, 2, 2), text_len=TEXT_LEN, in_dim=C + 2 * C, dim=32, ffn_dim=64, freq_dim=32, text_dim=32,
        out_dim=C, num_heads=HEADS, num_layers=2, use_img_emb=False,
    ))
    ref_frames, h, w = 2, 4, 4  # the generation stream carries one more latent frame (the reference image)
    grid = torch.tensor([[ref_frames, h // 2, w // 2]])

    def latents(batch):
        return noise(seed, batch, C, ref_frames + 1, h, w)

    @torch.no_grad()  # flex attention has no CPU backward: never record a graph
    def prepare(model, batch):
        g, gt = gens(seed)
        kv_cache = WanAnimate2KVCache(model.config.num_layers)
        # The modular pipeline runs this pass at the schedule's first timestep; here at 1000,
        # above sample()'s first step, so a step tracker counts it as a step of its own.
        model(
            [torch.randn(C, ref_frames, h, w, generator=g) for _ in range(batch)],
            timestep=torch.full((1,), 1000.0),
            encoder_hidden_states=[torch.randn(TEXT_LEN, 32, generator=gt) for _ in range(batch)],
            condition_latents=[torch.randn(2 * C, ref_frames, h, w, generator=g) for _ in range(batch)],
            kv_cache=kv_cache,
            kv_cache_mode="extract",
            seq_len=ref_frames * (h // 2) * (w // 2),
            offset_grid_sizes=grid.expand(batch, -1),
        )
        return {"kv_cache": kv_cache}

    standalone = {}  # batch -> a KV cache filled once, by the full-precision model as built

    def inputs(batch, t=None, latents=None, negative=False, kv_cache=None):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, ref_frames + 1, h, w, generator=g)
        x = x if latents is None else latents
        cond = torch.randn(batch, 2 * C, ref_frames + 1, h, w, generator=g)
        if kv_cache is None:  # a call outside sample(): reuse one reference pass (cached mode only reads it)
            if batch not in standalone:
                standalone[batch] = prepare(model, batch)["kv_cache"]
            kv_cache = standalone[batch]
        return dict(
            hidden_states=list(x),
            timestep=timestep(t, 1, torch.float32),
            encoder_hidden_states=list(_text(gt, batch)),
            condition_latents=list(cond),
            kv_cache_mode="cached",
            seq_len=(ref_frames + 1) * (h // 2) * (w // 2),
            reference_grid_sizes=grid.expand(batch, -1),
            origin_len=4 * ref_frames + 1,
            origin_area=[8 * h, 8 * w],
            is_uncondtion=negative,
            kv_cache=kv_cache,
        )

    def output(out: Any) -> torch.Tensor:
        return torch.stack(out[0])

    for batch in (1, 2):  # before any step tracker or quantization can see the reference pass
        standalone[batch] = prepare(model, batch)["kv_cache"]
    return TinyModel("wan-animate-2", model, inputs, output, ("blocks",), latents=latents, prepare=prepare)


def _wan_like(cls_name: str, name: str, seed: int, text_len: int = TEXT_LEN, **cfg) -> TinyModel:
    import diffusers

    model = seeded(seed, lambda: getattr(diffusers, cls_name)(**_WAN, in_channels=C, out_channels=C, **cfg))
    image = cfg.get("image_dim") is not None

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, F, H, W, generator=g)
        kw = dict(
            hidden_states=x if latents is None else latents,
            timestep=timestep(t, batch, torch.float32),
            encoder_hidden_states=_text(gt, batch, text_len),
        )
        if image:  # CLIP image tokens of the input image (the same for both CFG branches)
            kw["encoder_hidden_states_image"] = torch.randn(batch, 4, 32, generator=g)
        return kw

    return TinyModel(name, model, inputs, first, ("blocks",))


def skyreels_v2(seed: int = 0) -> TinyModel:
    return _wan_like("SkyReelsV2Transformer3DModel", "skyreels-v2", seed, rope_max_seq_len=32)


def chronoedit(seed: int = 0) -> TinyModel:
    """ChronoEdit (Wan i2v): its cross-attention takes the image tokens as everything before the
    last 512 text tokens, so the prompt is padded to 512 tokens as the pipeline does."""
    return _wan_like("ChronoEditTransformer3DModel", "chronoedit", seed, text_len=512, rope_max_seq_len=32,
                     image_dim=32, added_kv_proj_dim=32, rope_temporal_skip_len=8)


def helios(seed: int = 0) -> TinyModel:
    """Helios: the noisy chunk plus short / mid / long history latents, each with frame indices."""
    from diffusers import HeliosTransformer3DModel

    model = seeded(seed, lambda: HeliosTransformer3DModel(**_WAN, in_channels=C, out_channels=C, rope_dim=(4, 6, 6)))

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        x = torch.randn(batch, C, F, H, W, generator=g)
        x = x if latents is None else latents
        idx = torch.arange(F + 6, dtype=torch.float32).expand(batch, -1)  # long | mid | short | current
        return dict(
            hidden_states=x,
            timestep=timestep(t, batch, torch.long),
            encoder_hidden_states=_text(gt, batch),
            indices_hidden_states=idx[:, 6:],
            indices_latents_history_short=idx[:, 5:6],
            indices_latents_history_mid=idx[:, 4:5],
            indices_latents_history_long=idx[:, :4],
            latents_history_short=torch.randn(batch, C, 1, H, W, generator=g),
            latents_history_mid=torch.randn(batch, C, 1, H, W, generator=g),
            latents_history_long=torch.randn(batch, C, 4, H, W, generator=g),
        )

    return TinyModel("helios", model, inputs, first, ("blocks",))


def _anyflow(cls_name: str, name: str, seed: int, frames: int, **cfg) -> TinyModel:
    """AnyFlow predicts the mean velocity from timestep t to r (per frame, (B, F) each)."""
    import diffusers

    model = seeded(seed, lambda: getattr(diffusers, cls_name)(
        **_WAN, in_channels=C, out_channels=C, rope_max_seq_len=32, **cfg,
    ))

    def inputs(batch, t=None, latents=None, negative=False):
        g, gt = gens(seed, negative)
        ts = timestep(t, batch, torch.float32)[:, None].repeat(1, frames)
        kw = dict(
            hidden_states=torch.randn(batch, frames, C, H, W, generator=g) if latents is None else latents,
            timestep=ts,
            r_timestep=(ts - 300.0).clamp_min(0.0),  # the next step's timestep
            encoder_hidden_states=_text(gt, batch),
        )
        if name == "anyflow-far":  # full-sequence (rollout) path: two chunks of two frames
            kw["chunk_partition"] = [2, 2]
        return kw

    return TinyModel(name, model, inputs, first, ("blocks",))


def anyflow(seed: int = 0) -> TinyModel:
    return _anyflow("AnyFlowTransformer3DModel", "anyflow", seed, frames=F)


def anyflow_far(seed: int = 0) -> TinyModel:
    return _anyflow("AnyFlowFARTransformer3DModel", "anyflow-far", seed, frames=4, compressed_patch_size=(1, 4, 4),
                    full_chunk_limit=3)


BUILDERS = {
    "wan-vace": wan_vace,
    "wan-animate": wan_animate,
    "wan-animate-2": wan_animate_2,
    "skyreels-v2": skyreels_v2,
    "chronoedit": chronoedit,
    "helios": helios,
    "anyflow": anyflow,
    "anyflow-far": anyflow_far,
}
