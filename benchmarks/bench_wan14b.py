"""Wan2.1-14B converted whole with the full ``w4a8`` recipe on this machine, as a guarded,
resumable background job (issue 63) → BENCHMARKS.md (section ``conversion-14b``).

    python benchmarks/bench_wan14b.py --workdir /work/scratch/wan14b     # write the model once, convert, resume
    python benchmarks/bench_wan14b.py --section                          # the section from the saved attempts

Random bf16 weights of Wan2.1-14B's configuration (40 blocks, 28 GB of shards: the shape is what
costs) are written once to ``--workdir``; then ``sixbit.convert_pretrained`` converts them with the
whole ``w4a8`` recipe (GPTQ + MSE scales + the low-rank branch), calibrated on two random-latent
calls of 4 latent frames at 480p (60 × 104 latents, batch 2), one block resident at a time.

Guarded: each attempt is a child process whose RSS the parent polls, killed past
``--rss-limit-gib`` (the machine has no swap). Resumed: an attempt that stops (killed, crashed, or
this script itself stopped and run again later, in another session) leaves its finished blocks in
``<output>.sixbit-progress``; the next attempt goes on after them, each verified by its sha256
(:mod:`sixbit.checkpoint.resume`). Every attempt is saved to ``--json`` as it ends, and each
block's time is recorded in the progress folder as it finishes, so the section gives every
block's time whichever attempt converted it (``StreamedConversion.resumed_seconds``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_real_size import ROOT, _calibration, _config, _peak_gib, _run_child, child_write, log, run_child_mode  # noqa: E402

MODEL = "Wan2.1-14B"
BLOCKS = 40
FRAMES, SIDE = 4, "60x104"  # calibration: 4 latent frames at 480p
SECTION = "conversion-14b"


def child_convert(folder: str, output: str, log_file: str) -> dict:
    """One attempt: the conversion into ``output`` (resumed where an earlier attempt stopped),
    sixbit's log lines appended to ``log_file``."""
    import logging

    import torch

    import sixbit

    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger("sixbit").addHandler(handler)
    logging.getLogger("sixbit").setLevel(logging.INFO)
    result = sixbit.convert_pretrained(folder, _config("w4a8"), output, _calibration(folder, FRAMES, SIDE), progress=False)
    return {"seconds": result.seconds, "part_seconds": result.part_seconds, "resumed_seconds": result.resumed_seconds,
            "resumed_parts": result.resumed_parts, "source_bytes": result.source_bytes,
            "checkpoint_bytes": result.checkpoint_bytes, "peak_gib": _peak_gib(), "threads": torch.get_num_threads()}


def _finished_parts(output: Path) -> int:
    from sixbit.checkpoint.resume import progress_folder

    record = progress_folder(output) / "progress.json"
    try:
        return len(json.loads(record.read_text()).get("parts", {}))
    except (OSError, ValueError):
        return 0


