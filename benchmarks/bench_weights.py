"""4-bit weights on the shipped shapes models: round to nearest, scale search, GPTQ, the low-rank
branch and their stacks, peers at equal or fewer bytes → BENCHMARKS.md (section ``weights``).

    python benchmarks/bench_weights.py                    # both models, 16 held-out pairs, 20 steps
    python benchmarks/bench_weights.py --quick            # 2 pairs, 4 steps: checks the script

Every row starts from the same shipped full-precision pipeline, seeds and steps; PSNR/SSIM are
against that pipeline's own FP videos. Rows are W4A16 (activations in full precision: what the
weights alone cost) unless the row says otherwise; NVFP4 activations (W4A4) are EMULATED here.
*weight bits*: stored bits per weight over the quantized linears (scales and the low-rank branch
included); *transformer MiB*: every parameter and buffer the transformer holds (peers' packed
tensors unwrapped); *quantize s*: conversion time (GPTQ: its calibration runs included);
*peak MiB*: the largest RSS growth above the starting point while quantizing (polled every 10 ms).

The per-layer part records each linear's input Hessian once on the FP model and reports, per
layer, the output SQNR of round to nearest, GPTQ + MSE scales and the low-rank branch on those
inputs, beside two predictors: the input-channel spread (max / median RMS of the input channels)
and the top-r singular-value energy of the weight.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

import sixbit
from report import machine_description, update_section
from sixbit.calibration import hessians
from sixbit.eval.metrics import psnr, ssim
from sixbit.zoo.shapes.judge import adherence, generate_heldout
from sixbit.nn import QuantLinear
from sixbit.presets import W4_RECIPE
from sixbit.transforms import hadamard, lowrank
from sixbit.rounding import quantize_weight
from sixbit.zoo.shapes import all_prompts, heldout_pairs, load_pipeline

ROOT = Path(__file__).resolve().parents[1]
GUIDANCE = 4.0
H128 = dict(weight_format="nvfp4", hadamard_block=128)
RTN = dict(H128)
GPTQ_MSE = dict(H128, scale_rule="mse", gptq=True)
RECIPE = dict(H128, **W4_RECIPE)  # the default of every 4-bit preset


def _rows() -> list[tuple[str, str, dict, tuple[str, ...]]]:
    """(label, kind, config or peer spec, activation modes)."""
    rows = [
        ("round to nearest (RTN)", "sixbit", RTN, ("fp", "int8", "nvfp4")),
        ("scale search: MSE", "sixbit", dict(H128, scale_rule="mse"), ("fp",)),
        ("scale search: 4/6", "sixbit", dict(H128, scale_rule="4/6"), ("fp",)),
        ("GPTQ (absmax scales)", "sixbit", dict(H128, gptq=True), ("fp",)),
        ("GPTQ + MSE scales", "sixbit", GPTQ_MSE, ("fp",)),
    ]
    rows += [(f"low-rank branch r={r} (RTN residual)", "sixbit", dict(H128, lowrank_rank=r), ("fp",)) for r in (16, 32, 64)]
    rows += [
        ("MSE scales + branch ≤ 0.5 bit", "sixbit", dict(H128, scale_rule="mse", lowrank_bits=0.5), ("fp",)),
        ("GPTQ + MSE + branch ≤ 0.5 bit", "sixbit", dict(GPTQ_MSE, lowrank_bits=0.5), ("fp",)),
        ("**default** (GPTQ + MSE + branch ≤ 0.5 bit, modulation NVFP4 weight-only)", "sixbit", RECIPE, ("fp", "int8", "nvfp4")),
        ("default, modulation INT4 g64", "sixbit", dict(RECIPE, role_formats={"modulation": "int4-g64"}), ("fp",)),
        ("default, modulation INT8", "sixbit", dict(RECIPE, role_formats={"modulation": "int8"}), ("fp",)),
        ("default + embeddings and output NVFP4", "sixbit",
         dict(RECIPE, role_formats={"modulation": "nvfp4", "embedding": "nvfp4", "output": "nvfp4"}), ("fp",)),
    ]
    only = {"attention": {"feedforward": None}, "feed-forward": {"attention": None},
            "modulation": {"attention": None, "feedforward": None, "modulation": "nvfp4"}}
    for role, formats_ in only.items():  # per-layer-type ablation: only that type quantized
        rows.append((f"ablation: {role} only, RTN", "sixbit", dict(RTN, role_formats=formats_), ("fp",)))
        rows.append((f"ablation: {role} only, default", "sixbit",
                     dict(RECIPE, role_formats={**RECIPE["role_formats"], **formats_}), ("fp",)))
    rows += [
        ("optimum-quanto qint4 (weights)", "quanto", {}, ("fp",)),
        ("torchao int4 weight-only (g64)", "torchao", {}, ("fp",)),
        ("SDNQ int4", "sdnq", dict(weights_dtype="int4"), ("fp",)),
        ("SDNQ int4 + Hadamard + SVD r=32", "sdnq", dict(weights_dtype="int4", use_hadamard=True, use_svd=True), ("fp",)),
        ("SDNQ fp4 (e2m1)", "sdnq", dict(weights_dtype="fp4"), ("fp",)),
        ("SDNQ fp4 + SVD r=32", "sdnq", dict(weights_dtype="fp4", use_svd=True), ("fp",)),
    ]
    return rows


class _PeakRSS:
    """Largest RSS growth above the start while the ``with`` block runs (polled every 10 ms)."""

    def __enter__(self):
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def mib(self) -> float:
        return (self.peak - self.start) / 2**20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor, unwrapping tensor subclasses (quanto, torchao) into their inner tensors."""
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(_nbytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def transformer_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += _nbytes(t.data if isinstance(t, torch.nn.Parameter) else t)
    return total


def weight_bits(model) -> float:
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if not layers:
        return float("nan")
    return 8 * sum(m.weight_nbytes() for m in layers) / sum(m.in_features * m.out_features for m in layers)


def _apply_peer(kind: str, spec: dict, pipe) -> str:
    t = pipe.transformer
    if kind == "quanto":
        from optimum import quanto

        quanto.quantize(t, weights=quanto.qint4)
        quanto.freeze(t)
        return "qint4"
    if kind == "torchao":
        from torchao.quantization import IntxWeightOnlyConfig, quantize_
        from torchao.quantization.granularity import PerGroup

        # Int4WeightOnlyConfig needs a CUDA kernel library (mslk); on CPU torchao's int4 weight-only
        # path is IntxWeightOnlyConfig, which keeps the int4 codes unpacked in int8
        quantize_(t, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(64)))
        return "IntxWeightOnlyConfig(int4, group 64): codes stored unpacked, one per int8"
    from sdnq import sdnq_post_load_quant

    sdnq_post_load_quant(t, minimum_allowed_numel=1, minimum_allowed_channel_size=16, dequantize_fp32=True, **spec)
    return ", ".join(f"{k}={v}" for k, v in spec.items())


