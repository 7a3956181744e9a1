"""Normalized block-diagonal Sylvester Hadamard rotations.

``H_b`` (``b`` a power of two) is symmetric and orthogonal: ``H·Hᵀ = I``. Rotating a linear
layer's weight offline along its input dimension (``W·H``) and its input online (``x·H``)
leaves the output unchanged, ``x·Wᵀ = (x·H)(W·H)ᵀ``, while spreading each activation outlier
over ``b`` channels so that low-bit block scales see flatter data (QuaRot, SpinQuant; block
128 in 6Bit-Diffusion). The rotation is block-diagonal: it acts on ``(..., K/b, b)``.

Example:
    >>> import torch
    >>> w, x = torch.randn(8, 64), torch.randn(3, 64)
    >>> y = rotate(x, 16) @ rotate(w, 16).T
    >>> torch.allclose(y, x @ w.T, atol=1e-5)
    True
"""

from __future__ import annotations

import functools
import math

import torch

BLOCK_SIZES = (16, 32, 64, 128, 256)


def check_block(k: int, block: int) -> None:
    """Raise ``ValueError`` unless ``block`` is a supported size dividing ``k``."""
    if block not in BLOCK_SIZES:
        raise ValueError(f"Hadamard block must be one of {BLOCK_SIZES}, got {block!r}")
    if k % block:
        fits = [b for b in BLOCK_SIZES if k % b == 0]
        hint = f"use hadamard_block={max(fits)}" if fits else "use hadamard_block=None"
        raise ValueError(
            f"input dimension {k} is not a multiple of the Hadamard block {block}; {hint}"
        )


@functools.lru_cache(maxsize=None)
def _matrix(block: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < block:  # Sylvester: H_2n = [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(block)).to(dtype=dtype, device=device)


def hadamard_matrix(block: int, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """The normalized ``block × block`` Sylvester Hadamard matrix."""
    check_block(block, block)
    return _matrix(block, dtype, str(torch.device(device)))


def rotate(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x·H`` with ``H`` block-diagonal of size ``block`` along the last dimension.

    Computes in fp32 (fp64 stays fp64) and returns ``x``'s dtype. Use it for the weight
    offline (``rotate(W, b)``, ``W`` of shape ``(N, K)``) and for the input online.
    """
    check_block(x.shape[-1], block)
    work = x if x.dtype == torch.float64 else x.float()
    h = _matrix(block, work.dtype, str(x.device))
    blocks = work.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    return (blocks @ h).reshape(x.shape).to(x.dtype)


@functools.lru_cache(maxsize=None)
def _signs(block: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    return (_matrix(block, torch.float64, "cpu") * math.sqrt(block)).round().to(dtype=dtype, device=device)


def rotate_unnormalized(x: torch.Tensor, block: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x·(√b·H)``: the rotation by the ±1 Sylvester matrix, exact in every dtype, computed in
    ``x``'s dtype (a bf16 input: one bf16 GEMM accumulating in fp32, one rounding — no fp32 copy
    of ``x``). ``rotate(x, b) = rotate_unnormalized(x, b) / √b``; a per-token quantization of it
    needs only its scales divided by ``√b``. ``out``: a contiguous tensor of ``x``'s shape and
    dtype to write it into (and return)."""
    check_block(x.shape[-1], block)
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    signs = _signs(block, x.dtype, str(x.device))
    if out is None:
        return (blocks @ signs).reshape(x.shape)
    if out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)}, got "
                         f"{out.dtype}{tuple(out.shape)}")
    torch.matmul(blocks, signs, out=out.view(blocks.shape))
    return out
