"""An analytic judge for videos of the shapes world (:mod:`sixbit.zoo.shapes.world`).

From a generated video the judge finds the object, names its color, shape and motion direction,
and measures temporal flicker; over a prompt set it reports adherence accuracy per attribute.
It has no learned parts, so it cannot share a model's blind spots, and on clean renders of the
world it is right every time (tested on every prompt, both background kinds).

How it decides (the world makes each step unambiguous):

* **Segmentation.** Objects are saturated (max - min channel >= 0.6), backgrounds are gray.
  Per frame, pixels whose saturation reaches half the frame's peak form the candidate mask; the
  largest 4-connected component is the object. A frame whose peak saturation is below
  ``MIN_PEAK_SATURATION`` has no object.
* **Color.** Mean chroma (RGB minus its gray level) of the object pixels over all frames, matched
  to the palette by cosine similarity: robust to the object being darker or lighter than the
  palette entry, which a blurry model output often is.
* **Shape.** Median over frames of two mask statistics: fill ratio of the bounding box (square
  ~1, circle ~pi/4, triangle ~1/2) and vertical mass asymmetry (upward triangles keep 3/4 of their
  area in the lower half; circles and squares are symmetric).
* **Motion.** Least-squares slope of the object's centroid over frames; the direction is the
  dominant axis, or ``"none"`` below ``MIN_TRAVEL_PX`` of travel over the clip (truth moves
  10.5-14 px).
* **Flicker.** Mean absolute frame-to-frame change of the pixels that are background in both
  frames (object masks dilated by 2 px are excluded), in [0, 1] intensity units averaged over RGB.
  The world's background is static, so a clean render scores 0; a model that shimmers, drifts
  in brightness or leaves trails scores higher.

Example:
    >>> from sixbit.zoo.shapes.world import sample_specs, render
    >>> spec = sample_specs(1, seed=0)[0]
    >>> verdict = judge_video(render(spec))
    >>> (verdict.color, verdict.shape, verdict.direction) == (spec.color, spec.shape, spec.direction)
    True
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np

from ...eval.media import as_frames
from .world import COLORS, DIRECTIONS, SHAPES, parse_prompt

#: Below this peak saturation a frame has no object (backgrounds are gray: saturation 0).
MIN_PEAK_SATURATION = 0.2
#: Fewer object pixels than this in a frame counts as no object (the smallest object covers ~60).
MIN_AREA_PX = 6
#: Less travel than this over the clip is "none" (the world's objects travel 10.5-14 px).
MIN_TRAVEL_PX = 3.0
#: Vertical asymmetry above which a shape is a triangle (triangles: ~0.5, others: ~0).
TRIANGLE_ASYMMETRY = 0.2
#: Bounding-box fill ratio above which a symmetric shape is a square (square ~1, circle ~0.79).
SQUARE_FILL = 0.9

ATTRIBUTES = ("color", "shape", "direction")

_PALETTE = np.array([COLORS[c] for c in COLORS], dtype=np.float64)
_PALETTE_CHROMA = _PALETTE - _PALETTE.mean(axis=1, keepdims=True)
_PALETTE_CHROMA /= np.linalg.norm(_PALETTE_CHROMA, axis=1, keepdims=True)


@dataclasses.dataclass
class ShapesVerdict:
    """What the judge sees in one video.

    ``color``/``shape``/``direction`` are ``"none"`` when no object was found (or, for the
    direction, when it does not move). ``displacement`` is (dx, dy) in px over the clip,
    ``flicker`` the background's mean absolute frame-to-frame change in [0, 1] units.
    """

    detected_frames: int
    color: str
    shape: str
    direction: str
    displacement: tuple[float, float]
    fill_ratio: float
    asymmetry: float
    flicker: float

    def __str__(self) -> str:
        if not self.detected_frames:
            return f"no object detected (flicker {self.flicker:.4f})"
        dx, dy = self.displacement
        return (
            f"a {self.color} {self.shape} moving {self.direction} "
            f"(travel dx={dx:+.1f} px, dy={dy:+.1f} px; fill {self.fill_ratio:.2f}, "
            f"asymmetry {self.asymmetry:+.2f}; seen in {self.detected_frames} frames; flicker {self.flicker:.4f})"
        )

    def matches(self, prompt: str) -> dict[str, bool]:
        """Per attribute, whether the verdict agrees with ``prompt``."""
        want = parse_prompt(prompt)
        return {a: getattr(self, a) == want[a] for a in ATTRIBUTES}


def _largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected component of a boolean (H, W) mask."""
    h, w = mask.shape
    seen = np.zeros_like(mask)
    best: list[tuple[int, int]] = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        queue, comp = deque([(y0, x0)]), []
        while queue:
            y, x = queue.popleft()
            comp.append((y, x))
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        if len(comp) > len(best):
            best = comp
    out = np.zeros_like(mask)
    if best:
        ys, xs = zip(*best)
        out[list(ys), list(xs)] = True
    return out


