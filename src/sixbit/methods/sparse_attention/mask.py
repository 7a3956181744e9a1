"""Block tables over the (frame, row, column) token grid: which key blocks each query block sees.

Tokens run in the model's order (text first or last, video frame-major after patching) and are
cut into blocks of ``block_size``. Each block's video tokens span a box in (frame, row, column);
a query block keeps a key block when the two boxes are within the window on every axis (the
gap between the boxes, 0 where they overlap, at most the window's half-width). A box is a
superset of its tokens, so a kept pair holds every token pair within the window: the mask never
drops what the window asks for, and every kept block is kept whole (no partial blocks: the
kernel runs only full tiles). Blocks holding text are kept as keys for every query, and text
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


def _boxes(grid: TokenGrid, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per block: the low and high (frame, row, column) of its video tokens and whether it holds text."""
    index = torch.arange(grid.tokens)
    video = index - grid.text if grid.text_first else index
    is_text = (video < 0) | (video >= grid.video)
    v = video.clamp(0, grid.video - 1)
    place = torch.stack([v // (grid.rows * grid.cols), (v // grid.cols) % grid.rows, v % grid.cols], -1)
    blocks = math.ceil(grid.tokens / block_size)
    pad = blocks * block_size - grid.tokens
    big = grid.tokens + 1  # above every place: no video token there
    lo = torch.nn.functional.pad(torch.where(is_text[:, None], big, place), (0, 0, 0, pad), value=big)
    hi = torch.nn.functional.pad(torch.where(is_text[:, None], -1, place), (0, 0, 0, pad), value=-1)
    text = torch.nn.functional.pad(is_text, (0, pad)).reshape(blocks, block_size).any(-1)
    return lo.reshape(blocks, block_size, 3).amin(1), hi.reshape(blocks, block_size, 3).amax(1), text


def window_table(grid: TokenGrid, block_size: int, window: tuple[int, int, int], global_blocks: int) -> torch.Tensor:
    """The ``(query blocks, key blocks)`` table of ``window`` (see the module docstring)."""
    lo, hi, text = _boxes(grid, block_size)
    video = hi[:, 0] >= 0  # blocks holding any video token
    gap = torch.clamp(torch.maximum(lo[None, :] - hi[:, None], lo[:, None] - hi[None, :]), min=0)
    table = (gap <= torch.tensor(window)).all(-1) & video[:, None] & video[None, :]
    table |= text[None, :] | text[:, None]
    first_video = int(video.nonzero()[0]) if video.any() else 0
    table[:, first_video:first_video + global_blocks] = True
    return table


def ladder(grid: TokenGrid, block_size: int, global_blocks: int) -> list[Rung]:
    """The windows from the smallest to dense, each table once (the last one is dense)."""
    rungs, seen = [], set()
    for radius in RADII:
        window = tuple(math.ceil(radius * (n - 1)) for n in (grid.frames, grid.rows, grid.cols))
        if window in seen:
            continue
        seen.add(window)
        table = window_table(grid, block_size, window, global_blocks)
        if rungs and torch.equal(table, rungs[-1].table):
            continue  # the same blocks as a smaller window: one rung
        rungs.append(Rung(window, table, float(table.float().mean())))
    return rungs


def budget_rung(rungs: list[Rung], density: float) -> int:
    """The index of the largest rung within ``density``, or 0 when even the smallest is over it."""
    within = [i for i, rung in enumerate(rungs) if rung.density <= density + 1e-9]
    return within[-1] if within else 0


__all__ = ["RADII", "Rung", "TokenGrid", "budget_rung", "ladder", "window_table"]
