"""Quantized attention in Triton: SageAttention's method in one flash-attention-style kernel.

``int8_attention_triton(q, k, v)`` computes what :func:`sixbit.kernels.attention.int8_attention_reference`
computes (its reference twin): K smoothed by its mean over tokens, Q and K as INT8 codes with
one fp32 scale per block of ``block_q`` query / ``block_k`` key tokens (:func:`quantize_blocks_int8`,
torch ops shared with the reference, so the codes and scales are identical), the scores as an
integer ``tl.dot`` of INT8 codes (int32 accumulation; Triton's interpreter runs it too, which is
how CI tests it), rescaled by the two block scales and the softmax scale; then softmax and
P(FP16)·V(FP16) with fp32 accumulation. One program per (query block, batch·head) walks the key
blocks with an **online softmax** (running max and sum in fp32), so the score matrix never
leaves the chip.

**Tolerance.** The scores are bit-identical to the reference's; the output is not. The
reference rounds the *normalized* probabilities to FP16; the kernel rounds each tile's
probabilities relative to the running max (values in (0, 1], the larger ones), rescales earlier
tiles when the max grows, and normalizes at the end — each probability carries its own FP16
rounding (relative 2⁻¹¹) in both, but not the same one. The output of the two agrees within
``ATOL = 2⁻⁹ · max|V|`` (four FP16 half-ulps of P times the largest value; measured on random
inputs, softmax flat to peaked: ≤ 2⁻¹¹ with fp32 outputs, ≤ 1.2 · 2⁻¹¹ with fp16 outputs, whose
own rounding adds up to 2⁻¹¹ · max|V|), and each is within ~1–3 % (relative norm) of exact
attention, the INT8 Q·Kᵀ being the dominant error.

Real speed on CUDA (INT8 tensor cores for Q·Kᵀ, FP16 for P·V). The quantization of Q and K is
torch ops before the kernel (one extra pass over Q and K); V is rounded to FP16 inside the kernel.
"""

from __future__ import annotations

import torch

from ...formats.constants import EMAX_ELEM
from ...formats.minifloat import element
from . import jit, require

ATOL = 2.0 ** -9  # kernel vs reference, in units of max|V| (see the module docstring)
_P_ELEMENTS = {"fp16": None, "e2m3": element("e2m3"), "e3m2": element("e3m2")}  # P's element format


