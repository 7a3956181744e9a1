"""Prompt adherence of the shipped shapes models on all 48 held-out pairs → BENCHMARKS.md.

    python benchmarks/bench_adherence.py                   # both models, 20 steps, CFG 4.0 (and 2.5 stochastic)
    python benchmarks/bench_adherence.py --output part.md  # write the section into another file

For each shipped model (full precision, float32 compute from the float16-stored weights), one
video per held-out (prompt, seed) pair: all 48 prompts "a {color} {shape} moving {direction}",
each with a generation seed training never used. The analytic judge (``sixbit.zoo.shapes.judge``)
names color, shape and motion direction; accuracy is the share of videos where it agrees with
the prompt. The first row runs the judge on clean renders of the same pairs: the ceiling, and
the check that the judge itself is right. (``sixbit bench`` reports adherence on its few
prompts per method; this is the full held-out set, issue 3's measure.)

Each model runs twice: with its shipped sampler (deterministic Euler steps of the flow ODE, what
every other benchmark uses) and with the same scheduler's stochastic variant
(``FlowMatchEulerDiscreteScheduler(stochastic_sampling=True)``: each step re-noises the predicted
clean video with fresh noise from the pair's generator) at a lower guidance scale. The median
bounding-box fill per asked shape shows how close squares come to the judge's threshold.

The learning curve below the table comes from the shipped weights' ``training.json``: training
(``--eval-pairs 48``) judged every saved checkpoint on the same pairs. It is plotted into
``benchmarks/plots/adherence_curve.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from report import machine_description, update_section
from sixbit.zoo.shapes.judge import SQUARE_FILL, adherence, generate_heldout
from sixbit.zoo.shapes import HELDOUT_PAIRS, WEIGHTS_DIR, load_pipeline
from sixbit.zoo.shapes.world import parse_prompt, render, sample_specs

SECTION = "shapes-adherence"
ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTES = ("color", "shape", "direction")


def _row(name, sampler, steps, guidance, report, seconds):
    a = report.accuracy
    return (f"| {name} | {sampler} | {steps} | {guidance} | {a['color']:.1%} | {a['shape']:.1%} | {a['direction']:.1%} | "
            f"{a['all']:.1%} | {report.flicker:.4f} | {seconds} |")


def _shape_lines(name, report, prompts) -> str:
    """Asked vs seen shape, and the median fill per asked shape."""
    asked = [parse_prompt(p)["shape"] for p in prompts]
    seen = Counter(zip(asked, (v.shape for v in report.verdicts)))
    fills = {s: float(np.median([v.fill_ratio for a, v in zip(asked, report.verdicts) if a == s]))
             for s in sorted(set(asked))}
    return (f"- {name}: " + ", ".join(f"asked {a} → seen {b}: {n}" for (a, b), n in sorted(seen.items()))
            + "; median fill " + ", ".join(f"{s} {f:.2f}" for s, f in fills.items()))


def learning_curves() -> dict[str, list[dict]]:
    """The adherence learning curve each shipped model's training recorded (empty when it did not)."""
    return {arch: json.loads((WEIGHTS_DIR / arch / "training.json").read_text()).get("adherence", [])
            for arch in ("cogvideox", "wan")}


def plot_curves(curves: dict[str, list[dict]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 3.8), squeeze=False, sharey=True)
    for ax, (arch, curve) in zip(axes[0], curves.items()):
        steps = [p["step"] for p in curve]
        for attr, style in zip((*ATTRIBUTES, "all"), ("s-", "o-", "^-", "k--")):
            ax.plot(steps, [100 * p[attr] for p in curve], style, label=attr, ms=5)
        ax.set_title(f"shapes-{arch}: 48 held-out pairs")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("judge agrees with the prompt (%)")
    axes[0][0].legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_lines(curves: dict[str, list[dict]]) -> list[str]:
    """The learning-curve table and plot (nothing when no shipped model recorded a curve)."""
    if not any(curves.values()):
        return []
    plot_curves({a: c for a, c in curves.items() if c}, ROOT / "benchmarks" / "plots" / "adherence_curve.png")
    lines = ["", ("Learning curve: each checkpoint saved during training, judged on the 48 held-out pairs "
             "(recorded by `python -m sixbit.zoo.shapes.train --eval-pairs 48` in the weights' `training.json`)."), "",
             "| model | step | color | shape | direction | all three | flicker |", "|---|---|---|---|---|---|---|"]
    for arch, curve in curves.items():
        lines += [f"| shapes-{arch} | {p['step']} | " + " | ".join(f"{p[k]:.1%}" for k in (*ATTRIBUTES, "all"))
                  + f" | {p['flicker']:.4f} |" for p in curve]
    return [*lines, "", "![adherence learning curve](benchmarks/plots/adherence_curve.png)"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--guidance", type=float, default=4.0)
    parser.add_argument("--stochastic-guidance", type=float, default=2.5,
                        help="guidance scale of the stochastic-sampler rows")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    renders = [render(sample_specs(1, seed=s, **parse_prompt(p))[0]) for p, s in HELDOUT_PAIRS]
    prompts = [p for p, _ in HELDOUT_PAIRS]
    lines = [
        "| model | sampler | steps | CFG | color | shape | direction | all three | flicker | s / video |",
        "|---|---|---|---|---|---|---|---|---|---|",
        _row("clean renders (judge check)", "–", "–", "–", clean := adherence(renders, prompts), "–"),
    ]
    confusion = [_shape_lines("clean renders", clean, prompts)]
    for arch in ("cogvideox", "wan"):
        pipe = load_pipeline(arch)
        shipped = pipe.scheduler
        stochastic = FlowMatchEulerDiscreteScheduler.from_config(shipped.config, stochastic_sampling=True)
        for sampler, scheduler, guidance in (("Euler (shipped)", shipped, args.guidance),
                                             ("stochastic", stochastic, args.stochastic_guidance)):
            pipe.scheduler = scheduler
            t0 = time.perf_counter()
            videos, prompts = generate_heldout(pipe, num_inference_steps=args.steps, guidance_scale=guidance)
            seconds = (time.perf_counter() - t0) / len(prompts)
            report = adherence(videos, prompts)
            print(f"{arch}, {sampler}: {report}", file=sys.stderr)
            lines.append(_row(f"shapes-{arch} ({type(pipe.transformer).__name__}, fp32)", sampler, args.steps, guidance,
                              report, f"{seconds:.2f}"))
            confusion.append(_shape_lines(f"shapes-{arch}, {sampler}, CFG {guidance}", report, prompts))
    body = "\n".join([
        "### Shapes models: prompt adherence on the 48 held-out pairs (full precision)",
        "",
        (f"Written by `python benchmarks/bench_adherence.py` on {machine_description()}. Flicker: mean absolute "
        "frame-to-frame change of background pixels (clean renders score 0)."),
        "",
        *lines,
        "",
        (f"Shape, asked vs what the judge saw, and the median bounding-box fill per asked shape (the judge "
         f"calls a symmetric shape a square above {SQUARE_FILL}):"),
        "",
        *confusion,
        *curve_lines(learning_curves()),
    ])
    print(body)
    update_section(args.output, SECTION, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
