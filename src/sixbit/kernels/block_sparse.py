"""Block-sparse attention: each query block attends only the key blocks a boolean table keeps.

:func:`block_sparse_attention` runs ``torch.nn.attention.flex_attention`` under
``torch.compile`` (an inductor C++ template on CPU, a Triton kernel on CUDA), which skips the
key blocks the table drops: its time falls nearly in proportion to the table's density
(REFERENCE.md §11). It is compiled once per shape and table size. Its reference twin,
:func:`block_sparse_reference`, is dense SDPA with the table expanded to an explicit boolean
token mask; the two agree to float rounding (the summation order differs), which is what the
tests check on CPU, for the CPU and the CUDA path alike (both are the same flex template).

Uncompiled (eager) ``flex_attention`` is not a path here: on CPU it silently mis-handles a
sequence whose length is not a multiple of the block size, and it materializes the scores.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def block_mask(table: torch.Tensor, tokens: int, block_size: int):
    """The flex ``BlockMask`` of ``table`` (``(heads, query blocks, key blocks)`` booleans, every
    kept block kept whole) over ``tokens`` queries and keys in blocks of ``block_size``."""
    from torch.nn.attention.flex_attention import BlockMask

    table = table.to(torch.bool)
    counts = table.sum(-1, dtype=torch.int32)[None]
    # kept key blocks first, in order (a stable sort of the kept flags)
    order = torch.argsort(table.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)[None]
    # no partial blocks: every kept block is full. (Distinct tensors for the two index sets:
    # inductor's CPU template fails to compile when one tensor is passed as both.)
    return BlockMask.from_kv_blocks(torch.zeros_like(counts), torch.zeros_like(order), counts, order,
                                    BLOCK_SIZE=block_size, seq_lengths=(tokens, tokens))


def token_mask(table: torch.Tensor, tokens: int, block_size: int) -> torch.Tensor:
    """``table`` expanded to an explicit ``(heads, tokens, tokens)`` boolean mask (True: attended)."""
    table = table.to(torch.bool)
    return table.repeat_interleave(block_size, -2).repeat_interleave(block_size, -1)[:, :tokens, :tokens]


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
                           block_size: int, scale: float | None = None) -> torch.Tensor:
    """Attention of ``q``, ``k``, ``v`` (``(batch, heads, tokens, dim)``, one length) where query
    block ``i`` of head ``h`` sees key block ``j`` only if ``table[h, i, j]``. Every query block
    must keep at least one key block. Compiled flex attention (see the module docstring)."""
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"block-sparse attention takes q, k, v of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    mask = block_mask(table.to(q.device), q.shape[-2], block_size)
    return _compiled_flex()(q, k, v, block_mask=mask, scale=scale)


def block_sparse_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
                           block_size: int, scale: float | None = None) -> torch.Tensor:
    """:func:`block_sparse_attention`'s reference twin: dense SDPA with the explicit token mask."""
    mask = token_mask(table.to(q.device), q.shape[-2], block_size)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


__all__ = ["block_mask", "block_sparse_attention", "block_sparse_reference", "token_mask"]
