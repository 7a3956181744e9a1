"""INT8 × INT8 → INT32 matrix multiplication, and the CPU's fused INT8 ops (below).

``torch._int_mm`` runs a real integer GEMM (oneDNN's generic s8 GEMM on CPUs, which does not use
AMX tiles: see :func:`amx_int8`; cuBLASLt on CUDA, whose shape limits — M > 16, K and N multiples
of 8 — are met by zero padding, :mod:`sixbit.kernels.gemm_shapes`: the same integers). CPUs
without VNNI, where its int16 sums saturate (wrong by up to 30 %), and devices without
``_int_mm`` take an exact fallback: products of int8 values summed in float64 are exact integers
while ``K · 127² < 2^53`` (any K below 5·10^11), so the int32 result is identical."""

from __future__ import annotations

import logging
import math

import torch

from ..formats.constants import F4_E2M1_MAX
from ..formats.minifloat import E2M1
from . import gemm_shapes, isa
from .isa import cpu_flags as _cpu_flags  # a name tests replace


def fastest_float_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """The full-precision dtype a user who wants speed runs on ``device``: bf16 on GPUs and on
    CPUs that multiply it natively (AVX512-BF16 or AMX: 2–3.7× fp32's speed measured here), fp32
    on other CPUs. Speedups in sixbit's benchmarks are quoted against it.

    Example:
        >>> fastest_float_dtype("cuda")
        torch.bfloat16
    """
    if torch.device(device).type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if {"avx512_bf16", "amx_bf16"} & isa.usable(_cpu_flags()) else torch.float32


def cpu_kind() -> str:
    """The bf16 and INT8 matrix instructions torch reaches here, which set each path's speed and
    rounding (``"AMX-BF16, AMX-INT8, AVX512-BF16, AVX512-VNNI"``); named with every speed ratio. Caps count (:mod:`sixbit.kernels.isa`): ``ONEDNN_MAX_CPU_ISA=AVX2``
    drops AMX and AVX512; ``ATEN_CPU_CAPABILITY=avx2`` on an AVX512 CPU adds ``"; ATen AVX2"``."""
    flags, aten = isa.usable(_cpu_flags()), isa.aten_cap(_cpu_flags())
    kind = ", ".join(name for flag, name in isa.MATRIX_FLAGS.items() if flag in flags) or "no AMX, AVX512-BF16 or VNNI"
    return kind if aten is None else f"{kind}; ATen {aten}"


def amx_int8() -> bool:
    """Whether this CPU has AMX INT8 tiles and torch reaches them (oneDNN's brgemm matmul through
    ``torch.ops.onednn.qlinear_pointwise``; not under an ``ONEDNN_MAX_CPU_ISA`` below AMX). ``torch._int_mm``
    takes oneDNN's generic s8 GEMM instead, which on an AMX machine is no faster than a bf16 matmul."""
    return "amx_int8" in isa.usable(_cpu_flags()) and hasattr(torch.ops.onednn, "qlinear_prepack")


def pack_int8_weight(codes: torch.Tensor) -> torch.Tensor:
    """``codes`` (N, K) int8 reordered once into the AMX kernel's blocked layout (an opaque
    oneDNN tensor of the same N·K bytes) for :func:`packed_int8_matmul`."""
    return torch.ops.onednn.qlinear_prepack(codes.contiguous(), [4096, codes.shape[1]])


