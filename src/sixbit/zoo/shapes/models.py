"""The two tiny pixel-space video DiTs of the shapes zoo and how to call them.

Both are unmodified diffusers transformers with RGB in/out channels (pixels in ``[-1, 1]``, no
VAE). Token counts are kept small for CPU training: 8 frames x 32 x 32 with a 2 x 4 x 4
(time x height x width) patch gives 4 x 8 x 8 = 256 video tokens.

* ``cogvideox``: :class:`diffusers.CogVideoXTransformer3DModel` in its 1.5 layout
  (``patch_size_t=2``, 3-D rotary embeddings computed by the caller, joint text+video attention).
* ``wan``: :class:`diffusers.WanTransformer3DModel` (patch ``(2, 4, 4)``, rotary embeddings
  computed inside, cross-attention to the text).

Each architecture is an :class:`ArchSpec` registered in :data:`ARCHS`; :func:`predict_velocity`
is the one place that knows the two layouts (CogVideoX takes (B, F, C, H, W), Wan (B, C, F, H, W)).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from .world import HEIGHT, NUM_FRAMES, WIDTH

#: Text embedding width shared by the text encoder and both transformers.
TEXT_DIM = 64
#: Tokens per prompt (the longest world caption has 9 words).
TEXT_LENGTH = 10


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """How to build and call one architecture.

    ``config`` is the transformer's diffusers config; ``layout`` is ``"BFCHW"`` or ``"BCFHW"``.
    """

    name: str
    transformer_cls: str
    config: dict[str, Any]
    layout: str
    call: Callable[..., torch.Tensor]


def cogvideox_rotary_emb(transformer, num_frames: int, height: int, width: int, device=None):
    """3-D RoPE (cos, sin) for a CogVideoX 1.5-layout transformer, as diffusers' pipeline builds it."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    cfg = transformer.config
    p, p_t = cfg.patch_size, cfg.patch_size_t
    return get_3d_rotary_pos_embed(
        embed_dim=cfg.attention_head_dim,
        crops_coords=None,
        grid_size=(height // p, width // p),
        temporal_size=(num_frames + p_t - 1) // p_t,
        grid_type="slice",
        max_size=(cfg.sample_height // p, cfg.sample_width // p),
        device=device,
    )


def _call_cogvideox(transformer, x: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    rope = cogvideox_rotary_emb(transformer, x.shape[1], x.shape[3], x.shape[4], device=x.device)
    return transformer(
        hidden_states=x, encoder_hidden_states=text, timestep=timestep, image_rotary_emb=rope, return_dict=False
    )[0]


def _call_wan(transformer, x: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    return transformer(hidden_states=x, encoder_hidden_states=text, timestep=timestep, return_dict=False)[0]


ARCHS: dict[str, ArchSpec] = {
    "cogvideox": ArchSpec(
        name="cogvideox",
        transformer_cls="CogVideoXTransformer3DModel",
        config=dict(
            num_attention_heads=4,
            attention_head_dim=48,
            in_channels=3,
            out_channels=3,
            time_embed_dim=128,
            text_embed_dim=TEXT_DIM,
            num_layers=4,
            sample_width=WIDTH,
            sample_height=HEIGHT,
            sample_frames=NUM_FRAMES,
            patch_size=4,
            patch_size_t=2,
            temporal_compression_ratio=1,
            max_text_seq_length=TEXT_LENGTH,
            use_rotary_positional_embeddings=True,
        ),
        layout="BFCHW",
        call=_call_cogvideox,
    ),
    "wan": ArchSpec(
        name="wan",
        transformer_cls="WanTransformer3DModel",
        config=dict(
            patch_size=(2, 4, 4),
            num_attention_heads=4,
            attention_head_dim=48,
            in_channels=3,
            out_channels=3,
            text_dim=TEXT_DIM,
            freq_dim=64,
            ffn_dim=768,
            num_layers=4,
            rope_max_seq_len=64,
        ),
        layout="BCFHW",
        call=_call_wan,
    ),
}


def get_arch(arch: str) -> ArchSpec:
    """The registered :class:`ArchSpec` named ``arch``; ``ValueError`` lists the choices otherwise."""
    if arch not in ARCHS:
        raise ValueError(f"unknown shapes architecture {arch!r}; choose one of {sorted(ARCHS)}")
    return ARCHS[arch]


def build_transformer(arch: str, **overrides: Any):
    """A freshly initialised transformer of ``arch`` (config overrides e.g. ``num_layers=1`` for tests)."""
    import diffusers

    spec = get_arch(arch)
    return getattr(diffusers, spec.transformer_cls)(**{**spec.config, **overrides})


def predict_velocity(arch: str, transformer, x: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor):
    """Call ``transformer`` on videos ``x`` of shape (B, F, C, H, W), returning (B, F, C, H, W).

    ``timestep`` is (B,) in [0, 1000] (the flow time sigma times 1000); ``text`` is (B, L, TEXT_DIM).
    """
    spec = get_arch(arch)
    if spec.layout == "BCFHW":
        return spec.call(transformer, x.transpose(1, 2), timestep, text).transpose(1, 2)
    return spec.call(transformer, x, timestep, text)
