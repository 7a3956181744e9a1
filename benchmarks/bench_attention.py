"""Quantized attention on the shipped models → BENCHMARKS.md (section ``attention``).

    python benchmarks/bench_attention.py                    # both models, 8 held-out pairs, 20 steps
    python benchmarks/bench_attention.py --output part.md   # write the section into another file

Each model runs through ``sixbit.bench.harness.run_bench`` (the harness of the bench-shapes
sections: the same held-out pairs and seeds for every method, FP first) with the full-precision
model, ``int8-attention`` (every attention call of every block and step quantized: INT8 Q·Kᵀ
after smoothing K, FP16 P·V) and ``int8-attention-2`` (the first two steps left in full
precision), and ``int8-attention-p-{int8,e2m3,e3m2}`` (every call, with the attention matrix P rounded
to INT8 or to seed 000's 6-bit floats, a scale per 32 keys, before P·V). Attention is **EMULATED** on this CPU (the method's numerics in fp32 matmuls): its
time is not INT8 speed. *attention share*: attention FLOPs (QKᵀ and PV) over all FLOPs of the FP
run as the work counter measured them; *quantized*: the share of those attention FLOPs that ran
quantized (the counter sees only full-precision attention calls: 1 − counted / FP).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sixbit.bench.harness import BenchSettings, run_bench
from sixbit.bench.layer_shapes import model_flops
from report import machine_description, update_section

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["fp", "int8-attention", "int8-attention-2", "int8-attention-p-int8", "int8-attention-p-e2m3",
           "int8-attention-p-e3m2"]


def rows_of(model: str, prompts: int, steps: int) -> list[dict]:
    # no speedup is quoted here (the attention is emulated): fp32, the model it runs on, is the only reference
    result = run_bench(BenchSettings(model, METHODS, prompts=prompts, steps=steps, baseline="fp"))
    fp = result.rows[0]["work"]
    fp_attention = fp["attention_flops"]
    total = sum(fp["gemm_flops"].values()) + fp_attention
    out = []
    for r in result.rows:
        if r["status"] != "ok":
            out.append({"model": model, "method": r["method"], "error": r["note"]})
            continue
        out.append({"model": model, "method": r["method"], "psnr": r["psnr"], "ssim": r["ssim"],
                    "adherence": r["adherence"], "flicker": r["flicker"], "s_per_video": r["s_per_video"],
                    "share": fp_attention / total, "quantized": 1 - r["work"]["attention_flops"] / fp_attention,
                    "note": r["note"]})
    return out


def section(rows: list[dict], args) -> str:
    gemm, attn = model_flops("CogVideoX-2B")
    lines = [
        "## Quantized attention on the shipped models (issues 18 and 46)", "",
        f"Written by `python benchmarks/bench_attention.py --prompts {args.prompts} --steps {args.steps}` on "
        f"{machine_description()}. {args.prompts} held-out (prompt, seed) pairs, {args.steps} steps, CFG 4, through the "
        "bench harness (FP first, the same seeds for every row); PSNR/SSIM against the FP videos; adherence: color, "
        "shape and direction all right per the shapes judge. **Attention is EMULATED on this CPU** (INT8 QKᵀ as an "
        "exact integer product in fp32 matmuls, FP16-rounded P·V): *s/video* is emulation time, not INT8 speed. "
        "*attention share*: QKᵀ + PV FLOPs over all FLOPs of the FP run (work counter); *quantized*: share of "
        "those attention FLOPs run quantized. *-p-int8 / -p-e2m3 / -p-e3m2*: every call, with the attention matrix P "
        "rounded before P·V to INT8 or to seed 000's 6-bit floats (E2M3, E3M2), a scale per 32 keys taken from P (E8M0 "
        "for the 6-bit ones), instead of FP16. At real size attention weighs far more: "
        f"{attn / (gemm + attn):.0%} of CogVideoX-2B's FLOPs at 49 frames (`sixbit.bench.layer_shapes`).", "",
        "| model | method | attention share | quantized | PSNR dB | SSIM | adherence | flicker | s/video |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['method']} | failed: {r['error']} | | | | | | |")
            continue
        psnr = "∞" if r["psnr"] is None or r["psnr"] == float("inf") else f"{r['psnr']:.2f}"
        lines.append(f"| {r['model']} | {r['method']} | {r['share']:.1%} | {r['quantized']:.0%} | {psnr} | "
                     f"{r['ssim']:.4f} | {r['adherence']:.0%} | {r['flicker']:.4f} | {r['s_per_video']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="shapes-cogvideox,shapes-wan")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    rows = [r for model in args.models.split(",") if model for r in rows_of(model, args.prompts, args.steps)]
    update_section(args.output, "attention", section(rows, args))
    print(section(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
