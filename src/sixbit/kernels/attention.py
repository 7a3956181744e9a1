"""Quantized attention, SageAttention's method: INT8 Q·Kᵀ after smoothing K, P·V in FP16.

``softmax(Q·Kᵀ·s)·V`` with

1. **K smoothed**: its mean over tokens is subtracted (per batch and head). Every score of a
   query moves by the same ``q·mean(K)``, which the softmax ignores — the result is unchanged
   in exact arithmetic, while K's shared offset (large in DiTs) no longer eats INT8 range;
2. **Q and K in INT8**, one fp32 scale per block of tokens (``block_q`` query tokens,
   ``block_k`` key tokens, all head channels): ``amax / 127``, round to nearest;
3. **Q·Kᵀ as an integer product** (exact), rescaled by the two block scales and ``s``;
4. **softmax in fp32**, then **P and V rounded to FP16** and multiplied with fp32 accumulation.

:func:`int8_attention` runs it, on CUDA, through the ``sageattention`` package where installed
(its own kernels, the same method), else (on the GPUs :mod:`.gpu_targets` lists, with Triton)
through sixbit's Triton kernel (:func:`sixbit.kernels.triton.attention.int8_attention_triton`:
INT8 ``tl.dot`` for Q·Kᵀ, online softmax, FP16 P·V; within ``ATOL · max|V|`` of the reference,
see its module; a 6-bit P runs as FP16 P on sm_80 / sm_86, :func:`triton_p_format`); on CPU (and on
CUDA without Triton) it runs :func:`int8_attention_reference`, an **emulation**: the integer
product is computed in fp32 (exact: |products| ≤ 127²·D < 2²⁴ for head dims up to 1040) and P·V
as an fp32 matmul of FP16-rounded values — the numerics of the method, at fp32 matmul speed, not
INT8 speed. Queries are processed ``chunk`` tokens at a time so the score matrix never exceeds
``chunk × keys`` per head. :func:`int8_attention_path` says which runs.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from ..formats import mx
from ..formats.constants import MX_BLOCK, P_FORMATS
from . import gpu_targets
from . import triton as tri
from .triton.attention import int8_attention_triton, quantize_blocks_int8

logger = logging.getLogger(__name__)
_LOGGED: set = set()  # (P format, capability) fallbacks already logged in this process


def _int8_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (..., L, D)`` as INT8 values (held in fp32) and per-token fp32 scales ``(..., L, 1)``,
    one scale per ``block`` consecutive tokens (:func:`~sixbit.kernels.triton.attention.quantize_blocks_int8`)."""
    codes, scales = quantize_blocks_int8(x, block)
    return codes.float(), scales.repeat_interleave(block, dim=-1)[..., :x.shape[-2], None]


def check_p_format(p_format: str, block_k: int = 64) -> None:
    """Refuse an unknown P format, or key blocks a 6-bit P's 32-key scale blocks do not tile."""
    if p_format not in P_FORMATS:
        raise ValueError(f"p_format must be one of {', '.join(P_FORMATS)}, got {p_format!r}")
    if p_format != "fp16" and block_k % MX_BLOCK:
        raise ValueError(f"p_format={p_format!r} scales P per {MX_BLOCK} keys: block_k must be a multiple of "
                         f"{MX_BLOCK}, got {block_k}")


def round_probabilities(p: torch.Tensor, p_format: str) -> torch.Tensor:
    """``p ≥ 0 (…, L)`` (L a multiple of 32) rounded as P·V takes it: ``"int8"``: codes 0…127
    times ``amax / 127`` per 32 values; ``"e2m3"`` / ``"e3m2"``: MX, an E8M0 scale per 32
    (:func:`sixbit.formats.mx.round_blocks`). fp32."""
    if p_format == "int8":
        blocks = p.reshape(*p.shape[:-1], -1, MX_BLOCK)
        amax = blocks.amax(dim=-1, keepdim=True)
        step = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        return (torch.round(blocks / step) * step).reshape(p.shape)
    return mx.round_blocks(p, p_format)


def _low_bit_pv(scores: torch.Tensor, v16: torch.Tensor, p_format: str, block_k: int) -> torch.Tensor:
    """``softmax(scores)·V`` as the Triton kernel walks the keys: per tile of ``block_k`` keys,
    P relative to the running max (values ≤ 1) is rounded (:func:`round_probabilities`) before
    P·V; earlier tiles are rescaled as the max grows, and the sum of the unrounded P normalizes."""
    pad = (-scores.shape[-1]) % block_k
    tiles = torch.nn.functional.pad(scores, (0, pad), value=float("-inf")).unflatten(-1, (-1, block_k))
    running = tiles.amax(dim=-1).cummax(dim=-1).values  # the kernel's max after each tile
    p = torch.exp(tiles - running[..., None])
    rescale = torch.exp(running - running[..., -1:])[..., None]  # what later tiles' growth multiplies each by
    total = (p * rescale).sum(dim=(-2, -1))[..., None]
    rounded = round_probabilities(p.flatten(-2), p_format).unflatten(-1, (-1, block_k)) * rescale
    return (rounded.flatten(-2) @ torch.nn.functional.pad(v16, (0, 0, 0, pad))) / total


