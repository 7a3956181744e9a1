"""Prompt adherence of the shipped shapes models on all 48 held-out pairs → BENCHMARKS.md.

    python benchmarks/bench_adherence.py                   # both models, 20 steps, CFG 4.0
    python benchmarks/bench_adherence.py --output part.md  # write the section into another file

For each shipped model (full precision, float32 compute from the float16-stored weights), one
video per held-out (prompt, seed) pair: all 48 prompts "a {color} {shape} moving {direction}",
each with a generation seed training never used. The analytic judge (``sixbit.eval.shapes``)
names color, shape and motion direction; accuracy is the share of videos where it agrees with
the prompt. The first row runs the judge on clean renders of the same pairs: the ceiling, and
the check that the judge itself is right. (``sixbit bench`` reports adherence on its few
prompts per method; this is the full held-out set, issue 3's measure.)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from sixbit.bench.report import machine_description, update_section
from sixbit.eval.shapes import adherence, generate_heldout, judge_video
from sixbit.zoo.shapes import HELDOUT_PAIRS, load_pipeline
from sixbit.zoo.shapes.world import parse_prompt, render, sample_specs

SECTION = "shapes-adherence"


def _row(name, steps, guidance, report, seconds):
    a = report.accuracy
    return (f"| {name} | {steps} | {guidance} | {a['color']:.1%} | {a['shape']:.1%} | {a['direction']:.1%} | "
            f"{a['all']:.1%} | {report.flicker:.4f} | {seconds} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--guidance", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parents[1] / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    renders = [render(sample_specs(1, seed=s, **parse_prompt(p))[0]) for p, s in HELDOUT_PAIRS]
    prompts = [p for p, _ in HELDOUT_PAIRS]
    lines = [
        "| model | steps | CFG | color | shape | direction | all three | flicker | s / video |",
        "|---|---|---|---|---|---|---|---|---|",
        _row("clean renders (judge check)", "–", "–", adherence(renders, prompts), "–"),
    ]
    confusion = []
    for arch in ("cogvideox", "wan"):
        pipe = load_pipeline(arch)
        t0 = time.perf_counter()
        videos, prompts = generate_heldout(pipe, num_inference_steps=args.steps, guidance_scale=args.guidance)
        seconds = (time.perf_counter() - t0) / len(prompts)
        report = adherence(videos, prompts)
        print(f"{arch}: {report}", file=sys.stderr)
        lines.append(_row(f"shapes-{arch} ({type(pipe.transformer).__name__}, fp32)", args.steps, args.guidance,
                          report, f"{seconds:.2f}"))
        seen = Counter((parse_prompt(p)["shape"], judge_video(v).shape) for v, p in zip(videos, prompts))
        confusion.append(f"- shapes-{arch}: " + ", ".join(f"asked {a} → seen {b}: {n}" for (a, b), n in sorted(seen.items())))
    body = "\n".join([
        "### Shapes models: prompt adherence on the 48 held-out pairs (full precision)",
        "",
        f"Written by `python benchmarks/bench_adherence.py` on {machine_description()}. Flicker: mean absolute "
        "frame-to-frame change of background pixels (clean renders score 0).",
        "",
        *lines,
        "",
        "Shape, asked vs what the judge saw:",
        "",
        *confusion,
    ])
    print(body)
    update_section(args.output, SECTION, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
