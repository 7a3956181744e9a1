"""Tiny random-weight diffusers video transformers with matching example inputs.

One builder (at least) per ``*Transformer3DModel`` class diffusers ships (:data:`EVERY_BUILDER`):
the eight below (:data:`TINY_BUILDERS`, the set the runtime, calibration and quantization tests
run on), the Wan derivatives in :mod:`tiny_wan_family`, the two-stream ones in
:mod:`tiny_two_stream_models` and the others in :mod:`tiny_other_models`.
Each returns a :class:`~tiny_base.TinyModel` (eval mode, fp32) whose
``inputs(batch, timestep, latents=..., negative=...)`` mirrors how the corresponding diffusers
pipeline calls the transformer (latent layout, timestep dtype, masks, rotary embeddings
computed outside the model); :func:`~tiny_base.sample` runs the plain CFG loop. Weights come
from the default ``nn.Module`` init under ``torch.manual_seed(seed)`` (where diffusers
zero-initializes a branch the tests need alive, the builder says so); the global RNG is left
untouched.

All models use 2 heads and 2 blocks per block list (HunyuanVideo: 2 dual-stream + 2
single-stream; Latte: 2 spatial + 2 temporal). Hidden size is 32, except 48 for Mochi
(FF inner ``8 * dim // 3`` must divide by 16; 32 or 64 would give 85/170) and Allegro
(rotary splits ``head_dim`` in three even parts, so ``head_dim % 6 == 0``).

``nn.Linear`` layers whose ``in_features`` is not a multiple of 16: only latent patch
projections (embeddings, full precision), whose width the latent channels fix: Cosmos
``patch_embed.proj`` (20), Kandinsky 5 / 6 / 6-SR ``visual_embeddings.in_layer`` (36: latents,
condition latents and mask, 2 × 2 patches), LTX-2 and SANA-WM's refiner ``proj_in`` and
``audio_proj_in`` (4).

``nn.Linear`` layers whose ``in_features`` is 48 (``% 16 == 0`` but not ``% 32``):

=======  ==============================================================================
model    linears
=======  ==============================================================================
mochi    every block linear except ``ff*.net.2`` (128); ``time_embed.timestep_embedder
         .linear_2``; ``norm_out.linear``; ``proj_out``
allegro  every block linear except ``ff.net.2`` (192); ``adaln_single.linear``;
         ``adaln_single.emb.timestep_embedder.linear_2``; ``caption_projection.linear_2``;
         ``proj_out``
=======  ==============================================================================

Mochi keeps diffusers' zero init of ``pos_frequencies`` (its RoPE is then the identity).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

import tiny_other_models
import tiny_two_stream_models
import tiny_wan_family
from tiny_base import HEADS as _HEADS
from tiny_base import TEXT_LEN as _TEXT_LEN
from tiny_base import TinyModel, sample
from tiny_base import first as _first
from tiny_base import gens as _gens
from tiny_base import seeded as _seeded
from tiny_base import text_mask as _text_mask
from tiny_base import timestep as _timestep

__all__ = ["EVERY_BUILDER", "TinyModel", "TINY_BUILDERS", "build_tiny", "sample"]


def _cogvideox(seed: int, v15: bool) -> TinyModel:
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    frames, height, width = 2, 8, 8  # latent (F, H, W)
    channels = 8 if v15 else 4
    head_dim = 16
    cfg = dict(
        num_attention_heads=_HEADS,
        attention_head_dim=head_dim,
        in_channels=channels,
        out_channels=channels,
        time_embed_dim=32,
        text_embed_dim=32,
        num_layers=2,
        sample_width=width,
        sample_height=height,
        sample_frames=(frames - 1) * 4 + 1,
        patch_size=2,
        max_text_seq_length=_TEXT_LEN,
    )
    if v15:
        # CogVideoX1.5-5B(-I2V): temporal patching, rotary, no learned pos-embed, ofs embedding.
        cfg.update(
            patch_size_t=2,
            ofs_embed_dim=32,
            use_rotary_positional_embeddings=True,
            use_learned_positional_embeddings=False,
            patch_bias=False,
        )
    else:
        # CogVideoX-2b: sincos positional embedding, no rotary.
        cfg.update(use_rotary_positional_embeddings=False, use_learned_positional_embeddings=False)
    model = _seeded(seed, lambda: CogVideoXTransformer3DModel(**cfg))

    rotary = None
    if v15:
        p, p_t = 2, 2
        rotary = get_3d_rotary_pos_embed(
            embed_dim=head_dim,
            crops_coords=None,
            grid_size=(height // p, width // p),
            temporal_size=(frames + p_t - 1) // p_t,
            grid_type="slice",
            max_size=(height // p, width // p),
            device=torch.device("cpu"),
        )

    def inputs(batch: int, timestep=None, latents=None, negative: bool = False) -> dict:
        g, gt = _gens(seed, negative)
        noise = torch.randn(batch, frames, channels, height, width, generator=g)
        kw = dict(
            hidden_states=noise if latents is None else latents,
            encoder_hidden_states=torch.randn(batch, _TEXT_LEN, 32, generator=gt),
            timestep=_timestep(timestep, batch, torch.long),
            image_rotary_emb=rotary,
        )
        if v15:
            kw["ofs"] = kw["hidden_states"].new_full((1,), fill_value=2.0)
        return kw

    return TinyModel("cogvideox1.5" if v15 else "cogvideox", model, inputs, _first, ("transformer_blocks",))


def _wan(seed: int) -> TinyModel:
    from diffusers import WanTransformer3DModel

    c, f, h, w = 4, 2, 8, 8
    model = _seeded(
        seed,
        lambda: WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=_HEADS,
            attention_head_dim=16,
            in_channels=c,
            out_channels=c,
            text_dim=32,
            freq_dim=32,
            ffn_dim=64,
            num_layers=2,
            rope_max_seq_len=32,
        ),
    )

    def inputs(batch: int, timestep=None, latents=None, negative: bool = False) -> dict:
        g, gt = _gens(seed, negative)
        return dict(
            hidden_states=torch.randn(batch, c, f, h, w, generator=g) if latents is None else latents,
            timestep=_timestep(timestep, batch, torch.float32),
            encoder_hidden_states=torch.randn(batch, _TEXT_LEN, 32, generator=gt),
        )

    return TinyModel("wan", model, inputs, _first, ("blocks",))


def _hunyuanvideo(seed: int) -> TinyModel:
    from diffusers import HunyuanVideoTransformer3DModel

    c, f, h, w = 4, 2, 8, 8
    model = _seeded(
        seed,
        lambda: HunyuanVideoTransformer3DModel(
            in_channels=c,
            out_channels=c,
            num_attention_heads=_HEADS,
            attention_head_dim=16,
            num_layers=2,
            num_single_layers=2,
            num_refiner_layers=1,
            patch_size=2,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=32,
            pooled_projection_dim=32,
            rope_axes_dim=(4, 6, 6),
        ),
    )

    def inputs(batch: int, timestep=None, latents=None, negative: bool = False) -> dict:
        g, gt = _gens(seed, negative)
        return dict(
            hidden_states=torch.randn(batch, c, f, h, w, generator=g) if latents is None else latents,
            timestep=_timestep(timestep, batch, torch.float32),
            encoder_hidden_states=torch.randn(batch, _TEXT_LEN, 32, generator=gt),
            encoder_attention_mask=_text_mask(batch),
            pooled_projections=torch.randn(batch, 32, generator=gt),
            guidance=torch.full((batch,), 6.0) * 1000.0,
        )

    return TinyModel(
        "hunyuanvideo", model, inputs, _first, ("transformer_blocks", "single_transformer_blocks")
    )


def _ltx(seed: int) -> TinyModel:
    from diffusers import LTXVideoTransformer3DModel

    c, f, h, w = 32, 2, 4, 4  # packed latents: (B, F*H*W, C), patch size 1
    model = _seeded(
        seed,
        lambda: LTXVideoTransformer3DModel(
            in_channels=c,
            out_channels=c,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=_HEADS,
            attention_head_dim=16,
            cross_attention_dim=32,
            num_layers=2,
            caption_channels=32,
        ),
    )

    def inputs(batch: int, timestep=None, latents=None, negative: bool = False) -> dict:
        g, gt = _gens(seed, negative)
        return dict(
            hidden_states=torch.randn(batch, f * h * w, c, generator=g) if latents is None else latents,
            encoder_hidden_states=torch.randn(batch, _TEXT_LEN, 32, generator=gt),
            timestep=_timestep(timestep, batch, torch.float32),
            encoder_attention_mask=_text_mask(batch),
            num_frames=f,
            height=h,
            width=w,
            rope_interpolation_scale=(8 / 25, 32, 32),  # (temporal_ratio / frame_rate, spatial, spatial)
        )

    return TinyModel("ltx", model, inputs, _first, ("transformer_blocks",))


def _mochi(seed: int) -> TinyModel:
    from diffusers import MochiTransformer3DModel

    c, f, h, w = 4, 2, 8, 8
    model = _seeded(
        seed,
        lambda: MochiTransformer3DModel(
            patch_size=2,
            num_attention_heads=_HEADS,
            attention_head_dim=24,  # dim 48: FF inner (8 * dim) // 3 = 128 stays a multiple of 16
            num_layers=2,
            pooled_projection_dim=48,
            in_channels=c,
            out_channels=c,
            text_embed_dim=32,
            time_embed_dim=32,
            max_sequence_length=_TEXT_LEN,
        ),
    )

    def inputs(batch: int, timestep=None, latents=None, negative: bool = False) -> dict:
        g, gt = _gens(seed, negative)
        return dict(
            hidden_states=torch.randn(batch, c, f, h, w, generator=g) if latents is None else latents,
            encoder_hidden_states=torch.randn(batch, _TEXT_LEN, 32, generator=gt),
            timestep=_timestep(timestep, batch, torch.float32),
            encoder_attention_mask=_text_mask(batch).bool(),
        )

    return TinyModel("mochi", model, inputs, _first, ("transformer_blocks",))


def _allegro(seed: int) -> TinyModel:
    from diffusers import AllegroTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    c, f, h, w = 4, 2, 8, 8
    head_dim, p = 24, 2  # rotary splits head_dim in 3 even parts
    interp = (2.2, 2.0, 2.0)  # (t, h, w) config defaults
    model = _seeded(
        seed,
        lambda: AllegroTransformer3DModel(
            patch_size=p,
            patch_size_t=1,
            num_attention_heads=_HEADS,
            attention_head_dim=head_dim,
            in_channels=c,
            out_channels=c,
            num_layers=2,
            cross_attention_dim=_HEADS * head_dim,
            sample_height=h,
            sample_width=w,
            sample_frames=f,
            caption_channels=32,
            interpolation_scale_t=interp[0],
            interpolation_scale_h=interp[1],
            interpolation_scale_w=interp[2],
        ),
    )

    # Same as AllegroPipeline._prepare_rotary_positional_embeddings.
    gh, gw = h // p, w // p
    ft, fh, fw, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        embed_dim=head_dim,
        crops_coords=((0, 0), (gh, gw)),
        grid_size=(gh, gw),
        temporal_size=f,
        interpolation_scale=interp,
        device=torch.device("cpu"),
    )
    pos = torch.cartesian_prod(grid_t.long(), grid_h.long(), grid_w.long())
    pos = pos.reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1).contiguous()
    rotary = ((ft, fh, fw), tuple(pos))

    def inputs(batch: int, timestep=None, latents=None, negative: bool = False) -> dict:
        g, gt = _gens(seed, negative)
        return dict(
            hidden_states=torch.randn(batch, c, f, h, w, generator=g) if latents is None else latents,
            encoder_hidden_states=torch.randn(batch, _TEXT_LEN, 32, generator=gt),
            encoder_attention_mask=_text_mask(batch),
            timestep=_timestep(timestep, batch, torch.float32),
            image_rotary_emb=rotary,
        )

    return TinyModel("allegro", model, inputs, _first, ("transformer_blocks",))


def _latte(seed: int) -> TinyModel:
    from diffusers import LatteTransformer3DModel

    c, f, h, w = 4, 2, 8, 8
    model = _seeded(
        seed,
        lambda: LatteTransformer3DModel(
            num_attention_heads=_HEADS,
            attention_head_dim=16,
            in_channels=c,
            out_channels=2 * c,  # learned sigma, as in Latte-1
            num_layers=2,
            cross_attention_dim=32,
            attention_bias=True,
            sample_size=h,
            patch_size=2,
            activation_fn="gelu-approximate",
            num_embeds_ada_norm=1000,
            norm_type="ada_norm_single",
            norm_elementwise_affine=False,
            norm_eps=1e-6,
            caption_channels=32,
            video_length=f,
        ),
    )

    def inputs(batch: int, timestep=None, latents=None, negative: bool = False) -> dict:
        g, gt = _gens(seed, negative)
        return dict(
            hidden_states=torch.randn(batch, c, f, h, w, generator=g) if latents is None else latents,
            encoder_hidden_states=torch.randn(batch, _TEXT_LEN, 32, generator=gt),
            timestep=_timestep(timestep, batch, torch.long),
            enable_temporal_attentions=True,
        )

    def output(out: Any) -> torch.Tensor:
        # LattePipeline keeps the first half (noise) of the learned-sigma channels.
        return out[0].chunk(2, dim=1)[0]

    return TinyModel("latte", model, inputs, output, ("transformer_blocks", "temporal_transformer_blocks"))


# The architectures the runtime, calibration and quantization tests run on (a fixed, small set).
TINY_BUILDERS: dict[str, Callable[[int], TinyModel]] = {
    "cogvideox": lambda seed=0: _cogvideox(seed, v15=False),
    "cogvideox1.5": lambda seed=0: _cogvideox(seed, v15=True),
    "wan": _wan,
    "hunyuanvideo": _hunyuanvideo,
    "ltx": _ltx,
    "mochi": _mochi,
    "allegro": _allegro,
    "latte": _latte,
}
# At least one builder per *Transformer3DModel class diffusers ships (tests/models/ runs them all).
EVERY_BUILDER: dict[str, Callable[[int], TinyModel]] = {
    **TINY_BUILDERS,
    **tiny_wan_family.BUILDERS,
    **tiny_two_stream_models.BUILDERS,
    **tiny_other_models.BUILDERS,
}


def build_tiny(name: str, seed: int = 0) -> TinyModel:
    """Build the tiny model ``name`` (a key of :data:`EVERY_BUILDER`), weights seeded by ``seed``."""
    if name not in EVERY_BUILDER:
        raise ValueError(f"unknown tiny model {name!r}; valid names: {', '.join(sorted(EVERY_BUILDER))}")
    return EVERY_BUILDER[name](seed)