def _dilate(mask: np.ndarray, r: int) -> np.ndarray:
    out = mask.copy()
    for _ in range(r):
        grown = out.copy()
        grown[1:] |= out[:-1]
        grown[:-1] |= out[1:]
        grown[:, 1:] |= out[:, :-1]
        grown[:, :-1] |= out[:, 1:]
        out = grown
    return out


def _segment(frames: np.ndarray) -> tuple[list[np.ndarray | None], list[np.ndarray | None]]:
    """Per frame, the object's boolean mask and its soft coverage (or None, None)."""
    sat = frames.max(axis=-1) - frames.min(axis=-1)
    masks: list[np.ndarray | None] = []
    softs: list[np.ndarray | None] = []
    for s in sat:
        # Robust peak: mean of the 8 most saturated pixels, so a single hot pixel cannot set it.
        peak = float(np.sort(s, axis=None)[-8:].mean())
        comp = _largest_component(s >= 0.5 * peak) if peak >= MIN_PEAK_SATURATION else None
        if comp is None or comp.sum() < MIN_AREA_PX:
            masks.append(None)
            softs.append(None)
            continue
        masks.append(comp)
        # Over a gray background, saturation is linear in the object's coverage of the pixel
        # (alpha * saturation of the color), so sat / peak is the anti-aliased coverage.
        softs.append(np.clip(s / peak, 0.0, 1.0) * _dilate(comp, 1))
    return masks, softs


def _shape_stats(mask: np.ndarray, soft: np.ndarray) -> tuple[float, float]:
    """(soft fill ratio, vertical asymmetry) of one frame's object.

    The fill ratio uses coverage, not the binary mask: a binary square loses corner pixels whose
    coverage is (partial x partial) < 1/2 and then looks like a circle. Soft width/height are the
    summed per-column/per-row maximum coverage, exact for an axis-aligned square (fill 1)."""
    width = float(soft.max(axis=0).sum())
    height = float(soft.max(axis=1).sum())
    fill = float(soft.sum()) / max(width * height, 1e-9)
    ys, _ = np.nonzero(mask)
    y0, y1 = ys.min(), ys.max()
    area = float(len(ys))
    mid = (y0 + y1) / 2.0
    # Rows exactly on the middle line count half to each side.
    lower = float((ys > mid).sum()) + 0.5 * float((ys == mid).sum())
    upper = area - lower
    return fill, (lower - upper) / area


def _classify_shape(fill: float, asymmetry: float) -> str:
    if asymmetry > TRIANGLE_ASYMMETRY:
        return "triangle"
    return "square" if fill > SQUARE_FILL else "circle"


def _flicker(frames: np.ndarray, masks: list[np.ndarray | None]) -> float:
    diffs = []
    empty = np.zeros(frames.shape[1:3], dtype=bool)
    for t in range(len(frames) - 1):
        a = masks[t] if masks[t] is not None else empty
        b = masks[t + 1] if masks[t + 1] is not None else empty
        keep = ~_dilate(a | b, 2)
        if keep.any():
            diffs.append(float(np.abs(frames[t + 1] - frames[t])[keep].mean()))
    return float(np.mean(diffs)) if diffs else 0.0


def judge_video(video) -> ShapesVerdict:
    """Judge one video (see :func:`sixbit.eval.media.as_frames` for accepted inputs) -> :class:`ShapesVerdict`."""
    frames = as_frames(video)
    masks, softs = _segment(frames)
    flicker = _flicker(frames, masks)
    seen = [(t, m) for t, m in enumerate(masks) if m is not None]
    if not seen:
        return ShapesVerdict(0, "none", "none", "none", (0.0, 0.0), 0.0, 0.0, flicker)

    pixels = np.concatenate([frames[t][m] for t, m in seen])
    chroma = (pixels - pixels.mean(axis=1, keepdims=True)).mean(axis=0)
    color = list(COLORS)[int(np.argmax(_PALETTE_CHROMA @ chroma))]

    stats = np.array([_shape_stats(m, softs[t]) for t, m in seen])
    fill, asym = float(np.median(stats[:, 0])), float(np.median(stats[:, 1]))
    shape = _classify_shape(fill, asym)

    direction, displacement = "none", (0.0, 0.0)
    if len(seen) >= 2:
        ts = np.array([t for t, _ in seen], dtype=np.float64)
        cents = np.array([[np.nonzero(m)[1].mean(), np.nonzero(m)[0].mean()] for _, m in seen])
        slope = np.polyfit(ts, cents, 1)[0]  # px per frame, (dx, dy)
        dx, dy = (slope * (len(frames) - 1)).tolist()
        displacement = (dx, dy)
        if max(abs(dx), abs(dy)) >= MIN_TRAVEL_PX:
            unit = (int(np.sign(dx)), 0) if abs(dx) >= abs(dy) else (0, int(np.sign(dy)))
            direction = next(d for d, v in DIRECTIONS.items() if v == unit)
    return ShapesVerdict(len(seen), color, shape, direction, displacement, fill, asym, flicker)


