"""Block tables over the (frame, row, column) token grid: which key blocks each query block sees.

Tokens run in the model's order (text first or last, video frame-major after patching), or in
a tile order (:func:`tile_order`), and are cut into blocks of ``block_size``. Each block's video
tokens span a few boxes in (frame, row, column), one per row or band they run through; a query
block keeps a key block when one of its boxes and one of the key block's are within the window
on every axis (the gap between the boxes, 0 where they overlap, at most the window's
half-width). A box is a superset of its tokens, so the table keeps every token pair within the
window: the mask never drops what the window asks for, and every kept block is kept whole (no
partial blocks: the kernel runs only full tiles). Blocks holding text are kept as keys for every query, and text
query blocks keep every key; so are the first ``global_blocks`` video key blocks.

A *ladder* is the sequence of windows growing evenly on the three axes, from the smallest
(radius 0: the query's own box) to the whole grid (dense), each with its block table and density;
the fixed budget takes the largest rung within it, the adaptive mode climbs from there.
"""

from __future__ import annotations

import dataclasses
import math

import torch

#: rungs of a ladder: windows at these shares of the grid's extent on every axis (duplicates dropped)
RADII = tuple(i / 24 for i in range(25))


@dataclasses.dataclass(frozen=True)
class TokenGrid:
    """Where a call's tokens lie: ``text`` text tokens before (``text_first``) or after the
    ``frames × rows × cols`` video tokens."""

    frames: int
    rows: int
    cols: int
    text: int = 0
    text_first: bool = True

    @property
    def video(self) -> int:
        return self.frames * self.rows * self.cols

    @property
    def tokens(self) -> int:
        return self.video + self.text


@dataclasses.dataclass
class Rung:
    """One window of a ladder: ``(frames, rows, cols)`` half-widths, its table, its density."""

    window: tuple[int, int, int]
    table: torch.Tensor  # (query blocks, key blocks) booleans
    density: float


def band_width(block_size: int) -> int:
    """Columns of a band: the power of two nearest ``√(2 · block_size)``, so that a block in a band
    is a patch about twice as wide as tall (128 tokens: 16 columns × 8 rows)."""
    return 2 ** round(math.log2((2 * block_size) ** 0.5))