def _measure(pipe, pairs, steps, ref) -> dict:
    t0 = time.perf_counter()
    videos, prompts = generate_heldout(pipe, pairs, steps, GUIDANCE)
    return {
        "psnr": float(np.mean([psnr(v, r) for v, r in zip(videos, ref)])),
        "ssim": float(np.mean([ssim(v, r) for v, r in zip(videos, ref)])),
        "adherence": adherence(videos, prompts).accuracy["all"],
        "s_per_video": (time.perf_counter() - t0) / len(pairs),
    }


def _set_act(model, mode: str) -> None:
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.act_mode = mode  # the layers' own setting; weight-only layers ignore it


def run_arch(arch: str, pairs, calib_pairs, steps: int, log) -> dict:
    fp = load_pipeline(arch)
    fp_bytes = transformer_bytes(fp.transformer)
    ref, _ = generate_heldout(fp, pairs, steps, GUIDANCE)
    fp_row = _measure(fp, pairs, steps, ref) | {"bits": 32.0, "bytes": fp_bytes, "quantize_s": 0.0, "peak_mib": 0.0}
    out = {"fp_bytes": fp_bytes, "rows": [("full precision (fp32)", "fp", fp_row)]}
    for label, kind, spec, acts in _rows():
        pipe = load_pipeline(arch)
        calls = []

        def calibration():
            calls.append(1)
            return generate_heldout(pipe, calib_pairs, steps, GUIDANCE)

        try:
            with _PeakRSS() as peak:
                t0 = time.perf_counter()
                if kind == "sixbit":
                    sixbit.quantize(pipe.transformer, sixbit.QuantConfig(**spec), calibration=calibration, progress=False)
                    note = f"{len(calls)} calibration runs" if calls else ""
                else:
                    note = _apply_peer(kind, spec, pipe)
                seconds = time.perf_counter() - t0
        except Exception as e:  # a peer that cannot run here is reported, not hidden
            out["rows"].append((label, "failed", {"error": f"{type(e).__name__}: {str(e)[:120]}"}))
            log(f"[{arch}] {label}: FAILED {e}")
            continue
        base = {"kind": kind, "bits": weight_bits(pipe.transformer) if kind == "sixbit" else float("nan"),
                "bytes": transformer_bytes(pipe.transformer), "quantize_s": seconds, "peak_mib": peak.mib, "note": note}
        for act in acts:
            if kind == "sixbit":
                _set_act(pipe.transformer, act)
            row = _measure(pipe, pairs, steps, ref) | base
            name = label if act == "fp" else f"{label} · {'W4A8 (INT8 act.)' if act == 'int8' else 'W4A4 (NVFP4 act., emulated)'}"
            out["rows"].append((name, act, row))
            log(f"[{arch}] {name}: {row}")
    out["layers"] = per_layer(arch, calib_pairs, steps)
    return out