@dataclasses.dataclass
class AdherenceReport:
    """Adherence over a prompt set: ``accuracy[attr]`` in [0, 1] for color, shape, direction and
    ``"all"`` (all three right), ``flicker`` the mean flicker, ``verdicts`` one per video."""

    prompts: list[str]
    verdicts: list[ShapesVerdict]
    accuracy: dict[str, float]
    flicker: float

    @property
    def n(self) -> int:
        return len(self.prompts)

    def __str__(self) -> str:
        acc = ", ".join(f"{k} {v:.1%}" for k, v in self.accuracy.items())
        return f"adherence over {self.n} videos: {acc}; mean flicker {self.flicker:.4f}"

    def failures(self) -> list[tuple[str, ShapesVerdict]]:
        """(prompt, verdict) for every video that got any attribute wrong."""
        return [(p, v) for p, v in zip(self.prompts, self.verdicts) if not all(v.matches(p).values())]


def adherence(videos, prompts: list[str]) -> AdherenceReport:
    """Judge ``videos`` (an iterable of videos, or an array with a leading batch axis) against
    ``prompts`` (one per video)."""
    videos = list(videos)
    if len(videos) != len(prompts):
        raise ValueError(f"got {len(videos)} videos for {len(prompts)} prompts; pass one prompt per video")
    verdicts = [judge_video(v) for v in videos]
    hits = {a: [] for a in (*ATTRIBUTES, "all")}
    for p, v in zip(prompts, verdicts):
        m = v.matches(p)
        for a in ATTRIBUTES:
            hits[a].append(m[a])
        hits["all"].append(all(m.values()))
    accuracy = {a: float(np.mean(h)) if h else 0.0 for a, h in hits.items()}
    flicker = float(np.mean([v.flicker for v in verdicts])) if verdicts else 0.0
    return AdherenceReport(list(prompts), verdicts, accuracy, flicker)


def generate_heldout(pipe, pairs=None, num_inference_steps: int = 20, guidance_scale: float = 4.0, batch_size: int = 16,
                     **size):
    """Generate one video per (prompt, seed) pair; returns (videos (N, F, H, W, 3), prompts).
    ``size``: ``num_frames``, ``height``, ``width`` for the pipeline (default: its trained size).

    Each video's noise comes from its own ``torch.Generator().manual_seed(seed)``, so a pair's
    video does not depend on which other pairs share its batch (up to float reassociation).
    ``pairs`` defaults to :data:`sixbit.zoo.shapes.world.HELDOUT_PAIRS` (48 pairs).
    """
    import torch

    from sixbit.zoo.shapes.world import HELDOUT_PAIRS

    pairs = list(HELDOUT_PAIRS if pairs is None else pairs)
    chunks = []
    for i in range(0, len(pairs), batch_size):
        part = pairs[i : i + batch_size]
        gens = [torch.Generator().manual_seed(seed) for _, seed in part]
        out = pipe([p for p, _ in part], num_inference_steps=num_inference_steps,
                   guidance_scale=guidance_scale, generator=gens, **size)
        chunks.append(out.frames)
    return np.concatenate(chunks), [p for p, _ in pairs]


def evaluate_pipeline(pipe, pairs=None, num_inference_steps: int = 20, guidance_scale: float = 4.0,
                      batch_size: int = 16) -> AdherenceReport:
    """Adherence of a shapes pipeline on ``pairs`` (default: the 48 held-out pairs).

    Example:
        >>> from sixbit.zoo.shapes import load_pipeline
        >>> print(evaluate_pipeline(load_pipeline("wan")))   # doctest: +SKIP
    """
    videos, prompts = generate_heldout(pipe, pairs, num_inference_steps, guidance_scale, batch_size)
    return adherence(videos, prompts)


__all__ = [
    "evaluate_pipeline",
    "generate_heldout","ATTRIBUTES", "AdherenceReport", "ShapesVerdict", "adherence", "as_frames", "judge_video", "SHAPES"]
