"""Offline refinement of the low-rank branches (``QuantConfig.refine_steps``) on the shipped
models: its gain and its cost → BENCHMARKS.md (section ``refine``).

    python benchmarks/bench_refine.py --arch cogvideox --json /tmp/refine-cogvideox.json
    python benchmarks/bench_refine.py --arch wan --json /tmp/refine-wan.json
    python benchmarks/bench_refine.py --merge /tmp/refine-cogvideox.json /tmp/refine-wan.json
    python benchmarks/bench_refine.py --arch wan --quick --json /tmp/q.json      # checks the script

Each row converts a fresh shipped pipeline with a preset (the 4-bit recipe: GPTQ, MSE scales,
low-rank branch), with and without refinement, calibrated on the same (prompt, seed) pairs
(seeds 20 000+), and scores it on held-out pairs: PSNR against the full-precision videos.
*convert s* is the whole conversion (calibration runs, GPTQ, refinement); *kept* the blocks
whose refined branches lowered their output error (the others keep GPTQ's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

import sixbit
from sixbit.bench.harness import calibration_pairs
from report import machine_description, update_section
from sixbit.eval.metrics import psnr
from sixbit.zoo.shapes.judge import generate_heldout
from sixbit.presets import resolve
from sixbit.zoo.shapes import heldout_pairs, load_pipeline

ROOT = Path(__file__).resolve().parents[1]
GUIDANCE = 4.0
PRESETS = ("w4a16", "w4a8")


class _Kept(logging.Handler):
    """Counts the blocks whose refinement was kept, from the conversion's log."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.kept = self.blocks = 0

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("refined the low-rank branches"):
            self.blocks += 1
            self.kept += "(kept)" in message


def run_arch(arch: str, args) -> dict:
    torch.manual_seed(0)
    pairs, calib = heldout_pairs(args.pairs), calibration_pairs(args.calib)
    ref, _ = generate_heldout(load_pipeline(arch), pairs, args.steps, GUIDANCE)
    rows = []
    logger = logging.getLogger("sixbit.builder.in_memory")
    logger.setLevel(logging.INFO)
    for preset in PRESETS:
        for steps in (0, args.refine_steps):
            base = resolve(preset)
            config = dataclasses.replace(base, weights=dataclasses.replace(base.weights, refine_steps=steps))
            pipe = load_pipeline(arch)
            counter = _Kept()
            logger.addHandler(counter)
            t0 = time.perf_counter()
            try:
                sixbit.convert_model(pipe, lambda: generate_heldout(pipe, calib, args.steps, GUIDANCE)[0], config)
            finally:
                logger.removeHandler(counter)
            seconds = time.perf_counter() - t0
            videos, _ = generate_heldout(pipe, pairs, args.steps, GUIDANCE)
            row = {"preset": preset, "refine_steps": steps, "convert_s": seconds, "kept": counter.kept,
                   "blocks": counter.blocks, "psnr": float(np.mean([psnr(v, r) for v, r in zip(videos, ref)]))}
            rows.append(row)
            print(f"[{arch}] {row}", file=sys.stderr, flush=True)
    return {"arch": arch, "rows": rows, "settings": vars(args), "machine": machine_description()}


def section(results: list[dict]) -> str:
    s = results[0]["settings"]
    lines = [
        "## Offline refinement of the low-rank branches (issue 19, stage 3)",
        "",
        f"Written by `python benchmarks/bench_refine.py` (per model `--arch A --pairs {s['pairs']} --calib {s['calib']} "
        f"--steps {s['steps']} --refine-steps {s['refine_steps']}`, then `--merge`). Machine: {results[0].get('machine', machine_description())}; each model in its own process (wall times: other jobs may have shared the 2 CPUs). "
        "Refinement fits each block's 16-bit low-rank branches (Adam, cosine schedule, on a sample of ≤ 32 recorded "
        "calibration calls: every step and CFG branch) to the full-precision block's outputs; codes, scales and every "
        f"model weight stay as GPTQ left them. Held-out: {s['pairs']} (prompt, seed) pairs never used in calibration.",
    ]
    for res in results:
        lines += ["", f"### shapes-{res['arch']}", "",
                  "| preset | refine steps | held-out PSNR dB | gain dB | convert s | cost × | blocks kept |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in res["rows"]:
            base = next(b for b in res["rows"] if b["preset"] == r["preset"] and b["refine_steps"] == 0)
            lines.append(f"| {r['preset']} | {r['refine_steps']} | {r['psnr']:.2f} | {r['psnr'] - base['psnr']:+.2f} | "
                         f"{r['convert_s']:.0f} | {r['convert_s'] / base['convert_s']:.2f} | "
                         f"{r['kept']}/{r['blocks']} |" if r["refine_steps"] else
                         f"| {r['preset']} | 0 | {r['psnr']:.2f} | — | {r['convert_s']:.0f} | 1.00 | — |")
    gains = {res["arch"]: [r["psnr"] - next(b["psnr"] for b in res["rows"] if b["preset"] == r["preset"]
                                          and b["refine_steps"] == 0) for r in res["rows"] if r["refine_steps"]]
             for res in results}
    helps = {arch: min(g) > 0.3 for arch, g in gains.items()}
    lines += ["", "Default: " + ("**on**" if all(helps.values()) else "**off**") + " — refinement gains "
              + "; ".join(f"shapes-{a}: {', '.join(f'{x:+.2f}' for x in g)} dB" for a, g in gains.items())
              + (" on every row." if all(helps.values()) else
                 f": it gains more than 0.3 dB on every row of {', '.join(f'shapes-{a}' for a, h in helps.items() if h) or 'no model'}"
                 f" (not of {', '.join(f'shapes-{a}' for a, h in helps.items() if not h)}), so it is opt-in "
                 "(`QuantConfig(refine_steps=200)`); check it on held-out prompts of your model.")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=["cogvideox", "wan"])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--calib", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--refine-steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="2 pairs, 1 calibration pair, 3 steps, 10 refine steps")
    parser.add_argument("--json", help="write this model's results here")
    parser.add_argument("--merge", nargs="+", help="results files to write the BENCHMARKS.md section from")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.merge:
        update_section(args.out, "refine", section([json.loads(Path(p).read_text()) for p in args.merge]))
        print(f"wrote section 'refine' of {args.out}")
        return 0
    if args.arch is None or args.json is None:
        parser.error("give --arch and --json (or --merge)")
    if args.quick:
        args.pairs, args.calib, args.steps, args.refine_steps = 2, 1, 3, 10
    Path(args.json).write_text(json.dumps(run_arch(args.arch, args), indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
