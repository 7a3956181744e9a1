"""Write a :class:`~sixbit.bench.harness.BenchResult`: markdown, CSV, JSON, PNG plots, HTML videos.

``write_all(result, folder)`` writes::

    results.md  results.csv  results.json
    speedup_vs_psnr.png              measured CPU speedup and PROJECTED GPU speedup vs PSNR
    precision_<method>.png           step × block activation precision (methods with quantized linears)
    skips_<method>.png               step × block skipped calls (methods that skipped any)
    index.html + videos/             the videos of every method side by side

Every projected number is labelled PROJECTION; emulated low-bit arithmetic is labelled EMULATED.
"""

from __future__ import annotations

import csv
import html
import json
import math
from pathlib import Path

from . import gpu_model

_PRECISION_COLORS = {"nvfp4": "#2b83ba", "int8": "#fdae61", "fp": "#d7191c", "skip": "#1a9641"}


def _fmt(value, spec: str, none: str = "—") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return none
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return format(value, spec)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _scale_name(result) -> str | None:
    names = [k for k in next((r["projection"] for r in result.rows if "projection" in r), {}) if k != "as run"]
    return names[0] if names else None


def baseline_label(baseline: str) -> str:
    """The dtype a harness baseline method runs in: ``"bf16"`` or ``"fp32"``."""
    return "fp32" if baseline == "fp" else baseline


