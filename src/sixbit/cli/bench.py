"""``sixbit bench``: run methods and peers side by side and write tables, plots and videos."""

from __future__ import annotations

import argparse

from .args import MAX_STEPS, check_output_folder, guidance_type, int_in

DEFAULT_METHODS = "fp,w8a8,w8a8-static,w4a8,w4a6-dynamic,tdc,balanced,fbcache-0.2,magcache,torchao-int8dq,quanto-qint8"


def _cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.harness import BenchSettings, run_bench
    from ..bench.methods import PEERS, available_names
    from ..bench.outputs import write_all

    if args.list_methods:
        for name in available_names():
            method = PEERS.get(name)
            knob = f"  (-VALUE sets {method.param})" if method is not None and method.param else ""
            print(f"{name}{knob}")
        return 0
    check_output_folder(args.output)  # before hours of work, not after
    settings = BenchSettings(
        args.model, (args.methods or DEFAULT_METHODS).split(","), prompts=args.prompts, steps=args.steps,
        guidance=args.guidance, runs=args.runs, calibration_prompts=args.calibration_prompts,
        video_prompts=args.video_prompts, baseline=args.baseline,
    )
    if args.methods is None and not args.yes:
        print(plan(settings, args.output))
        return 0
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    result = run_bench(settings, progress=not args.quiet)
    paths = write_all(result, args.output)
    for r in result.rows:
        if r["status"] == "ok":
            print(f"{r['method']:<24} {r['s_per_video']:.3f} s/video  {r['speedup']:.2f}× {settings.baseline}  "
                  f"{r['speedup_fp32']:.2f}× fp32  PSNR {r['psnr']:.2f} dB  "
                  f"act {r['act_bits']:.2f} bits  skipped {100 * r['skip_share']:.0f}%")
        else:
            print(f"{r['method']:<24} {r['status']}: {r['note']}")
    print(f"wrote {paths['markdown']}, {paths['csv'].name}, {paths['json'].name}, plots and {paths['html'].name} "
          f"in {args.output} ({result.total_seconds:.0f} s)")
    return 0


def plan(settings, output: str) -> str:
    """What ``sixbit bench`` would run for ``settings``, with its size in generated videos, and how to start it."""
    n, prompts, runs = len(settings.methods), settings.prompts, settings.runs
    refs = len({"fp", settings.baseline})
    # a reference: a warm-up, `runs` timed, `runs` more at the end; every method: a warm-up, one probe of each
    # reference measured before it, `runs` timed
    videos = prompts * (n * (1 + runs) + (refs * runs if n > 1 else 0) + sum(min(i, refs) for i in range(n)))
    return "\n".join([
        f"sixbit bench would run {n} methods on {settings.model}: {', '.join(settings.methods)}; "
        f"speedups against {settings.baseline} (and fp32)",
        (f"  {prompts} prompts × {settings.steps} steps (guidance {settings.guidance:g}), a warm-up and {runs} timed "
         f"runs per method: about {videos} videos of {settings.steps} steps, plus calibration; results into {output}/"),
        "not started: add --yes to run it, or name the methods (--methods fp,w4a8,tdc; --list-methods shows them all)",
    ])


def register(subparsers) -> None:
    """Add the ``bench`` command to the CLI's subparsers."""
    p = subparsers.add_parser(
        "bench",
        help="measure methods and peers side by side (speed, memory, bits, skips, quality, GPU projection)",
        description="Run every method through the same pipeline, prompts, seeds and steps; write results.md, "
        "results.csv, results.json, PNG plots and index.html with the videos into -o. Method names: fp, the "
        "sixbit presets (balanced, w8a8-static, w4a6-dynamic, tdc, …) and peers (fbcache, magcache, taylorseer, "
        "pab, fastercache, cache-dit's dbcache, dbcache-ts1, dbcache-ts2, dbcache-f1b1, dbcache-f1b1-ts1, "
        "dbcache-nocap, torchao-int8dq, quanto-qint8, quanto-qint4); append -VALUE to set a method's knob, "
        "e.g. fbcache-0.2 (threshold), pab-3 (skip range), tdc-0.25 (threshold), dbcache-ts1-0.12 (residual diff "
        "threshold). --list-methods shows them all. "
        "A run starts when it names its --methods or is confirmed with --yes; bare `sixbit bench` only prints "
        "what it would run (every default method: a long run).",
    )
    p.add_argument("--model", default="shapes-cogvideox",
                   help="shapes-cogvideox (default), shapes-wan, or a saved shapes pipeline folder")
    p.add_argument("--methods", help=f"comma-separated; naming them starts the run (default {DEFAULT_METHODS}, "
                   "which needs --yes)")
    p.add_argument("-y", "--yes", action="store_true", help="start the run with the default methods (without it, "
                   "bare `sixbit bench` prints what it would run and exits)")
    p.add_argument("--prompts", type=int_in(1, 48), default=8,
                   help="held-out prompts, each with its own seed, 1-48 (default 8)")
    p.add_argument("--steps", type=int_in(2, MAX_STEPS), default=20, help=f"denoising steps, 2-{MAX_STEPS} (default 20)")
    p.add_argument("--guidance", type=guidance_type, default=4.0, help="CFG scale ≥ 0; ≤ 1 turns guidance off (default 4)")
    p.add_argument("--runs", type=int_in(3, 1000), default=3,
                   help="timed runs per method after a warm-up, at least 3; median (default 3)")
    p.add_argument("--calibration-prompts", type=int_in(1, 1000), default=8,
                   help="prompts for calibrating methods (default 8)")
    p.add_argument("--video-prompts", type=int_in(0, 48), default=2,
                   help="prompts whose videos go in index.html, 0 for none (default 2)")
    p.add_argument("--baseline", choices=("bf16", "fp"),
                   help="the full-precision method speedups are quoted against (default: the fastest on this "
                   "CPU, bf16 where it multiplies bf16 natively, AVX512-BF16 or AMX, else fp = fp32); fp32 is always a column")
    p.add_argument("--threads", type=int_in(1, 4096), help="torch CPU threads (default: torch's)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--list-methods", action="store_true", help="print every method name and exit")
    p.add_argument("-o", "--output", default="sixbit-bench", help="output folder (default ./sixbit-bench)")
    p.set_defaults(func=_cmd_bench)