def per_layer(arch: str, calib_pairs, steps: int) -> list[dict]:
    """Output SQNR per linear on its calibration inputs: RTN, GPTQ + MSE, the branch; predictors."""
    pipe = load_pipeline(arch)
    spec = sixbit.models.spec_for(pipe.transformer)
    layers = {n: m for n, m in pipe.transformer.named_modules()
              if isinstance(m, torch.nn.Linear) and spec.role_of(n).value in ("attention", "feedforward", "modulation")}
    stats = hessians.collect(pipe.transformer, lambda: generate_heldout(pipe, calib_pairs, steps, GUIDANCE), layers)
    cfg = sixbit.QuantConfig(lowrank_bits=0.5)
    rows = []
    for name, lin in layers.items():
        hb = 128 if lin.in_features % 128 == 0 else None
        w = QuantLinear.stored_weight(lin, hb)
        h = stats[name].hessian
        if hb:
            h = hadamard.rotate(hadamard.rotate(h, hb).T.contiguous(), hb)
        rank = cfg.lowrank_rank_for(lin.in_features, lin.out_features) or 1

        def sqnr(q, branch=None):
            d = q.dequantize() - w
            if branch is not None:
                d = d + branch[0].float() @ branch[1].float()
            err = float(torch.einsum("nk,kl,nl->", d, h, d))
            return 10 * math.log10(float(torch.einsum("nk,kl,nl->", w, h, w)) / max(err, 1e-30))

        rtn = sqnr(*quantize_weight(w, "nvfp4"))
        gptq = sqnr(*quantize_weight(w, "nvfp4", "mse", h, use_gptq=True))
        branch = sqnr(*quantize_weight(w, "nvfp4", rank=rank))
        rms = h.diagonal().clamp_min(0).sqrt()
        rows.append({
            "layer": name, "role": spec.role_of(name).value, "shape": f"{lin.in_features}→{lin.out_features}",
            "rtn_db": rtn, "gptq_mse_db": gptq, "branch_db": branch, "rank": rank,
            "branch_bits": 16 * rank * (lin.in_features + lin.out_features) / (lin.in_features * lin.out_features),
            "spread": float(rms.max() / rms.median().clamp_min(1e-12)),
            "energy": lowrank.energy(w, rank),
        })
    return rows


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else float("nan")