def markdown(result, plot_prefix: str = "", heading: str = "###") -> str:
    """The result as markdown: settings, the measured table, the PROJECTION table, the plots."""
    from .harness import speed_baseline

    s = result.settings
    ok = [r for r in result.rows if r["status"] == "ok"]
    fp = next(r for r in ok if r["method"] == "fp")
    base = baseline_label(s.baseline)
    columns = f"× {base} | × fp32" if base != "fp32" else "× fp32"
    lines = [
        f"{heading} {s.model}: every method through one pipeline",
        "",
        f"Machine: {result.machine}. {s.prompts} held-out (prompt, seed) pairs, {s.steps} steps, CFG {s.guidance:g}, "
        f"the same seeds for every method; methods that calibrate use {s.calibration_prompts} other prompts with their "
        f"own seeds. *s/video*: median of {s.runs} timed generations after a warm-up ({'the references, fp and bf16,' if base != 'fp32' else 'FP'} "
        "timed before and after the others; the median over both), divided by the prompts; "
        f"**× {base}**: speedup on this CPU against the shipped model in {base}, "
        + ("the fastest full-precision dtype here (what a user who wants speed runs), " if s.baseline == speed_baseline()
           else f"chosen with `--baseline` (the fastest full-precision dtype here is {baseline_label(speed_baseline())}), ")
        + f"= median of the four `{s.baseline}` generations timed nearest the method's runs (two before, two after) "
        "÷ the method's median (the machine is shared and its load drifts; rows doing the same work as the baseline "
        "show the remaining noise)" + ("; *× fp32*: the same against the fp32 model" if base != "fp32" else "")
        + ". *weights*: every transformer parameter "
        "and buffer as stored; *peak*: weights + resident memory added during a generation. *act bits*: GEMM-FLOP-"
        "weighted activation bits over all linears (16 for full precision, NVFP4 4.5). *skipped*: share of block "
        "calls in which no linear ran. PSNR/SSIM vs the FP videos; adherence: all of color, shape and direction "
        f"right per the shapes judge (clean renders of these prompts: {_fmt(100 * result.judge_check, '.0f')}%). "
        f"Methods marked EMULATED run NVFP4 activations by dequantizing on this CPU: their time is not FP4 speed.",
        "",
        f"| method | s/video | {columns} | weights MiB | peak MiB | act bits | skipped | PSNR dB | SSIM | flicker | "
        "adherence | notes |",
        "|---|---:|---:|" + ("---:|" if base != "fp32" else "") + "---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result.rows:
        if r["status"] != "ok":
            dashes = " — |" * (11 if base != "fp32" else 10)
            lines.append(f"| {r['method']} |{dashes} **{r['status']}**: {r['note']} |")
            continue
        tag = " (EMULATED)" if r["emulated"] else ""
        note = r["note"] + (" — output identical to FP: nothing was skipped or rounded"
                            if r["method"] != "fp" and r["psnr"] == float("inf") else "")
        lines.append(
            f"| {r['method']}{tag} | {r['s_per_video']:.3f} | {r['speedup']:.2f}× | "
            + (f"{r['speedup_fp32']:.2f}× | " if base != "fp32" else "")
            + f"{r['weight_bytes'] / 2**20:.2f} | "
            f"{_fmt(None if r['peak_bytes'] is None else r['peak_bytes'] / 2**20, '.1f')} | {r['act_bits']:.2f} | "
            f"{100 * r['skip_share']:.0f}% | {_fmt(r['psnr'], '.2f')} | {r['ssim']:.4f} | {r['flicker']:.4f} | "
            f"{100 * r['adherence']:.0f}% | {note} |"
        )
    lines += _projection_lines(result, ok, fp)
    lines += ["", f"![speedup vs PSNR]({plot_prefix}speedup_vs_psnr.png)"]
    maps = [f"![{kind} {m}]({plot_prefix}{kind}_{_safe(m)}.png)" for m, kind in _map_plots(result)]
    if maps:
        lines += ["", " ".join(maps)]
    return "\n".join(lines)


def _projection_lines(result, ok: list[dict], fp: dict) -> list[str]:
    """The PROJECTION table: each run's work at each GPU's peak throughput per precision."""
    scale = _scale_name(result)
    gpus = list(gpu_model.GPUS)
    lines = [
        "",
        f"**{gpu_model.LABEL}.** Projected speedup over the full-precision model run in BF16 on the GPU, from the "
        "work each run counted: GEMM FLOPs per activation "
        "precision, attention FLOPs (always BF16) and skipped blocks, at each GPU's peak throughput per precision "
        "(`sixbit.bench.gpu_model`: Blackwell FP4 4×, INT8 2× BF16; Hopper INT8 2×, no FP4). *as run*: this tiny "
        "model's own FLOPs; "
        + (f"*{scale} scale*: the run's precision and skip mix applied to {scale}'s GEMM and attention FLOPs at 49 frames "
           f"(attention {100 * _attention_share(scale):.0f}% of its FP FLOPs). " if scale else "")
        + "Memory traffic, quantization overheads and non-GEMM work are left out.",
        "",
        "| method | GEMM FLOPs by precision | attention vs FP | "
        + " | ".join(f"PROJECTED {g} as run" for g in gpus)
        + ("".join(f" | PROJECTED {g} at {scale}" for g in gpus) if scale else "") + " |",
        "|---|---|---:|" + "---:|" * (len(gpus) * (2 if scale else 1)),
    ]
    fp_gemm = sum(fp["work"]["gemm_flops"].values())
    for r in ok:
        w = r["work"]
        mix = ", ".join(f"{p} {100 * f / fp_gemm:.0f}%" for p, f in sorted(w["gemm_flops"].items()) if f)
        attn = w["attention_flops"] / fp["work"]["attention_flops"] if fp["work"]["attention_flops"] else float("nan")
        cells = [f"{r['projection']['as run'][g]:.2f}×" for g in gpus]
        if scale:
            cells += [f"{r['projection'][scale][g]:.2f}×" for g in gpus]
        lines.append(f"| {r['method']} | {mix or '—'} | {100 * attn:.0f}% | " + " | ".join(cells) + " |")
    return lines


def _attention_share(scale: str) -> float:
    from .layer_shapes import model_flops

    gemm, attention = model_flops(scale)
    return attention / (gemm + attention)


def _map_plots(result) -> list[tuple[str, str]]:
    """(method, "precision" | "skips") of every map worth drawing."""
    out = []
    for method, (steps, grid) in result.grids.items():
        cells = {c for row in grid for c in row}
        if cells - {"fp", "skip", ""}:
            out.append((method, "precision"))
        if "skip" in cells:
            out.append((method, "skips"))
    return out


def write_csv(result, path) -> Path:
    gpus = list(gpu_model.GPUS)
    scale = _scale_name(result)
    columns = ["method", "family", "status", "emulated", "s_per_video", "speedup", "speedup_fp32", "setup_s", "weight_bytes",
               "peak_bytes", "act_bits", "skip_share", "psnr", "ssim", "flicker", "adherence", "note"]
    proj = [f"projected_{g}_as_run" for g in gpus] + ([f"projected_{g}_{scale}" for g in gpus] if scale else [])
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns + ["gemm_flops_" + p for p in ("fp", "int8", "nvfp4")] + ["attention_flops"] + proj)
        for r in result.rows:
            work = r.get("work", {})
            gemm = work.get("gemm_flops", {})
            p = r.get("projection", {})
            writer.writerow(
                [r.get(c, "") for c in columns] + [gemm.get(k, 0.0) if work else "" for k in ("fp", "int8", "nvfp4")]
                + [work.get("attention_flops", "")]
                + [p["as run"][g] if p else "" for g in gpus] + ([p[scale][g] if p else "" for g in gpus] if scale else [])
            )
    return Path(path)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_tradeoff(result, path) -> Path:
    """Two panels: measured CPU speedup vs PSNR, and PROJECTED GPU speedup vs PSNR."""
    plt = _plt()
    ok = [r for r in result.rows if r["status"] == "ok"]
    finite = [r["psnr"] for r in ok if math.isfinite(r["psnr"])]
    top = (max(finite) if finite else 40.0) + 3
    scale = _scale_name(result) or "as run"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    base = baseline_label(result.settings.baseline)
    for ax, (label, key) in zip(axes, [(f"measured speedup on this CPU vs {base}", None),
                                       (f"PROJECTION: speedup on RTX 5090 vs BF16 ({scale})", scale)]):
        for r in ok:
            x = r["speedup"] if key is None else r["projection"][key]["RTX 5090"]
            y = r["psnr"] if math.isfinite(r["psnr"]) else top
            color = {"sixbit": "#d7191c", "reference": "black"}.get(r["family"], "#2b83ba")
            ax.scatter([x], [y], color=color, s=25)
            ax.annotate(r["method"], (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.axvline(1.0, color="gray", lw=0.8, ls=":")
        ax.set_xlabel(label)
        ax.set_title(("PROJECTION — " if key else "") + f"{result.settings.model}", fontsize=9)
    axes[0].set_ylabel(f"PSNR vs FP video (dB; identical to FP drawn at {top:.0f})")
    fig.text(0.01, 0.01, "red: sixbit · blue: peers · black: FP", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_map(steps, grid, path, title: str, kind: str) -> Path:
    """Step × block map: ``kind="precision"`` colors each call's precision (skips green),
    ``kind="skips"`` only computed (orange) vs skipped (green)."""
    from matplotlib.colors import ListedColormap

    plt = _plt()
    if kind == "precision":
        order = ["nvfp4", "int8", "fp", "skip"]
        legend = "blue NVFP4 · orange INT8 · red full precision · green skipped"
    else:
        order = ["run", "skip"]
        grid = [["skip" if c == "skip" else ("run" if c else "") for c in row] for row in grid]
        legend = "orange computed · green skipped"
    colors = [_PRECISION_COLORS[o] if o != "run" else "#fdae61" for o in order]
    values = [[order.index(c) if c in order else float("nan") for c in row] for row in grid]
    n_blocks = len(grid[0]) if grid else 0
    fig, ax = plt.subplots(figsize=(max(4.0, 1.5 + 0.35 * n_blocks), max(2.5, 1.2 + 0.22 * len(grid))))
    ax.imshow(values, cmap=ListedColormap(colors), vmin=0, vmax=len(order) - 1, aspect="auto")
    ax.set_yticks(range(len(steps)))
    ax.set_yticklabels(steps, fontsize=6)
    ax.set_xticks(range(n_blocks))
    ax.set_xlabel("block")
    ax.set_ylabel("denoising step")
    ax.set_title(f"{title}\n{legend}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_html(result, folder: Path) -> Path:
    """index.html: the metrics and, per prompt, every method's video side by side."""
    from ..eval.media import write_video

    folder = Path(folder)
    cells = {}
    for method, videos in result.videos.items():
        for i, video in enumerate(videos):
            written = write_video(video, folder / "videos" / f"{_safe(method)}_{i}.mp4", scale=4)
            cells[(method, i)] = written.relative_to(folder).as_posix()
    methods = list(result.videos)
    rows_by = {r["method"]: r for r in result.rows}
    base = baseline_label(result.settings.baseline)

    def media(src: str) -> str:
        if src.endswith(".mp4"):
            return f'<video src="{src}" autoplay loop muted playsinline width="128"></video>'
        return f'<img src="{src}" width="128">'

    head = "".join(
        f"<th>{html.escape(m)}<br><small>PSNR {_fmt(rows_by[m].get('psnr'), '.1f')} · "
        f"{_fmt(rows_by[m].get('speedup'), '.2f')}× {base}</small></th>" for m in methods
    )
    body = []
    for i, prompt in enumerate(result.prompts[: result.settings.video_prompts]):
        tds = "".join(f"<td>{media(cells[(m, i)])}</td>" for m in methods if (m, i) in cells)
        body.append(f"<tr><th>{html.escape(prompt)}</th>{tds}</tr>")
    failed = "".join(
        f"<li><b>{html.escape(r['method'])}</b>: {html.escape(r['status'])} — {html.escape(r['note'])}</li>"
        for r in result.rows if r["status"] != "ok"
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>sixbit bench: {html.escape(result.settings.model)}</title>
<style>body{{font-family:sans-serif}} td,th{{padding:4px;text-align:center;vertical-align:top}}</style></head>
<body><h1>sixbit bench: {html.escape(result.settings.model)}</h1>
<p>{html.escape(result.machine)}; {result.settings.steps} steps, CFG {result.settings.guidance:g}; speedup measured
on this machine against the model in {base}; PSNR vs the FP video of the same seed. Full tables: <a href="results.md">results.md</a>,
<a href="results.csv">results.csv</a>, <a href="results.json">results.json</a>.</p>
<table><tr><th>prompt</th>{head}</tr>{''.join(body)}</table>
{f'<h2>Not run</h2><ul>{failed}</ul>' if failed else ''}
<p><img src="speedup_vs_psnr.png"></p>
</body></html>
"""
    path = folder / "index.html"
    path.write_text(page)
    return path


def write_all(result, folder) -> dict[str, Path]:
    """Write every output into ``folder`` (created); returns name → path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {
        "markdown": folder / "results.md",
        "csv": write_csv(result, folder / "results.csv"),
        "json": folder / "results.json",
        "tradeoff": plot_tradeoff(result, folder / "speedup_vs_psnr.png"),
    }
    out["markdown"].write_text(markdown(result) + "\n")
    out["json"].write_text(json.dumps(result.to_json(), indent=1, default=float) + "\n")
    for method, kind in _map_plots(result):
        steps, grid = result.grids[method]
        label = "activation precision" if kind == "precision" else "skipped block calls"
        out[f"{kind}:{method}"] = plot_map(steps, grid, folder / f"{kind}_{_safe(method)}.png",
                                           f"{result.settings.model} · {method}: {label}", kind)
    out["html"] = write_html(result, folder)
    return out


def layer_markdown(rows: list[dict], machine: str, heading: str = "##") -> str:
    """The real-shape linear timings (:func:`sixbit.bench.layer_shapes.time_layers`) and each real
    model's FLOP split with the PROJECTED attention share of FP time per GPU."""
    from .layer_shapes import REAL_MODELS, model_flops

    measured = rows[0]["measured_rows"] if rows else []
    base = rows[0]["baseline"] if rows else "fp32"
    lines = [
        f"{heading} Real layer shapes at 49 frames: CogVideoX-2B/5B, Wan2.1-14B",
        "",
        f"Machine: {machine}. Random weights (the shape is what matters). Each (K, N, precision) timed at "
        f"{' and '.join(str(m) for m in measured)} rows (median of 3 after a warm-up), fitted as fixed + per-row cost "
        "and evaluated at the rows of one real call (*ms/call*; a real call is too slow to time directly here). "
        f"*× {base}*: speedup against the same shape in {base}, the fastest full-precision dtype on this CPU "
        "(`sixbit.kernels.fastest_float_dtype`); *× fp32* against fp32. EMULATED rows do not run FP4 arithmetic (no "
        "FP4 GEMM on this device; their time is per-call weight dequantization) and are timed on CogVideoX-2B's "
        "shapes only.",
        "",
        f"| model | linear | K → N | rows/call | precision | how it runs | ms/call | × {base} | × fp32 |",
        "|---|---|---|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['role']} | {r['k']} → {r['n']} | {r['tokens']:,} | {r['precision']} | {r['how']} | "
            f"{r['ms_per_call']:,.1f} | {r['speedup']:.2f}× | {r['speedup_fp32']:.2f}× |"
        )
    gpus = list(gpu_model.GPUS)
    lines += [
        "",
        f"FLOPs of one generation (50 steps, CFG: 2 samples per step) and the **{gpu_model.LABEL}** share of FP time "
        "spent in attention (BF16 everywhere; the paper: \"attention is over half of run time\").",
        "",
        "| model | blocks | video + text tokens | GEMM TFLOPs | attention TFLOPs | " + " | ".join(f"PROJECTED attention share {g}" for g in gpus) + " |",
        "|---|---:|---|---:|---:|" + "---:|" * len(gpus),
    ]
    for name, m in REAL_MODELS.items():
        gemm, attention = model_flops(name)
        shares = " | ".join(f"{100 * gpu_model.attention_share(gemm, attention, gpu_model.GPUS[g]):.0f}%" for g in gpus)
        lines.append(f"| {name} | {m.layers} | {m.video_tokens:,} + {m.text_tokens} | {gemm / 1e12:,.0f} | "
                     f"{attention / 1e12:,.0f} | {shares} |")
    return "\n".join(lines)
