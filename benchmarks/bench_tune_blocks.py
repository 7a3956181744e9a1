"""Stage 1 priced on kept block inputs vs whole generations (issue 63) on the shipped models →
BENCHMARKS.md (section ``tune-blocks``).

    python benchmarks/bench_tune_blocks.py --arch cogvideox --sensitivity generation --json /tmp/g-cog.json
    python benchmarks/bench_tune_blocks.py --arch cogvideox --sensitivity blocks --json /tmp/b-cog.json
    python benchmarks/bench_tune_blocks.py --arch wan --sensitivity generation --json /tmp/g-wan.json
    python benchmarks/bench_tune_blocks.py --arch wan --sensitivity blocks --json /tmp/b-wan.json
    python benchmarks/bench_tune_blocks.py --merge /tmp/g-cog.json /tmp/b-cog.json /tmp/g-wan.json /tmp/b-wan.json
    python benchmarks/bench_tune_blocks.py --arch wan --sensitivity blocks --quick --json /tmp/q.json  # checks it

Per model and mode: the whole tune, timed (``sixbit.tuning.Tuner(..., sensitivity=mode)``, then
``search`` at two targets: ≤ the bits of uniform NVFP4, and ``min_psnr``), on calibration pairs
with seeds 20 000+ — the same as ``bench_tune.py`` (its helpers convert and score). Each pick is
then converted for real on a fresh pipeline and scored on held-out pairs (not timed) and on the
calibration pairs (*calib conv.*, mean − 1 SE: whether ``min_psnr`` is met on real videos). The
merge pairs the two modes of a model: tune time ratio, held-out dB difference at the same target,
and the blocks mode's predicted sensitivities against the generation mode's measured ones
(Spearman rank and Pearson linear correlation over every layer × quantized format, summed over
the calibration videos).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench_tune import FORMATS, GUIDANCE, _se, heldout
from report import machine_description, update_section
from sixbit.bench.harness import calibration_pairs
from sixbit.tuning import Tuner
from sixbit.zoo.shapes import heldout_pairs, load_pipeline
from sixbit.zoo.shapes.judge import generate_heldout

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_arch(arch: str, args) -> dict:
    torch.manual_seed(0)
    pairs, calib = heldout_pairs(args.pairs), calibration_pairs(args.calib)
    pipe = load_pipeline(arch)
    ref, _ = generate_heldout(pipe, pairs, args.steps, GUIDANCE)
    start = time.perf_counter()
    tuner = Tuner(pipe, lambda: generate_heldout(pipe, calib, args.steps, GUIDANCE)[0], base="w4a8", formats=FORMATS,
                  progress=False, sensitivity=args.sensitivity)
    stage1 = time.perf_counter() - start
    log(f"[{arch} {args.sensitivity}] stage 1: {stage1:.0f} s ({tuner.seconds})")
    library = tuner.library
    bits = round(library.bits(library.uniform("nvfp4")), 4)
    rows = []
    for label, target in ((f"≤ {bits:.2f} bits", dict(max_bits=bits)), (f"≥ {args.min_psnr:g} dB",
                                                                          dict(min_psnr=args.min_psnr))):
        t0 = time.perf_counter()
        report = tuner.search(**target, seed=args.seed, population=args.population, generations=args.generations)
        log(f"[{arch} {args.sensitivity}] {label}:\n{report.summary()}")
        rows.append({"target": label, "tune_s": time.perf_counter() - t0, "calib_bits": report.best["bits"],
                     "calib_psnr": report.best["psnr"], "calib_psnr_bound": report.best["psnr_bound"],
                     "inputs": report.best["calibration_inputs"], "reached": report.reached,
                     "checks": report.best.get("checks", []), "config": report.config})
    tune_s = time.perf_counter() - start
    generations = tuner.evaluator.count
    names = [layer.name for layer in library.layers]
    for row in rows:
        config = row.pop("config")
        row["layer_formats"] = dict(config.weights.layer_formats)
        row.update(heldout(arch, config, names, pairs, calib, args.steps, ref, tuner.evaluator))
        log(f"[{arch} {args.sensitivity}] {row['target']}: {row['bits']:.2f} bits, calib converted "
            f"{row['calib_real_psnr']:.2f} dB (mean − 1 SE {row['calib_real_psnr_bound']:.2f}), held-out "
            f"{row['psnr']:.2f} ± {_se(row['psnr_videos']):.2f} dB")
    sens = tuner.sensitivity
    layers = [{"name": layer.name, "formats": ["16-bit" if v.format is None else v.format for v in layer.variants],
               "mse": [float(m.sum()) for m in sens.mse[i]]} for i, layer in enumerate(library.layers)]
    out = {"arch": arch, "sensitivity": args.sensitivity, "tune_s": tune_s, "stage1_s": stage1, "rows": rows,
           "layers": layers, "seconds": dict(tuner.seconds), "generations": generations, "settings": vars(args),
           "machine": machine_description()}
    if args.sensitivity == "blocks":
        fit = tuner.fit
        out["fit"] = {"factors": fit.factors, "points": fit.points, "spearman": fit.spearman, "pearson": fit.pearson}
    return out


def _factors(fit: dict) -> str:
    """The fitted factors (one per role; results from before issue 63's per-role fit hold one)."""
    if "factor" in fit:
        return f"{fit['factor']:.3g} (all roles)"
    return ", ".join(f"{v:.3g} ({role})" for role, v in fit["factors"].items())


def _correlations(predicted: list[float], measured: list[float]) -> tuple[float, float, float]:
    """Spearman rank, Pearson linear, and Pearson on log10 of the pairs with both > 0."""
    from sixbit.tuning.sensitivity import spearman

    p, m = np.asarray(predicted), np.asarray(measured)
    pos = (p > 0) & (m > 0)
    return (spearman(list(p), list(m)), float(np.corrcoef(p, m)[0, 1]),
            float(np.corrcoef(np.log10(p[pos]), np.log10(m[pos]))[0, 1]))


def section(results: list[dict]) -> str:
    by = {(r["arch"], r["sensitivity"]): r for r in results}
    s = results[0]["settings"]
    lines = ["## Tuning stage 1 from kept block inputs vs whole generations (issue 63)", "",
             f"Written by `python benchmarks/bench_tune_blocks.py` (per model and mode: `--arch A --sensitivity M "
             f"--pairs {s['pairs']} --calib {s['calib']} --steps {s['steps']} --population {s['population']} "
             f"--generations {s['generations']}`, then `--merge`). Machine: {results[0]['machine']}; each run in its "
             "own process, one at a time, a model's two modes back to back at the same thread count (the machine otherwise quiet). *tune s*: "
             "`Tuner(...)` (candidates, stage 1) plus both searches with their picks' conversions and check "
             "generations; held-out scoring not included. *blocks*: each layer × format priced by its block's "
             "output error on the kept block inputs (one replay per block and variant), mapped to video error by a "
             "factor fitted on a few whole generations; the genetic search runs on those predictions; the pick is "
             "checked with whole generations (`min_psnr`: tightened and re-checked if missed). *generation*: a "
             "whole calibration generation per layer × format and per assignment the search scores. *calib conv.*: "
             "the pick converted for real on a fresh pipeline, on the calibration pairs (mean − 1 SE, what "
             f"`min_psnr` is checked against); *held-out*: the same conversion on {s['pairs']} held-out pairs."]
    for arch in dict.fromkeys(r["arch"] for r in results):
        gen, blk = by.get((arch, "generation")), by.get((arch, "blocks"))
        lines += ["", f"### shapes-{arch}", "",
                  "| mode | target | tune s | whole generations | bits | calib conv. dB (mean − 1 SE) | held-out dB (SE) |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for res in (gen, blk):
            if res is None:
                continue
            for r in res["rows"]:
                lines.append(f"| {res['sensitivity']} | {r['target']} | {res['tune_s']:.0f} | {res['generations']} | "
                             f"{r['bits']:.2f} | {r['calib_real_psnr']:.2f} ({r['calib_real_psnr_bound']:.2f}) | "
                             f"{r['psnr']:.2f} ({_se(r['psnr_videos']):.2f}) |")
        lines.append("")
        if blk is not None:
            f = blk["fit"]
            lines.append(f"- Blocks mode: stage 1 {blk['stage1_s']:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in blk['seconds'].items())}); "
                         f"factors fitted on {len(f['points'])} whole generations: {_factors(f)} (their predicted vs "
                         f"measured video error: Spearman {f['spearman']:+.2f}, Pearson {f['pearson']:+.2f}).")
            for r in blk["rows"]:
                if r["target"].startswith("≥"):
                    met = r["calib_real_psnr_bound"] >= s["min_psnr"]
                    lines.append(f"- {r['target']} on real videos (converted, calibration pairs, mean − 1 SE): "
                                 f"{r['calib_real_psnr_bound']:.2f} dB: **{'met' if met else 'NOT met'}**; "
                                 f"check rounds: {len(r['checks'])} ({'; '.join(f'{c:.2f} dB' for c in r['checks'])}).")
        if gen is not None and blk is not None:
            pred = [m for layer in blk["layers"] for fmt, m in zip(layer["formats"], layer["mse"]) if fmt != "16-bit"]
            meas = [m for layer in gen["layers"] for fmt, m in zip(layer["formats"], layer["mse"]) if fmt != "16-bit"]
            rho, r_lin, r_log = _correlations(pred, meas)
            lines.append(f"- Predicted (blocks) vs measured (generation) video error, {len(pred)} layer × format "
                         f"points: Spearman **{rho:+.2f}**, Pearson **{r_lin:+.2f}** (on log10: {r_log:+.2f}).")
            lines.append(f"- Speed: {gen['tune_s']:.0f} s → {blk['tune_s']:.0f} s: **{gen['tune_s'] / blk['tune_s']:.1f}×** "
                         "(needs ≥ 10×).")
            for g, b in zip(gen["rows"], blk["rows"]):
                diff = np.subtract(b["psnr_videos"], g["psnr_videos"])
                lines.append(f"- {g['target']}: blocks − generation held-out **{b['psnr'] - g['psnr']:+.2f} dB** "
                             f"(paired SE {_se(diff):.2f}) at {b['bits']:.2f} vs {g['bits']:.2f} bits"
                             + (" (needs within 0.5 dB)." if g["target"].startswith("≤") else "."))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=["cogvideox", "wan"])
    parser.add_argument("--sensitivity", choices=["blocks", "generation"], default="blocks")
    parser.add_argument("--pairs", type=int, default=12, help="held-out (prompt, seed) pairs")
    parser.add_argument("--calib", type=int, default=6, help="calibration (prompt, seed) pairs the tuning sees")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--population", type=int, default=10)
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--min-psnr", type=float, default=35.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 pairs, 2 calibration pairs, 3 steps, tiny search")
    parser.add_argument("--json", help="write this run's results here")
    parser.add_argument("--merge", nargs="+", help="results files to write the BENCHMARKS.md section from")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.merge:
        results = [json.loads(Path(p).read_text()) for p in args.merge]
        for res, path in zip(results, args.merge):
            (ROOT / "benchmarks" / "results" / f"tune_blocks_shapes-{res['arch']}-{res['sensitivity']}.json").write_text(
                Path(path).read_text())
        update_section(args.out, "tune-blocks", section(results))
        print(f"wrote section 'tune-blocks' of {args.out}")
        return 0
    if args.arch is None or args.json is None:
        parser.error("give --arch and --json (or --merge)")
    if args.quick:
        args.pairs, args.calib, args.steps, args.population, args.generations = 2, 2, 3, 4, 1
    result = run_arch(args.arch, args)
    Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
