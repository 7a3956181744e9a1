"""Quantized attention, SageAttention's method: INT8 Q·Kᵀ after smoothing K, P·V in FP16.

``softmax(Q·Kᵀ·s)·V`` with

1. **K smoothed**: its mean over tokens is subtracted (per batch and head). Every score of a
   query moves by the same ``q·mean(K)``, which the softmax ignores — the result is unchanged
   in exact arithmetic, while K's shared offset (large in DiTs) no longer eats INT8 range;
2. **Q and K in INT8**, one fp32 scale per block of tokens (``block_q`` query tokens,
   ``block_k`` key tokens, all head channels): ``amax / 127``, round to nearest;
3. **Q·Kᵀ as an integer product** (exact), rescaled by the two block scales and ``s``;
4. **softmax in fp32**, then **P and V rounded to FP16** and multiplied with fp32 accumulation.

:func:`int8_attention` runs it through the ``sageattention`` package on CUDA where installed
(its own kernels, the same method); everywhere else it runs :func:`int8_attention_reference`,
an **emulation**: the integer product is computed in fp32 (exact: |products| ≤ 127²·D < 2²⁴
for head dims up to 1040) and P·V as an fp32 matmul of FP16-rounded values — the numerics of
the method, at fp32 matmul speed, not INT8 speed. Queries are processed ``chunk`` tokens at a
time so the score matrix never exceeds ``chunk × keys`` per head.
"""

from __future__ import annotations

import importlib.util

import torch


def _int8_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (..., L, D)`` as INT8 values (held in fp32) and per-token fp32 scales ``(..., L, 1)``,
    one scale per ``block`` consecutive tokens."""
    length = x.shape[-2]
    pad = (-length) % block
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    blocks = xp.reshape(*x.shape[:-2], (length + pad) // block, block, x.shape[-1])
    amax = blocks.abs().amax(dim=(-2, -1), keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    codes = torch.round(blocks / scale).clamp_(-127, 127)
    per_token = scale.expand(*scale.shape[:-2], block, 1)
    return (codes.reshape(xp.shape)[..., :length, :],
            per_token.reshape(*x.shape[:-2], length + pad, 1)[..., :length, :])


def int8_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                             block_q: int = 128, block_k: int = 64, chunk: int = 4096) -> torch.Tensor:
    """Reference (and CPU) twin: the method in torch ops. ``q (…, Lq, D)``, ``k, v (…, Lk, D)``
    with the same leading dims; returns ``(…, Lq, D)`` in ``q``'s dtype."""
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"int8 attention needs q (…, Lq, D), k and v (…, Lk, D) with the same leading dims, "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    kf = k.float()
    kc, ks = _int8_blocks(kf - kf.mean(dim=-2, keepdim=True), block_k)
    v16 = v.to(torch.float16).float()
    chunk = max(block_q, chunk - chunk % block_q)  # whole query blocks per chunk: the same scales
    out = []
    for start in range(0, q.shape[-2], chunk):
        qc, qs = _int8_blocks(q[..., start:start + chunk, :].float(), block_q)
        scores = (qc @ kc.transpose(-1, -2)) * (qs * scale) * ks.transpose(-1, -2)
        p = torch.softmax(scores, dim=-1).to(torch.float16).float()
        out.append(p @ v16)
    return torch.cat(out, dim=-2).to(q.dtype)


def sageattention_installed() -> bool:
    return importlib.util.find_spec("sageattention") is not None


def int8_attention_path(device: torch.device | str) -> str:
    """How :func:`int8_attention` runs on ``device``."""
    if torch.device(device).type == "cuda" and sageattention_installed():
        return "real: sageattention (INT8 QKᵀ, FP16/FP8 PV)"
    return "emulated: INT8 QKᵀ and FP16 PV in fp32 matmuls"


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Quantized attention on ``(B, H, L, D)`` tensors (see :func:`int8_attention_path`)."""
    if q.device.type == "cuda" and sageattention_installed():
        from sageattention import sageattn

        return sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=scale)
    return int8_attention_reference(q, k, v, scale)
