"""Static timestep-aware W8A8 on the shipped shapes models; writes its section of BENCHMARKS.md.

    python benchmarks/bench_static_w8a8.py                  # both models, every method, 16 pairs
    python benchmarks/bench_static_w8a8.py --pairs 48       # all held-out pairs (finer adherence steps)
    python benchmarks/bench_static_w8a8.py --arch wan --no-write

Per model: calibrate once on 10 varied prompts of the zoo (seeds training and evaluation never
use), then generate the held-out (prompt, seed) pairs with every method and the same noise:

* FP — the shipped model in float32 (the reference video of every PSNR/SSIM);
* dynamic W8A8 — per-channel INT8 weights × dynamic per-token INT8 activations (ViDiT-Q's
  W8A8 scheme, symmetric here), ``sixbit.quantize(QuantConfig("int8", act_mode="int8"))``;
* static presets of :func:`sixbit.apply_static_w8a8`: naive (one per-tensor scale per layer,
  no smoothing), ASQ, TSQ + 4 time ranges (``w8a8-static``), and its mixed-precision variant.

Every quantized path here runs real int8 GEMMs (``torch._int_mm``, int32 accumulation; 6-bit
codes in int8 containers). Adherence comes from the analytic judge ``sixbit.zoo.shapes.judge``;
"mean attr." is the mean of the color/shape/direction accuracies, "all" needs all three right.
Weight bytes: linear-layer weights as stored (packed codes + scales; TSQ's per-range copies
included), other parameters excluded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import sixbit
from report import machine_description, update_section
from sixbit.eval.metrics import psnr, ssim
from sixbit.zoo.shapes.judge import adherence
from sixbit.zoo.shapes import HELDOUT_PAIRS, WEIGHTS_DIR, all_prompts, load_pipeline

SECTION = "static-w8a8"
STEPS, GUIDANCE = 20, 4.0
STATIC = {
    "static naive (1 range, no SQ, no outlier path)": "w8a8-static-naive",
    "static ASQ + 4 ranges, 8-bit side path": "w8a8-static-asq",
    "**static TSQ + 4 time ranges, 8-bit side path** (`w8a8-static`)": "w8a8-static",
    "static TSQ + 4 ranges, source's 6-bit side path at 3σ": "w8a8-static-side6",
    "static TSQ mixed precision (W8 attn / W6 FFN, A8-6-6-8, 6-bit side path)": "w8a8-static-mp",
}


def calibration_prompts(n: int = 10) -> list[tuple[str, int]]:
    """``n`` prompts spread over colors, shapes and directions, seeds 20 000+ (unused elsewhere)."""
    prompts = all_prompts()
    step = len(prompts) // n
    return [(prompts[(i * step + i) % len(prompts)], 20_000 + i) for i in range(n)]


def generate(pipe, pairs, batch):
    videos = []
    t0 = time.perf_counter()
    for i in range(0, len(pairs), batch):
        part = pairs[i : i + batch]
        out = pipe([p for p, _ in part], num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                   generator=[torch.Generator().manual_seed(s) for _, s in part])
        videos.append(out.frames)
    return np.concatenate(videos), (time.perf_counter() - t0) / len(pairs)


def linear_weight_bytes(model) -> int:
    total = sixbit.summary(model).bytes_after
    try:
        total += sixbit.static_w8a8_info(model).extra_weight_bytes
    except ValueError:
        pass
    return total


def snapshot_weights(arch: str, into: Path) -> Path:
    """Copy the shipped weights first: every method then loads the same weights, even if a
    training run rewrites the shipped folder meanwhile."""
    dest = into / arch
    shutil.copytree(WEIGHTS_DIR / arch, dest)
    return dest


def run_arch(arch, pairs, batch, methods, log, folder, n_calib=10):
    rows = []
    calib = calibration_prompts(n_calib)
    pipe = load_pipeline(arch, path=folder)
    t0 = time.perf_counter()
    data = sixbit.calibrate(pipe.transformer, lambda: generate(pipe, calib, len(calib)))
    log(f"{arch}: calibrated in {time.perf_counter() - t0:.1f} s")
    prompts = [p for p, _ in pairs]
    ref, sec = generate(pipe, pairs, batch)
    fp_report = adherence(ref, prompts)
    rows.append(("FP (float32)", ref, sec, linear_weight_bytes(pipe.transformer), fp_report, "–"))
    log(f"{arch}: FP {sec:.2f} s/video, {fp_report}")
    for label, preset in [("dynamic W8A8 per-token (ViDiT-Q style)", None)] + list(STATIC.items()):
        if methods and preset not in methods and not (preset is None and "dynamic" in methods):
            continue
        pipe = load_pipeline(arch, path=folder)
        t0 = time.perf_counter()
        if preset is None:
            sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="int8", act_mode="int8"))
            how = "int8 GEMM, dynamic per-token scales"
        else:
            sixbit.apply_static_w8a8(pipe.transformer, sixbit.StaticW8A8Config.preset(preset), data)
            info = sixbit.static_w8a8_info(pipe.transformer)
            alphas = [v["alpha"] for v in info.layers.values() if v["alpha"] is not None]
            variants = sum(v["variants"] for v in info.layers.values())
            how = f"`{preset}`; " + (f"α median {np.median(alphas):.2f}; " if alphas else "") + (
                f"{variants} weights for {len(info.layers)} layers" if variants > len(info.layers) else "int8 GEMM")
        setup = time.perf_counter() - t0
        videos, sec = generate(pipe, pairs, batch)
        report = adherence(videos, prompts)
        rows.append((label, videos, sec, linear_weight_bytes(pipe.transformer), report, how))
        log(f"{arch}: {label}: setup {setup:.1f} s, {sec:.2f} s/video, PSNR {psnr(videos, ref):.2f} dB, {report}")
    return rows, ref


def _training_step(folder: Path) -> str:
    path = folder / "training.json"
    try:
        info = json.loads(path.read_text())
        return f"weights after {info['step']} of {info['steps']} training steps"
    except (OSError, ValueError, KeyError):
        return "weights of unknown training state"


def _mean_attr(report) -> float:
    return float(np.mean([report.accuracy[a] for a in ("color", "shape", "direction")]))


def table(arch, rows, ref, folder) -> list[str]:
    lines = [
        f"#### shapes-{arch} ({_training_step(folder)})",
        "",
        "| method | PSNR vs FP (dB) | SSIM vs FP | adherence mean attr. | all three | flicker | s / video | weight MiB | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, videos, sec, nbytes, report, how in rows:
        acc = report.accuracy
        mean_attr = _mean_attr(report)
        p = psnr(videos, ref)
        lines.append(
            f"| {label} | {'∞' if p == float('inf') else f'{p:.2f}'} | {ssim(videos, ref):.4f} | {mean_attr:.1%} | "
            f"{acc['all']:.1%} | {report.flicker:.4f} | {sec:.2f} | {nbytes / 2**20:.2f} | {how} |"
        )
    by = {r[5].split(";")[0].strip("`"): r for r in rows}
    tsq, dyn, fp = by.get("w8a8-static"), rows[1] if len(rows) > 1 else None, rows[0]
    if tsq is not None and dyn is not None:
        gap = psnr(dyn[1], ref) - psnr(tsq[1], ref)
        lines += [
            "",
            f"Done-when check: PSNR of `w8a8-static` minus dynamic per-token W8A8 = {-gap:+.2f} dB (needs ≥ −1 dB); "
            f"adherence of `w8a8-static` minus FP = {100 * (_mean_attr(tsq[4]) - _mean_attr(fp[4])):+.1f} points "
            f"(mean attr.), {100 * (tsq[4].accuracy['all'] - fp[4].accuracy['all']):+.1f} points (all three) "
            "(needs ≥ −2 points).",
        ]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", action="append", choices=["cogvideox", "wan"], help="default: both")
    parser.add_argument("--pairs", type=int, default=16, help="held-out (prompt, seed) pairs per model (max 48)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--calib", type=int, default=10, help="calibration prompts (default 10, the source recipe)")
    parser.add_argument("--method", action="append", help="only these presets (and 'dynamic')")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parents[1] / "BENCHMARKS.md"))
    parser.add_argument("--no-write", action="store_true", help="print the table, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pairs = list(HELDOUT_PAIRS[: args.pairs])

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    body = [
        "### Static timestep-aware W8A8 (hardware-friendly: no runtime min/max)",
        "",
        f"Written by `python benchmarks/bench_static_w8a8.py --pairs {args.pairs} --calib {args.calib}` on {machine_description()}.",
        f"{len(pairs)} held-out (prompt, seed) pairs per model, {STEPS} steps, CFG {GUIDANCE}; calibration: "
        f"{args.calib} zoo prompts with their own seeds. PSNR/SSIM against the FP video of the "
        "same seed (SSIM: 7×7 Gaussian window, `sixbit.eval.metrics`). Every quantized row runs real int8 "
        "GEMMs (`torch._int_mm`, int32 accumulation); nothing is emulated. Weight MiB: linear-layer weights as "
        "stored, TSQ's per-range weight copies included.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.arch or ["cogvideox", "wan"]:
            folder = snapshot_weights(arch, Path(tmp))
            rows, ref = run_arch(arch, pairs, args.batch, args.method, log, folder, args.calib)
            body += table(arch, rows, ref, folder) + [""]
    body.append(f"Total benchmark time: {time.perf_counter() - t_start:.0f} s.")
    text = "\n".join(body)
    print(text)
    if not args.no_write:
        update_section(args.output, SECTION, text)
        log(f"wrote section {SECTION!r} of {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