def int8_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                             block_q: int = 128, block_k: int = 64, chunk: int = 4096,
                             p_format: str = "fp16") -> torch.Tensor:
    """Reference (and CPU) twin: the method in torch ops. ``q (…, Lq, D)``, ``k, v (…, Lk, D)``
    with the same leading dims; returns ``(…, Lq, D)`` in ``q``'s dtype. ``p_format``
    (:data:`P_FORMATS`): P in FP16 (default, normalized first), or rounded to ``"int8"`` or a
    6-bit float (``"e2m3"``, ``"e3m2"``) per 32 keys with a dynamic scale, as the flash kernel
    does it (:func:`_low_bit_pv`)."""
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"int8 attention needs q (…, Lq, D), k and v (…, Lk, D) with the same leading dims, "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    check_p_format(p_format, block_k)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    kf = k.float()
    kc, ks = _int8_blocks(kf - kf.mean(dim=-2, keepdim=True), block_k)
    v16 = v.to(torch.float16).float()
    chunk = max(block_q, chunk - chunk % block_q)  # whole query blocks per chunk: the same scales
    out = []
    for start in range(0, q.shape[-2], chunk):
        qc, qs = _int8_blocks(q[..., start:start + chunk, :].float(), block_q)
        scores = (qc @ kc.transpose(-1, -2)) * (qs * scale) * ks.transpose(-1, -2)
        if p_format == "fp16":
            out.append(torch.softmax(scores, dim=-1).to(torch.float16).float() @ v16)
        else:
            out.append(_low_bit_pv(scores, v16, p_format, block_k))
    return torch.cat(out, dim=-2).to(q.dtype)


def sageattention_installed() -> bool:
    return importlib.util.find_spec("sageattention") is not None


def triton_p_format(device: torch.device | str, p_format: str = "fp16", capability: tuple[int, int] | None = None,
                    log: bool = False) -> str | None:
    """The P format sixbit's Triton kernel multiplies with when :func:`int8_attention` is asked
    for ``p_format`` on ``device`` (a GPU of ``capability`` when given), or ``None`` where the
    kernel does not run: off CUDA, without Triton, on a GPU :mod:`.gpu_targets` does not list, or
    for INT8 P (which has no kernel).

    A 6-bit P (E2M3, E3M2) on a GPU whose Triton has no E4M3 (sm_80, sm_86: the kernel does not
    compile there, BENCHMARKS.md ``gpu-aot``) runs as **FP16 P**, not INT8 P: INT8 P has no kernel
    (its reference is an fp32 emulation, slower than bf16 attention on a GPU), and FP16 P is the
    precision the 6-bit P approximates — on the shipped models E2M3 P gave 41.9 / 43.7 dB, INT8 P
    46.9 / 49.4, FP16 P 47.5 / 50.4 (BENCHMARKS.md ``attention``): the fallback is never less
    accurate than what was asked, and on these GPUs the 6-bit P would not be faster (no FP8 or
    FP6 tensor cores). ``log``: say so in one log line (once per process, format and GPU), as
    :func:`int8_attention` does.

    Example:
        >>> triton_p_format("cuda", "e2m3", capability=(8, 0)), triton_p_format("cuda", "e2m3", capability=(9, 0))
        ('fp16', 'e2m3')
    """
    device = torch.device(device)
    cap = gpu_targets.capability_of(device, capability)
    if device.type != "cuda" or not tri.installed() or p_format == "int8" or not gpu_targets.runs("int8_attention", cap):
        return None
    if p_format == "fp16" or gpu_targets.runs("int8_attention_p6", cap):
        return p_format
    if log and (p_format, cap) not in _LOGGED:
        _LOGGED.add((p_format, cap))
        logger.warning("%s P does not compile for %s (Triton has E4M3 only from sm_89): attention runs with FP16 P "
                   "instead (more accurate, no slower on this GPU)", p_format.upper(), gpu_targets.sm(cap))
    return "fp16"


def _p_words(p_format: str) -> str:
    return {"fp16": "FP16 PV", "int8": "INT8 P"}.get(p_format, f"{p_format.upper()} P (6-bit, scale per 32 keys)")


def int8_attention_path(device: torch.device | str, p_format: str = "fp16",
                        capability: tuple[int, int] | None = None) -> str:
    """How :func:`int8_attention` runs on ``device`` (a GPU of ``capability`` when given) with P
    in ``p_format``, and what runs instead where that P has no kernel.

    Example:
        >>> int8_attention_path("cpu")
        'emulated: INT8 QKᵀ and FP16 PV in fp32 matmuls'
        >>> int8_attention_path("cuda", "e2m3", capability=(8, 6)).split("; ")[1]
        'E2M3 P does not compile for sm_86: FP16 P instead'
    """
    device = torch.device(device)
    if device.type == "cuda" and sageattention_installed() and p_format == "fp16":
        return "real: sageattention (INT8 QKᵀ, FP16/FP8 PV)"
    runs = triton_p_format(device, p_format, capability)
    if runs is None:
        return f"emulated: INT8 QKᵀ and {_p_words(p_format)} in fp32 matmuls"
    p = ("FP16 PV" if runs == "fp16" else
         f"{runs.upper()} P with E8M0 scales per 32 keys through tl.dot_scaled (E4M3 containers)")
    path = f"real: sixbit Triton kernel (INT8 QKᵀ, {p}, online softmax)"
    if runs != p_format:
        cap = gpu_targets.sm(gpu_targets.capability_of(device, capability))
        path += f"; {p_format.upper()} P does not compile for {cap}: FP16 P instead"
    return path


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                   p_format: str = "fp16") -> torch.Tensor:
    """Quantized attention on ``(B, H, L, D)`` tensors, by the path :func:`int8_attention_path` names.

    Example:
        >>> q = k = v = torch.randn(1, 2, 37, 16)
        >>> torch.equal(int8_attention(q, k, v), int8_attention_reference(q, k, v))  # CPU: the reference
        True
    """
    if q.device.type == "cuda" and sageattention_installed() and p_format == "fp16":
        from sageattention import sageattn

        return sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=scale)
    runs = triton_p_format(q.device, p_format, log=True)
    if runs is None:
        return int8_attention_reference(q, k, v, scale, p_format=p_format)
    return int8_attention_triton(q, k, v, scale, p_format=runs)
