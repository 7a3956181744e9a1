"""A weight format's rounding grid with its scales fixed up front, and the scale searches.

A :class:`Grid` holds one scale per block of a weight (NVFP4: one E4M3 scale per 16 elements
and the fp32 per-tensor scale; symmetric integers: one fp32 scale per row or per group). With
the scales fixed, rounding is elementwise, so GPTQ (:mod:`sixbit.rounding.gptq`) can round one
column at a time and :meth:`Grid.pack` turns the rounded values into the format's container,
bit-identical to what the format's own ``quantize`` makes with the same scales.

Scale rules (:func:`grid_for`), all free at run time (they only change the stored scales):

- ``"absmax"``: the format's own rule (NVFP4 ``amax/6``, integer ``amax/qmax``): round to nearest.
- ``"mse"``: each block's scale chosen by the (optionally importance-weighted) squared error
  of the block it produces. NVFP4: among the real E4M3 values from 4 codes below to 6 codes
  above the ``amax/6`` one (half an octave of clipping to the ``amax/4`` scale and beyond;
  ModelOpt's NVFP4 MSE calibrator searches the same values). Integers: ``amax/qmax`` times
  one of 21 shrink factors 0.5…1.0 (clipping search).
- ``"4/6"`` (NVFP4 only, arXiv 2512.02010): per block, ``amax/6`` or ``amax/4`` (the grid's 4 —
  not 6 — on the block's largest value, avoiding the wide 4→6 gap), whichever errs less.

``importance`` weights each input channel's error, e.g. the calibration Hessian's diagonal
(the mean squared input of the channel): a channel the layer's inputs never use costs nothing.
The searches try one candidate scale at a time; on large weights each candidate's block errors
come from one compiled pass (:func:`sixbit.kernels.nvfp4_block_errors`, ``int_block_errors``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import formats, kernels
from ..config.quant import SCALE_RULES
from ..formats import integer, nvfp4
from ..formats.constants import E4M3_MIN_NORMAL, F4_E2M1_MAX, F8_E4M3_MAX, NVFP4_BLOCK


# fp32 temporaries of one scale-search chunk (rows × K, three of them per candidate) stay under this many bytes.
_CHUNK_BYTES = 64 << 20
# E4M3 codes searched around the amax/6 scale's code (8 codes per octave).
_E4M3_BELOW, _E4M3_ABOVE = 4, 6
_INT_SHRINK = torch.linspace(0.5, 1.0, 21)


class Grid:
    """Fixed scales of one ``(N, K)`` weight; :meth:`round` and :meth:`pack` use them."""

    def round(self, w: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """``w`` (``(N, len(cols))``: the weight's columns ``cols``, in any order) rounded to the grid."""
        raise NotImplementedError

    def pack(self, q: torch.Tensor) -> formats.Quantized:  # pragma: no cover - interface
        """The format's container of a whole weight whose values are on the grid (:meth:`round`'s)."""
        raise NotImplementedError

    def rows(self, cols: torch.Tensor) -> Callable[[int, torch.Tensor], torch.Tensor]:  # pragma: no cover
        """``f(j, x)``: :meth:`round` of ``x`` (``(N,)``) as column ``cols[j]``, bit for bit, with
        those columns' scales gathered once (GPTQ rounds the transposed weight row by row)."""
        raise NotImplementedError


class NVFP4Grid(Grid):
    def __init__(self, scales: torch.Tensor, global_scale: torch.Tensor):
        self.scales, self.global_scale = scales, global_scale
        s = scales.float()
        self._value = (s * global_scale).repeat_interleave(NVFP4_BLOCK, dim=1)  # decode: code · scale · gs
        self._reciprocal = ((1.0 / global_scale) / s).repeat_interleave(NVFP4_BLOCK, dim=1)  # as nvfp4.quantize

    def round(self, w, cols):
        scaled = torch.clamp(w * self._reciprocal[:, cols], -F4_E2M1_MAX, F4_E2M1_MAX)
        return kernels.e2m1_round(scaled) * self._value[:, cols]

    def pack(self, q):
        return nvfp4.quantize(q, global_scale=self.global_scale, scales=self.scales)

    def rows(self, cols):
        reciprocal, value = self._reciprocal[:, cols].T.contiguous(), self._value[:, cols].T.contiguous()
        return lambda j, x: kernels.e2m1_round(torch.clamp(x * reciprocal[j], -F4_E2M1_MAX, F4_E2M1_MAX)) * value[j]


class IntGrid(Grid):
    def __init__(self, scale: torch.Tensor, bits: int, group_size: int | None):
        self.scale, self.bits, self.group_size = scale, bits, group_size
        flat = scale.reshape(scale.shape[0], -1)  # (N, 1) per row, (N, K/g) per group
        self._value = flat.repeat_interleave(group_size, dim=1) if group_size else flat
        self.qmax = 2 ** (bits - 1) - 1

    def round(self, w, cols):
        s = self._value[:, cols] if self.group_size else self._value
        return torch.round(w / s).clamp_(-self.qmax, self.qmax) * s

    def pack(self, q):
        gran = "group" if self.group_size else "channel"
        return integer.quantize(q, self.bits, True, gran, self.group_size, scale=self.scale)

    def rows(self, cols):
        if not self.group_size:  # one scale per row: the same for every column
            s = self._value[:, 0]
            return lambda j, x: torch.round(x / s).clamp_(-self.qmax, self.qmax) * s
        value = self._value[:, cols].T.contiguous()
        return lambda j, x: torch.round(x / value[j]).clamp_(-self.qmax, self.qmax) * value[j]


def supports(fmt_name: str) -> bool:
    """Whether scale search and GPTQ handle ``fmt_name`` (NVFP4; symmetric per-row or per-group integers)."""
    fmt = formats.get(fmt_name)
    if fmt.family == "nvfp4":
        return True
    return fmt.family == "integer" and "-asym" not in fmt.name and not fmt.name.endswith("-tensor")


def grid_for(w: torch.Tensor, fmt_name: str, rule: str = "absmax", importance: torch.Tensor | None = None) -> Grid:
    """The grid of ``w`` (``(N, K)``, fp32) in format ``fmt_name`` with scales chosen by ``rule``.

    Args:
        w: the weight as it will be stored (rotated / divided already).
        fmt_name: ``"nvfp4"`` or a symmetric integer format (``"int4"``, ``"int4-g64"``, ``"int8"``…).
        rule: ``"absmax"`` (round to nearest; default), ``"mse"`` or ``"4/6"`` (NVFP4): see the
            module docstring. ``"mse"`` is never worse than ``"absmax"`` in (weighted) squared
            error: the ``absmax`` scale is one of its candidates.
        importance: optional non-negative ``(K,)`` weights of the input channels' errors.

    Example:
        >>> w = torch.randn(8, 64)
        >>> g = grid_for(w, "nvfp4", "mse")
        >>> q = g.pack(g.round(w, torch.arange(64)))
        >>> bool(((q.dequantize() - w) ** 2).sum() <= ((nvfp4.quantize(w).dequantize() - w) ** 2).sum())
        True
    """
    if rule not in SCALE_RULES:
        raise ValueError(f"unknown scale rule {rule!r}; choose one of {SCALE_RULES}")
    if not supports(fmt_name):
        raise ValueError(
            f"scale search and GPTQ support NVFP4 and symmetric per-row or per-group integer formats, not {fmt_name!r}: "
            "use scale rule 'absmax' without GPTQ, or e.g. 'int4-g64'"
        )
    fmt = formats.get(fmt_name)
    w = w.float()
    if importance is not None:
        importance = importance.float().reshape(1, -1).clamp_min(0)
    if fmt.family == "nvfp4":
        return _nvfp4_grid(w, rule, importance)
    if rule == "4/6":
        raise ValueError("the '4/6' scale rule is for NVFP4; integer formats use 'absmax' or 'mse'")
    return _int_grid(w, fmt, rule, importance)


def _pick(candidates, errors) -> torch.Tensor:
    """Per block, the candidate scale with the least (weighted) squared error: ``candidates``
    yields ``(key, scale)`` (keys ``(n, blocks)``, scales ``(n, blocks, 1)``), ``errors(scale)``
    gives that scale's block errors. Candidates are tried one at a time and the first of equal
    errors is kept (the absmax scale goes first: never worse than it). Returns the chosen keys."""
    best = keys = None
    for key, scale in candidates:
        err = errors(scale)
        if best is None:
            best, keys = err, key.clone()
        else:
            better = err < best
            best = torch.where(better, err, best)
            keys = torch.where(better, key, keys)
    return keys


def _rows_per_chunk(k: int) -> int:
    return max(1, _CHUNK_BYTES // (4 * k * 3))


def _nvfp4_grid(w: torch.Tensor, rule: str, importance) -> NVFP4Grid:
    scales, gs = nvfp4.block_scales(w)  # the absmax scales (and the global scale every rule keeps)
    if rule == "absmax":
        return NVFP4Grid(scales, gs)
    lo_code, hi_code = (torch.tensor(v).to(torch.float8_e4m3fn).view(torch.uint8).item()
                        for v in (E4M3_MIN_NORMAL, F8_E4M3_MAX))
    codes0 = scales.view(torch.uint8).long()
    if rule == "mse":
        offsets = torch.arange(-_E4M3_BELOW, _E4M3_ABOVE + 1)
        others = (codes0.unsqueeze(0) + offsets.view(-1, 1, 1)).clamp(lo_code, hi_code)
    else:  # "4/6": the amax/4 scale beside the amax/6 one
        amax = w.reshape(w.shape[0], -1, NVFP4_BLOCK).abs().amax(-1)
        four = torch.clamp(amax / 4.0 / gs, E4M3_MIN_NORMAL, F8_E4M3_MAX).to(torch.float8_e4m3fn)
        others = four.view(torch.uint8).long().unsqueeze(0)
    cand = torch.cat([codes0.unsqueeze(0), others]).to(torch.uint8)  # (C, N, K/16) E4M3 bit patterns
    blocks = w.reshape(w.shape[0], -1, NVFP4_BLOCK)
    weights = None if importance is None else importance.reshape(1, -1, NVFP4_BLOCK)

    best = torch.empty_like(scales)
    step = _rows_per_chunk(w.shape[1])
    for r in range(0, w.shape[0], step):
        rows = blocks[r:r + step]
        tried = ((c, c.view(torch.float8_e4m3fn).float().unsqueeze(-1)) for c in cand[:, r:r + step])
        errors = lambda s: kernels.nvfp4_block_errors(rows, s, gs, weights, numel=w.numel())  # noqa: E731
        best[r:r + step] = _pick(tried, errors).view(torch.float8_e4m3fn)
    return NVFP4Grid(best, gs)


def _int_grid(w: torch.Tensor, fmt, rule: str, importance) -> IntGrid:
    bits, group = fmt.element_bits, fmt.block_size
    base = fmt.quantize(w)
    if rule == "absmax":
        return IntGrid(base.scale, bits, group)
    qmax = 2 ** (bits - 1) - 1
    block = group or w.shape[1]
    shrink = torch.cat([torch.ones(1), _INT_SHRINK[:-1]])  # 1.0 (absmax) first: ties keep it
    blocks = w.reshape(w.shape[0], -1, block)
    weights = None if importance is None else importance.reshape(1, -1, block)

    best = torch.empty_like(base.scale)
    step = _rows_per_chunk(w.shape[1])
    for r in range(0, w.shape[0], step):
        rows = blocks[r:r + step]
        s0 = base.scale[r:r + step].reshape(rows.shape[0], -1, 1)  # (n, K/block, 1)
        tried = ((s.squeeze(-1), s) for s in (s0 * f for f in shrink))
        errors = lambda s: kernels.int_block_errors(rows, s, qmax, weights, numel=w.numel())  # noqa: E731
        best[r:r + step] = _pick(tried, errors).reshape(best[r:r + step].shape)
    return IntGrid(best, bits, group)