def tile_order(grid: TokenGrid, block_size: int) -> torch.Tensor:
    """A tile order of the tokens (as STA's): position ``p`` of the reordered sequence holds token
    ``order[p]``.

    Each frame is cut into bands of :func:`band_width` columns; the video runs frame by frame,
    band by band, each band row by row, from position 0; the text follows. Any ``block_size``
    tokens in a band are then a compact patch (128 tokens: ~8 rows × 16 columns) wherever the
    block starts, so no padding is needed where the frame's size is not a multiple of a tile;
    only a block crossing from one band to the next spans two patches. In the model's order a
    block of 128 tokens is a strip of ~3 rows spanning a 45-column frame, so a window around it
    keeps whole rows of the frame."""
    width = band_width(block_size)
    v = torch.arange(grid.video)
    f, r, c = v // (grid.rows * grid.cols), (v // grid.cols) % grid.rows, v % grid.cols
    bands = -(-grid.cols // width)
    video = torch.argsort(((f * bands + c // width) * grid.rows + r) * width + c % width)
    text = torch.arange(grid.text)
    return torch.cat([grid.text + video, text]) if grid.text_first else torch.cat([video, grid.video + text])


def _boxes(grid: TokenGrid, block_size: int, order: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per block and segment: the low and high (frame, row, column) of the block's video tokens in
    that segment (``(blocks, segments, 3)``), and per block whether it holds text. Blocks are cut
    from the tokens in ``order`` (``None``: the model's order); a segment is a run of a block's
    tokens within one row of a frame (the model's order) or one band of a frame (the tile order),
    so each box is tight even where a block crosses to the next row or band."""
    index = torch.arange(grid.tokens) if order is None else order
    video = index - grid.text if grid.text_first else index
    is_text = (video < 0) | (video >= grid.video)
    v = video.clamp(0, grid.video - 1)
    f, r, c = v // (grid.rows * grid.cols), (v // grid.cols) % grid.rows, v % grid.cols
    place = torch.stack([f, r, c], -1)
    width = band_width(block_size)
    segment = f * grid.rows + r if order is None else f * -(-grid.cols // width) + c // width
    blocks = math.ceil(grid.tokens / block_size)
    pad = blocks * block_size - grid.tokens
    big = grid.tokens + 1  # above every place: no video token there
    key = torch.nn.functional.pad(torch.where(is_text, -1, segment), (0, pad), value=-1).reshape(blocks, block_size)
    change = torch.ones_like(key, dtype=torch.bool)
    change[:, 1:] = key[:, 1:] != key[:, :-1]
    slot = change.cumsum(1) - 1  # each block's segments, in order
    segments = int(slot.max()) + 1
    where = (torch.arange(blocks)[:, None] * segments + slot).reshape(-1, 1).expand(-1, 3)
    lo_tokens = torch.nn.functional.pad(torch.where(is_text[:, None], big, place), (0, 0, 0, pad), value=big)
    hi_tokens = torch.nn.functional.pad(torch.where(is_text[:, None], -1, place), (0, 0, 0, pad), value=-1)
    lo = torch.full((blocks * segments, 3), big).scatter_reduce(0, where, lo_tokens, "amin")
    hi = torch.full((blocks * segments, 3), -1).scatter_reduce(0, where, hi_tokens, "amax")
    text = torch.nn.functional.pad(is_text, (0, pad)).reshape(blocks, block_size).any(-1)
    return lo.reshape(blocks, segments, 3), hi.reshape(blocks, segments, 3), text


def window_table(grid: TokenGrid, block_size: int, window: tuple[int, int, int], global_blocks: int,
                 order: torch.Tensor | None = None) -> torch.Tensor:
    """The ``(query blocks, key blocks)`` table of ``window`` (see the module docstring) over the
    tokens in ``order`` (:func:`tile_order`; ``None``: the model's order)."""
    lo, hi, text = _boxes(grid, block_size, order)
    video = (hi[:, :, 0] >= 0).any(1)  # blocks holding any video token
    q_lo, q_hi, k_lo, k_hi = lo[:, :, None, None], hi[:, :, None, None], lo[None, None], hi[None, None]
    gap = torch.clamp(torch.maximum(k_lo - q_hi, q_lo - k_hi), min=0)  # (q block, q segment, k block, k segment, axis)
    table = (gap <= torch.tensor(window)).all(-1).any(-1).any(1) & video[:, None] & video[None, :]
    table |= text[None, :] | text[:, None]
    first_video = int(video.nonzero()[0]) if video.any() else 0
    table[:, first_video:first_video + global_blocks] = True
    return table


def ladder(grid: TokenGrid, block_size: int, global_blocks: int, order: torch.Tensor | None = None) -> list[Rung]:
    """The windows from the smallest to dense, each table once (the last one is dense)."""
    rungs, seen = [], set()
    for radius in RADII:
        window = tuple(round(radius * (n - 1)) for n in (grid.frames, grid.rows, grid.cols))
        if window in seen:
            continue
        seen.add(window)
        table = window_table(grid, block_size, window, global_blocks, order)
        if rungs and torch.equal(table, rungs[-1].table):
            continue  # the same blocks as a smaller window: one rung
        rungs.append(Rung(window, table, float(table.float().mean())))
    return rungs


def budget_rung(rungs: list[Rung], density: float) -> int:
    """The index of the largest rung within ``density``, or 0 when even the smallest is over it."""
    within = [i for i, rung in enumerate(rungs) if rung.density <= density + 1e-9]
    return within[-1] if within else 0


__all__ = ["RADII", "Rung", "TokenGrid", "band_width", "budget_rung", "ladder", "tile_order", "window_table"]
