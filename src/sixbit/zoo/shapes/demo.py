"""``sixbit demo``: generate one video with a shipped shapes model and say what the judge sees.

Example:
    >>> from sixbit.zoo.shapes.demo import run_demo
    >>> result = run_demo("cogvideox", prompt="a blue square moving up", seed=0, out_dir="/tmp/demo")
    >>> print(result)                     # what the CLI prints
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from .world import parse_prompt

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "a red circle moving right"


@dataclasses.dataclass
class DemoResult:
    """Paths written by :func:`run_demo`, the judge's verdict and timing.

    ``video`` is an MP4 (a GIF where no encoder is installed), ``contact_sheet`` a PNG with all
    frames side by side, ``verdict`` a :class:`sixbit.zoo.shapes.judge.ShapesVerdict`, ``matches``
    per attribute whether the verdict agrees with the prompt.
    """

    arch: str
    prompt: str
    seed: int
    steps: int
    video: Path
    contact_sheet: Path
    verdict: object
    matches: dict[str, bool]
    seconds: float

    def __str__(self) -> str:
        marks = ", ".join(f"{k} {'ok' if v else 'WRONG'}" for k, v in self.matches.items())
        return "\n".join(
            [
                f"model:         shapes-{self.arch} (shipped weights, {self.steps} steps, seed {self.seed})",
                f"prompt:        {self.prompt}",
                f"judge sees:    {self.verdict}",
                f"adherence:     {marks}",
                f"video:         {self.video}",
                f"contact sheet: {self.contact_sheet}",
                f"generated in {self.seconds:.1f} s",
            ]
        )


def run_demo(
    arch: str = "cogvideox",
    prompt: str | None = None,
    seed: int = 0,
    steps: int | None = None,
    out_dir: str | Path = "sixbit-demo",
    guidance_scale: float = 4.0,
) -> DemoResult:
    """Generate one video from ``prompt`` with the shipped ``arch`` model and write it to ``out_dir``.

    Args:
        arch ("cogvideox" | "wan", default "cogvideox"): which shipped model.
        prompt (str, default "a red circle moving right"): words from the shapes vocabulary.
        seed (int, default 0): noise seed; the same seed gives the same video.
        steps (int, default None = the pipeline's 20): sampling steps; fewer is faster and blurrier.
        out_dir (path, default "sixbit-demo"): created if missing; receives
            ``<arch>-<seed>.mp4`` (or ``.gif``) and ``<arch>-<seed>.png``.
        guidance_scale (float, default 4.0): classifier-free guidance scale.
    """
    import torch

    from sixbit.eval.media import write_contact_sheet, write_video
    from sixbit.zoo.shapes.judge import judge_video

    from . import load_pipeline

    prompt = prompt or DEFAULT_PROMPT
    parse_prompt(prompt)  # unknown words / missing attributes raise ValueError before any work
    pipe = load_pipeline(arch)
    kwargs = {} if steps is None else {"num_inference_steps": int(steps)}
    start = time.perf_counter()
    out = pipe(prompt, guidance_scale=guidance_scale, generator=torch.Generator().manual_seed(seed), **kwargs)
    seconds = time.perf_counter() - start
    frames = out.frames[0]
    out_dir = Path(out_dir)
    stem = out_dir / f"{arch}-{seed}"
    video = write_video(frames, stem.with_suffix(".mp4"))
    sheet = write_contact_sheet(frames, stem.with_suffix(".png"))
    verdict = judge_video(frames)
    logger.info("wrote %s and %s", video, sheet)
    return DemoResult(
        arch=arch,
        prompt=prompt,
        seed=seed,
        steps=pipe.num_timesteps,
        video=video,
        contact_sheet=sheet,
        verdict=verdict,
        matches=verdict.matches(prompt),
        seconds=seconds,
    )
