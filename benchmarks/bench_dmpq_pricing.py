"""DMPQ's cost map priced per cell vs per step range (issue 63): fitting time and gap closure, side by side.

    python benchmarks/bench_dmpq_pricing.py --arch cogvideox --json /tmp/pricing-cogvideox.json
    python benchmarks/bench_dmpq_pricing.py --arch wan --json /tmp/pricing-wan.json
    python benchmarks/bench_dmpq_pricing.py --merge /tmp/pricing-cogvideox.json /tmp/pricing-wan.json

Both fits start from the same 4-bit weights (bench_dmpq's recipe) and the same calibration
prompts, in the same process, one after the other: ``error_at="video"`` re-runs the calibration
once per cell of the step-range × block-range grid (23 runs with the defaults),
``error_at="steps"`` once per step range (8 runs). PSNR is against the FP pipeline's held-out
videos; gap closure is (DMPQ − W4A4) / (W4A8 − W4A4). NVFP4 activations are EMULATED on this CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from bench_dmpq import _RECIPE, GUIDANCE, _measure, _quantized
from report import machine_description, update_section

from sixbit.methods.dmpq import DMPQConfig, apply_dmpq, fit_dmpq
from sixbit.zoo.shapes import all_prompts, heldout_pairs, load_pipeline
from sixbit.zoo.shapes.judge import generate_heldout

ROOT = Path(__file__).resolve().parents[1]
PRICINGS = ("video", "steps")


def run_arch(arch: str, args) -> dict:
    pairs = heldout_pairs(args.pairs)
    prompts = all_prompts()
    calib_pairs = [(prompts[(7 * i + 3) % len(prompts)], 20_000 + i) for i in range(args.calib)]
    _RECIPE["calibration"] = (calib_pairs, args.steps)
    _, ref = _measure(load_pipeline(arch), pairs, args.steps, None)
    rows = {}
    for name, act in (("W4A8", "int8"), ("W4A4", "nvfp4")):
        rows[name], _ = _measure(_quantized(arch, "nvfp4", 128, act), pairs, args.steps, ref)
        print(f"[{arch}] {name}: {rows[name]['psnr']:.2f} dB", flush=True)
    for error_at in PRICINGS:
        pipe = _quantized(arch, "nvfp4", 128, "int8")
        runs = []

        def calib(pipe=pipe, runs=runs):
            runs.append(1)
            return generate_heldout(pipe, calib_pairs, args.steps, GUIDANCE)[0]

        t0 = time.perf_counter()
        predictor = fit_dmpq(pipe.transformer, calib, DMPQConfig(target_bits=args.target_bits, error_at=error_at))
        fit_s = time.perf_counter() - t0
        dmpq = apply_dmpq(pipe.transformer, predictor)
        row, _ = _measure(pipe, pairs, args.steps, ref)
        row.update(bits=dmpq.report().average_bits, fit_s=fit_s, runs=len(runs))
        rows[error_at] = row
        print(f"[{arch}] error_at={error_at}: {row['psnr']:.2f} dB at {row['bits']:.2f} bits, fit {fit_s:.0f} s "
              f"({len(runs)} runs)", flush=True)
    return {"arch": arch, "rows": rows, "machine": machine_description(),
            "settings": {k: getattr(args, k) for k in ("pairs", "calib", "steps", "target_bits")}}


def section(results: list[dict]) -> str:
    s = results[0]["settings"]
    lines = [
        "## DMPQ's cost map: per cell vs per step range (issue 63)",
        "",
        (f"Written by `python benchmarks/bench_dmpq_pricing.py --pairs {s['pairs']} --calib {s['calib']} --steps "
         f"{s['steps']} --target-bits {s['target_bits']:g}` (each model in its own process, then `--merge`). Machine: "
         f"{results[0]['machine']}; wall times on a machine other jobs shared, so compare the two fits of a model "
         "(same process, back to back), not absolute seconds. NVFP4 activations are EMULATED."),
        "",
        "| model | pricing | calibration runs | fit s | act bits | PSNR dB | gap closed |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rows = r["rows"]
        w4a8, w4a4 = rows["W4A8"]["psnr"], rows["W4A4"]["psnr"]
        lines.append(f"| shapes-{r['arch']} | W4A8 / W4A4 | — | — | 8.00 / 4.50 | {w4a8:.2f} / {w4a4:.2f} | — |")
        for error_at in PRICINGS:
            row = rows[error_at]
            closed = (row["psnr"] - w4a4) / (w4a8 - w4a4)
            lines.append(f"| shapes-{r['arch']} | `error_at=\"{error_at}\"` | {row['runs']} | {row['fit_s']:.0f} | "
                         f"{row['bits']:.2f} | {row['psnr']:.2f} | {100 * closed:.1f}% |")
        lines.append(f"| shapes-{r['arch']} | speed-up of the fit | | {rows['video']['fit_s'] / rows['steps']['fit_s']:.2f}× | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=("cogvideox", "wan"))
    parser.add_argument("--pairs", type=int, default=16, help="held-out (prompt, seed) pairs")
    parser.add_argument("--calib", type=int, default=8, help="calibration generations")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--target-bits", type=float, default=6.0)
    parser.add_argument("--json", help="write this model's results here")
    parser.add_argument("--merge", nargs="+", help="results files to write the BENCHMARKS.md section from")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.merge:
        update_section(args.out, "dmpq-pricing", section([json.loads(Path(p).read_text()) for p in args.merge]))
        print(f"wrote {args.out}")
        return 0
    if args.arch is None or args.json is None:
        parser.error("give --arch and --json (or --merge)")
    torch.manual_seed(0)
    result = run_arch(args.arch, args)
    tmp = Path(args.json).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.json)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
