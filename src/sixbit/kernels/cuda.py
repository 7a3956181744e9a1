"""GEMMs through the ops torch already has, and which one runs where.

===============  ===========================================================================
INT8 W8A8        ``torch._int_mm`` (cuBLASLt on CUDA, oneDNN on CPU); on CUDA with Triton the
                 per-token quantization of the input (with the online Hadamard rotation) and
                 the scale epilogue are Triton kernels (:mod:`.triton`).
FP8 W8A8         ``torch._scaled_mm`` with E4M3 operands and row-wise fp32 scales (CUDA sm_89+;
                 it also runs on CPU, which is how it is tested).
NVFP4 × NVFP4    ``torch._scaled_mm`` with ``float4_e2m1fn_x2`` operands and E4M3 block scales
                 in cuBLAS's swizzled layout (:func:`swizzle_block_scales`): sm_100 / sm_120.
W4A16            the Triton dequantize-in-the-GEMM kernel (NVFP4 or INT4 weights) on CUDA.
attention        INT8 Q·Kᵀ / FP16 P·V (:mod:`.attention`): ``sageattention`` or sixbit's
                 Triton kernel on CUDA, an emulation elsewhere.
===============  ===========================================================================

Every function has a reference twin (``*_reference``): the same result computed by dequantizing
and multiplying in fp32. :func:`available` says which path each precision takes on a device.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..formats import nvfp4
from . import gemm_shapes
from . import triton as tri
from .attention import int8_attention_path
from .cpu import amx_int8, cpu_ops_compiling, int8_matmul, int8_matmul_backend
from .gpu_targets import capability_of, fused_rotation, runs
from .paths import Capabilities, Operands, Path, select
from .triton.gemm import int8_epilogue, int8_epilogue_reference
from .triton.quantize import quantize_rows_int8, quantize_rows_int8_reference

F8_MAX = 448.0


Capability = tuple[int, int] | None  # a GPU's compute capability; None: read it from the device


def fused_int8(device: torch.device | str, capability: Capability = None) -> bool:
    """Whether :func:`int8_linear` uses the Triton quantize/epilogue kernels on ``device``
    (CUDA with Triton where :mod:`.gpu_targets` lists both; not the interpreter, which is for tests)."""
    device = torch.device(device)
    cap = capability_of(device, capability)
    return device.type == "cuda" and tri.runs_on(device) and runs("int8_rows", cap) and runs("epilogue", cap)


def fp8_supported(device: torch.device | str, capability: Capability = None) -> bool:
    """Whether ``torch._scaled_mm`` takes E4M3 operands with row-wise scales on ``device``."""
    device = torch.device(device)
    return device.type == "cpu" or runs("fp8_scaled_mm", capability_of(device, capability))


def fp4_supported(device: torch.device | str, capability: Capability = None) -> bool:
    """Whether ``torch._scaled_mm`` has NVFP4 × NVFP4 on ``device`` (Blackwell: sm_100, sm_120)."""
    cap = capability_of(device, capability)
    return runs("nvfp4_scaled_mm", cap) and hasattr(torch, "float4_e2m1fn_x2")


def weight4_fused(device: torch.device | str, capability: Capability = None) -> bool:
    """Whether 4-bit weights multiply through the Triton dequantize-in-the-GEMM kernel on ``device``."""
    return runs("weight4", capability_of(device, capability)) and tri.installed()


# ---------------------------------------------------------------- INT8

def int8_linear_reference(x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor,
                          hadamard_block: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference twin of :func:`int8_linear`, in torch ops."""
    codes, scale = quantize_rows_int8_reference(x, hadamard_block)
    return int8_epilogue_reference(int8_matmul(codes, w_codes), scale, w_scale, None, dtype)


def int8_linear(x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor,
                hadamard_block: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(x·H) @ Wᵀ`` with per-token INT8 activations and per-channel INT8 weights ``(N, K)``:
    Triton quantize (rotation fused) → ``torch._int_mm`` → Triton epilogue wherever Triton
    runs (CUDA GPUs :mod:`.gpu_targets` lists; CPU under the interpreter) with a rotation the
    kernel takes (:func:`~sixbit.kernels.gpu_targets.fused_rotation`), the reference ops elsewhere."""
    fused = tri.runs_on(x.device) and fused_rotation(hadamard_block)
    if not fused or (x.device.type == "cuda" and not fused_int8(x.device)):
        return int8_linear_reference(x, w_codes, w_scale, hadamard_block, dtype)
    codes, scale = quantize_rows_int8(x, hadamard_block)
    return int8_epilogue(int8_matmul(codes, w_codes), scale, w_scale, None, dtype)


# ---------------------------------------------------------------- FP8

def fp8_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise E4M3: codes ``(M, K)`` float8_e4m3fn and fp32 scales ``(M, 1)`` (amax / 448)."""
    amax = x.float().abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / F8_MAX, torch.ones_like(amax))
    return (x.float() / scale).clamp_(-F8_MAX, F8_MAX).to(torch.float8_e4m3fn), scale


