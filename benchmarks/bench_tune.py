"""Per-layer formats tuned to a target (``sixbit.tune``) on the shipped models → BENCHMARKS.md
(section ``tune``) and ``benchmarks/plots/tune_pareto.png``.

    python benchmarks/bench_tune.py --arch cogvideox --json /tmp/tune-cogvideox.json   # one model
    python benchmarks/bench_tune.py --arch wan --json /tmp/tune-wan.json
    python benchmarks/bench_tune.py --merge /tmp/tune-cogvideox.json /tmp/tune-wan.json  # the section
    python benchmarks/bench_tune.py --arch cogvideox --quick --json /tmp/q.json        # checks the script

Per model: stage 1 once (``sixbit.tuning.Tuner`` on calibration pairs with seeds 20 000+), then
the greedy assignment and the genetic search at two bit budgets — the bits of uniform NVFP4 (the
4-bit recipe) and of uniform INT6, so that each search has a uniform assignment at its bits to
beat — and at ``min_psnr``. Every row is then **converted for real** (``sixbit.convert_model``
with the config's ``layer_formats``) on a fresh pipeline: the uniform ones as the ``w4a8`` preset
converts (GPTQ on the quantized blocks' outputs: what users would otherwise run), the greedy and
genetic ones as the tuner picked (its ``calibration_inputs``: the full-precision model's, as the
search's candidates were built, or the quantized blocks', whichever calibrated better) — and
scored on held-out (prompt, seed) pairs never used in tuning: PSNR against the full-precision
videos of the same pairs (and, with the same
conversion, on the calibration pairs: *calib converted*), with each video's PSNR kept (the
held-out standard error, paired differences); each row's ``layer_formats`` is stored, so rows
can be re-scored without searching again. *bits*: average stored bits
per tuned weight (attention and feed-forward linears; scales and low-rank branch included; full
precision counted at 16). Activations: per-token INT8 (the ``w4a8`` base), a real integer GEMM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
from sixbit.nn import QuantLinear
from sixbit.presets import resolve
from sixbit.tuning import DEFAULT_FORMATS, Tuner
from sixbit.calibration.quality import psnr_bound, psnr_of
from sixbit.zoo.shapes import heldout_pairs, load_pipeline

ROOT = Path(__file__).resolve().parents[1]
GUIDANCE = 4.0
FORMATS = DEFAULT_FORMATS


def _bits(model, names) -> float:
    """Average stored bits per weight over ``names`` of a converted model (full precision: 16)."""
    total = numel = 0
    for name in names:
        m = model.get_submodule(name)
        n = m.in_features * m.out_features
        total += 8 * m.weight_nbytes() if isinstance(m, QuantLinear) else 16 * n
        numel += n
    return total / numel


def heldout(arch: str, config, names, pairs, calib, steps: int, ref, evaluator) -> dict:
    """Convert a fresh pipeline with ``config`` and score it on the held-out pairs (``names``: the
    tuned layers, for the bits) and on the calibration pairs (``evaluator``: the tuner's, whose
    reference videos are the full-precision calibration ones); per-video PSNRs kept."""
    pipe = load_pipeline(arch)
    t0 = time.perf_counter()
    sixbit.convert_model(pipe, lambda: generate_heldout(pipe, calib, steps, GUIDANCE)[0], config)
    seconds = time.perf_counter() - t0
    videos, _ = generate_heldout(pipe, pairs, steps, GUIDANCE)
    per_video = [float(psnr(v, r)) for v, r in zip(videos, ref)]
    calib_error = evaluator.error(generate_heldout(pipe, calib, steps, GUIDANCE)[0])
    return {"bits": _bits(pipe.transformer, names), "psnr": float(np.mean(per_video)), "psnr_videos": per_video,
            "calib_real_psnr": psnr_of(calib_error), "calib_real_psnr_bound": psnr_bound(calib_error),
            "calib_real_psnr_videos": [float(-10 * np.log10(max(m, 1e-10))) for m in calib_error.tolist()], "convert_s": seconds}


def _se(values) -> float:
    """Standard error of the mean (sample SD / √n; 0 for one value)."""
    values = np.asarray(values, dtype=float)
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def _seconds(row: dict) -> str:
    """A searched row's search and pick times (``search + pick``), else nothing."""
    return f"{row['search_s']:.0f} + {row['pick_s']:.0f}" if "search_s" in row else ""


