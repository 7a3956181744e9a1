"""Bit packing of sub-byte codes into ``uint8`` storage.

Codes are packed little-endian in bit order: value ``i`` of a group occupies bits
``[b·i, b·(i+1))`` of the group's byte string. For 4-bit codes this puts element ``2i`` in the
LOW nibble and ``2i+1`` in the high nibble (torchao ``pack_uint4``, NVIDIA ModelOpt); for 6-bit
codes four values fill three bytes. Packing runs along the flattened tensor; the trailing
group is zero-padded and :func:`unpack_bits` drops the padding.
"""

from __future__ import annotations

import math

import torch


def code_group(bits: int) -> tuple[int, int]:
    """(values per group, bytes per group): the smallest run of codes filling whole bytes."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    values = 8 // math.gcd(8, bits)
    return values, values * bits // 8


def packed_numel(numel: int, bits: int) -> int:
    """Number of bytes that :func:`pack_bits` produces for ``numel`` codes of ``bits`` bits."""
    values, nbytes = code_group(bits)
    return -(-numel // values) * nbytes


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes in ``[0, 2**bits)`` into a flat ``uint8`` tensor."""
    values, nbytes = code_group(bits)
    if bits == 8:  # the hot path for INT8 activations: no int64 round trip
        if codes.dtype in (torch.int8, torch.uint8):
            return codes.reshape(-1).view(torch.uint8)
        return (codes.reshape(-1).to(torch.int32) & 0xFF).to(torch.uint8)
    flat = codes.reshape(-1).to(torch.int64) & ((1 << bits) - 1)
    pad = (-flat.numel()) % values
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    groups = flat.view(-1, values)
    shifts = torch.arange(values, device=codes.device, dtype=torch.int64) * bits
    word = (groups << shifts).sum(dim=1, keepdim=True)  # ≤ 56 bits: fits int64
    byte_shifts = torch.arange(nbytes, device=codes.device, dtype=torch.int64) * 8
    return ((word >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``numel`` codes as a flat ``uint8`` tensor.

    For 8-bit codes the result is a view of ``packed`` (no copy).
    """
    values, nbytes = code_group(bits)
    expected = packed_numel(numel, bits)
    if packed.dtype != torch.uint8 or packed.numel() != expected:
        raise ValueError(
            f"packed codes must be {expected} uint8 values for {numel} {bits}-bit codes, "
            f"got {packed.numel()} of {packed.dtype}"
        )
    if bits == 8:
        return packed.reshape(-1)
    grouped = packed.reshape(-1, nbytes).to(torch.int64)
    byte_shifts = torch.arange(nbytes, device=packed.device, dtype=torch.int64) * 8
    word = (grouped << byte_shifts).sum(dim=1, keepdim=True)
    shifts = torch.arange(values, device=packed.device, dtype=torch.int64) * bits
    codes = (word >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:numel].to(torch.uint8)