def section(results: dict, args) -> str:
    lines = [
        "## 4-bit weights: scale search, GPTQ, low-rank branch (issue 16)",
        "",
        f"Written by `python benchmarks/bench_weights.py --pairs {args.pairs} --calib {args.calib} --steps {args.steps}`. "
        f"Machine: {machine_description()}. {args.pairs} held-out (prompt, seed) pairs per model, {args.steps} steps, "
        f"CFG {GUIDANCE:g}; PSNR/SSIM against the same pipeline's FP videos; adherence = share of videos whose color, "
        f"shape and direction the judge reads right. GPTQ calibrates on {args.calib} other prompts (unseen seeds), one "
        "run per transformer block. Rows are W4A16 unless marked; NVFP4 activations are **emulated**. *weight bits*: per "
        "weight over the quantized linears, scales and branch included (— for peers: their packing is not ours to "
        "count per layer); *MiB*: every parameter and buffer of the transformer; *peak MiB*: RSS growth while "
        "quantizing. All sixbit rows use NVFP4 with Hadamard 128 on attention and feed-forward unless named.",
    ]
    checks = []
    for model, res in results.items():
        rows = res["rows"]
        lines += ["", f"### {model}", "",
                  "| method | weight bits | transformer MiB | % of fp32 | PSNR dB | SSIM | adherence | quantize s | peak MiB | notes |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for name, act, r in rows:
            if act == "failed":
                lines.append(f"| {name} | — | — | — | — | — | — | — | — | could not run here: {r['error']} |")
                continue
            bits = "—" if math.isnan(r["bits"]) else f"{r['bits']:.2f}"
            lines.append(
                f"| {name} | {bits} | {r['bytes'] / 2**20:.2f} | {100 * r['bytes'] / res['fp_bytes']:.1f}% | "
                f"{r['psnr']:.2f} | {r['ssim']:.4f} | {100 * r['adherence']:.1f}% | {r['quantize_s']:.0f} | "
                f"{r['peak_mib']:.0f} | {r.get('note', '')} |")
        by = {name: r for name, act, r in rows if act != "failed"}
        default = next(r for n, r in by.items() if n.startswith("**default**") and "·" not in n)
        d8 = next(r for n, r in by.items() if n.startswith("**default**") and "W4A8" in n)
        r8 = by["round to nearest (RTN) · W4A8 (INT8 act.)"]
        peers = {n: r for n, act, r in rows if act != "failed" and r.get("kind") in ("quanto", "torchao", "sdnq")}
        cheaper = {n: r for n, r in peers.items() if r["bytes"] <= d8["bytes"]}
        beats = all(d8["psnr"] > r["psnr"] for r in cheaper.values())
        listed = ", ".join(f"{n} {r['psnr']:.2f} dB ({r['bytes'] / 2**20:.2f} MiB)" for n, r in cheaper.items())
        checks.append(
            f"- {model}: default `w4a8` {d8['psnr']:.2f} dB vs NVFP4 RTN `w4a8` {r8['psnr']:.2f} dB: "
            f"**{d8['psnr'] - r8['psnr']:+.2f} dB** (needs ≥ +2) at **{d8['bits']:.2f}** weight bits (needs ≤ 5.0); "
            f"transformer {d8['bytes'] / 2**20:.2f} MiB = **{100 * d8['bytes'] / res['fp_bytes']:.1f}%** of fp32; "
            f"peers at ≤ its bytes: {listed or 'none'}"
            f" → {'above all' if beats else '**not above all**'}.")
        rtn16 = by["round to nearest (RTN)"]
        for rank_label in ("MSE scales + branch ≤ 0.5 bit",):
            with_b, without = by[rank_label], by["scale search: MSE"]
            gain = (with_b["psnr"] - without["psnr"]) / max(with_b["bits"] - without["bits"], 1e-9)
            checks.append(f"- {model}: the ≤ 0.5-bit branch on MSE scales adds {with_b['psnr'] - without['psnr']:+.2f} dB "
                          f"for {with_b['bits'] - without['bits']:.2f} bits: **{gain:+.2f} dB per bit** at width 192; "
                          f"W4A16 default vs RTN: {default['psnr'] - rtn16['psnr']:+.2f} dB.")
        layers = res["layers"]
        lines += ["", f"Per layer type, output SQNR on the calibration inputs (NVFP4, Hadamard 128 where it fits; "
                  f"mean over layers; full table in `benchmarks/results/weights_layers_{model}.csv`):", "",
                  "| type | layers | RTN dB | GPTQ+MSE dB | gain | branch dB (rank) | gain | channel spread | top-r energy |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for role in ("attention", "feedforward", "modulation"):
            rs = [r for r in layers if r["role"] == role]
            if not rs:
                continue
            m = lambda k: statistics.mean(r[k] for r in rs)  # noqa: E731
            lines.append(f"| {role} | {len(rs)} | {m('rtn_db'):.2f} | {m('gptq_mse_db'):.2f} | {m('gptq_mse_db') - m('rtn_db'):+.2f} | "
                         f"{m('branch_db'):.2f} ({'/'.join(sorted({str(r['rank']) for r in rs}))}) | {m('branch_db') - m('rtn_db'):+.2f} | "
                         f"{m('spread'):.1f} | {m('energy'):.3f} |")
        gg = [r["gptq_mse_db"] - r["rtn_db"] for r in layers]
        bg = [r["branch_db"] - r["rtn_db"] for r in layers]
        lines += ["", f"Predictors over the {len(layers)} layers (Spearman ρ): GPTQ gain vs channel spread "
                  f"{_spearman([r['spread'] for r in layers], gg):+.2f}; branch gain vs top-r energy "
                  f"{_spearman([r['energy'] for r in layers], bg):+.2f}."]
        path = ROOT / "benchmarks" / "results" / f"weights_layers_{model}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(layers[0]))
            writer.writeheader()
            writer.writerows(layers)
    cfg = sixbit.QuantConfig(lowrank_bits=0.5)
    lines += ["", "Checks (issue 16's done-when):", "", *checks,
              f"- Width: the ≤ 0.5-bit branch is rank {cfg.lowrank_rank_for(192, 192)} on a 192×192 layer "
              f"({16 * 2 * 192 / 192**2:.3f} bits per rank) and rank {cfg.lowrank_rank_for(1920, 1920)} at CogVideoX-2B's "
              f"1920 ({16 * 2 * 1920 / 1920**2:.4f} bits per rank). Its gain per bit at 1920 is not measured: no trained "
              "1920-wide weights exist offline here, and random weights have no low-rank structure to find."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="cogvideox,wan")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--calib", type=int, default=4, help="calibration generations (prompts with unseen seeds)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="2 pairs, 1 calibration prompt, 4 steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="write the section from --json files of earlier runs (e.g. one per model, run side by side)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.calib, args.steps = 2, 1, 4
    torch.set_num_threads(args.threads)
    prompts = all_prompts()
    calib_pairs = [(prompts[(7 * i + 3) % len(prompts)], 20_000 + i) for i in range(args.calib)]
    pairs = heldout_pairs(args.pairs)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    if args.merge:
        results = {k: v for path in args.merge for k, v in json.loads(Path(path).read_text()).items()}
        update_section(args.output, "weights", section(results, args))
        print(f"wrote {args.output}")
        return 0
    results = {f"shapes-{arch}": run_arch(arch, pairs, calib_pairs, args.steps, log) for arch in args.archs.split(",")}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    update_section(args.output, "weights", section(results, args))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
