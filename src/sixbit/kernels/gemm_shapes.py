"""The shapes torch's CUDA GEMMs take, and the zero padding that fits every other shape to them.

What torch 2.13 checks on CUDA:

* ``torch._int_mm(a (M, K), b (K, N))``: ``M > 16``, ``K`` and ``N`` multiples of 8
  (``_int_mm_out_cuda`` in ATen's CUDA BLAS: "self.size(0) needs to be greater than 16",
  "self.size(1) needs to be greater than 0 and a multiple of 8", the same of ``mat2.size(1)``).
* ``torch._scaled_mm(a, b)``: ``a`` row-major, ``b`` column-major, ``a.size(1)`` and both sizes
  of ``b`` multiples of 16 (``_scaled_mm_out_cuda``, and ``meta_scaled_mm`` in
  ``torch/_meta_registrations.py``: "self must be row_major", "mat2 must be col_major",
  "Expected both dimensions of mat2 to be divisible by 16"); on ``float4_e2m1fn_x2`` operands
  the sizes count bytes, two values each: K a multiple of 32. No limit on M (the NVFP4 block
  scales are padded to 128-row tiles by :func:`~sixbit.kernels.cuda.swizzle_block_scales`).
  Row-wise FP8 writes bf16 only, except through cuBLAS ≥ 12.9 on sm_90.

The CPU kernels check none of it (``meta_scaled_mm`` skips its checks for CPU tensors, and
oneDNN's ``_int_mm`` takes M = 3, K = 12, N = 7), so a CPU test cannot rely on them to catch a
shape a GPU refuses: sixbit checks shapes itself (:func:`int_mm_padding`,
:func:`scaled_mm_padding`), and :mod:`sixbit.kernels.strict_ops` holds CPU stand-ins that refuse
what CUDA refuses (tests, and the GPU script's dry run).

**Padding, not a fallback, for each limit.** Zeros appended along K add nothing to a dot
product; zero rows (of the input, or of the weight: N) give outputs that are sliced off. So a
padded GEMM returns the unpadded one's integers (``_int_mm``) or values (``_scaled_mm``) exactly,
for the price of a copy of each padded operand:

* M ≤ 16 (a few conditioning vectors through a layer that multiplies in INT8): the input codes
  padded to 32 rows per call, a few KiB. The alternative, the exact float64 product, would copy
  the whole weight to float64 on every call and run at 1/64 of the fp32 rate on consumer GPUs.
* K or N off the multiple: the input codes per call (M·K bytes) and the weight codes per call
  (N·K bytes of int8 / FP8 / FP4, no fp32 temporary). Kept padded once instead, they would be
  a second copy of the weight, lost on every ``.to()``; and every linear of the models sixbit
  targets (CogVideoX, Wan, HunyuanVideo, LTX: widths multiples of 64) is aligned, so only an
  odd layer of another model pays it.

:func:`cuda_notes` says, from a layer's shape alone, what its calls pad on CUDA: each conversion
logs it for each layer, ``sixbit.summary`` lists it, wherever the model was converted, and a
layer's ``execution()`` names it on CUDA.
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
