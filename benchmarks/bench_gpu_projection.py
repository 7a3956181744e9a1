"""PROJECTION, not a measurement: sixbit's GPU kernels at real layer shapes on an H100 and an RTX
4090, from a roofline of each kernel → BENCHMARKS.md (section ``gpu-projection``).

    python benchmarks/bench_gpu_projection.py        # seconds; reads benchmarks/results/gpu_aot.json

Each kernel's time is ``max(bytes moved / memory bandwidth, FLOPs / peak of the unit it multiplies
on)``, the unit read from the kernel as compiled ahead of time (``gpu-aot``: tensor-core family,
or FMA for an fp32 ``tl.dot``; the Hadamard rotation of 16-bit inputs multiplies on bf16 tensor
cores, of fp32 inputs (and before issue 64) on FMA units). Bytes: each operand read once and each result written
once, except the fused quantize, which reads its input twice (abs-max, then codes). FLOPs: 2·M·K·N
per GEMM; the rotation ``4·M·K·b`` (a ``b``-wide dot per element, in both passes). Peaks
(dense, no sparsity): H100 SXM 3.35 TB/s, BF16 989.4, INT8 1978.9, FP32 66.9 TFLOPS (NVIDIA H100
datasheet); RTX 4090 1008 GB/s, BF16 with fp32 accumulation 165.2, INT8 660.6, FP32 82.6 TFLOPS
(NVIDIA Ada whitepaper). Rows: one call of each distinct linear of CogVideoX-2B at 49 frames
(17,776 rows) and Wan2.1-14B at 81 frames of 480×832 (21 latent frames of 30×52 patches: 32,760
rows), one sample. Left out: launch overheads, caches, efficiency below peak (the W4A16 kernel's
16-row tiles use ``mma.sync`` on Hopper, not ``wgmma``, so its real H100 rate is lower).

Then one denoising step of each model in bf16 and every preset (:mod:`gpu_step_projection`: the
path of each linear as the dispatcher chooses it per capability, attention, the delta cache's skips).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from gpu_step_projection import (
    CFG_BATCH,
    int8_attention_seconds,
    plan,
    seconds,
    skip_shares,
    step,
)
from report import update_section

from sixbit.bench.layer_shapes import REAL_MODELS
from sixbit.kernels import available
from sixbit.nn.precision import ACT_BITS, ActMode
from sixbit.presets import PRESETS, resolve

ROOT = Path(__file__).resolve().parents[1]
LABEL = "PROJECTION (roofline from the compiled kernels' bytes and FLOPs at peak rates, not measured)"
GPUS = {  # bytes/s and FLOP/s, dense; memory in bytes
    "H100 SXM": {"sm": "sm_90", "capability": (9, 0), "bw": 3.35e12, "bf16": 989.4e12, "int8": 1978.9e12,
                 "fp32": 66.9e12, "memory": 80e9},
    "RTX 4090": {"sm": "sm_89", "capability": (8, 9), "bw": 1.008e12, "bf16": 165.2e12, "int8": 660.6e12,
                 "fp32": 82.6e12, "memory": 24e9},
}
ROWS = {"CogVideoX-2B": (49, 13 * 30 * 45 + 226), "Wan2.1-14B": (81, 21 * 30 * 52)}  # frames, rows per call
ROTATION = 128  # the presets' Hadamard block


def kernels(m: int, k: int, n: int, gpu: dict, rotation_unit: str) -> dict[str, float]:
    """Roofline seconds of each kernel a call of a (K → N) linear on ``m`` rows runs; the
    Hadamard rotation multiplies on ``rotation_unit`` (``"bf16"`` tensor cores or ``"fp32"`` FMA)."""
    gemm = 2.0 * m * k * n
    quantize = 2 * 2 * m * k + m * k + 4 * m
    return {
        "bf16 F.linear": seconds(gpu, 2 * m * k + 2 * k * n + 2 * m * n, {"bf16": gemm}),
        "quantize": seconds(gpu, quantize, {}),
        f"quantize + Hadamard {ROTATION}": seconds(gpu, quantize + 2 * ROTATION ** 2,
                                                   {rotation_unit: 4.0 * m * k * ROTATION}),
        f"quantize + fp32 Hadamard {ROTATION}": seconds(gpu, quantize + 4 * ROTATION ** 2,
                                                        {"fp32": 4.0 * m * k * ROTATION}),
        "_int_mm": seconds(gpu, m * k + k * n + 4 * m * n, {"int8": gemm}),
        "epilogue": seconds(gpu, 4 * m * n + 2 * m * n + 4 * (m + n), {}),
        "W4A16 (NVFP4)": seconds(gpu, 2 * m * k + k * n / 2 + k * n / 16 + 2 * m * n, {"bf16": gemm}),
    }


def measure() -> list[dict]:
    aot = json.loads((ROOT / "benchmarks" / "results" / "gpu_aot.json").read_text())["records"]
    families = {}
    for r in aot:  # the tensor-core family each kernel compiled to (bf16 inputs), per target
        if r["config"].startswith("bf16"):
            families.setdefault((r["kernel"], r["target"]), set()).update(m.split()[0] for m in r["mma"])
    rotation_mma = {r["target"] for r in aot if r["config"] == f"bf16, Hadamard {ROTATION}" and r["mma"]}
    out = []
    for model, (frames, m) in ROWS.items():
        for k, n in sorted({(lin.k, lin.n) for lin in REAL_MODELS[model].linears}):
            for name, gpu in GPUS.items():
                t = kernels(m, k, n, gpu, "bf16" if gpu["sm"] in rotation_mma else "fp32")
                int8 = t["quantize"] + t["_int_mm"] + t["epilogue"]
                share = {key: (t[f"quantize + {key}Hadamard {ROTATION}"] - t["quantize"]) / t["_int_mm"]
                         for key in ("", "fp32 ")}
                out.append({"model": model, "frames": frames, "rows": m, "k": k, "n": n, "gpu": name, "ms": {
                    key: 1e3 * value for key, value in t.items()}, "int8_ms": 1e3 * int8,
                    "rotated_ms": 1e3 * (int8 - t["quantize"] + t[f"quantize + Hadamard {ROTATION}"]),
                    "fp32_rotated_ms": 1e3 * (int8 - t["quantize"] + t[f"quantize + fp32 Hadamard {ROTATION}"]),
                    "rotation_share": share[""], "fp32_rotation_share": share["fp32 "],
                    "rotation_unit": "tensor cores" if gpu["sm"] in rotation_mma else "FMA",
                    "w4a16_mma": "/".join(sorted(families.get(("weight4", gpu["sm"]), ()))) or "none"})
    return out


def section(rows: list[dict]) -> str:
    lines = [
        "## GPU kernels at real shapes: a roofline PROJECTION (issue 64)",
        "",
        f"**{LABEL}.** Written by `python benchmarks/bench_gpu_projection.py`; no GPU has run these kernels yet "
        "(`gpu` section). " + " ".join(__doc__.split("\n\n")[2].split()),
        "",
        ("*INT8*: the fused quantize, `torch._int_mm` and the epilogue; *+ H128*: the same with the Hadamard-128 "
        "rotation fused into the quantize, on bf16 inputs: the ±1 Hadamard in bf16 on tensor cores where `gpu-aot` "
        "finds the kernel's `mma` (*fp32 H128*: the rotation as an fp32 `tl.dot` on FMA units, what ran before and "
        "what fp32 inputs run); *rotation / GEMM*: the rotation's time over the INT8 GEMM's; speedups against bf16."),
        "",
        ("| model | linear K→N | rows | GPU | bf16 ms | INT8 ms | INT8 + H128 ms | rotation / GEMM | "
        "fp32 H128: rotation / GEMM | W4A16 ms | INT8 × | INT8 + H128 × | INT8 + fp32 H128 × | W4A16 × | W4A16 MMA (AOT) |"),
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        bf16, w4 = r["ms"]["bf16 F.linear"], r["ms"]["W4A16 (NVFP4)"]
        lines.append(f"| {r['model']} ({r['frames']} frames) | {r['k']}→{r['n']} | {r['rows']:,} | {r['gpu']} | "
                     f"{bf16:.3f} | {r['int8_ms']:.3f} | {r['rotated_ms']:.3f} | {r['rotation_share']:.2f} | "
                     f"{r['fp32_rotation_share']:.2f} | {w4:.3f} | {bf16 / r['int8_ms']:.2f} | {bf16 / r['rotated_ms']:.2f} | "
                     f"{bf16 / r['fp32_rotated_ms']:.2f} | {bf16 / w4:.2f} | {r['w4a16_mma']} |")
    worst = max(rows, key=lambda r: r["fp32_rotation_share"])
    count = {g: sum(r["gpu"] == g for r in rows) for g in GPUS}

    def slower(key: str) -> str:
        return ", ".join(f"{sum(r[key] > r['ms']['bf16 F.linear'] for r in rows if r['gpu'] == g)} of {count[g]} {g} rows"
                         for g in GPUS)
    lines += ["", (f"As an fp32 `tl.dot` the rotation cost up to {worst['fp32_rotation_share']:.1f}× the INT8 GEMM it "
              f"precedes ({worst['model']} {worst['k']}→{worst['n']} on {worst['gpu']}): its FLOPs are 2·{ROTATION}/N "
              f"of the GEMM's, on units 8–30× slower than INT8 tensor cores, and INT8 projected slower than bf16 in "
              f"{slower('fp32_rotated_ms')}. On bf16 tensor cores (issue 64: the ±1 Hadamard in the input's dtype, "
              f"exact products summed in fp32) its FLOPs finish inside the quantize's own memory traffic (rotation / GEMM "
              f"≤ {max(r['rotation_share'] for r in rows):.2f} in this roofline): INT8 + H128 projects as INT8 alone, "
              f"slower than bf16 in {slower('rotated_ms')} (at CogVideoX-2B's width the quantize's and epilogue's "
              "memory passes outweigh what the INT8 GEMM saves on an H100).")]
    return "\n".join(lines) + "\n"


def rotation_unit(gpu: dict) -> str:
    """``"bf16"`` where ``gpu-aot`` finds the rotation of 16-bit inputs compiled to ``mma``, else ``"fp32"``."""
    aot = json.loads((ROOT / "benchmarks" / "results" / "gpu_aot.json").read_text())["records"]
    mma = {r["target"] for r in aot if r["config"] == f"bf16, Hadamard {ROTATION}" and r["mma"]}
    return "bf16" if gpu["sm"] in mma else "fp32"


def steps() -> list[dict]:
    """Every (model, GPU, bf16 or preset) step projection (:mod:`gpu_step_projection`)."""
    skips, out = skip_shares(), []
    for gname, gpu in GPUS.items():
        unit, plans = rotation_unit(gpu), plan(gpu["capability"])
        for model, (frames, m) in ROWS.items():
            real = REAL_MODELS[model]
            rows = {"joint": m} if real.joint else {"video": m}
            for name in ("bf16", *plans):
                r = step(name, plans.get(name), real, rows, gpu, functools.partial(kernels, rotation_unit=unit), skips)
                out.append({"model": model, "frames": frames, "gpu": gname, "preset": name, **r})
    return out


def step_section(rows: list[dict]) -> str:
    """The per-step table: every (model, GPU, bf16 or preset), then what it leaves out."""
    lines = [
        "### One denoising step per preset: a PROJECTION (issue 64)",
        "",
        f"**{LABEL}.** " + step_method(rows),
        "",
        ("| model | GPU | preset | block linears run as (calls per step) | linears ms | attention ms | step ms | "
         "× bf16 | rotation share | fp32 rotation share | cache skips (borrowed) | mean step ms | mean × bf16 |"),
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {(r["model"], r["gpu"]): r for r in rows if r["preset"] == "bf16"}
    for r in rows:
        b = base[(r["model"], r["gpu"])]
        runs = "; ".join(f"{path} ×{calls:.0f}" for path, calls in r["paths"].items())
        skip = f"{100 * r['skip']:.0f} % (`{r['cache_method']}`)" if r["cache_method"] else "no cache"
        lines.append(f"| {r['model']} ({r['frames']} frames) | {r['gpu']} | {r['preset']} | {runs} | {r['linears_ms']:.0f} | "
                     f"{r['attention_ms']:.0f} | {r['step_ms']:.0f} | {b['step_ms'] / r['step_ms']:.2f} | "
                     f"{100 * r['rotation_share']:.1f} % | {100 * r['fp32_rotation_share']:.1f} % | {skip} | "
                     f"{r['mean_step_ms']:.0f} | {b['step_ms'] / r['mean_step_ms']:.2f} |")
    return "\n".join(lines) + "\n\n" + step_findings(rows) + "\n"


def step_method(rows: list[dict]) -> str:
    """Every modelling choice of the per-step table, in words, from the code it reads."""
    caps = {g: available("cuda", capability=gpu["capability"]) for g, gpu in GPUS.items()}
    notes = sorted({f"`{r['preset']}`: {r['note']}" for r in rows if r["note"]})
    low, high = ACT_BITS[ActMode.NVFP4], ACT_BITS[ActMode.INT8]
    dmpq = sorted({resolve(n).dmpq.target_bits for n in PRESETS if resolve(n).dmpq})
    share = ", ".join(f"{(high - t) / (high - low):.0%} at target {t:g} bits" for t in dmpq)
    attention = [n for n in PRESETS if resolve(n).attention is not None]
    sparse = sorted({(r["preset"], r["density"]) for r in rows if r["density"] < 1})
    kept = {(r["model"], r["gpu"]): r["kept"] for r in rows if any("INT8 copy" in p for p in r["paths"])}
    return " ".join([
        (f"One transformer call per step with **both classifier-free-guidance samples counted** (one call on a batch "
        f"of {CFG_BATCH}, as diffusers runs them); rows per sample as above; every block's linears "
        "(`REAL_MODELS` shapes × block count; Wan's cross-attention k, v on its 512 text tokens) and attention."),
        "**Paths are the code's choice, asked per capability without a GPU**: each preset through "
        "`sixbit.presets.for_device(config, 'cuda', capability=...)`, then `sixbit.kernels.paths.select` with each "
        "layer's operands and the capability's switches (what `sixbit.kernels.available(capability=...)` answers: "
        + "; ".join(f"{g}: NVFP4 *{c['nvfp4']}*, INT8 *{c['int8']}*" for g, c in caps.items()) + ").",
        ("Device notes: " + " ".join(notes) + ".") if notes else "",
        (f"DMPQ that keeps NVFP4 (`low='nvfp4'`) runs it on the FLOP share that brings the mean to its target "
        f"(`ACT_BITS`: {share}), emulated here."),
        ("A 4-bit layer with a low-rank branch (rank from `QuantConfig.lowrank_rank_for`) has no plain input, so its "
        "INT8 calls take the unfused path: the rotation as one bf16 GEMM by the ±1 matrix (`int8_inputs`), the "
        "quantize, `_int_mm`, the epilogue, and the branch's two bf16 GEMMs with its (rows, N) output read once more; "
        "W4A16 and emulated NVFP4 calls rotate with `hadamard.rotate` (an fp32 matmul on FMA units; TF32 off)."),
        "Their NVFP4 weights multiply in INT8 through `QuantLinear.int8_weight`: an INT8 copy kept where the default "
        "layout (`sixbit.memory`, `auto`) keeps it, i.e. its bytes (`fast_path.kept_bytes`) fit in half the free "
        "memory, taken as the card's (80 / 24 GB) less the stored block weights (text encoder, VAE, activations "
        "left out); else re-rounded on every call (4.5-bit weight read, INT8 codes written, then read by the GEMM): "
        + ", ".join(f"{m} on {g}: {'kept' if k else 're-rounded'}" for (m, g), k in sorted(kept.items())) + ".",
        ("Emulated NVFP4: activations to fp32, rotated, rounded through NVFP4 and back, the weight dequantized to fp32, "
        "an fp32 matmul on FMA units, each a memory pass."),
        f"Attention: bf16 flash attention (4·Lq·Lkv·d FLOPs on bf16 tensor cores; q, k, v read, output written once); "
        f"presets setting `attention` (sixbit's INT8 attention kernel): {', '.join(attention) or 'none'}; block-sparse "
        + ", ".join(f"`{n}` at its configured density {d:.0%} of the self-attention tiles (its floor: the adaptive "
                    "mode widens heads whose error passes its bound; its first warm-up steps run dense, not "
                    "in this steady-state step)" for n, d in sparse) + ", Wan's cross-attention dense.",
        ("*rotation share*: the Hadamard rotation's time over the step, as the code runs now (the fused quantize "
        "rotates 16-bit inputs on tensor cores); *fp32 rotation share*: with the fused quantize's rotation as an fp32 "
        "`tl.dot`, as before."),
        ("*Cache skips* are **borrowed**: the share of block calls the delta cache skipped on this project's shipped "
        "shapes models at 20 steps (`cache-pareto`: the preset's own row, else `tdc` at its error budget), the "
        "CogVideoX one for CogVideoX-2B and the Wan one for Wan2.1-14B; not measured on these models. "
        "*mean step* = step × (1 − skip share): a skipped block costs nothing, the cache's own checks are left out."),
        ("**Left out**: the elementwise rest (norms, AdaLN modulation and gating, RoPE, GELU, residual adds: memory "
        "passes over the activations), the layers outside the blocks, the text encoder and VAE, launch overheads, "
        "the unfused INT8 path sharing q/k/v's quantized input (each linear quantizes here: an upper bound), the "
        "static W8A8 outlier side path, and efficiency below peak (flash attention reaches well under its peak)."),
    ])


def step_findings(rows: list[dict]) -> str:
    """What the per-step table says, from its numbers."""
    out = []
    for (model, gname) in sorted({(r["model"], r["gpu"]) for r in rows}):
        mine = {r["preset"]: r for r in rows if r["model"] == model and r["gpu"] == gname}
        b, gpu = mine["bf16"], GPUS[gname]
        best = min(mine.values(), key=lambda r: r["mean_step_ms"])
        nocache = min((r for r in mine.values() if not r["cache_method"]), key=lambda r: r["step_ms"])
        real = REAL_MODELS[model]
        m = ROWS[model][1]
        int8_attn = 1e3 * real.layers * int8_attention_seconds(real, CFG_BATCH, {"joint" if real.joint else "video": m}, gpu)
        out.append(f"- {model} on {gname}: bf16 {b['step_ms']:.0f} ms per step ({100 * b['attention_ms'] / b['step_ms']:.0f} % "
                   f"attention); fastest without a cache `{nocache['preset']}` ({b['step_ms'] / nocache['step_ms']:.2f}×), "
                   f"fastest mean step `{best['preset']}` ({b['step_ms'] / best['mean_step_ms']:.2f}×); `w4a8` "
                   f"{b['step_ms'] / mine['w4a8']['step_ms']:.2f}× (rotation {100 * mine['w4a8']['rotation_share']:.1f} % of "
                   f"its step); emulated NVFP4 (`w4a4`) {b['step_ms'] / mine['w4a4']['step_ms']:.2f}×; sixbit's INT8 "
                   f"attention kernel, which no preset turns on, would take {int8_attn:.0f} ms of attention against "
                   f"bf16's {b['attention_ms']:.0f}.")
    now = max(rows, key=lambda r: r["rotation_share"])
    before = max(rows, key=lambda r: r["fp32_rotation_share"])
    fused = [r for r in rows if all(p.startswith("int8-fused + H") for p in r["paths"])]
    out.append(f"- The Hadamard rotation as the code runs it now: at most {100 * now['rotation_share']:.1f} % of a step "
               f"(`{now['preset']}`, {now['model']} on {now['gpu']}: {'; '.join(now['paths'])}, outside the fused "
               f"quantize; W4A16 and emulated NVFP4 calls rotate in fp32 on FMA units); inside the fused quantize, on tensor cores, at most "
               f"{100 * max(r['rotation_share'] for r in fused):.1f} % (`{'`, `'.join(sorted({r['preset'] for r in fused}))}`). "
               f"As an fp32 `tl.dot` there, as before, it was up to {100 * before['fp32_rotation_share']:.1f} % "
               f"(`{before['preset']}`, {before['model']} on {before['gpu']}).")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    text = section(measure()) + "\n" + step_section(steps())
    print(text)
    update_section(args.output, "gpu-projection", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
