"""DMPQ vs uniform W4A4/W4A8 and other baselines on the shipped shapes models → BENCHMARKS.md.

    python benchmarks/bench_dmpq.py                       # both models, 16 held-out pairs, 20 steps

Every method starts from the same shipped full-precision pipeline, seeds and steps; PSNR/SSIM
are against that pipeline's own FP videos. NVFP4 activations are EMULATED on this CPU
(dequantize + fp32 matmul), so the time column measures emulation, not FP4 hardware; INT8 runs
a real integer GEMM. Methods:

- W4A8: sixbit's 4-bit weights (the presets' recipe: NVFP4 with Hadamard 128, GPTQ, searched
  scales, a ≤ 0.5-bit low-rank branch, modulation NVFP4 weight-only; quantized once from the
  calibration prompts), dynamic per-token INT8 activations everywhere.
- W4A4: the same weights, dynamic NVFP4 activations everywhere (QuaRot-style rotation).
- W4A4 no rotation: NVFP4 × NVFP4 without the Hadamard rotation.
- ViDiT-Q W4A8: per-channel INT4 weights, per-token INT8 activations, no rotation.
- SmoothQuant W4A8: NVFP4 weights with SmoothQuant (α = 0.5) folded in from the calibration
  runs' per-channel activation abs-max, per-token INT8 activations (no rotation: the rotation
  would mix the smoothed channels).
- W4A16: the same 4-bit weights, activations in full precision — the ceiling of every
  W4 row; compared with W8A8 (INT8 weights and activations) to show what the weights cost.
- DMPQ: W4A4/W4A8 per block and step from the fitted predictor (``target_bits``), fitted to what
  NVFP4 costs the calibration videos per step range × block range (``error_at="video"``).
- DMPQ, block-output target: the same, fitted to the error at the block's own output (the
  paper's target, ``error_at="block"``).
- DMPQ's calibration map, fixed: the (step, block) cells DMPQ ran NVFP4 on the calibration
  prompts, applied to every video whatever its Γ: what Γ adds beyond the learnt cell costs.
- random: the same weights with each block/step drawn NVFP4 with DMPQ's share (mean of draws).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import sixbit
from report import machine_description, update_section
from sixbit.eval.metrics import psnr, ssim
from sixbit.zoo.shapes.judge import adherence, generate_heldout
from sixbit.methods.dmpq import DMPQConfig, FixedAssignment, RandomAssignment, apply_dmpq, fit_dmpq
from sixbit.nn import QuantLinear
from sixbit.presets import W4_RECIPE
from sixbit.eval.plots import plot_precision_map, plot_predictor
from sixbit.transforms.smoothquant import smoothing_factors, weight_channel_amax
from sixbit.zoo.shapes import all_prompts, heldout_pairs, load_pipeline

ROOT = Path(__file__).resolve().parents[1]
GUIDANCE = 4.0


# NVFP4 with Hadamard 128 means sixbit's 4-bit weights (the presets' recipe: GPTQ, searched scales,
# low-rank branch, modulation NVFP4 weight-only), quantized once per model from the calibration
# prompts and copied for each row; the other weight rows (ViDiT-Q INT4, no rotation, W8A8) round to nearest.
_RECIPE: dict = {}


def _quantized(arch, weight_format, hadamard, act_mode):
    pipe = load_pipeline(arch)
    if weight_format == "nvfp4" and hadamard == 128:
        calib_pairs, steps = _RECIPE["calibration"]
        if arch not in _RECIPE:
            src = load_pipeline(arch)
            sixbit.quantize(src.transformer, sixbit.QuantConfig(weight_format="nvfp4", hadamard_block=128, **W4_RECIPE),
                            calibration=lambda: generate_heldout(src, calib_pairs, steps, GUIDANCE), progress=False)
            _RECIPE[arch] = src.transformer
        pipe.transformer = copy.deepcopy(_RECIPE[arch])
        for m in pipe.transformer.modules():
            if isinstance(m, QuantLinear):
                m.act_mode = act_mode  # weight-only layers (modulation) ignore it
        return pipe
    sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format=weight_format, hadamard_block=hadamard, act_mode=act_mode))
    return pipe


def _measure(pipe, pairs, steps, ref):
    t0 = time.perf_counter()
    videos, prompts = generate_heldout(pipe, pairs, steps, GUIDANCE)
    seconds = (time.perf_counter() - t0) / len(pairs)
    adh = adherence(videos, prompts)
    row = {
        "psnr": float(np.mean([psnr(v, r) for v, r in zip(videos, ref)])) if ref is not None else float("inf"),
        "ssim": float(np.mean([ssim(v, r) for v, r in zip(videos, ref)])) if ref is not None else 1.0,
        "adherence": adh.accuracy["all"],
        "flicker": adh.flicker,
        "s_per_video": seconds,
        "weight_mib": sixbit.summary(pipe.transformer).bytes_after / 2**20,
    }
    return row, videos


def _smoothquant_w4a8(arch, calib_pairs, steps, alpha=0.5):
    """NVFP4 weights with SmoothQuant folded in (act abs-max from the calibration runs), INT8 activations."""
    pipe = load_pipeline(arch)
    probe = _quantized(arch, "nvfp4", None, "fp").transformer  # which layers sixbit.quantize would replace
    names = [n for n, m in probe.named_modules() if isinstance(m, QuantLinear)]
    amax, handles = {}, []
    for name in names:
        def hook(module, args, name=name):
            a = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(dim=0)
            amax[name] = a if name not in amax else torch.maximum(amax[name], a)
        handles.append(pipe.transformer.get_submodule(name).register_forward_pre_hook(hook))
    generate_heldout(pipe, calib_pairs, steps, GUIDANCE)
    for h in handles:
        h.remove()
    for name in names:
        linear = pipe.transformer.get_submodule(name)
        s = smoothing_factors(amax[name], weight_channel_amax(linear.weight), alpha)
        parent, _, child = name.rpartition(".")
        setattr(pipe.transformer.get_submodule(parent), child,
                QuantLinear.from_linear(linear, "nvfp4", act_mode="int8", input_divisor=s))
    return pipe


def run_arch(arch: str, pairs, calib_pairs, steps: int, target_bits: list[float], draws: int, plots: Path):
    rows = {}
    fp = load_pipeline(arch)
    rows["FP"], ref = _measure(fp, pairs, steps, None)
    rows["FP"]["bits"] = 16.0  # the convention of every table: full-precision activations count 16
    print(f"[{arch}] FP: {rows['FP']}", flush=True)
    uniform = {
        "W4A8 (sixbit 4-bit W, INT8 A)": ("nvfp4", 128, "int8", 8.0),
        "W4A4 (sixbit 4-bit W, NVFP4 A)": ("nvfp4", 128, "nvfp4", 4.5),
        "W4A4 no rotation": ("nvfp4", None, "nvfp4", 4.5),
        "ViDiT-Q W4A8 (INT4 per-channel W, INT8 per-token A)": ("int4", None, "int8", 8.0),
        "W4A16 (sixbit 4-bit W, FP A): ceiling of the W4 rows": ("nvfp4", 128, "fp", 16.0),
        "W8A8 (INT8 W and A)": ("int8", None, "int8", 8.0),
    }
    for name, (wf, hb, act, bits) in uniform.items():
        rows[name], _ = _measure(_quantized(arch, wf, hb, act), pairs, steps, ref)
        rows[name]["bits"] = bits
        print(f"[{arch}] {name}: {rows[name]}", flush=True)

    name = "SmoothQuant W4A8 (NVFP4 W, α 0.5, INT8 A)"
    rows[name], _ = _measure(_smoothquant_w4a8(arch, calib_pairs, steps), pairs, steps, ref)
    rows[name]["bits"] = 8.0
    print(f"[{arch}] {name}: {rows[name]}", flush=True)

    fits = {}
    for target in target_bits:
        pipe = _quantized(arch, "nvfp4", 128, "int8")
        runs = []
        calib = lambda: runs.append(1) or generate_heldout(pipe, calib_pairs, steps, GUIDANCE)[0]  # noqa: E731
        t0 = time.perf_counter()
        predictor = fit_dmpq(pipe.transformer, calib, DMPQConfig(target_bits=target))
        fit_s = time.perf_counter() - t0
        dmpq = apply_dmpq(pipe.transformer, predictor)
        name = f"DMPQ (target {target:g} bits)"
        rows[name], _ = _measure(pipe, pairs, steps, ref)
        report = dmpq.report()
        rows[name]["bits"] = report.average_bits
        if target == target_bits[0]:
            plot_precision_map(report, plots / f"dmpq_map_{arch}.png", branch="cond" if arch == "wan" else "cond_uncond",
                               title=f"DMPQ on shapes-{arch}, target {target:g} bits")
            plot_predictor(predictor, plots / f"dmpq_corr_{arch}.png", title=f"shapes-{arch}")
        print(f"[{arch}] {name}: {rows[name]}", flush=True)
        low_share = report.flop_share().get("nvfp4", 0.0) * steps / max(steps - 1, 1)
        draws_rows = []
        for seed in range(draws):
            rp = _quantized(arch, "nvfp4", 128, "int8")
            handle = apply_dmpq(rp.transformer, RandomAssignment(min(low_share, 1.0), seed))
            r, _ = _measure(rp, pairs, steps, ref)
            r["bits"] = handle.report().average_bits
            draws_rows.append(r)
        rname = f"random NVFP4/INT8 (DMPQ {target:g}'s share, mean of {draws})"
        rows[rname] = {k: statistics.mean(r[k] for r in draws_rows) for k in draws_rows[0]}
        rows[rname]["psnr_draws"] = [r["psnr"] for r in draws_rows]
        print(f"[{arch}] random: {[r['psnr'] for r in draws_rows]}", flush=True)
        fits[target] = (name, rname, predictor, report, f"{fit_s:.0f} s ({len(runs)} calibration runs)")
        if target == target_bits[0]:
            bp = _quantized(arch, "nvfp4", 128, "int8")
            block_fit = fit_dmpq(bp.transformer, lambda: generate_heldout(bp, calib_pairs, steps, GUIDANCE)[0],
                                 DMPQConfig(target_bits=target, error_at="block"))
            handle = apply_dmpq(bp.transformer, block_fit)
            bname = f"DMPQ, block-output target (target {target:g} bits)"
            rows[bname], _ = _measure(bp, pairs, steps, ref)
            rows[bname]["bits"] = handle.report().average_bits
            print(f"[{arch}] {bname}: {rows[bname]}", flush=True)
            # what Γ adds: the cells DMPQ chose on the calibration prompts, fixed for every video
            generate_heldout(pipe, calib_pairs, steps, GUIDANCE)
            chosen = dmpq.report().decisions
            branches = {b for b, _, _ in chosen}
            low = {(s, k) for _, s, k in chosen if all(chosen.get((b, s, k)) == "nvfp4" for b in branches)}
            sp = _quantized(arch, "nvfp4", 128, "int8")
            handle = apply_dmpq(sp.transformer, FixedAssignment(low))
            sname = f"DMPQ's calibration map, fixed (target {target:g} bits)"
            rows[sname], _ = _measure(sp, pairs, steps, ref)
            rows[sname]["bits"] = handle.report().average_bits
            print(f"[{arch}] {sname}: {rows[sname]}", flush=True)
    return rows, fits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="cogvideox,wan")
    parser.add_argument("--pairs", type=int, default=16, help="held-out (prompt, seed) pairs (every third of 48)")
    parser.add_argument("--calib", type=int, default=8, help="calibration generations (prompts with unseen seeds)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--target-bits", default="6.0,6.5", help="comma-separated DMPQ targets")
    parser.add_argument("--draws", type=int, default=3, help="random-assignment draws to average")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    pairs = heldout_pairs(args.pairs)
    prompts = all_prompts()
    calib_pairs = [(prompts[(7 * i + 3) % len(prompts)], 20_000 + i) for i in range(args.calib)]
    _RECIPE["calibration"] = (calib_pairs, args.steps)
    plots = ROOT / "benchmarks" / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    lines = [
        "## DMPQ: dynamic NVFP4/INT8 activations per block and step (issue 6)",
        "",
        f"Written by `python benchmarks/bench_dmpq.py --pairs {args.pairs} --calib {args.calib} --steps {args.steps} "
        f"--target-bits {args.target_bits} --draws {args.draws}`. Machine: {machine_description()}.",
        f"{len(pairs)} held-out (prompt, seed) pairs, {args.steps} flow-matching steps, CFG {GUIDANCE:g}; PSNR/SSIM "
        "against the same pipeline's FP videos; adherence = share of videos whose color, shape and direction the "
        "judge reads right. *bits* = GEMM-FLOP-weighted average activation bits (NVFP4 counted as 4.5 with its "
        "scales). **NVFP4 activations are EMULATED** (dequantize + fp32 matmul): *s/video* measures emulation on this "
        "CPU, not FP4 hardware speed.",
    ]
    targets = [float(t) for t in args.target_bits.split(",")]
    for arch in args.archs.split(","):
        rows, fits = run_arch(arch, pairs, calib_pairs, args.steps, targets, args.draws, plots)
        w4a8 = rows["W4A8 (sixbit 4-bit W, INT8 A)"]["psnr"]
        w4a4 = rows["W4A4 (sixbit 4-bit W, NVFP4 A)"]["psnr"]
        lines += [
            "",
            f"### shapes-{arch}",
            "",
            "| method | act bits | linear weights MiB | PSNR dB | SSIM | adherence | flicker | s/video |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in rows.items():
            p = "—" if r["psnr"] == float("inf") else f"{r['psnr']:.2f}"
            lines.append(
                f"| {name} | {r['bits']:.2f} | {r['weight_mib']:.3f} | {p} | {r['ssim']:.4f} | "
                f"{100 * r['adherence']:.1f}% | {r['flicker']:.4f} | {r['s_per_video']:.2f} |"
            )
        lines.append("")
        for target, (dname, rname, predictor, report, fit_cost) in fits.items():
            closed = (rows[dname]["psnr"] - w4a4) / (w4a8 - w4a4) if w4a8 != w4a4 else float("nan")
            share = report.flop_share()
            lines += [
                f"- Target {target:g}: DMPQ closes **{100 * closed:.1f}%** of the PSNR gap from W4A4 to W4A8 "
                f"(done-when: ≥ 60% at ≤ 6.5 bits) at **{rows[dname]['bits']:.2f}** average activation bits "
                f"(NVFP4 {100 * share.get('nvfp4', 0):.0f}% / INT8 {100 * share.get('int8', 0):.0f}% of GEMM FLOPs); "
                f"random assignment with the same share: {rows[rname]['psnr']:.2f} dB vs DMPQ {rows[dname]['psnr']:.2f} dB "
                f"(draws {', '.join(f'{x:.2f}' for x in rows[rname]['psnr_draws'])}); adherence DMPQ "
                f"{100 * rows[dname]['adherence']:.1f}% vs FP {100 * rows['FP']['adherence']:.1f}%; fitting took "
                f"{fit_cost}.",
            ]
        predictor = fits[targets[0]][2]
        bname = f"DMPQ, block-output target (target {targets[0]:g} bits)"
        bclosed = (rows[bname]["psnr"] - w4a4) / (w4a8 - w4a4) if w4a8 != w4a4 else float("nan")
        sname = f"DMPQ's calibration map, fixed (target {targets[0]:g} bits)"
        dname0 = fits[targets[0]][0]
        w4a16 = rows["W4A16 (sixbit 4-bit W, FP A): ceiling of the W4 rows"]["psnr"]
        w8a8 = rows["W8A8 (INT8 W and A)"]["psnr"]
        lines += [
            f"- Ceiling: W4A16 (4-bit weights alone) reaches {w4a16:.2f} dB vs W8A8 {w8a8:.2f} dB: the 4-bit weights "
            f"alone cost {w8a8 - w4a16:.1f} dB, while W4A4 → W4A16 (all activation error) is {w4a16 - w4a4:.1f} dB.",
            f"- Fitted to the block-output error instead (the paper's target), DMPQ closes {100 * bclosed:.1f}% at "
            f"{rows[bname]['bits']:.2f} bits: a block's own error misses that NVFP4 in the first steps moves the "
            "whole trajectory.",
            f"- The cells DMPQ chose on the calibration prompts, fixed for every video (Γ ignored): "
            f"{rows[sname]['psnr']:.2f} dB at {rows[sname]['bits']:.2f} bits, vs DMPQ {rows[dname0]['psnr']:.2f} dB at "
            f"{rows[dname0]['bits']:.2f}: following Γ adds {rows[dname0]['psnr'] - rows[sname]['psnr']:+.2f} dB to the "
            "learnt (step, block) cells.",
            f"- The paper's observation on this model: Pearson r between Γ(t−1) and the NVFP4 error at t = "
            f"**{predictor.pearson_r:.3f}** over {predictor.pairs[0].numel()} calibration pairs.",
            "",
            f"![precision map](benchmarks/plots/dmpq_map_{arch}.png) ![Γ vs error](benchmarks/plots/dmpq_corr_{arch}.png)",
        ]
    update_section(args.out, "dmpq", "\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
