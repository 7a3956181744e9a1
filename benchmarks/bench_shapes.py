"""Measure prompt adherence of the shipped shapes models and write it into BENCHMARKS.md.

    python benchmarks/bench_shapes.py                       # both models, 20 steps, CFG 4.0
    python benchmarks/bench_shapes.py --arch wan --no-write # print only

For each shipped model (full precision, float32 compute from the float16-stored weights), one
video per held-out (prompt, seed) pair: all 48 prompts "a {color} {shape} moving {direction}",
each with a generation seed training never used. The analytic judge (``sixbit.eval.shapes``)
names color, shape and motion direction; accuracy is the fraction of videos where it agrees with
the prompt. Flicker is the background's mean absolute frame-to-frame change (0 for the world's
own renders). The first row runs the judge on clean renders of the same 48 prompts: it shows the
ceiling and that the judge itself is right.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from sixbit.bench.report import machine_description, update_section
from sixbit.eval.shapes import adherence, generate_heldout
from sixbit.zoo.shapes import HELDOUT_PAIRS, load_pipeline
from sixbit.zoo.shapes.world import parse_prompt, render, sample_specs

SECTION = "shapes-adherence"


def clean_renders_report():
    videos, prompts = [], []
    for prompt, seed in HELDOUT_PAIRS:
        spec = sample_specs(1, seed=seed, **{k: v for k, v in parse_prompt(prompt).items()})[0]
        videos.append(render(spec))
        prompts.append(prompt)
    return adherence(videos, prompts)


def row(name, params, steps, guidance, report, seconds):
    a = report.accuracy
    return (
        f"| {name} | {params} | {steps} | {guidance} | {a['color']:.1%} | {a['shape']:.1%} | "
        f"{a['direction']:.1%} | {a['all']:.1%} | {report.flicker:.4f} | {seconds} |"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", action="append", choices=["cogvideox", "wan"], help="default: both")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--guidance", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parents[1] / "BENCHMARKS.md"))
    parser.add_argument("--no-write", action="store_true", help="print the table, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    archs = args.arch or ["cogvideox", "wan"]

    lines = [
        "| model | transformer params | steps | CFG | color | shape | direction | all three | flicker | s / video |",
        "|---|---|---|---|---|---|---|---|---|---|",
        row("clean renders (judge check)", "–", "–", "–", clean_renders_report(), "–"),
    ]
    failures = []
    for arch in archs:
        pipe = load_pipeline(arch)
        params = sum(p.numel() for p in pipe.transformer.parameters())
        t0 = time.perf_counter()
        videos, prompts = generate_heldout(pipe, num_inference_steps=args.steps, guidance_scale=args.guidance)
        seconds = (time.perf_counter() - t0) / len(prompts)
        report = adherence(videos, prompts)
        print(f"{arch}: {report}", file=sys.stderr)
        for prompt, verdict in report.failures():
            failures.append(f"{arch}: asked '{prompt}', judge saw: {verdict}")
        name = f"shapes-{arch} ({type(pipe.transformer).__name__}, fp32)"
        lines.append(row(name, f"{params / 1e6:.2f} M", args.steps, args.guidance, report, f"{seconds:.2f}"))

    body = "\n".join(
        [
            "### Shapes models: prompt adherence (full precision)",
            "",
            f"Written by `python benchmarks/bench_shapes.py` on {machine_description()}.",
            f"{len(HELDOUT_PAIRS)} held-out (prompt, seed) pairs per model, judged by the analytic judge "
            "`sixbit.eval.shapes`. Flicker: mean absolute frame-to-frame change of background pixels "
            "(intensity in [0, 1]; clean renders score 0).",
            "",
            *lines,
        ]
    )
    if failures:
        shown = failures[:12]
        body += f"\n\nMisjudged or mis-generated videos ({len(failures)}; the first {len(shown)}):\n\n"
        body += "\n".join(f"- {f}" for f in shown)
    print(body)
    if not args.no_write:
        update_section(args.output, SECTION, body)
        print(f"wrote section {SECTION!r} of {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