def quantize_blocks_int8(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (…, L, D)`` as INT8 codes ``(…, L, D)`` and fp32 scales ``(…, ceil(L / block))``: one
    scale per ``block`` consecutive tokens over all channels, ``amax / 127`` (1 for an all-zero
    block), rounded to nearest even.

    Example:
        >>> codes, scales = quantize_blocks_int8(torch.tensor([[1.0, -2.0], [0.5, 0.0], [4.0, 0.0]]), 2)
        >>> codes.tolist(), scales.tolist()
        ([[64, -127], [32, 0], [127, 0]], [0.015748031437397003, 0.031496062874794006])
    """
    length = x.shape[-2]
    pad = (-length) % block
    xp = torch.nn.functional.pad(x.float(), (0, 0, 0, pad)) if pad else x.float()
    blocks = xp.reshape(*x.shape[:-2], (length + pad) // block, block, x.shape[-1])
    amax = blocks.abs().amax(dim=(-2, -1), keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    codes = torch.round(blocks / scale).clamp_(-127, 127).to(torch.int8)
    return codes.reshape(xp.shape)[..., :length, :], scale.reshape(*x.shape[:-2], -1)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_k: int) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"int8_attention_triton needs (B, H, L, D) tensors, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"int8 attention needs q (…, Lq, D), k and v (…, Lk, D) with the same leading dims, "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[-2] == 0:
        raise ValueError("int8 attention needs at least one key token, got Lk = 0")
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(block, int) or block < 16 or block & (block - 1):
            raise ValueError(f"{name} must be a power of two ≥ 16 (a tile of tl.dot), got {block!r}")


def attention_constants(d: int, dv: int, block_q: int = 128, block_k: int = 64,
                        p_format: str = "fp16") -> tuple[dict, int]:
    """The ``int8_attention`` kernel's compile-time constants and warps for head dims ``d``
    (Q, K) and ``dv`` (V), as :func:`int8_attention_triton` launches it (and :mod:`.aot` compiles it)."""
    mx = _P_ELEMENTS[p_format]
    # head dims padded (masked) to a power of two, ≥ 32 for Q·Kᵀ: the INT8 MMA's reduction is 32 wide
    dp, dvp = max(32, 1 << (d - 1).bit_length()), max(16, 1 << (dv - 1).bit_length())
    constants = dict(BLOCK_M=block_q, BLOCK_N=block_k, DP=dp, DVP=dvp, P_MX=mx is not None,
                     MBITS=0 if mx is None else mx.mbits, EMIN=0 if mx is None else mx.emin,
                     EMAX=0 if mx is None else EMAX_ELEM[mx.name], PMAX=0.0 if mx is None else mx.max)
    # Triton's flash-attention tutorial: 8 warps for 128 × 128 accumulators
    return constants, 8 if block_q >= 128 and dvp >= 128 else 4


def int8_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                          block_q: int = 128, block_k: int = 64, p_format: str = "fp16") -> torch.Tensor:
    """Triton kernel: ``softmax(Q·Kᵀ·scale)·V`` by SageAttention's method on ``(B, H, L, D)``
    tensors (``scale`` default ``D ** -0.5``); returns ``(B, H, Lq, Dv)`` in ``q``'s dtype.

    ``block_q`` / ``block_k`` (powers of two ≥ 16; default 128 / 64 as SageAttention) are both
    the quantization blocks and the kernel's tiles: smaller blocks quantize more finely
    (slightly more accurate) and run less efficiently. Any lengths (the last blocks are masked)
    and head dims (padded to a power of two inside the kernel).

    ``p_format="e2m3"`` / ``"e3m2"``: each tile's P rounded to that 6-bit float with an E8M0
    scale per 32 keys, multiplied by ``tl.dot_scaled``; its values travel as E4M3 (which holds
    every E2M3 and E3M2 value exactly: this Triton's ``dot_scaled`` takes no e2m3/e3m2 operand).
    Its reference twin is :func:`sixbit.kernels.attention.int8_attention_reference` with the same
    ``p_format``, which rounds the same tiles relative to the same running max.

    Example:
        >>> q = k = v = torch.randn(1, 2, 37, 16, device="cuda", dtype=torch.bfloat16)  # doctest: +SKIP
        >>> int8_attention_triton(q, k, v).shape                                          # doctest: +SKIP
        torch.Size([1, 2, 37, 16])
    """
    require(q.device)
    _check(q, k, v, block_q, block_k)
    if p_format not in _P_ELEMENTS:
        raise ValueError(f"the Triton kernel takes p_format fp16, e2m3 or e3m2, got {p_format!r} (int8 P: the reference)")
    if p_format != "fp16" and block_k % 32:
        raise ValueError(f"p_format={p_format!r} scales P per 32 keys: block_k must be a multiple of 32, got {block_k}")
    b, h, lq, d = q.shape
    lk, dv = k.shape[-2], v.shape[-1]
    scale = d ** -0.5 if scale is None else float(scale)
    kf = k.float()
    q_codes, q_scales = quantize_blocks_int8(q, block_q)
    k_codes, k_scales = quantize_blocks_int8(kf - kf.mean(dim=-2, keepdim=True), block_k)
    out = torch.empty(b, h, lq, dv, dtype=q.dtype, device=q.device)
    if out.numel():
        constants, warps = attention_constants(d, dv, block_q, block_k, p_format)
        grid = (q_scales.shape[-1], b * h)
        jit().int8_attention[grid](q_codes.contiguous(), k_codes.contiguous(), v.contiguous(), q_scales.contiguous(),
                                   k_scales.contiguous(), out, lq, lk, d, dv, q_scales.shape[-1], k_scales.shape[-1],
                                   scale, num_warps=warps, **constants)
    return out