def fp8_linear_reference(x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference twin of :func:`fp8_linear`: dequantize both operands, fp32 matmul."""
    xq, xs = fp8_quantize_rows(x)
    return ((xq.float() * xs) @ (w_codes.float() * w_scale.reshape(-1, 1)).t()).to(dtype)


def fp8_linear(x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x @ Wᵀ`` with row-wise E4M3 activations and E4M3 weights ``(N, K)`` with per-row
    scales ``(N,)``, through ``torch._scaled_mm``. ``dtype``: fp32, bf16 or fp16 on CPU; bf16 on
    CUDA (torch's row-wise FP8 kernel writes bf16 only, except cuBLAS ≥ 12.9 on sm_90). K and N
    off multiples of 16 are zero-padded on CUDA (:mod:`.gemm_shapes`; same result)."""
    if not fp8_supported(x.device):
        raise RuntimeError(f"FP8 GEMMs need CUDA sm_89+ or a CPU, not {x.device}: use fp8_linear_reference")
    if w_codes.dtype != torch.float8_e4m3fn or x.dim() != 2 or x.shape[1] != w_codes.shape[1]:
        raise ValueError(f"fp8_linear needs x (M, K) and float8_e4m3fn weights (N, K), got {tuple(x.shape)} and "
                         f"{w_codes.dtype}{tuple(w_codes.shape)}")
    strict = gemm_shapes.enforced(x.device)
    if strict and dtype != torch.bfloat16:
        raise ValueError(f"fp8_linear on CUDA writes bfloat16 (torch._scaled_mm's row-wise FP8 kernel), not {dtype}: "
                         "pass dtype=torch.bfloat16")
    xq, xs = fp8_quantize_rows(x)
    (m, k), n = xq.shape, w_codes.shape[0]
    kp, np_ = gemm_shapes.scaled_mm_padding(k, n) if strict else (k, n)
    w_scale = gemm_shapes.pad2d(w_scale.float().reshape(1, -1), 1, np_).contiguous()  # padded rows: sliced off
    y = torch._scaled_mm(gemm_shapes.pad2d(xq, m, kp), gemm_shapes.pad2d(w_codes.contiguous(), np_, kp).t(),
                         scale_a=xs, scale_b=w_scale, out_dtype=dtype)
    return y if np_ == n else y[:, :n]


# ---------------------------------------------------------------- NVFP4

def swizzle_block_scales(scales: torch.Tensor) -> torch.Tensor:
    """E4M3 block scales ``(rows, K/16)`` in cuBLAS's block-scaled layout, flat.

    The scale matrix is padded to whole 128 × 4 tiles; tiles are stored row-major over
    (row tile, column tile), and inside a tile the scale of row ``r`` and column ``c`` sits at
    ``(r mod 32)·16 + (r div 32)·4 + c`` — four 32-row strips interleaved, as the tensor
    cores read them.
    """
    rows, cols = scales.shape
    rt, ct = -(-rows // 128), -(-cols // 4)
    padded = scales.new_zeros(rt * 128, ct * 4)
    padded[:rows, :cols] = scales
    tiles = padded.view(rt, 4, 32, ct, 4)  # (row tile, strip, row in strip, column tile, column)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1)


def unswizzle_block_scales(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_block_scales`."""
    rt, ct = -(-rows // 128), -(-cols // 4)
    tiles = flat.view(rt, ct, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rt * 128, ct * 4)[:rows, :cols]


def nvfp4_operands(q: nvfp4.NVFP4Quantized, rows_to: int | None = None,
                   k_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An NVFP4 tensor ``(rows, K)`` as ``_scaled_mm`` takes it: ``float4_e2m1fn_x2`` codes
    ``(rows, K/2)`` (element 2i in the low nibble, as sixbit packs them) and swizzled scales;
    zero-padded to ``rows_to`` rows and ``k_to`` values per row where given (zero codes and
    zero scales: the padded values are 0)."""
    rows, k = q.shape
    rows_to, k_to = rows_to or rows, k_to or k
    codes = gemm_shapes.pad2d(q.codes.reshape(rows, k // 2), rows_to, k_to // 2)
    scales = gemm_shapes.pad2d(q.scales.reshape(rows, k // 16), rows_to, k_to // 16)
    return codes.view(torch.float4_e2m1fn_x2), swizzle_block_scales(scales)


def nvfp4_linear_reference(x: torch.Tensor, w: nvfp4.NVFP4Quantized, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference twin of :func:`nvfp4_linear`: NVFP4 activations, both operands dequantized, fp32 matmul."""
    return F.linear(nvfp4.quantize(x.float(), check=False).dequantize(), w.dequantize()).to(dtype)


def nvfp4_linear(x: torch.Tensor, w: nvfp4.NVFP4Quantized, dtype: torch.dtype = torch.bfloat16,
                 x_global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ Wᵀ`` with dynamic NVFP4 activations on FP4 tensor cores (``torch._scaled_mm``);
    ``x_global_scale``: the activations' per-tensor scale (default: from ``amax(|x|)``). K off a
    multiple of 32 and N off a multiple of 16 are zero-padded (:mod:`.gemm_shapes`; same result)."""
    if not fp4_supported(x.device):
        raise RuntimeError(f"NVFP4 × NVFP4 GEMMs need a Blackwell GPU (sm_100/sm_120), not {x.device}: "
                           "use nvfp4_linear_reference (emulation)")
    xq = nvfp4.quantize(x.float(), x_global_scale, check=False)
    (n, k), m = w.shape, xq.shape[0]
    kp, np_ = gemm_shapes.scaled_mm_padding(k, n, fp4=True)
    a, sa = nvfp4_operands(xq, m, kp)
    b, sb = nvfp4_operands(w, np_, kp)
    y = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    y = y if np_ == n else y[:, :n]
    return (y * (xq.global_scale * w.global_scale)).to(dtype)


# ---------------------------------------------------------------- which path runs where

#: This module's device switches, as :func:`sixbit.kernels.paths.select` reads them.
CAPABILITIES = Capabilities(fused_int8, weight4_fused, fp4_supported)


def available(device: torch.device | str | None = None, capability: Capability = None) -> dict[str, str]:
    """Which path each precision takes on ``device`` (default: CUDA when present, else CPU), for
    a layer with nothing kept or static: the answer of :func:`~sixbit.kernels.paths.select`, the
    decision every quantized linear call makes. ``capability``: answer for a CUDA GPU of that
    compute capability (e.g. ``(8, 0)``) instead of the one present, if any.

    Example:
        >>> from sixbit.kernels import available
        >>> available("cpu")["int8"].split(" + ")[0]
        'real: torch._int_mm'
        >>> available("cuda", capability=(8, 6))["fp8"]
        'not available (needs sm_89+)'
    """
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    backend = int8_matmul_backend(device, 4096, 4096, 4096)  # the fallback (CPUs without VNNI): no INT8 arithmetic
    int8 = f"real: {backend}" if backend == "torch._int_mm" else f"emulated (exact integers): {backend}"
    caps = CAPABILITIES if capability is None else Capabilities(*(functools.partial(fn, capability=capability)
                                                                 for fn in CAPABILITIES))
    if select("int8", device, Operands(), caps) is Path.INT8_FUSED:
        int8 += " + Triton fused quantize (Hadamard fused) and epilogue"
    elif device.type == "cpu":
        int8 += " + compiled quantize and epilogue on large inputs" if cpu_ops_compiling() else ""
        int8 += "; oneDNN AMX INT8 in the fast layout (sixbit.memory.fast_path, the default)" if amx_int8() else ""
    nvfp4 = select("nvfp4", device, Operands(), caps)
    w4a16 = select("fp", device, Operands(weight4=True), caps)
    paths = {
        "int8": int8,
        "fp8": "real: torch._scaled_mm (row-wise E4M3)" if fp8_supported(device, capability)
        else "not available (needs sm_89+)",
        "nvfp4": "real: torch._scaled_mm (FP4 tensor cores)" if nvfp4 is Path.NVFP4
        else "emulated: dequantize + fp32 matmul (no FP4 GEMM on this device)",
        "w4a16": "real: Triton dequantize-in-the-GEMM" if w4a16 is Path.W4A16
        else "dequantize the weight, then a 16-bit matmul",
        "attention": int8_attention_path(device, capability=capability),
    }
    return paths