def _config(layer_formats: dict, description: str, calibration_inputs: str = "quantized"):
    """The ``w4a8`` base with ``layer_formats`` (``calibration_inputs``: as the preset, or as a tuned config)."""
    base = resolve("w4a8")
    weights = dataclasses.replace(base.weights, layer_formats=dict(layer_formats), calibration_inputs=calibration_inputs)
    return dataclasses.replace(base, weights=weights, description=description)


def run_arch(arch: str, args) -> dict:
    torch.manual_seed(0)
    log(f"[{arch}] torch threads: {torch.get_num_threads()}; {args.pairs} held-out pairs, {args.calib} calibration pairs")
    pairs, calib = heldout_pairs(args.pairs), calibration_pairs(args.calib)
    pipe = load_pipeline(arch)
    ref, _ = generate_heldout(pipe, pairs, args.steps, GUIDANCE)
    t0 = time.perf_counter()
    tuner = Tuner(pipe, lambda: generate_heldout(pipe, calib, args.steps, GUIDANCE)[0], base="w4a8",
                  formats=FORMATS, progress=False)
    stage1 = time.perf_counter() - t0
    log(f"[{arch}] stage 1: {stage1:.0f} s, Spearman {tuner.sensitivity.spearman:+.2f}")
    budgets = [round(tuner.uniform[f]["bits"], 4) for f in ("nvfp4", "int6")]
    searches = {f"≤ {b:.2f} bits": dict(max_bits=b) for b in budgets}
    searches[f"≥ {args.min_psnr:g} dB"] = dict(min_psnr=args.min_psnr)
    rows = []
    names = tuner.library.layers
    for label, u in tuner.uniform.items():
        if label == "16-bit":
            continue
        rows.append({"kind": "uniform", "target": label, "calib_bits": u["bits"], "calib_psnr": u["psnr"],
                     "calib_psnr_bound": u["psnr_bound"], "inputs": "quantized",
                     "config": _config(u["formats"], f"uniform {label}")})
    for label, target in searches.items():
        report = tuner.search(**target, seed=args.seed, population=args.population, generations=args.generations)
        log(f"[{arch}] {label}:\n{report.summary()}")
        rows.append({"kind": "greedy", "target": label, "calib_bits": report.greedy["bits"],
                     "calib_psnr": report.greedy["psnr"], "calib_psnr_bound": report.greedy["psnr_bound"],
                     "inputs": report.greedy["calibration_inputs"],
                     "config": _config(report.greedy["formats"], f"greedy {label}", report.greedy["calibration_inputs"])})
        rows.append({"kind": "genetic", "target": label, "calib_bits": report.best["bits"], "calib_psnr": report.best["psnr"],
                     "calib_psnr_bound": report.best["psnr_bound"], "inputs": report.best["calibration_inputs"],
                     "config": report.config, "search_s": report.search.seconds, "pick_s": report.seconds["pick"],
                     "evaluations": report.search.history[-1]["evaluations"], "history": report.search.history})
    for row in rows:
        config = row.pop("config")
        row["layer_formats"] = dict(config.weights.layer_formats)
        row.update(heldout(arch, config, [layer.name for layer in names], pairs, calib, args.steps, ref,
                           tuner.evaluator))
        log(f"[{arch}] {row['kind']} {row['target']}: calib {row['calib_psnr']:.2f} dB as tuned, "
            f"{row['calib_real_psnr']:.2f} dB converted (mean − 1 SE {row['calib_real_psnr_bound']:.2f}) @ "
            f"{row['calib_bits']:.2f} bits, held-out {row['psnr']:.2f} ± {_se(row['psnr_videos']):.2f} dB @ "
            f"{row['bits']:.2f} bits")
    sens = tuner.sensitivity
    layers = [{"name": layer.name, "role": layer.role,
               "formats": ["16-bit" if v.format is None else v.format for v in layer.variants],
               "bits": [v.bits for v in layer.variants],
               "psnr": [None if float(m.sum()) == 0 else float(-10 * np.log10(float(m.mean()))) for m in sens.mse[i]],
               "proxy": sens.proxy[i]} for i, layer in enumerate(names)]
    return {"arch": arch, "rows": rows, "stage1_s": stage1, "spearman": sens.spearman, "layers": layers,
            "settings": vars(args), "calibration_runs": tuner.evaluator.count, "machine": machine_description()}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _machines(results: list[dict]) -> str:
    """The machine line: one description, or each model's where their runs differ (e.g. threads)."""
    seen = {res.get("machine", machine_description()) for res in results}
    if len(seen) == 1:
        return seen.pop()
    return "; ".join(f"shapes-{res['arch']}: {res.get('machine', machine_description())}" for res in results)


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4))
    for ax, res in zip(np.atleast_1d(axes), results):
        for kind, style in (("uniform", "s"), ("greedy", "^"), ("genetic", "o")):
            pts = sorted((r["bits"], r["psnr"]) for r in res["rows"] if r["kind"] == kind)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style + ("-" if kind != "uniform" else ":"), label=kind)
        ax.set_xlabel("average weight bits (tuned layers)")
        ax.set_ylabel("held-out PSNR vs FP (dB)")
        ax.set_title(f"shapes-{res['arch']}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def section(results: list[dict]) -> str:
    s = results[0]["settings"]
    lines = [
        "## Tuned per-layer formats: sensitivity, greedy and genetic search (issue 19)",
        "",
        f"Written by `python benchmarks/bench_tune.py` (per model: `--arch A --pairs {s['pairs']} --calib {s['calib']} "
        f"--steps {s['steps']} --population {s['population']} --generations {s['generations']}`, then `--merge`). "
        f"Machine: {_machines(results)}; each model in its own process (wall times: other jobs may have shared the 2 CPUs). Candidates: {', '.join('16-bit' if f is None else f for f in FORMATS)} "
        "(the `w4a8` recipe: Hadamard 128, MSE scales, GPTQ, low-rank branch on the 3/4-bit ones; INT8 activations). "
        "*calib tuner*: PSNR on the tuning's own calibration pairs as the tuner measured it — uniform rows with the "
        "candidates (built once, GPTQ on the full-precision model's inputs), greedy and genetic rows as the tuner "
        "reports them (the better of the two *GPTQ inputs*: `full_precision`, measured exactly by the candidates, or "
        "`quantized`, `convert_model`'s default, converted for real); *calib conv.*: the same pairs with the row "
        "converted for real by `convert_model` on a fresh pipeline — uniform rows as the `w4a8` preset converts "
        "(GPTQ on the quantized blocks' outputs: what users would otherwise run), greedy and genetic rows as the "
        "tuned config says (*tuner − conv.* 0.00: the tuner measured the converted model); *held-out*: that "
        f"conversion scored on {s['pairs']} held-out pairs "
        "(*held-out SE*: the per-video PSNRs' SD / √n). A PSNR target is checked against "
        "the calibration videos' mean PSNR minus one standard error (`sixbit.calibration.quality.psnr_bound`: a margin "
        "for unseen prompts), budgets maximize the mean. Each row's "
        "`layer_formats` and per-video PSNRs are in `benchmarks/results/tune_shapes-*.json`. "
        "![pareto](benchmarks/plots/tune_pareto.png)",
    ]
    for res in results:
        lines += ["", f"### shapes-{res['arch']}", "",
                  f"Stage 1: {len(res['layers'])} layers × {len(FORMATS) - 1} formats in {res['stage1_s']:.0f} s; "
                  f"proxy (output error energy on the calibration inputs) vs measured video error: Spearman "
                  f"**{res['spearman']:+.2f}**.", "",
                  ("| assignment | target | GPTQ inputs | bits | calib tuner dB | calib conv. dB | held-out dB "
                   "| held-out SE (SD) | tuner − conv. | conv. − held-out | search + pick s | runs |"),
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in res["rows"]:
            lines.append(f"| {r['kind']} | {r['target']} | {r.get('inputs', 'quantized')} | {r['bits']:.2f} | "
                         f"{r['calib_psnr']:.2f} | "
                         f"{r['calib_real_psnr']:.2f} | {r['psnr']:.2f} | {_se(r['psnr_videos']):.2f} "
                         f"(SD {np.std(r['psnr_videos'], ddof=1) if len(r['psnr_videos']) > 1 else 0:.2f}) | "
                         f"{r['calib_psnr'] - r['calib_real_psnr']:+.2f} | "
                         f"{r['calib_real_psnr'] - r['psnr']:+.2f} | "
                         f"{_seconds(r)} | "
                         f"{r.get('evaluations', '')} |")
        lines.append("")
        uniform = [r["calib_psnr"] - r["calib_real_psnr"] for r in res["rows"] if r["kind"] == "uniform"]
        tuned = [abs(r["calib_psnr"] - r["calib_real_psnr"]) for r in res["rows"] if r["kind"] != "uniform"]
        held = [r["calib_real_psnr"] - r["psnr"] for r in res["rows"]]
        lines.append(f"- Tuner − converted (calibration): uniform rows (candidates vs the preset's GPTQ on quantized "
                     f"inputs) from {min(uniform):+.2f} to {max(uniform):+.2f} dB; greedy and genetic rows at most "
                     f"{max(tuned):.3f} dB apart. Converted calibration − held-out: {np.mean(held):+.2f} dB on average "
                     f"(from {min(held):+.2f} to {max(held):+.2f}).")
        lines += checks(res)
    return "\n".join(lines) + "\n"


def checks(res: dict) -> list[str]:
    rows, out = res["rows"], []
    uniform = [r for r in rows if r["kind"] == "uniform"]
    for target in dict.fromkeys(r["target"] for r in rows if r["kind"] == "genetic"):
        gen = next(r for r in rows if r["kind"] == "genetic" and r["target"] == target)
        gre = next(r for r in rows if r["kind"] == "greedy" and r["target"] == target)
        near = [u for u in uniform if abs(u["bits"] - gen["bits"]) <= 0.1]
        best_u = max(near, key=lambda u: u["psnr"]) if near else None
        budget = not target.startswith("≥")  # the greedy/uniform checks are at equal bits: budgets only
        diff = np.subtract(gen["psnr_videos"], gre["psnr_videos"])  # the same held-out pairs: paired
        text = (f"- {target}: genetic {gen['psnr']:.2f} dB at {gen['bits']:.2f} bits vs greedy {gre['psnr']:.2f} dB at "
                f"{gre['bits']:.2f} bits: **{gen['psnr'] - gre['psnr']:+.2f} dB** (" + ("needs ≥ +0.5; " if budget else "")
                + f"per-video differences on the {len(diff)} held-out pairs: mean {diff.mean():+.2f}, paired SE "
                  f"{_se(diff):.2f} dB)")
        if budget:
            text += (f"; vs the best uniform within ±0.1 bits ({best_u['target']}, {best_u['psnr']:.2f} dB): "
                     f"**{gen['psnr'] - best_u['psnr']:+.2f} dB** (needs ≥ +3; paired SE "
                     f"{_se(np.subtract(gen['psnr_videos'], best_u['psnr_videos'])):.2f} dB)"
                     if best_u else "; no uniform assignment within ±0.1 bits")
        else:
            int8 = next((u for u in uniform if u["target"] == "int8"), None)
            text += (f"; calibration converted {gen['calib_real_psnr']:.2f} dB, mean − 1 SE "
                     f"**{gen['calib_real_psnr_bound']:.2f} dB**; held-out {gen['psnr']:.2f} ± {_se(gen['psnr_videos']):.2f} "
                     f"dB (SE)")
            text += (f"; held-out ≥ 34 dB: **{'yes' if gen['psnr'] >= 34 else 'no'}**, at fewer bits than uniform INT8 "
                     f"({int8['bits']:.2f}): **{'yes' if gen['bits'] < int8['bits'] else 'no'}**" if int8 else "")
        out.append(text + ".")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=["cogvideox", "wan"])
    parser.add_argument("--pairs", type=int, default=24, help="held-out (prompt, seed) pairs (24: every 2nd of the 48)")
    parser.add_argument("--calib", type=int, default=6, help="calibration (prompt, seed) pairs the tuning sees")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--population", type=int, default=10)
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--min-psnr", type=float, default=35.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 pairs, 1 calibration pair, 3 steps, tiny search")
    parser.add_argument("--json", help="write this model's results here")
    parser.add_argument("--merge", nargs="+", help="results files to write the BENCHMARKS.md section from")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.merge:
        results = [json.loads(Path(p).read_text()) for p in args.merge]
        plots = ROOT / "benchmarks" / "plots"
        plots.mkdir(parents=True, exist_ok=True)
        _plot(results, plots / "tune_pareto.png")
        for res, path in zip(results, args.merge):
            (ROOT / "benchmarks" / "results" / f"tune_shapes-{res['arch']}.json").write_text(Path(path).read_text())
        update_section(args.out, "tune", section(results))
        print(f"wrote section 'tune' of {args.out}")
        return 0
    if args.arch is None or args.json is None:
        parser.error("give --arch and --json (or --merge)")
    if args.quick:
        args.pairs, args.calib, args.steps, args.population, args.generations = 2, 1, 3, 4, 1
    result = run_arch(args.arch, args)
    Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
