"""The shapes world: procedural videos of one colored shape moving over a gray background.

Every video is ``NUM_FRAMES`` frames of ``HEIGHT`` x ``WIDTH`` RGB in ``[0, 1]``. One object per
video, described by a :class:`VideoSpec`; a spec is drawn deterministically from a seed by
:func:`sample_specs` and rendered (with 4x4 supersampled anti-aliasing) by :func:`render`.

Design decisions that the judge (:mod:`sixbit.zoo.shapes.judge`) relies on:

* Object colors are strongly saturated (max - min channel >= 0.6); every background, plain or
  textured, is pure gray (saturation 0). Segmenting the object is therefore a saturation
  threshold, and no texture can be mistaken for the object.
* The object stays entirely inside the frame for all frames, and moves 1.5-2 px per frame
  (10.5-14 px over the clip), far above what counts as "static" for the judge.
* Triangles point up, squares are axis aligned: shape is identifiable from the fill ratio of the
  bounding box (square ~1, circle ~pi/4, triangle ~1/2) and the top/bottom mass asymmetry.

Example:
    >>> from sixbit.zoo.shapes.world import sample_specs, render
    >>> specs = sample_specs(2, seed=0)
    >>> render(specs).shape
    torch.Size([2, 8, 3, 32, 32])
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import torch

NUM_FRAMES = 8
HEIGHT = 32
WIDTH = 32

#: Object palette, RGB in [0, 1]. Saturated so that gray backgrounds never collide with it.
COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.12, 0.12),
    "green": (0.12, 0.78, 0.20),
    "blue": (0.18, 0.32, 0.95),
    "yellow": (0.95, 0.85, 0.12),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
#: Direction -> unit displacement (dx, dy) in image coordinates (y grows downwards).
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
BACKGROUNDS: tuple[str, ...] = ("plain", "textured")
TEXTURES: tuple[str, ...] = ("checker", "hstripes", "vstripes", "diagonal")

#: Every word a prompt may use, in a fixed order (the text encoder's token ids follow it).
VOCABULARY: tuple[str, ...] = (
    "a",
    *COLORS,
    *SHAPES,
    "moving",
    *DIRECTIONS,
    "on",
    *BACKGROUNDS,
    "background",
)

_SUPERSAMPLE = 4
#: Default object sizes (px across) drawn by :func:`sample_specs`: 13-16 px is 3-4 patches of 4x4,
#: so a square's corners and a triangle's apex are more than sub-patch detail.
SIZE_RANGE: tuple[float, float] = (13.0, 16.0)
#: Default distance (px) of a trajectory's midpoint from the frame center on each axis.
JITTER: float = 3.0


@dataclasses.dataclass(frozen=True)
class VideoSpec:
    """Everything needed to render one video. Sizes and positions are in pixels.

    ``x0, y0`` is the object's center in frame 0; it moves ``speed`` px per frame along
    ``direction``. ``gray`` is the background level, ``gray2`` the second level of the texture.
    """

    color: str
    shape: str
    direction: str
    background: str = "plain"
    texture: str = "checker"
    size: float = 10.0
    speed: float = 1.75
    x0: float = 16.0
    y0: float = 16.0
    gray: float = 0.3
    gray2: float = 0.3
    period: int = 4

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("color", self.color, tuple(COLORS)),
            ("shape", self.shape, SHAPES),
            ("direction", self.direction, tuple(DIRECTIONS)),
            ("background", self.background, BACKGROUNDS),
            ("texture", self.texture, TEXTURES),
        ):
            if value not in allowed:
                raise ValueError(f"VideoSpec.{name}={value!r} is not one of {allowed}")

    def prompt(self, with_background: bool = False) -> str:
        """The caption, e.g. ``"a red circle moving right"`` (+ ``" on a plain background"``)."""
        text = f"a {self.color} {self.shape} moving {self.direction}"
        return f"{text} on a {self.background} background" if with_background else text

    def centers(self) -> np.ndarray:
        """(NUM_FRAMES, 2) array of the object's (x, y) center per frame."""
        dx, dy = DIRECTIONS[self.direction]
        t = np.arange(NUM_FRAMES, dtype=np.float64)
        return np.stack([self.x0 + dx * self.speed * t, self.y0 + dy * self.speed * t], axis=1)


