"""What :class:`~sixbit.nn.QuantLinear` makes of its stored weight for a call: the dequantized
weight of the full-precision path, the dense weight of the whole function it computes, and the
per-channel INT8 operand of the integer GEMM, converted a block of rows at a time (no fp32 copy
of the whole weight)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import kernels
from ..formats import Quantized, integer, nvfp4
from ..transforms import hadamard

# Rows of a non-INT8 weight re-rounded to INT8 at a time: ≤ 1 MiB of fp32 temporaries per chunk.
CONVERT_BYTES = 1 << 20


def dequantize(q: Quantized, dtype: torch.dtype) -> torch.Tensor:
    """``q.dequantize(dtype)``; NVFP4 and per-channel INT8 weights through the compiled kernels
    when large (one pass, bit-identical)."""
    if isinstance(q, nvfp4.NVFP4Quantized) and q.codes.dim() == 2:
        return kernels.nvfp4_dequantize(q.codes, q.scales, q.global_scale, nvfp4.E2M1.table(q.codes.device), dtype)
    if fits_int8_gemm(q) and q.bits == 8:
        return kernels.int8_dequantize(q.values(), q.scale, dtype)
    return q.dequantize(dtype)


def fits_int8_gemm(q: Quantized) -> bool:
    """Symmetric per-channel integer codes of ≤ 8 bits: ``values()`` is int8, ``scale`` is (N, 1)."""
    return isinstance(q, integer.IntQuantized) and q.symmetric and q.granularity == "channel"


def _row_blocks(stored: Quantized, n: int, k: int, convert: Callable[[Quantized, slice], object]) -> list:
    """``convert(part, rows)`` on blocks of rows of ``stored`` (``part``: those rows, ``rows``:
    their slice), so no fp32 temporary is larger than ~1 MiB; a container that cannot be sliced
    is converted whole (``rows``: every row)."""
    step = max(1, CONVERT_BYTES // (4 * k))
    try:
        return [convert(stored.rows(r, min(r + step, n)), slice(r, min(r + step, n))) for r in range(0, n, step)]
    except NotImplementedError:
        return [convert(stored, slice(None))]


def by_row_blocks(stored: Quantized, n: int, k: int,
                   convert: Callable[[Quantized, slice], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel codes ``(n, k)`` and scales ``(n,)`` from ``convert(part, rows)`` run on blocks of
    rows of ``stored``; identical to converting it whole when each row's result depends only on
    that row."""
    parts = _row_blocks(stored, n, k, convert)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]).reshape(-1)


def to_int8(q: Quantized, numel: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel INT8 codes ``(n, K)`` and scales ``(n,)`` of a dequantized weight slice (of a
    weight of ``numel`` elements: large NVFP4 ones take the compiled kernel, bit-identical)."""
    if isinstance(q, nvfp4.NVFP4Quantized) and q.codes.dim() == 2:
        return kernels.nvfp4_to_int8(q.codes, q.scales, q.global_scale, nvfp4.E2M1.table(q.codes.device), numel)
    w = integer.quantize(q.dequantize(), bits=8, granularity="channel", check=False)
    return w.values(), w.scale.reshape(-1)


def int8_operand(stored: Quantized, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel INT8 codes ``(n, k)`` and scales ``(n,)`` of a weight of another format,
    converted a block of rows at a time (identical to converting it whole)."""
    return by_row_blocks(stored, n, k, lambda part, rows: to_int8(part, n * k))


def int8_container(codes: torch.Tensor, scale: torch.Tensor) -> integer.IntQuantized:
    """:func:`int8_operand`'s result as a per-channel INT8 container (a kept copy)."""
    n, k = codes.shape
    return integer.IntQuantized(codes.reshape(-1).view(torch.uint8), scale.reshape(-1, 1), (n, k), 8, True, "channel")


def _folded(w: torch.Tensor, rows: slice, up: torch.Tensor | None, down: torch.Tensor | None,
            divisor: torch.Tensor | None, block: int | None) -> torch.Tensor:
    """``((W + U·D)·diag(1/s))·H`` of the fp32 rows ``w`` (``rows`` of the weight): what a
    full-precision call multiplies its raw input by."""
    if up is not None:
        w = w + up[rows].float() @ down.float()
    if divisor is not None:
        w = w / divisor.float()
    return w if block is None else hadamard.rotate(w, block)


def folded_dense(stored: Quantized, n: int, k: int, up: torch.Tensor | None, down: torch.Tensor | None,
                 divisor: torch.Tensor | None, block: int | None, dtype: torch.dtype) -> torch.Tensor:
    """The dense ``(n, k)`` weight, in ``dtype``, of the whole function a full-precision call
    computes: the stored weight plus its low-rank branch (``up``/``down``, if any), divided by
    the input ``divisor`` (if any), rotated back by the Hadamard ``block`` (if any). Rounded once,
    from fp32; what ``QuantLinear.keep_dense`` keeps."""
    parts = _row_blocks(stored, n, k, lambda part, rows: _folded(part.dequantize(), rows, up, down, divisor, block).to(dtype))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def folded_int8(stored: Quantized, n: int, k: int, up: torch.Tensor | None, down: torch.Tensor | None,
                block: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel INT8 codes ``(n, k)`` and scales ``(n,)`` of ``(W_q + U·D)·H``: the stored weight
    plus its low-rank branch (``up``/``down``, if any), rotated back by the Hadamard ``block`` (if
    any). What ``QuantLinear.pack_int8(fold=True)`` packs."""

    return by_row_blocks(stored, n, k, lambda part, rows: kernels.quantize_rows_reference(
        _folded(part.dequantize(), rows, up, down, None, block)))
