"""Triton GEMMs around low-bit weights.

``weight4_linear(x, w)``: ``x @ Wᵀ`` for a 4-bit weight ``w`` — NVFP4 (E2M1 codes two per byte,
E4M3 scale per 16, fp32 global scale) or symmetric INT4 (per channel or per group) — decoded
tile by tile inside the GEMM: the weight stays packed in memory (4.5 or ~4 bits per weight), no
16-bit copy is ever made. Each tile is decoded to fp32, scaled, cast to ``x``'s dtype and fed to
``tl.dot`` with fp32 accumulation — the numerics of the reference ``F.linear(x,
w.dequantize(x.dtype))`` up to the order of the sums.

``int8_epilogue(acc, x_scale, w_scale, bias, dtype)``: ``acc · x_scale · w_scaleᵀ (+ bias)``
for the int32 result of an INT8 GEMM, in one pass, written in ``dtype``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...formats import integer, nvfp4
from ..cpu import scale_epilogue_reference
from . import jit, require

_TILE_M, _TILE_N, _TILE_K = 16, 32, 32


def weight4_linear_reference(x: torch.Tensor, w) -> torch.Tensor:
    """Reference twin of :func:`weight4_linear`: dequantize, then ``F.linear`` in ``x``'s dtype."""
    return F.linear(x, w.dequantize(x.dtype))


def weight4_supported(w) -> bool:
    """Whether :func:`weight4_linear` reads this weight: NVFP4, or symmetric INT4 per channel or
    per group (groups dividing or multiples of 32), 2-D with K a multiple of 32."""
    if len(w.shape) != 2 or w.shape[1] % _TILE_K:
        return False
    if isinstance(w, nvfp4.NVFP4Quantized):
        return True
    group = getattr(w, "group_size", None) or _TILE_K
    return (isinstance(w, integer.IntQuantized) and w.bits == 4 and w.symmetric
            and w.granularity in ("channel", "group") and (group % _TILE_K == 0 or _TILE_K % group == 0))


def _weight4_operands(w, k: int):
    """(codes (N, K/2) uint8, scales (N, K/G) as uint8 E4M3 bits or fp32, global scale, group, NVFP4?)
    of a weight :func:`weight4_supported` accepts."""
    if isinstance(w, nvfp4.NVFP4Quantized):
        return w.codes.reshape(-1, k // 2), w.scales.reshape(-1, k // 16).view(torch.uint8), \
            w.global_scale.reshape(1).float(), 16, True
    group = w.group_size or k
    return w.codes.reshape(-1, k // 2), w.scale.reshape(-1, k // group).float().contiguous(), \
        torch.ones(1, device=w.codes.device), group, False


def weight4_constants(group: int, is_nvfp4: bool) -> dict:
    """The ``weight4`` kernel's compile-time constants for a weight with one scale per ``group``
    inputs (``K`` for INT4 per channel), as :func:`weight4_linear` launches it."""
    return dict(TM=_TILE_M, TN=_TILE_N, TK=_TILE_K, GROUP=group, NVFP4=is_nvfp4)


def epilogue_constants(bias: bool) -> dict:
    """The ``epilogue`` kernel's compile-time constants, as :func:`int8_epilogue` launches it."""
    return dict(TM=_TILE_M, TN=_TILE_N, BIAS=bias)


def weight4_linear(x: torch.Tensor, w) -> torch.Tensor:
    """Triton kernel: ``x (M, K) @ Wᵀ`` → ``(M, N)`` in ``x``'s dtype, ``W`` a packed 4-bit weight."""
    require(x.device)
    n, k = w.shape
    if not weight4_supported(w):
        raise ValueError(f"weight4_linear takes NVFP4 or symmetric per-channel/per-group INT4 weights, K a multiple "
                         f"of {_TILE_K}, got {type(w).__name__} {getattr(w, 'bits', '')} {getattr(w, 'granularity', '')}"
                         f" of shape {tuple(w.shape)}")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"weight4_linear needs x of shape (M, {k}), got {tuple(x.shape)}")
    codes, scales, global_scale, group, is_nvfp4 = _weight4_operands(w, k)
    x = x.contiguous()
    m = x.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m and n:
        grid = (-(-m // _TILE_M), -(-n // _TILE_N))
        jit().weight4[grid](x, codes, scales, global_scale, y, m, n, k, k // group, **weight4_constants(group, is_nvfp4))
    return y


def int8_epilogue_reference(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                            bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Reference twin of :func:`int8_epilogue`: the CPU epilogue's ops, without a branch."""
    return scale_epilogue_reference(acc, x_scale, w_scale, None, bias, dtype)


def int8_epilogue(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                  bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Triton kernel: ``acc (M, N) int32 · x_scale (M,) · w_scale (N,) (+ bias)`` in ``dtype``."""
    require(acc.device)
    m, n = acc.shape
    y = torch.empty(m, n, dtype=dtype, device=acc.device)
    if m and n:
        b = bias.float().contiguous() if bias is not None else x_scale
        grid = (-(-m // _TILE_M), -(-n // _TILE_N))
        jit().epilogue[grid](acc.contiguous(), x_scale.float().reshape(-1).contiguous(),
                             w_scale.float().reshape(-1).contiguous(), b, y, m, n,
                             **epilogue_constants(bias is not None))
    return y
