"""The shapes torch's CUDA GEMMs take, and the zero padding that fits every other shape to them.

What torch 2.13 checks on CUDA (and does not check on CPU):

==================================  ===========================================================
``torch._int_mm(a (M, K), b (K, N))``  ``M > 16``, ``K`` and ``N`` multiples of 8
                                     (``aten/src/ATen/native/cuda/Blas.cpp``, ``_int_mm_out_cuda``:
                                     "self.size(0) needs to be greater than 16", "… a multiple of 8").
``torch._scaled_mm(a, b)``           ``a`` row-major, ``b`` column-major, ``a.size(1)`` and both
                                     sizes of ``b`` multiples of 16 (``torch/_meta_registrations.py``,
                                     ``meta_scaled_mm``: "self must be row_major", "mat2 must be
                                     col_major", "… divisible by 16"). On ``float4_e2m1fn_x2``
                                     operands the sizes count byte pairs: K a multiple of 32.
                                     No constraint on M (block scales are padded to 128-row tiles
                                     by :func:`~sixbit.kernels.cuda.swizzle_block_scales`).
==================================  ===========================================================

The CPU kernels take any shape (``meta_scaled_mm`` skips its checks for ``device == "cpu"``;
oneDNN's ``_int_mm`` takes M = 3, K = 12, N = 7), so the CPU twins cannot be relied on to
catch a shape a GPU refuses: sixbit checks the shapes itself (:func:`int_mm_padding`,
:func:`scaled_mm_padding`), and :mod:`sixbit.kernels.strict_ops` holds CPU stand-ins that
refuse what CUDA refuses (tests, and the GPU script's dry run).

**Padding, not a fallback.** Zeros appended along K add nothing to any dot product; rows of
zeros (M, or N of the weight) give outputs that are sliced off. So a padded GEMM returns the
unpadded one's integers (``_int_mm``) or values (``_scaled_mm``) exactly, at the cost of one
copy of each padded operand: the activation codes per call (M·K bytes), and the weight codes
per call where K or N is off (N·K bytes, int8 or FP8/FP4, no fp32 temporary). Every linear of
the models sixbit targets (CogVideoX, Wan, HunyuanVideo, LTX: widths multiples of 64) has
aligned K and N, so only M ≤ 16 (a batch of modulation or timestep vectors) pads there — 32 rows
instead of M, a few KiB. The alternative, an exact float64 product on the GPU, copies the whole
weight to float64 on every call and runs at 1/64 of the fp32 rate on consumer GPUs.
:func:`cuda_notes` says, from a layer's shape alone, what its calls pad on CUDA: conversion
logs it and ``sixbit.summary`` lists it, wherever the model was converted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

INT_MM_MIN_ROWS = 17  # torch._int_mm on CUDA: M > 16
INT_MM_ALIGN = 8  # K and N
SCALED_MM_ALIGN = 16  # K (in bytes of a packed FP4 operand: 32 values) and N
_PADDED_ROWS = 32  # rows a short INT8 call is padded to: the next multiple of 16 above 16


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def enforced(device: torch.device | str) -> bool:
    """Whether torch's GEMMs on ``device`` refuse the shapes above (CUDA; a CPU takes any shape)."""
    return torch.device(device).type == "cuda"


def int_mm_padding(m: int, k: int, n: int) -> tuple[int, int, int]:
    """``(M, K, N)`` as :func:`int_mm` hands them to ``torch._int_mm`` on CUDA.

    Example:
        >>> int_mm_padding(2, 1920, 11520), int_mm_padding(4096, 36, 20)
        ((32, 1920, 11520), (4096, 40, 24))
    """
    return (m if m >= INT_MM_MIN_ROWS else _PADDED_ROWS, round_up(k, INT_MM_ALIGN), round_up(n, INT_MM_ALIGN))


def scaled_mm_padding(k: int, n: int, fp4: bool = False) -> tuple[int, int]:
    """``(K, N)`` in values as ``torch._scaled_mm`` takes them on CUDA (``fp4``: K counts values,
    two per byte of a ``float4_e2m1fn_x2`` operand, so a multiple of 32)."""
    return round_up(k, 2 * SCALED_MM_ALIGN if fp4 else SCALED_MM_ALIGN), round_up(n, SCALED_MM_ALIGN)


def pad2d(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``t`` (2-D) with zeros appended up to ``(rows, cols)``; ``t`` itself when it has that shape.
    One-byte float types (FP8, packed FP4) are padded as bytes: the zero byte is +0 in each."""
    r, c = t.shape
    if (r, c) == (rows, cols):
        return t
    raw = t.view(torch.uint8) if t.element_size() == 1 and t.dtype not in (torch.int8, torch.uint8) else t
    out = F.pad(raw, (0, cols - c, 0, rows - r))
    return out.view(t.dtype) if raw is not t else out


def int_mm(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """``a (M, K) @ b_tᵀ`` (``b_t``: (N, K)), int8 → int32, through ``torch._int_mm`` with the
    operands zero-padded to :func:`int_mm_padding`'s shape: the same integers for any shape."""
    (m, k), n = a.shape, b_t.shape[0]
    mp, kp, np_ = int_mm_padding(m, k, n)
    out = torch._int_mm(pad2d(a, mp, kp), pad2d(b_t, np_, kp).t())
    return out if (mp, np_) == (m, n) else out[:m, :n]


def cuda_notes(k: int, n: int, int8: bool = True, nvfp4: bool = False) -> list[str]:
    """What calls of a ``K → N`` linear zero-pad on CUDA because of its shape (empty: nothing):
    ``int8``: its INT8 calls (``torch._int_mm``); ``nvfp4``: its NVFP4 calls on FP4 tensor cores.

    Example:
        >>> cuda_notes(36, 20)
        ['INT8 calls zero-pad K 36 → 40, N 20 → 24 (torch._int_mm on CUDA needs K, N multiples of 8)']
    """
    notes = []
    kp, np_ = int_mm_padding(INT_MM_MIN_ROWS, k, n)[1:]
    if int8 and (kp, np_) != (k, n):
        notes.append(f"INT8 calls zero-pad {_dims(k, n, kp, np_)} (torch._int_mm on CUDA needs K, N multiples of "
                     f"{INT_MM_ALIGN})")
    kp, np_ = scaled_mm_padding(k, n, fp4=True)
    if nvfp4 and (kp, np_) != (k, n):
        notes.append(f"NVFP4 calls zero-pad {_dims(k, n, kp, np_)} (torch._scaled_mm FP4 needs K a multiple of "
                     f"{2 * SCALED_MM_ALIGN}, N of {SCALED_MM_ALIGN})")
    return notes


def _dims(k: int, n: int, kp: int, np_: int) -> str:
    return ", ".join(f"{name} {a} → {b}" for name, a, b in (("K", k, kp), ("N", n, np_)) if a != b)
