"""Real sizes through diffusers: quantize while ``from_pretrained`` loads a bf16 folder
(``quantization_config=sixbit.SixbitConfig(...)``), save the converted folder with
``save_pretrained``, reload it with a plain ``from_pretrained``, and load the same model's
single-file checkpoint with ``sixbit.load_pretrained`` → BENCHMARKS.md (section ``from-pretrained``).

    python benchmarks/bench_from_pretrained.py                            # CogVideoX-2B and Wan2.1-14B
    python benchmarks/bench_from_pretrained.py --models CogVideoX-2B --presets w8a8
    python benchmarks/bench_from_pretrained.py --quick                    # Wan2.1-1.3B's width, 2 blocks

The bf16 folders are the random-weight ones of ``bench_real_size.py`` (shards of 2 GiB), written
once under ``--workdir``. Each step runs in a fresh child process killed past
``--rss-limit-gib``; peak RSS is its ``VmHWM``, *baseline* its RSS once torch, diffusers and
sixbit are imported. Budgets checked per row (issue 44): quantizing while loading at most
1.5 × the quantized tensor bytes + one shard; loading a converted folder at most 1.3 × its tensor
bytes + the baseline.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from bench_real_size import CONFIGS, SHARD_BYTES, _gib, _peak_gib, _rss_gib, _run_child, child_write, log, run_child_mode

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("w8a8", "w4a8-rtn")
MODELS = ("CogVideoX-2B", "Wan2.1-14B")


def _imports(name: str):
    """The model class, torch and sixbit, with everything loading imports already imported (the
    baseline RSS then holds the libraries, not the model)."""
    import accelerate  # noqa: F401
    import diffusers
    import torch

    import sixbit
    import sixbit.integrations.diffusers  # noqa: F401
    import sixbit.streaming  # noqa: F401

    return getattr(diffusers, CONFIGS[name][0]), torch, sixbit


def _held(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def child_onload(name: str, folder: str, preset: str, out_folder: str, single_file: str) -> dict:
    cls, torch, sixbit = _imports(name)
    base = _rss_gib()
    t0 = time.perf_counter()
    model = cls.from_pretrained(folder, quantization_config=sixbit.SixbitConfig(preset), torch_dtype=torch.bfloat16)
    seconds, peak, held = time.perf_counter() - t0, _peak_gib(), _held(model)
    t0 = time.perf_counter()
    model.save_pretrained(out_folder)
    save_s = time.perf_counter() - t0
    sixbit.save(model, single_file)
    return {"seconds": seconds, "peak_gib": peak, "base_gib": base, "held_bytes": held, "save_s": save_s,
            "save_peak_gib": _peak_gib()}


def child_reload(name: str, out_folder: str) -> dict:
    cls, torch, _ = _imports(name)
    base = _rss_gib()
    t0 = time.perf_counter()
    model = cls.from_pretrained(out_folder, torch_dtype=torch.bfloat16)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_gib": _peak_gib(), "base_gib": base, "held_bytes": _held(model)}


def child_sixbit_load(name: str, folder: str, single_file: str) -> dict:
    _, _, sixbit = _imports(name)
    base = _rss_gib()
    t0 = time.perf_counter()
    model = sixbit.load_pretrained(single_file, folder)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_gib": _peak_gib(), "base_gib": base, "held_bytes": _held(model)}


def section(results: dict) -> str:
    from report import machine_description

    shard = SHARD_BYTES / 2**30
    lines = [
        "## Real sizes through diffusers: quantize while loading, converted folders",
        "",
        f"Written by `python benchmarks/bench_from_pretrained.py` on {machine_description()}. The random bf16 folders of "
        f"`bench_real_size.py` (shards of {shard:.0f} GiB). *on load*: `from_pretrained(folder, quantization_config="
        "SixbitConfig(preset), torch_dtype=torch.bfloat16)`; *reload*: `from_pretrained` of the folder its "
        "`save_pretrained` wrote, in a fresh process; *sixbit.load*: `sixbit.load_pretrained` of the same model's "
        "single-file checkpoint. Peak: the child's `VmHWM`; *baseline*: its RSS with torch, diffusers and sixbit "
        "imported. *budget*: 1.5 × quantized bytes + one shard (on load), 1.3 × tensor bytes + baseline (reload). "
        "Every tensor read from a mapped shard (to quantize, copy or checksum it) has its pages handed back as soon as "
        "it is done (`sixbit.memory.allocator.page_out`), so neither a bf16 shard nor the converted folder piles up in "
        "RSS; packed weights are read again from the file when first used, as `sixbit.load` maps them.",
        "",
        "| model | preset | quantized GiB | on load s | on load peak GiB | budget GiB | save s | reload s | reload peak GiB | "
        "budget GiB | sixbit.load s | sixbit.load peak GiB | baseline GiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        for preset, row in r.get("presets", {}).items():
            on, re_, sl = row.get("onload", {}), row.get("reload", {}), row.get("sixbit_load", {})
            if "error" in on:
                lines.append(f"| {name} | `{preset}` | – | – | {on['error']} | – | – | – | – | – | – | – | – |")
                continue
            q = on["held_bytes"]
            budget_on = (1.5 * q + SHARD_BYTES) / 2**30
            budget_re = 1.3 * q / 2**30 + re_.get("base_gib", 0)
            mark = lambda peak, budget: f"{peak:.2f} {'✓' if peak <= budget else '✗'}"  # noqa: E731
            lines.append(
                f"| {name} | `{preset}` | {_gib(q)} | {on['seconds']:.0f} | {mark(on['peak_gib'], budget_on)} | "
                f"{budget_on:.2f} | {on['save_s']:.0f} | {re_.get('seconds', float('nan')):.1f} | "
                f"{mark(re_.get('peak_gib', float('nan')), budget_re)} | {budget_re:.2f} | "
                f"{sl.get('seconds', float('nan')):.1f} | {sl.get('peak_gib', float('nan')):.2f} | {on['base_gib']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--workdir", default="/tmp/sixbit-real-size")
    parser.add_argument("--keep", action="store_true", help="keep the random bf16 folders")
    parser.add_argument("--rss-limit-gib", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="Wan2.1-1.3B with 2 blocks: checks the script")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--json", help="raw results: read (runs add to them) and written after every row")
    args = parser.parse_args(argv)
    if args.child:
        return run_child_mode({"write": child_write, "onload": child_onload, "reload": child_reload, "sixbit_load": child_sixbit_load}, args.child)

    def run(*child_args):
        return _run_child([str(a) for a in child_args], args.rss_limit_gib, log, script=__file__)

    results = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() else {}
    for name in ["Wan2.1-1.3B"] if args.quick else args.models.split(","):
        r = results.setdefault(name, {})
        work = Path(args.workdir)
        folder = work / name.replace(".", "_")
        if not (folder / "config.json").exists():
            log(f"{name}: writing random bf16 weights to {folder}")
            r["write"] = run("write", name, folder, 2 if args.quick else "none")
            log(f"{name}: {r['write']}")
        for preset in [p for p in args.presets.split(",") if p]:
            out, single = work / f"{folder.name}-{preset}", work / f"{folder.name}-{preset}.safetensors"
            log(f"{name}: from_pretrained with SixbitConfig({preset!r})")
            row = r.setdefault("presets", {}).setdefault(preset, {})
            row["onload"] = run("onload", name, folder, preset, out, single)
            log(f"{name} {preset} on load: {row['onload']}")
            if "error" not in row["onload"]:
                row["reload"] = run("reload", name, out)
                log(f"{name} {preset} reload: {row['reload']}")
                row["sixbit_load"] = run("sixbit_load", name, folder, single)
                log(f"{name} {preset} sixbit.load: {row['sixbit_load']}")
            shutil.rmtree(out, ignore_errors=True)
            single.unlink(missing_ok=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
            if not args.quick:  # the section grows row by row: a long run leaves what it measured
                from report import update_section

                update_section(args.output, "from-pretrained", section(results))
        if not args.keep and not args.quick:
            shutil.rmtree(folder, ignore_errors=True)
    if args.quick:
        print(section(results))
    else:
        log(f"wrote section from-pretrained of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