def all_prompts() -> list[str]:
    """The 48 object prompts ``"a {color} {shape} moving {direction}"``, in a fixed order."""
    return [f"a {c} {s} moving {d}" for c, s, d in itertools.product(COLORS, SHAPES, DIRECTIONS)]


#: Held-out evaluation set: every object prompt once, each with a generation seed that training
#: never uses (training draws its noise from torch generators seeded below 10_000).
HELDOUT_PAIRS: tuple[tuple[str, int], ...] = tuple((p, 10_000 + i) for i, p in enumerate(all_prompts()))


def heldout_pairs(n: int) -> list[tuple[str, int]]:
    """``n`` held-out (prompt, seed) pairs spread evenly over all 48 (every ``48 // n``-th)."""
    if not isinstance(n, int) or not 1 <= n <= len(HELDOUT_PAIRS):
        raise ValueError(f"the number of held-out pairs must be 1…{len(HELDOUT_PAIRS)}, got {n!r}")
    return list(HELDOUT_PAIRS[:: len(HELDOUT_PAIRS) // n])[:n]


def parse_prompt(prompt: str) -> dict[str, str]:
    """Extract ``color``, ``shape``, ``direction`` (and ``background`` if named) from a prompt.

    Raises ``ValueError`` when a word is outside :data:`VOCABULARY` or an attribute is missing.
    """
    words = prompt.lower().split()
    unknown = [w for w in words if w not in VOCABULARY]
    if unknown:
        raise ValueError(f"unknown word(s) {unknown} in prompt {prompt!r}; the vocabulary is {list(VOCABULARY)}")
    found: dict[str, str] = {}
    for key, values in (("color", COLORS), ("shape", SHAPES), ("direction", DIRECTIONS), ("background", BACKGROUNDS)):
        hits = [w for w in words if w in values]
        if hits:
            found[key] = hits[0]
    missing = [k for k in ("color", "shape", "direction") if k not in found]
    if missing:
        raise ValueError(f"prompt {prompt!r} names no {missing}; write e.g. 'a red circle moving right'")
    return found


def sample_specs(n: int, seed: int, size_range: tuple[float, float] = SIZE_RANGE, jitter: float | None = JITTER,
                 **fixed: str) -> list[VideoSpec]:
    """Draw ``n`` random specs deterministically from ``seed``.

    Attributes passed in ``fixed`` (``color``, ``shape``, ``direction``, ``background``) are
    held at the given value; everything else is drawn. Object sizes (px) are uniform in
    ``size_range``; the largest size must leave room for the longest travel inside the frame.
    Positions: anywhere the whole trajectory fits (``jitter=None``), or with the trajectory's
    midpoint within ``jitter`` px of the frame center on each axis (clipped to where it fits).
    """
    if jitter is not None and not jitter >= 0:
        raise ValueError(f"jitter={jitter!r} must be None (anywhere) or >= 0 px")
    lo_size, hi_size = size_range
    if not 0 < lo_size <= hi_size <= min(HEIGHT, WIDTH) - 2 - 2.0 * (NUM_FRAMES - 1):
        raise ValueError(f"size_range={size_range!r}: sizes must be 0 < low <= high <= "
                         f"{min(HEIGHT, WIDTH) - 2 - 2.0 * (NUM_FRAMES - 1):g} px (the object and its travel fit the frame)")
    rng = np.random.default_rng(seed)
    specs = []
    for _ in range(n):
        color = fixed.get("color") or rng.choice(list(COLORS))
        shape = fixed.get("shape") or rng.choice(SHAPES)
        direction = fixed.get("direction") or rng.choice(list(DIRECTIONS))
        background = fixed.get("background") or rng.choice(BACKGROUNDS)
        texture = rng.choice(TEXTURES)
        size = float(rng.uniform(lo_size, hi_size))
        speed = float(rng.uniform(1.5, 2.0))
        travel = speed * (NUM_FRAMES - 1)
        margin = size / 2 + 1.0
        # Along the motion axis, leave room for the whole trajectory; across it, anywhere inside.
        dx, dy = DIRECTIONS[str(direction)]
        lo_x, hi_x = margin, WIDTH - margin
        lo_y, hi_y = margin, HEIGHT - margin
        if dx > 0:
            hi_x -= travel
        elif dx < 0:
            lo_x += travel
        if dy > 0:
            hi_y -= travel
        elif dy < 0:
            lo_y += travel
        if jitter is None:
            x0, y0 = float(rng.uniform(lo_x, hi_x)), float(rng.uniform(lo_y, hi_y))
        else:
            x0 = float(np.clip(WIDTH / 2 - dx * travel / 2 + rng.uniform(-jitter, jitter), lo_x, hi_x))
            y0 = float(np.clip(HEIGHT / 2 - dy * travel / 2 + rng.uniform(-jitter, jitter), lo_y, hi_y))
        gray = float(rng.uniform(0.08, 0.55))
        # Textures are low contrast gray: second level 0.12-0.25 away, clipped into [0.02, 0.7].
        gray2 = float(np.clip(gray + rng.choice([-1, 1]) * rng.uniform(0.12, 0.25), 0.02, 0.7))
        period = int(rng.choice([4, 6, 8]))
        specs.append(
            VideoSpec(str(color), str(shape), str(direction), str(background), str(texture),
                      size, speed, x0, y0, gray, gray2, period)
        )
    return specs


def _background(spec: VideoSpec) -> torch.Tensor:
    """(H, W) gray level of the static background."""
    if spec.background == "plain":
        return torch.full((HEIGHT, WIDTH), spec.gray)
    y, x = torch.meshgrid(torch.arange(HEIGHT), torch.arange(WIDTH), indexing="ij")
    half = spec.period // 2
    if spec.texture == "checker":
        on = ((x // half) + (y // half)) % 2 == 1
    elif spec.texture == "hstripes":
        on = (y // half) % 2 == 1
    elif spec.texture == "vstripes":
        on = (x // half) % 2 == 1
    else:
        on = ((x + y) // half) % 2 == 1
    return torch.where(on, torch.tensor(spec.gray2), torch.tensor(spec.gray))


def _coverage(spec: VideoSpec) -> torch.Tensor:
    """(F, H, W) fraction of each pixel covered by the object (4x4 supersampling)."""
    s = _SUPERSAMPLE
    ys = (torch.arange(HEIGHT * s, dtype=torch.float64) + 0.5) / s
    xs = (torch.arange(WIDTH * s, dtype=torch.float64) + 0.5) / s
    centers = torch.from_numpy(spec.centers())
    cx = centers[:, 0].view(-1, 1, 1)
    cy = centers[:, 1].view(-1, 1, 1)
    x = xs.view(1, 1, -1) - cx
    y = ys.view(1, -1, 1) - cy
    h = spec.size / 2
    if spec.shape == "circle":
        inside = x * x + y * y <= h * h
    elif spec.shape == "square":
        inside = (x.abs() <= h) & (y.abs() <= h)
    else:
        # Upward isosceles triangle in the size x size box: apex at top, base at bottom.
        inside = (y >= -h) & (y <= h) & (x.abs() <= (y + h) / 2)
    inside = inside.to(torch.float32)
    return torch.nn.functional.avg_pool2d(inside, s)


def render(specs: VideoSpec | list[VideoSpec]) -> torch.Tensor:
    """Render specs to a float32 tensor (B, F, 3, H, W) in [0, 1] (B omitted for a single spec)."""
    single = isinstance(specs, VideoSpec)
    batch = [specs] if single else list(specs)
    videos = []
    for spec in batch:
        alpha = _coverage(spec).unsqueeze(1)  # (F, 1, H, W)
        bg = _background(spec).to(torch.float32).expand(NUM_FRAMES, 3, HEIGHT, WIDTH)
        color = torch.tensor(COLORS[spec.color], dtype=torch.float32).view(1, 3, 1, 1)
        videos.append(alpha * color + (1 - alpha) * bg)
    out = torch.stack(videos)
    return out[0] if single else out
