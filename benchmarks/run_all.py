"""Regenerate BENCHMARKS.md from scratch with one command; every number in it is measured here.

    python benchmarks/run_all.py                  # both shipped models, < 30 min on 2 CPU cores
    python benchmarks/run_all.py --quick          # tiny settings: checks the pipeline end to end

Two lanes run side by side, one CPU thread each (the shipped models are too small for two
threads to help a single generation):

* lane 1: ``sixbit bench`` on shapes-cogvideox (every preset and peer, plus a threshold sweep
  of the caches), then ``bench_adherence.py`` (full-precision adherence on all 48 held-out
  pairs), the real layer shapes (CogVideoX-2B/5B, Wan2.1-14B at 49 frames),
  ``bench_static_w8a8.py`` (the static-W8A8 ablations), ``bench_stabilize.py`` (flicker with
  and without the frame stabilizer), ``bench_hot_path.py`` (per-call cost of one quantized
  linear; torch.compile of both models) and last ``bench_memory.py`` (peak memory with and without
  offloading; it runs two threads, so it waits until shapes-wan's timings are done);
* lane 2: ``sixbit bench`` on shapes-wan, then ``bench_dmpq.py`` (DMPQ vs W4A4/W4A8 and
  random assignment), then ``bench_weights.py`` on shapes-wan (4-bit weight algorithms and peers;
  its shapes-cogvideox half runs in lane 1 before ``bench_memory.py``), then
  ``bench_attention.py`` (quantized attention on both models).

``bench_real_size.py`` (hours of CPU), ``bench_tune.py`` and ``bench_refine.py`` (about 45 and
20 minutes per model, one process per model, then ``--merge``), ``bench_caches.py`` (every cache,
cache-dit's included, swept on both models: about 15 minutes per model, the two side by side,
then its own merge), ``bench_parallel.py`` (one process against two, about 10 minutes, both cores)
``bench_cpu_speed.py`` (a CogVideoX-2B-sized model, about 25 minutes on a quiet machine) and ``benchmarks/gpu/run.py``
(a GPU) are not run here: a full run keeps their sections from the existing file.

Every speedup names its baseline: the harness quotes it against the shipped model in the
fastest full-precision dtype of the CPU (bf16 with AVX512-BF16 or AMX, else fp32) and keeps a
fp32 column; the cache comparisons use the fp32 column, the uncached model the caches run on.

``--only STEP …`` runs some steps and updates only their sections of the existing file.

To stay under 30 minutes on 2 shared cores the defaults are 4 prompts × 20 steps per model
(4 pairs for the scripts, 16 for the DMPQ script, whose W4A4-to-W4A8 gap is only ~1.5 dB: on
4 pairs, random assignments alone spread over 0.5 dB), 4 calibration prompts (the static-W8A8 recipe uses 10; its
calibration alone takes minutes per model here), a single DMPQ target (6 bits) against the
mean of three random draws. ``--prompts``, ``--pairs`` and ``--calibration-prompts`` raise them.

The harness writes its full outputs (CSV, JSON, plots; ``index.html`` with the videos, not
committed) into ``benchmarks/results/<model>/``. The older scripts write into scratch files;
their sections are copied in. BENCHMARKS.md is then written anew, so no stale section survives.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

MAIN = ("fp,bf16,w8a8,high_quality,w8a8-static,w4a8,w4a6-dynamic,balanced,balanced-nopdr,aggressive,aggressive-nopdr,"
        "tdc,tdc-perblock,tdc-nodrift,fbcache-0.2,magcache,taylorseer-3,pab-2,fastercache-2,torchao-int8dq,"
        "quanto-qint8,quanto-qint4")
SWEEP = "tdc-2,fbcache-0.3,fbcache-0.4,magcache-0.12,magcache-0.24,magcache-0.3"
CACHES = ("tdc", "fbcache", "magcache", "taylorseer", "pab", "fastercache")  # method names: family-knob
ORDER = ["shapes-adherence", "cache-check", "cache-pareto", "bench-shapes-cogvideox", "bench-shapes-wan", "layer-shapes", "static-w8a8", "dmpq", "weights",
         "stabilize-frames", "memory",
         "hot-path-linear", "hot-path-compile", "attention", "tune", "refine", "parallel", "real-size", "cpu-speed", "gpu"]
# Sections of ORDER no step here writes (hours of CPU, or a GPU): a full run keeps them from the existing
# file, as it keeps every section outside ORDER (written by its own script), after them in the file's order.
KEPT = ("cache-pareto", "tune", "refine", "parallel", "real-size", "cpu-speed", "gpu")
# The sections each step writes (``--only`` updates just these).
SECTIONS_OF = {
    "bench shapes-cogvideox": ("bench-shapes-cogvideox", "cache-check"),
    "bench shapes-wan": ("bench-shapes-wan", "cache-check"),
    "bench_adherence.py": ("shapes-adherence",),
    "layer shapes": ("layer-shapes",),
    "bench_static_w8a8.py": ("static-w8a8",),
    "bench_stabilize.py": ("stabilize-frames",),
    "bench_hot_path.py": ("hot-path-linear", "hot-path-compile"),
    "bench_memory.py": ("memory",),
    "bench_dmpq.py": ("dmpq",),
    "bench_attention.py": ("attention",),
    "bench_weights.py cogvideox": ("weights",),
    "bench_weights.py wan": ("weights",),
}


def _layers_part(out: Path, tokens: int, runs: int) -> None:
    """Child mode: time the real layer shapes and write their section into ``out``."""
    import torch

    from sixbit.bench.layer_shapes import time_layers
    from sixbit.bench.outputs import layer_markdown
    from report import machine_description, update_section

    torch.set_num_threads(1)
    rows = time_layers(rows=(tokens // 4, tokens), runs=runs, progress=False)
    (out.with_suffix(".json")).write_text(json.dumps(rows, indent=1))
    update_section(out, "layer-shapes", layer_markdown(rows, machine_description()))


def _lanes(args, parts: Path) -> list[list[tuple[str, list[str]]]]:
    py = sys.executable
    bench = [py, "-m", "sixbit.cli", "bench", "--prompts", str(args.prompts), "--steps", str(args.steps),
             "--calibration-prompts", str(args.calibration_prompts), "--threads", "1", "--quiet"]
    methods = MAIN if args.quick is False else "fp,w4a8,tdc,fbcache-0.2,torchao-int8dq"
    if not args.quick:
        methods += "," + SWEEP
    small = ["--pairs", "2"] if args.quick else ["--pairs", str(args.pairs)]
    calib = str(args.calibration_prompts)
    lane1 = [
        ("bench shapes-cogvideox", bench + ["--model", "shapes-cogvideox", "--methods", methods, "-o", str(RESULTS / "shapes-cogvideox")]),
        ("bench_adherence.py", [py, str(ROOT / "benchmarks" / "bench_adherence.py"), "--steps", str(args.steps),
                                "--output", str(parts / "adherence.md")]),
        ("layer shapes", [py, __file__, "--layers-part", str(parts / "layers.md"), "--layer-tokens", "64" if args.quick else "512"]),
        ("bench_static_w8a8.py", [py, str(ROOT / "benchmarks" / "bench_static_w8a8.py"), *small, "--calib", calib,
                                  "--threads", "1", "--output", str(parts / "static.md")]),
        ("bench_stabilize.py", [py, str(ROOT / "benchmarks" / "bench_stabilize.py"), *small,
                                "--steps", str(args.steps), "--output", str(parts / "stabilize.md")]),
        ("bench_hot_path.py", [py, str(ROOT / "benchmarks" / "bench_hot_path.py"), *(["--quick"] if args.quick else []),
                               "--section", args.hot_path, "--output", str(parts / "hot_path.md")]),
        ("bench_memory.py", [py, str(ROOT / "benchmarks" / "bench_memory.py"), "--output", str(parts / "memory.md")]),
    ]
    weights = [py, str(ROOT / "benchmarks" / "bench_weights.py"), *(["--quick"] if args.quick else ["--pairs", str(args.dmpq_pairs)]),
               "--calib", calib, "--steps", str(args.steps)]
    lane1.insert(-1, ("bench_weights.py cogvideox", weights + ["--archs", "cogvideox", "--json", str(parts / "weights_cogvideox.json"),
                                                              "--output", str(parts / "weights_cogvideox.md")]))
    lane2 = [
        ("bench shapes-wan", bench + ["--model", "shapes-wan", "--methods", methods, "-o", str(RESULTS / "shapes-wan")]),
        ("bench_dmpq.py", [py, str(ROOT / "benchmarks" / "bench_dmpq.py"),
                           "--pairs", "2" if args.quick else str(args.dmpq_pairs), "--calib", calib,
                           "--steps", str(args.steps), "--target-bits", "6.0", "--draws", "3", "--out", str(parts / "dmpq.md")]),
        ("bench_weights.py wan", weights + ["--archs", "wan", "--json", str(parts / "weights_wan.json"),
                                            "--output", str(parts / "weights_wan.md")]),
        ("bench_attention.py", [py, str(ROOT / "benchmarks" / "bench_attention.py"), "--prompts", str(args.prompts),
                                "--steps", str(args.steps), "--output", str(parts / "attention.md")]),
    ]
    if args.only:
        lane1, lane2 = ([step for step in lane if step[0] in args.only] for lane in (lane1, lane2))
    return [lane1, lane2]


def _run_lane(lane, logs: Path, status: dict) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for label, cmd in lane:
        log = logs / (re.sub(r"[^a-z0-9]+", "_", label.lower()) + ".log")
        t0 = time.perf_counter()
        with open(log, "w") as f:
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        status[label] = (rc, time.perf_counter() - t0, log)
        print(f"{label}: {'ok' if rc == 0 else f'FAILED (exit {rc}, see {log})'} in {time.perf_counter() - t0:.0f} s", flush=True)


def _section(path: Path, name: str) -> str | None:
    if not path.is_file():
        return None
    m = re.search(rf"<!-- sixbit:begin {re.escape(name)} -->\n(.*?)\n<!-- sixbit:end {re.escape(name)} -->", path.read_text(), re.S)
    return m.group(1) if m else None


def _bench_section(model: str) -> str | None:
    path = RESULTS / model / "results.md"
    if not path.is_file():
        return None
    prefix = f"benchmarks/results/{model}/"
    body = re.sub(r"\]\((?!https?:|benchmarks/)([^)]+\.png)\)", lambda m: f"]({prefix}{m.group(1)})", path.read_text())
    return body.replace("### ", "## ", 1).strip() + (
        f"\n\nFull outputs: `{prefix}results.csv`, `results.json`; `index.html` shows the videos side by side "
        "(written by the run, not committed)."
    )


def _cache_check() -> str | None:
    """Issue 7's done-when, read from both harness runs: every delta-cache row at ≥ 1.8× against
    every diffusers cache row at equal or greater speedup, and the full method with and without PDR."""
    lines = ["## Delta cache vs diffusers' caches: the check, from the two harness runs below", "",
             "Each `tdc` row (our delta cache on the full-precision model) measured at ≥ 1.8× wall-clock speedup "
             "over the uncached fp32 model on this CPU, against every diffusers cache row measured at an equal or "
             "greater speedup (same model, seeds and steps). The caches all run on the fp32 model, so this compares "
             "them against it (the harness's *× fp32* column); against the bf16 model, the fastest full-precision "
             "dtype here, see the *× bf16* column of the tables below. Speedups are timed on a shared machine and "
             "drift by tenths; skipped shares are exact. A row no diffusers cache matched in speed compares with "
             "nothing.", "",
             "| model | delta cache | × fp32 | skipped | PSNR dB | diffusers caches at ≥ its speedup (× fp32, PSNR) | above all? |",
             "|---|---|---:|---:|---:|---|---|"]
    pdr = []
    for model in ("shapes-cogvideox", "shapes-wan"):
        path = RESULTS / model / "results.json"
        if not path.is_file():
            return None
        rows = [r for r in json.loads(path.read_text())["rows"] if r.get("status") == "ok"]
        family = {r["method"]: r["method"].split("-")[0] for r in rows}
        peers = [r for r in rows if r["family"] == "diffusers" and family[r["method"]] in CACHES]
        for r in rows:
            if family[r["method"]] != "tdc" or r["method"] in ("tdc-perblock", "tdc-nodrift") or r["speedup_fp32"] < 1.8:
                continue
            faster = [q for q in peers if q["speedup_fp32"] >= r["speedup_fp32"]]
            listed = ", ".join(f"{q['method']} ({q['speedup_fp32']:.2f}×, {q['psnr']:.2f})" for q in faster)
            verdict = "nothing to compare" if not faster else "yes" if all(r["psnr"] > q["psnr"] for q in faster) else "**no**"
            lines.append(f"| {model} | {r['method']} | {r['speedup_fp32']:.2f}× | {100 * r['skip_share']:.0f}% | "
                         f"{r['psnr']:.2f} | {listed or 'none'} | {verdict} |")
        by = {r["method"]: r for r in rows}
        for full in ("balanced", "aggressive"):
            if full in by and f"{full}-nopdr" in by:
                a, b = by[full], by[f"{full}-nopdr"]
                pdr.append(f"- {model}: {full} (with PDR) {a['psnr']:.2f} dB at {a['act_bits']:.2f} act bits vs "
                           f"{full}-nopdr {b['psnr']:.2f} dB at {b['act_bits']:.2f}: PDR {a['psnr'] - b['psnr']:+.2f} dB.")
    return "\n".join(lines + ["", "PDR on and off (same harness runs; balanced refreshes run INT8 after skips, "
                                   "aggressive ones NVFP4):", ""] + pdr)


def _weights_section(parts: Path) -> str | None:
    """bench_weights.py's section from the per-model JSON files its two steps wrote."""
    files = [p for p in (parts / "weights_cogvideox.json", parts / "weights_wan.json") if p.is_file()]
    if not files:
        return None
    scratch = parts / "weights.md"
    scratch.unlink(missing_ok=True)
    rc = subprocess.call([sys.executable, str(ROOT / "benchmarks" / "bench_weights.py"), "--merge", *map(str, files),
                          "--output", str(scratch)], cwd=ROOT)
    return _section(scratch, "weights") if rc == 0 else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts per model in the harness (default 4)")
    parser.add_argument("--steps", type=int, default=20, help="denoising steps everywhere (default 20)")
    parser.add_argument("--calibration-prompts", type=int, default=4, help="calibration prompts everywhere (default 4)")
    parser.add_argument("--pairs", type=int, default=4, help="held-out pairs of the DMPQ, static-W8A8 and stabilizer scripts (default 4)")
    parser.add_argument("--dmpq-pairs", type=int, default=16,
                        help="held-out pairs of the DMPQ script (default 16: its PSNR gaps are ~1 dB, so 4 pairs are too noisy)")
    parser.add_argument("--quick", action="store_true", help="tiny settings, to check the whole pipeline")
    parser.add_argument("--only", nargs="+", metavar="STEP", choices=list(SECTIONS_OF),
                        help="run only these steps and update only their sections of the existing file (its other "
                             f"sections and header stay): {', '.join(repr(s) for s in SECTIONS_OF)}")
    parser.add_argument("--hot-path", choices=["linear", "compile", "both"], default="both",
                        help="which parts bench_hot_path.py measures (default both)")
    parser.add_argument("--layers-part", help=argparse.SUPPRESS)
    parser.add_argument("--layer-tokens", type=int, default=512, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.layers_part:
        _layers_part(Path(args.layers_part), args.layer_tokens, 3)
        return 0
    if args.quick:
        args.prompts, args.steps, args.calibration_prompts = 1, 3, 1
    start = time.perf_counter()
    parts = RESULTS / "_parts"
    parts.mkdir(parents=True, exist_ok=True)
    if not args.only:
        for stale in [*parts.glob("*.md"), *parts.glob("*.json")]:
            stale.unlink()
    status: dict = {}
    threads = [threading.Thread(target=_run_lane, args=(lane, parts, status)) for lane in _lanes(args, parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.perf_counter() - start

    from report import update_section

    bodies = {
        "shapes-adherence": _section(parts / "adherence.md", "shapes-adherence"),
        "cache-check": _cache_check(),
        "bench-shapes-cogvideox": _bench_section("shapes-cogvideox"),
        "bench-shapes-wan": _bench_section("shapes-wan"),
        "layer-shapes": _section(parts / "layers.md", "layer-shapes"),
        "static-w8a8": _section(parts / "static.md", "static-w8a8"),
        "dmpq": _section(parts / "dmpq.md", "dmpq"),
        "memory": _section(parts / "memory.md", "memory"),
        "stabilize-frames": _section(parts / "stabilize.md", "stabilize-frames"),
        "hot-path-linear": _section(parts / "hot_path.md", "hot-path-linear"),
        "hot-path-compile": _section(parts / "hot_path.md", "hot-path-compile"),
        "weights": _weights_section(parts),
        "attention": _section(parts / "attention.md", "attention"),
    }
    out = Path(args.out)
    # sections of the existing file that no step here writes (each script that writes its own): kept as they are
    others = [n for n in re.findall(r"<!-- sixbit:begin ([a-z0-9_-]+) -->", out.read_text() if out.is_file() else "")
              if n not in ORDER]
    kept = (*KEPT, *others)
    bodies.update({name: _section(out, name) for name in kept})
    if args.only:
        names = [n for n in ORDER if any(n in SECTIONS_OF[step] for step in args.only)]
        for name in names:
            if bodies[name] is not None:
                update_section(out, name, bodies[name])
        # The header's step list is the full run's: note where a step that failed there has now run.
        text = out.read_text()
        for label, (rc, sec, _) in status.items():
            text = re.sub(rf"({re.escape(label)} \d+ s) \(FAILED\)", r"\1 (FAILED; rerun with --only: "
                          + ("ok" if rc == 0 else "failed again") + f" in {sec:.0f} s)", text, count=1)
        out.write_text(text)
        print(f"updated {', '.join(n for n in names if bodies[n] is not None)} in {out} in {total / 60:.1f} min")
        return 0 if all(rc == 0 for rc, _, _ in status.values()) else 1
    steps = "; ".join(f"{label} {sec:.0f} s" + ("" if rc == 0 else " (FAILED)") for label, (rc, sec, _) in status.items())
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    scripts = ", ".join(f"`{label}`" for label in status if label.endswith(".py"))
    out.write_text(
        "# sixbit benchmarks\n\n"
        f"Every number below was written by `{command}`: the harness `sixbit bench` on both shipped models "
        f"({args.prompts} prompts × {args.steps} steps each), the real layer shapes, and the scripts it calls "
        f"({scripts}); nothing is typed by hand. Total run time: **{total / 60:.1f} min** on 2 CPU cores ({steps}). "
        "Numbers marked PROJECTION come from a peak-throughput model of the counted work, not from a GPU. "
        f"Not run here, kept from the previous file (each names its own script and may predate the shipped "
        f"weights): {', '.join(f'`{k}`' for k in kept)}.\n"
    )
    for name in (*ORDER, *others):
        body = bodies[name]
        if body is None and name in kept:
            continue
        if body is None:
            body = f"*Section `{name}` was not written: its step failed in this run (see the logs in `benchmarks/results/_parts/`).*"
        update_section(out, name, body)
    print(f"wrote {out} in {total / 60:.1f} min")
    return 0 if all(rc == 0 for rc, _, _ in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