def _progress(output: Path) -> dict:
    """What the progress folder of an unfinished conversion records (``{}`` when there is none)."""
    from sixbit.checkpoint.resume import progress_folder

    try:
        return json.loads((progress_folder(output) / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def section(results: dict, progress: dict | None = None) -> str:
    """The section: the whole model's time (every block's, whichever attempt converted it), the
    peak of every attempt, and the attempts; while unfinished, what the progress folder records
    (``progress``: its ``progress.json``)."""
    attempts = results.get("attempts", [])
    done = next((a for a in attempts if "error" not in a and "part_seconds" in a), None)
    lines = [
        "## Wan2.1-14B converted whole: the full `w4a8` recipe, streamed and resumed (issue 63)", "",
        f"Written by `python benchmarks/bench_wan14b.py` on {results.get('machine', '?')}. Random bf16 weights of "
        f"Wan2.1-14B's configuration ({BLOCKS} blocks; the shape is what costs) on disk, converted by "
        "`sixbit.convert_pretrained` with the whole `w4a8` recipe (GPTQ + MSE scales + the low-rank branch), "
        "calibrated on two random-latent calls of 4 latent frames at 480p (60 × 104 latents, batch 2), one block "
        "resident at a time. A guarded background job: each attempt is a child process killed past "
        f"{results.get('rss_limit_gib', '?')} GiB of RSS; an attempt that stops leaves its finished blocks on disk and the "
        "next one resumes after them (each verified by its sha256). *s / block*: each block's own time, recorded as it "
        "finished, whichever attempt converted it. Peak: each attempt's RSS high-water mark (Python and torch "
        "included).", "",
    ]
    if done is None:
        parts = (progress or {}).get("parts", {})
        blocks = [p["seconds"] for name, p in parts.items() if name != "outside blocks" and "seconds" in p]
        finished = max([len(parts), *(a.get("finished_after", 0) for a in attempts)])
        lines.append(f"Not finished yet: {finished} of {BLOCKS + 1} parts (the layers outside the blocks, then each "
                     "block) finished; run the script again to resume.")
        if blocks:
            calibration = (progress or {}).get("calibration seconds")
            lines += ["", f"So far, from the progress folder: {len(blocks)} blocks, s / block median "
                      f"{statistics.median(blocks):.0f} (min {min(blocks):.0f}, max {max(blocks):.0f}); calibration "
                      + (f"{calibration:.0f} s" if calibration else "not recorded") + ". Wall times on a shared "
                      "machine: the job runs at the lowest priority, and a block that other work starved took longer "
                      "(the max).", ""]
    else:
        seconds = {**done["resumed_seconds"], **done["part_seconds"]}
        blocks = [t for name, t in seconds.items() if name not in ("outside blocks", "calibration runs")]
        total = sum(seconds.values())
        peak = max(a["peak_gib"] for a in attempts if "peak_gib" in a)
        lines += [
            "| model | blocks | s / block (median, min–max) | calibration s | parts, all attempts h | "
            "last attempt's assembly s | peak GiB | checkpoint GiB | vs bf16 | attempts |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {MODEL} | {len(blocks)} of {BLOCKS} | {statistics.median(blocks):.1f} ({min(blocks):.0f}–{max(blocks):.0f}) | "
            f"{seconds.get('calibration runs', 0):.0f} | {total / 3600:.2f} | "
            f"{done['seconds'] - sum(done['part_seconds'].values()):.0f} | {peak:.2f} | "
            f"{done['checkpoint_bytes'] / 2**30:.2f} | {done['source_bytes'] / done['checkpoint_bytes']:.2f}× | "
            f"{len(attempts)} |", "",
        ]
    lines.append("Attempts:")
    lines.append("")
    for i, a in enumerate(attempts, 1):
        what = a.get("error") or f"finished ({a['resumed_parts']} parts resumed)"
        peak = f", peak {a['peak_gib']:.2f} GiB" if "peak_gib" in a else ""
        lines.append(f"{i}. {a['started']}: {what}; {a['wall_s'] / 60:.1f} min{peak}; parts finished before it "
                     f"{a['finished_before']}, after it {a['finished_after']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default="/tmp/sixbit-wan14b", help="the model's shards, the output and its "
                        "progress folder (keep it across sessions to resume)")
    parser.add_argument("--rss-limit-gib", type=float, default=20.0)
    parser.add_argument("--attempts", type=int, default=3, help="attempts in this run (each resumes the one before)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "wan14b.json"))
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--section", action="store_true", help="only write the section from --json")
    parser.add_argument("--keep", action="store_true", help="keep the shards and the checkpoint once converted")
    args = parser.parse_args(argv)
    if args.child:
        return run_child_mode({"convert": child_convert, "write": child_write}, args.child)

    from report import machine_description, update_section

    path = Path(args.json)
    results = json.loads(path.read_text()) if path.exists() else {}
    if not args.section:
        work = Path(args.workdir)
        folder, output = work / "Wan2_1-14B", work / "wan14b-w4a8.safetensors"
        if not (folder / "config.json").exists():
            log(f"writing random bf16 {MODEL} to {folder}")
            log(f"{_run_child(['write', MODEL, str(folder), 'none'], args.rss_limit_gib, log, script=__file__)}")
        results.update(machine=machine_description(), rss_limit_gib=args.rss_limit_gib)
        for _ in range(args.attempts):
            before = _finished_parts(output)
            started, t0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.perf_counter()
            log(f"attempt: {before} parts finished before; log in {work / 'convert.log'}")
            r = _run_child(["convert", str(folder), str(output), str(work / "convert.log")], args.rss_limit_gib, log,
                           script=__file__)
            r.update(started=started, wall_s=time.perf_counter() - t0, finished_before=before,
                     finished_after=BLOCKS + 1 if "error" not in r else _finished_parts(output))
            results.setdefault("attempts", []).append(r)
            path.write_text(json.dumps(results, indent=1))
            log(f"{ {k: v for k, v in r.items() if k not in ('part_seconds', 'resumed_seconds')} }")
            if "error" not in r:
                if not args.keep:
                    output.unlink(missing_ok=True)
                    shutil.rmtree(folder, ignore_errors=True)
                break
    output = Path(args.workdir) / "wan14b-w4a8.safetensors"
    update_section(args.output, SECTION, section(results, _progress(output)))
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