def packed_int8_matmul(a: torch.Tensor, packed: torch.Tensor, w_scale: torch.Tensor,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(a @ codesᵀ) · w_scale`` for int8 ``a`` (M, K) and a :func:`pack_int8_weight` weight: the
    integer products accumulate exactly in int32 (AMX tiles), then one fp32 multiply per element,
    rounded once to ``dtype`` (fp32 or bf16: a bf16 result is half the bytes to write and read
    back, which at (M, 7680) costs more than the rounding) — :func:`packed_int8_matmul_reference`,
    bit for bit."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"packed_int8_matmul writes float32 or bfloat16, not {dtype}")
    n = w_scale.numel()
    return torch.ops.onednn.qlinear_pointwise(a, 1.0, 0, packed, w_scale.float().reshape(-1),
                                              torch.zeros(n, dtype=torch.int64), None, 1.0, 0, dtype,
                                              "none", [], "")


def packed_int8_matmul_reference(a: torch.Tensor, codes: torch.Tensor, w_scale: torch.Tensor,
                                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference twin of :func:`packed_int8_matmul` on the unpacked ``codes`` (N, K)."""
    return (int8_matmul(a, codes).float() * w_scale.float().reshape(1, -1)).to(dtype)


def int8_matmul_backend(device: torch.device | str, m: int, k: int, n: int) -> str:
    """Which path :func:`int8_matmul` takes for an (m, k) × (k, n) product on ``device`` (on CUDA
    every shape takes ``torch._int_mm``, zero-padded where its limits need it)."""
    device = torch.device(device)
    ok = hasattr(torch, "_int_mm") and (  # CPUs: oneDNN's s8 GEMM saturates in int16 without VNNI
        (device.type == "cpu" and isa.int_mm_exact()) or device.type == "cuda")  # CUDA: any shape, padded
    return "torch._int_mm" if ok else "float64 exact fallback"


def int8_matmul_reference(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """Reference ``a @ b_tᵀ`` in int64 arithmetic, returned as int32."""
    return (a.to(torch.int64).unsqueeze(1) * b_t.to(torch.int64).unsqueeze(0)).sum(-1).to(torch.int32)


def int8_matmul(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """``a @ b_tᵀ`` for ``int8`` ``a`` of shape (M, K) and ``b_t`` of shape (N, K), as int32 (M, N)."""
    if a.dtype != torch.int8 or b_t.dtype != torch.int8 or a.dim() != 2 or b_t.dim() != 2:
        raise ValueError(
            f"int8_matmul needs two 2-D int8 tensors, got {a.dtype}{tuple(a.shape)} and "
            f"{b_t.dtype}{tuple(b_t.shape)}"
        )
    if a.shape[1] != b_t.shape[1]:
        raise ValueError(f"inner dimensions differ: {a.shape[1]} vs {b_t.shape[1]}")
    if int8_matmul_backend(a.device, a.shape[0], a.shape[1], b_t.shape[0]) == "torch._int_mm":
        # CUDA refuses M ≤ 16 and K, N off multiples of 8: zero-padded there (exact)
        return gemm_shapes.int_mm(a, b_t) if gemm_shapes.enforced(a.device) else torch._int_mm(a, b_t.t())
    return (a.double() @ b_t.double().t()).to(torch.int32)


# ---------------------------------------------------------------- fused CPU ops
#
# The per-token quantization of a GEMM's input and the scale epilogue are chains of elementwise
# ops; run op by op, each reads and writes the whole (M, K) or (M, N) tensor in fp32, and at real
# sizes they took longer than the integer GEMM itself (CogVideoX-2B's 7680→1920 layer: 2.3× the
# GEMM). Compiled by ``torch.compile`` (inductor's C++ backend), each chain is one or two
# vectorized loops. The compiled function is the very Python function that runs eagerly when
# compiling is off or does not pay (tensors below ``_MIN_ELEMENTS``, e.g. the shipped tiny models),
# and inductor keeps IEEE division and round-half-even: the results are bit-identical (tested),
# except an epilogue's activation, whose vectorized erf / exp can differ from aten's in the last fp32 bit.

_MIN_ELEMENTS = 1 << 20  # the shipped tiny models peak at 0.4 M (never compile); CogVideoX-2B at 4.8 M
_COMPILED: dict[str, object] = {}
_STATE = {"enabled": True, "broken": None}
# a value a kernel rounds to bf16 and reads back is the rounded value, as eagerly (see scale_epilogue_quantize)
_OPTIONS = {"emulate_precision_casts": True}
log = logging.getLogger(__name__)


def compiled_cpu_ops(enabled: bool = True) -> None:
    """Use the compiled CPU kernels for activation quantization and the scale epilogue (default
    on; results are bit-identical either way). The first large call compiles them (a C++ compiler
    is needed; without one sixbit logs a warning once and keeps the eager ops)."""
    _STATE["enabled"] = bool(enabled)


def cpu_ops_compiling() -> bool:
    """Whether large CPU inputs take the compiled kernels: :func:`compiled_cpu_ops` is on and the
    compiler has not failed."""
    return _STATE["enabled"] and _STATE["broken"] is None


def fused_cpu(t: torch.Tensor, numel: int | None = None) -> bool:
    """Whether ops on ``t`` take the compiled CPU kernels (CPU, :func:`cpu_ops_compiling`, and
    ``t`` — or the whole of which it is a part, ``numel`` elements — large enough)."""
    return (t.device.type == "cpu" and cpu_ops_compiling()
            and (t.numel() if numel is None else numel) >= _MIN_ELEMENTS)


def _run(fn, *args, numel: int | None = None, per_width: bool = False):
    """``fn(*args)`` compiled when :func:`fused_cpu` says so for ``args[0]`` (and ``numel``),
    eagerly otherwise. Compiled with ``dynamic=True`` (one kernel for every shape), or with
    ``per_width``: one kernel per width of ``args[0]`` (its last dimension, then a constant the
    row loops are unrolled and vectorized for: a 7680-wide quantization took 7.5 ms instead of
    11.7 at 2,500 rows), its rows dynamic."""
    if not fused_cpu(args[0], numel) or torch.compiler.is_compiling():  # inside a user's torch.compile: theirs fuses it
        return fn(*args)
    key = f"{fn.__name__}[{args[0].shape[-1]}]" if per_width else fn.__name__
    if per_width:
        torch._dynamo.maybe_mark_dynamic(args[0], 0)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = _COMPILED[key] = torch.compile(fn, dynamic=None if per_width else True,
                                                  options={**_OPTIONS, **isa.inductor_options()})
        try:
            return compiled(*args)
        except Exception as e:  # no C++ compiler, or inductor cannot build here: same numerics eagerly
            _STATE["broken"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("sixbit: compiling the CPU kernels failed (%s); running them op by op (slower, "
                        "same results)", _STATE["broken"])
            return fn(*args)
    return compiled(*args)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """``E2M1.round(x)`` for ``|x| ≤ 6``, bit for bit. Eagerly it is ``E2M1.round`` (rounding by
    fp32 addition: 3.4× faster than the selects below on an 8,960-long GPTQ column, one
    thread); compiled, by binade: quanta of 0.5 below 2, 1 below 4, 2 above, ties to even
    (elementwise selects compile into a loop that vectorizes, 1.3× faster there)."""
    if not torch.compiler.is_compiling():
        return E2M1.round(x)
    a = x.abs()
    quantum = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    return torch.copysign(torch.round(a / quantum) * quantum, x)


def nvfp4_block_errors_reference(w: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor,
                                 importance: torch.Tensor | None) -> torch.Tensor:
    """Squared error of each NVFP4 block of ``w`` (``(n, blocks, 16)`` fp32) on the grid of block
    scale ``scale`` (``(n, blocks, 1)``, E4M3 values in fp32) and ``global_scale``, rounded as
    ``nvfp4.quantize`` rounds; each input channel weighted by ``importance`` (``(1, blocks, 16)``
    or ``None``). Returns ``(n, blocks)``: what the MSE scale search compares per candidate."""
    q = e2m1_round(torch.clamp(w * ((1.0 / global_scale) / scale), -F4_E2M1_MAX, F4_E2M1_MAX)) * (scale * global_scale)
    err = (w - q).square()
    return (err if importance is None else err * importance).sum(-1)


def nvfp4_block_errors(w: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor,
                       importance: torch.Tensor | None, numel: int | None = None) -> torch.Tensor:
    """:func:`nvfp4_block_errors_reference`, compiled into one pass when the weight (``numel``
    elements, default ``w``'s) is large: 30× faster per candidate on a 8960 × 1536 weight here. The sums over a
    block may differ from the reference in the last bit, so a near-tie can pick the other scale."""
    return _run(nvfp4_block_errors_reference, w, scale, global_scale, importance, numel=numel)


def int_block_errors_reference(w: torch.Tensor, scale: torch.Tensor, qmax: int,
                               importance: torch.Tensor | None) -> torch.Tensor:
    """Squared error of each block of ``w`` (``(n, blocks, size)`` fp32: a group, or a whole row)
    on the symmetric integer grid of ``scale`` (``(n, blocks, 1)``) with codes ``±qmax``, weighted
    like :func:`nvfp4_block_errors_reference`. Returns ``(n, blocks)``."""
    err = (w - torch.round(w / scale).clamp(-qmax, qmax) * scale).square()
    return (err if importance is None else err * importance).sum(-1)


def int_block_errors(w: torch.Tensor, scale: torch.Tensor, qmax: int, importance: torch.Tensor | None,
                     numel: int | None = None) -> torch.Tensor:
    """:func:`int_block_errors_reference`, compiled into one pass when the weight is large (as
    :func:`nvfp4_block_errors`)."""
    return _run(int_block_errors_reference, w, scale, qmax, importance, numel=numel)


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric INT8 of a 2-D ``x``: codes ``(M, K)`` int8 and scales ``(M, 1)`` fp32
    (``amax / 127``; an all-zero row gets scale 1) — ``formats.integer.quantize(x, 8, "token")``."""
    codes, amax = _codes_and_amax(x)
    return codes, _token_scale(amax)


def _codes_and_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # What the compiled kernels return: the row abs-max, not the scale. A scale computed inside
    # would be a loop over rows of its own, and inductor then runs the abs-max and the codes as
    # two passes over the whole input; with only per-row loops it fuses them into one pass per row
    # (the row still in cache): 1.8× faster at 2,500 × 7,680, 1.4× at 17,776 × 1,920, the same at
    # 2,500 × 1,920 (one thread; bf16 input).
    x = x.float()
    amax = x.abs().amax(dim=1, keepdim=True)
    return torch.round(x / _token_scale(amax)).clamp(-127, 127).to(torch.int8), amax


def _token_scale(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax == 0, torch.ones_like(amax), amax / 127)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows_reference`, compiled into one pass on large CPU inputs (any float dtype:
    a bf16 input is read as bf16, no fp32 copy)."""
    codes, amax = _run(_codes_and_amax, x, per_width=True)
    return codes, _token_scale(amax)


#: Activations an epilogue can apply (diffusers' ``GELU`` module: ``approximate`` "none" / "tanh").
ACTIVATIONS = ("gelu", "gelu-tanh")
_GELU_TANH_K = 2 * math.sqrt(2 / math.pi)


def scale_epilogue_reference(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor | None,
                             extra: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype,
                             activation: str | None = None, inplace: bool = False) -> torch.Tensor:
    """``acc (M, N) · x_scale (M, 1) · w_scale (N,)`` in fp32 (``acc``: the int32 accumulator, or
    already times ``w_scale``, e.g. by :func:`packed_int8_matmul`: then ``w_scale`` is None),
    ``+ extra`` (fp32, e.g. the low-rank branch), ``+ bias``, then ``activation`` (one of
    :data:`ACTIVATIONS`; GELU's tanh form as the identical ``y·σ(2·√(2/π)·(y + 0.044715·y³))``,
    cheaper to vectorize), in ``dtype``: each step rounds in fp32 in this order. ``inplace``: the
    result is written into ``acc`` (of dtype ``dtype``) and returned, no new (M, N) tensor."""
    if inplace and acc.dtype != dtype:
        raise ValueError(f"an in-place epilogue writes into the accumulator: it must be {dtype}, not {acc.dtype}")
    y = acc.float() * x_scale.reshape(-1, 1)
    if w_scale is not None:
        y = y * w_scale.reshape(1, -1)
    if extra is not None:
        y = y + extra
    if bias is not None:
        y = y + bias.float()
    if activation == "gelu":
        y = torch.nn.functional.gelu(y)
    elif activation == "gelu-tanh":
        y = y * torch.sigmoid(_GELU_TANH_K * (y + 0.044715 * y * y * y))
    elif activation is not None:
        raise ValueError(f"unknown activation {activation!r}; sixbit's epilogue applies {', '.join(ACTIVATIONS)}")
    return acc.copy_(y) if inplace else y.to(dtype)


def scale_epilogue(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor | None, extra: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                   activation: str | None = None, inplace: bool = False) -> torch.Tensor:
    """:func:`scale_epilogue_reference`, compiled into one pass on large CPU accumulators (in place
    too: the compiled pass stores into ``acc``)."""
    return _run(scale_epilogue_reference, acc, x_scale, w_scale, extra, bias, dtype, activation, inplace)


def scale_epilogue_quantize_reference(acc: torch.Tensor, x_scale: torch.Tensor, bias: torch.Tensor | None,
                                      activation: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`scale_epilogue_reference` in place into ``acc`` (the output, in ``acc``'s dtype), then
    :func:`quantize_rows_reference` of that output: the per-token INT8 codes and scales of the next
    linear's input when it is this one's output (a feed-forward's second linear)."""
    codes, amax = _epilogue_codes_and_amax(acc, x_scale, bias, activation)
    return codes, _token_scale(amax)


def _epilogue_codes_and_amax(acc, x_scale, bias, activation):
    return _codes_and_amax(scale_epilogue_reference(acc, x_scale, None, None, bias, acc.dtype, activation, True))


def scale_epilogue_quantize(acc: torch.Tensor, x_scale: torch.Tensor, bias: torch.Tensor | None,
                            activation: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`scale_epilogue_quantize_reference`, compiled into one pass per row on large CPU
    accumulators: each output row is computed once, written, and quantized from a row buffer,
    instead of a second pass over the whole (tokens, N) output. Bit-identical: the codes are of the
    output as rounded to ``acc``'s dtype."""
    codes, amax = _run(_epilogue_codes_and_amax, acc, x_scale, bias, activation, per_width=True)
    return codes, _token_scale(amax)


def abs_max_sum_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``max |x|`` and ``Σ |x|`` in fp32 (0-d tensors)."""
    a = x.detach().float().abs()
    return a.amax(), a.sum()


def abs_max_sum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`abs_max_sum_reference`, compiled into one pass on large CPU inputs (no ``|x|``
    written: the delta cache's refresh check reads every linear input of a refreshed block)."""
    return _run(abs_max_sum_reference, x)


def abs_sum_per_sample_reference(x: torch.Tensor) -> torch.Tensor:
    """``Σ |x|`` over all but the first (batch) dimension, in fp32: shape ``(B,)``."""
    return x.detach().float().abs().reshape(x.shape[0], -1).sum(1)


def abs_sum_per_sample(x: torch.Tensor) -> torch.Tensor:
    """:func:`abs_sum_per_sample_reference`, compiled into one pass on large CPU inputs."""
    return _run(abs_sum_per_sample_reference, x)


def nvfp4_dequantize_reference(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                               table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows of an NVFP4 weight (``codes`` (n, K/2) uint8, low nibble first; E4M3 ``scales``
    (n, K/16); the fp32 ``global_scale``; ``table``: the 16 E2M1 values) in ``dtype``:
    ``formats.nvfp4``'s ``e2m1 · (fp32(scale) · global_scale)``, op for op."""
    n = codes.shape[0]
    values = torch.stack([table[(codes & 15).long()], table[(codes >> 4).long()]], -1).reshape(n, -1, 16)
    return (values * (scales.float() * global_scale).unsqueeze(-1)).reshape(n, -1).to(dtype)


def nvfp4_dequantize(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, table: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """:func:`nvfp4_dequantize_reference`, compiled into one pass on large weights (a weight-only
    layer, e.g. a modulation linear, dequantizes its weight on every call)."""
    return _run(nvfp4_dequantize_reference, codes, scales, global_scale, table, dtype)


def nvfp4_unpacked_dequantize_reference(values: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                                        dtype: torch.dtype) -> torch.Tensor:
    """Rows of an NVFP4 weight whose E2M1 values are kept unpacked (``values`` (n, K) int8, twice
    each value: the integers −12…12, exact) in ``dtype``: :func:`nvfp4_dequantize_reference`'s
    result bit for bit (``v/2`` is the exact E2M1 value, then the same fp32 product and rounding)."""
    n = values.shape[0]
    return ((values.float() * 0.5).reshape(n, -1, 16) * (scales.float() * global_scale).unsqueeze(-1)).reshape(n, -1).to(dtype)


def nvfp4_unpacked_dequantize(values: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                              dtype: torch.dtype) -> torch.Tensor:
    """:func:`nvfp4_unpacked_dequantize_reference`, compiled into one pass on large weights: no
    table lookup per nibble (3.4× faster than :func:`nvfp4_dequantize` at CogVideoX-2B's
    modulation shape, 11520 × 512)."""
    return _run(nvfp4_unpacked_dequantize_reference, values, scales, global_scale, dtype)


def int8_dequantize_reference(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-channel INT8 ``codes`` (n, K) times ``scale`` (n, 1) in ``dtype``, as ``formats.integer``."""
    return (codes.float() * scale).to(dtype)


def int8_dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`int8_dequantize_reference`, compiled into one pass on large weights."""
    return _run(int8_dequantize_reference, codes, scale, dtype)


def nvfp4_to_int8_reference(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                            table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of an NVFP4 weight (as :func:`nvfp4_dequantize_reference` takes them) re-rounded to
    per-channel INT8: codes (n, K) int8 and scales (n,) fp32, as ``integer.quantize`` rounds."""
    codes8, amax = _nvfp4_codes_and_amax(codes, scales, global_scale, table)
    return codes8, _token_scale(amax).reshape(-1)


def _nvfp4_codes_and_amax(codes, scales, global_scale, table):
    return _codes_and_amax(nvfp4_dequantize_reference(codes, scales, global_scale, table, torch.float32))


def nvfp4_to_int8(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, table: torch.Tensor,
                  numel: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nvfp4_to_int8_reference`, compiled into one vectorized pass per row when the weight
    (``numel`` elements, of which these rows are a part) is large: a W4A8 call re-rounds its weight
    on every call unless ``sixbit.keep_int8_weights`` keeps the INT8 copy."""
    codes8, amax = _run(_nvfp4_codes_and_amax, codes, scales, global_scale, table, numel=numel)
    return codes8, _token_scale(amax).reshape(-1)
