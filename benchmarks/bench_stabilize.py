"""Temporal flicker with and without ``stabilize_frames`` on the shipped models → BENCHMARKS.md.

    python benchmarks/bench_stabilize.py                    # both models, 12 held-out pairs, 20 steps
    python benchmarks/bench_stabilize.py --output part.md   # write the section into another file

Every row converts a fresh copy of the shipped full-precision pipeline with one preset, with
and without the frame stabilizer (``sixbit.convert_model(..., stabilize_frames=True)``, the
default dead zone), and
generates the same held-out (prompt, seed) pairs. Flicker is the judge's background
frame-to-frame change (``sixbit.zoo.shapes.judge``); "added flicker" is the converted model's
flicker minus the full-precision model's on the same pairs, i.e. what quantization added.
NVFP4 activations are emulated on this CPU (the stabilizer works the same either way).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import sixbit
from report import machine_description, update_section
from sixbit.eval.metrics import psnr
from sixbit.zoo.shapes.judge import adherence, generate_heldout
from sixbit.methods.stabilize import DEFAULT_DEADZONE
from sixbit.zoo.shapes import heldout_pairs, load_pipeline

SECTION = "stabilize-frames"
GUIDANCE = 4.0


def measure(arch: str, presets: list[str], pairs, steps: int) -> list[str]:
    ref, prompts = generate_heldout(load_pipeline(arch), pairs, steps, GUIDANCE)
    fp = adherence(ref, prompts)
    lines = [f"| shapes-{arch} | full precision | – | {fp.flicker:.4f} | – | – | {fp.accuracy['all']:.0%} |"]
    for preset in presets:
        row = {}
        for stabilize in (False, True):
            pipe = load_pipeline(arch)
            sixbit.convert_model(pipe, None, preset, stabilize_frames=stabilize)
            videos, _ = generate_heldout(pipe, pairs, steps, GUIDANCE)
            a = adherence(videos, prompts)
            row[stabilize] = (a.flicker, float(np.mean([psnr(v, r) for v, r in zip(videos, ref)])), a.accuracy["all"])
            print(f"{arch} {preset} stabilize={stabilize}: flicker {a.flicker:.4f}", file=sys.stderr)
        added = {k: v[0] - fp.flicker for k, v in row.items()}
        change = row[True][0] / row[False][0] - 1
        for stabilize in (False, True):
            flicker, db, adh = row[stabilize]
            lines.append(
                f"| shapes-{arch} | {preset} | {'on' if stabilize else 'off'} | {flicker:.4f} | {added[stabilize]:+.4f} | "
                f"{db:.2f} | {adh:.0%} |" + (f" {change:+.0%} |" if stabilize else " |")
            )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", action="append", choices=["cogvideox", "wan"], help="default: both")
    parser.add_argument("--presets", default="w4a8-rtn,w8a8", help="presets without calibration (default w4a8-rtn,w8a8)")
    parser.add_argument("--pairs", type=int, default=12, help="held-out pairs, spread over all 48 (default 12)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parents[1] / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pairs = heldout_pairs(args.pairs)
    lines = [
        "| model | preset | stabilizer | flicker | added flicker | PSNR vs FP (dB) | adherence (all three) | flicker, on vs off |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arch in args.arch or ["cogvideox", "wan"]:
        lines += measure(arch, args.presets.split(","), pairs, args.steps)
    body = "\n".join([
        "### Frame stabilization (`stabilize_frames=True`): flicker before and after",
        "",
        f"Written by `python benchmarks/bench_stabilize.py` on {machine_description()}.",
        f"{len(pairs)} held-out pairs, {args.steps} steps, CFG {GUIDANCE}. Flicker: the judge's mean absolute "
        "frame-to-frame change of background pixels; added flicker: minus the full-precision model's on the same "
        "pairs. `stabilize_frames=True` multiplies each token's temporal mean and per-frame deviation apart and holds "
        f"tokens whose deviation is below {DEFAULT_DEADZONE} of their mean still (the dead zone, "
        "`sixbit.methods.stabilize`): a temporal smoothing, so PSNR against the flickering full-precision video also "
        "counts the jitter it removes as error — read it with the adherence column.",
        "",
        *lines,
    ])
    print(body)
    update_section(args.output, SECTION, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
