"""Settings of sparse attention (:mod:`sixbit.methods.sparse_attention`): how many key blocks each
query block sees, and when a head falls back to more."""

from __future__ import annotations

import dataclasses

from .method_types import register_config_type
from .serialize import Serializable
from .validate import report, type_problems


@dataclasses.dataclass
class SparseAttentionConfig(Serializable):
    """Block-sparse self-attention over the video's (frame, row, column) token grid.

    Each query block sees the key blocks within a window around it — within ``rows × columns``
    of its place in a frame, and within ``frames`` frames of its own — plus every block holding
    text tokens and the first ``global_blocks`` video blocks; text queries see everything.
    Cross-attention (Wan's text keys) stays dense.

    Args:
        density: fixed budget (default 0.2): the share of (query block, key block) pairs kept,
            text and global blocks included. The window grows evenly in frames, rows and columns
            up to the largest one within the budget (the smallest window where even that is
            over it). Lower: faster, further from dense attention. ``None`` with ``window``.
        window: ``(frames, rows, columns)`` half-widths in tokens (after patching) instead of a
            budget, e.g. ``(1, 8, 8)``; ``None`` (default) to size it from ``density``.
        error_bound: ``None`` (default): the fixed budget (or window) for every head. A number
            turns on the adaptive mode: at each call, on ``sample_rows`` sampled query rows, each
            head's masked output is compared with its dense output, and a head whose relative
            error (L2) is above the bound widens its window step by step, up to dense. Tighter:
            closer to dense, slower. ~0.05 keeps the shipped models near dense quality.
        warmup_steps: first denoising steps that run dense (default 2): the early steps lay out
            the video and their attention is the least local.
        block_size: tokens per query and key block (default 128; smaller blocks follow the
            window more closely, larger ones run faster per kept block).
        global_blocks: the first video key blocks every query sees (default 1): an attention
            sink, as in Radial Attention.
        sample_rows: query rows per call the adaptive mode measures (default 32).
        tiles: cut the blocks from the video tokens reordered into bands of a frame (default
            True; STA's idea of a tile order, undone after the kernel): a block is then a compact
            patch (128 tokens: ~8 rows × 16 columns), so a window keeps its neighbours in both
            directions. ``False`` cuts them in the model's order, where a block is a strip of rows
            spanning the frame. Which keeps more quality per kept block is not measured on
            sixbit's models yet (their frames are 8 patches wide, where both orders coincide).

    A call whose mask keeps ≥ 90 % of the blocks runs as the unhooked dense SDPA call, bit for
    bit: flex attention's dense path is slower than SDPA's fused kernel.

    Example:
        >>> SparseAttentionConfig(density=0.15, warmup_steps=4).describe()
        'density 0.15, dense for steps 0–3, blocks of 128'
    """

    density: float | None = 0.2
    window: tuple[int, int, int] | None = None
    error_bound: float | None = None
    warmup_steps: int = 2
    block_size: int = 128
    global_blocks: int = 1
    sample_rows: int = 32
    tiles: bool = True

    def __post_init__(self):
        problems = type_problems(self)
        if isinstance(self.window, list):
            self.window = tuple(self.window)
        if (self.density is None) == (self.window is None):
            problems.append(f"give density (a share of blocks) or window (frames, rows, columns), exactly one; got "
                            f"density={self.density!r}, window={self.window!r}")
        if self.density is not None and not (isinstance(self.density, (int, float)) and 0 < self.density <= 1):
            problems.append(f"density must be within (0, 1], got {self.density!r}")
        if self.window is not None and not (isinstance(self.window, tuple) and len(self.window) == 3 and all(
                isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in self.window)):
            problems.append(f"window must be (frames, rows, columns) of integers ≥ 0, got {self.window!r}")
        if self.error_bound is not None and not (isinstance(self.error_bound, (int, float)) and self.error_bound > 0):
            problems.append(f"error_bound must be None (fixed budget) or a relative error > 0, got {self.error_bound!r}")
        for name, least in (("warmup_steps", 0), ("block_size", 16), ("global_blocks", 0), ("sample_rows", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                problems.append(f"{name} must be an integer ≥ {least}, got {value!r}")
        if isinstance(self.block_size, int) and self.block_size % 16:
            problems.append(f"block_size must be a multiple of 16 (flex attention's tiles), got {self.block_size!r}")
        if problems:
            raise ValueError(report("invalid SparseAttentionConfig", problems))

    @property
    def adaptive(self) -> bool:
        """Whether heads widen their windows where the measured error passes ``error_bound``."""
        return self.error_bound is not None

    def describe(self) -> str:
        """The settings in words: ``"density 0.2, dense for steps 0–1, blocks of 128"``."""
        size = f"density {self.density:g}" if self.window is None else "window {}×{}×{}".format(*self.window)
        if self.adaptive:
            size += f", adaptive to error {self.error_bound:g}"
        warm = ("no dense warm-up" if not self.warmup_steps else "dense for step 0" if self.warmup_steps == 1
                else f"dense for steps 0–{self.warmup_steps - 1}")
        return f"{size}, {warm}, blocks of {self.block_size}"


# A preset names this config (``w8a8-sparse``): its method name is known wherever configs are
# read, before :mod:`sixbit.methods` registers the method itself under the same name.
register_config_type("sparse_attention", SparseAttentionConfig)
