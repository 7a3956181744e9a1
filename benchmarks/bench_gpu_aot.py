"""Every Triton kernel compiled ahead of time for six NVIDIA GPUs, no GPU needed → BENCHMARKS.md
(section ``gpu-aot``).

    python benchmarks/bench_gpu_aot.py                 # the whole matrix (~15 CPU-minutes)
    python benchmarks/bench_gpu_aot.py --workers 4
    python benchmarks/bench_gpu_aot.py --kernel int8_rows   # recompile one kernel, keep the other records

Each configuration the wrappers launch for the block linears and attention heads of CogVideoX-2B
and -5B, Wan2.1-1.3B and -14B and HunyuanVideo (:data:`sixbit.bench.layer_shapes.KERNEL_SHAPES`),
in bf16, fp16 and fp32, is compiled by :mod:`sixbit.kernels.triton.aot` for sm_80, 86, 89, 90,
100 and 120: whether it compiles, its shared memory against the target's limit, registers and
spills (``ptxas -v``), and the tensor-core instructions in its PTX. Then the capability table
(:mod:`sixbit.kernels.gpu_targets`) is checked against the results: a kernel is listed for a
target exactly where all its configurations compile, fit and multiply on tensor cores (an fp32
``tl.dot`` excepted, which runs on CUDA cores by design). Raw records:
``benchmarks/results/gpu_aot.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from pathlib import Path

import triton
from report import machine_description, update_section

from sixbit.bench.layer_shapes import KERNEL_SHAPES
from sixbit.files.atomic import write_text_atomic
from sixbit.kernels import gpu_targets
from sixbit.kernels.triton import aot

ROOT = Path(__file__).resolve().parents[1]


def _variants() -> tuple[list[int], list[int], list[aot.Variant]]:
    ks = sorted({k for widths, _ in KERNEL_SHAPES.values() for k in widths})
    head_dims = sorted({d for _, d in KERNEL_SHAPES.values()})
    return ks, head_dims, aot.variants(ks, head_dims)


def measure(workers: int, kernel: str | None = None, before: dict | None = None) -> dict:
    """Compile every configuration; ``kernel``: only that kernel's, the others' records (and the
    matrix's time) kept from ``before``, the last run's."""
    ks, head_dims, variants = _variants()
    jobs = [(v, t) for v in variants for t in gpu_targets.TARGETS if kernel in (None, v.kernel)]
    start = time.perf_counter()
    records = [c.record() for c in aot.compile_many(jobs, workers=workers)]
    result = {"ks": ks, "head_dims": head_dims, "triton": triton.__version__, "machine": machine_description(),
              "seconds": time.perf_counter() - start, "workers": workers, "records": records}
    if kernel is not None:
        fresh = {(r["kernel"], r["config"], r["target"]): r for r in records}
        kept = {(r["kernel"], r["config"], r["target"]): r for r in before["records"] if r["kernel"] != kernel}
        order = [(v.kernel, v.config, f"sm_{t}") for v in variants for t in gpu_targets.TARGETS]
        result.update(seconds=before["seconds"], workers=before["workers"], recompiled=sorted(
            set(before.get("recompiled", [])) | {kernel}), records=[(fresh | kept)[key] for key in order])
    return result


def _cell(r: dict) -> str:
    if not r["compiles"]:
        return f"**✗** {r['error'].split(' The supported')[0]}"
    text = f"{r['shared'] / 1024:.1f}K, {r['registers']} reg"
    text += f", {r['spills']} B spill" if r["spills"] else ""
    if r["multiplies"]:
        families = "/".join(sorted({m.split()[0] for m in r["mma"]}))
        text += ", " + (families or ("FMA" if r["multiplies"] == aot.CUDA_CORES else "no MMA"))
    return text if r["ok"] else f"**✗** {text}" + ("" if r["fits"] else f" > {r['smem_limit'] // 1024}K")


def table_check(records: list[dict]) -> list[tuple[str, list[int], list[int]]]:
    """(row, targets where every configuration is ok, targets the table lists) per Triton row."""
    good = {r["row"]: set(gpu_targets.TARGETS) for r in records}
    for r in records:
        if not r["ok"]:
            good[r["row"]].discard(int(r["target"][3:]))
    return [(row, sorted(good[row]), sorted(gpu_targets.TABLE[row])) for row in sorted(good)]


def findings(records: list[dict]) -> list[str]:
    """What the matrix says, in sentences written from the records."""
    def where(rs):  # "kernel configuration (dtypes) on targets", the dtypes on the same targets merged
        targets = defaultdict(list)
        for r in rs:
            targets[r["kernel"], r["config"]].append(r["target"])
        groups = defaultdict(set)
        for (kernel, config), on in targets.items():
            dtype, config = config.split(", ", 1)
            groups[kernel, config, tuple(sorted(on, key=lambda t: int(t[3:])))].add(dtype)
        return "; ".join(f"{k} {c} ({'/'.join(sorted(d))}) on {', '.join(t)}" for (k, c, t), d in groups.items())

    failed = [r for r in records if not r["compiles"]]
    too_big = [r for r in records if r["compiles"] and not r["fits"]]
    spilled = [r for r in records if r["compiles"] and r["spills"]]
    worst = max(spilled, key=lambda r: r["spills"] * r["fits"], default=None)
    families = defaultdict(set)
    for r in records:
        families[r["kernel"], r["target"]] |= {m.split()[0] for m in r["mma"]}
    lines = [f"- **Does not compile** ({len(failed)} of {len(records)}): {where(failed) or 'none'}"
             + (f" — \"{failed[0]['error'].split(' The supported')[0].rstrip('.')}\"" if failed else "") + ".",
             f"- **Exceeds shared memory** ({len(too_big)}): {where(too_big) or 'none'}.",
             f"- **Spills** in {len(spilled)} compilations that fit"
             + (f" (at most {worst['spills']} B: {worst['kernel']} {worst['config']} on {worst['target']})" if worst else "")
             + "; they run, slower than a kernel that holds its values in registers."]
    for kernel in sorted({k for k, _ in families}):
        used = {t: "/".join(sorted(f)) for (k, t), f in families.items() if k == kernel and f}
        if used:
            lines.append(f"- **{kernel}** multiplies with " + ", ".join(f"{f} on {t}" for t, f in used.items()) + ".")
    return lines


def section(result: dict) -> str:
    records = result["records"]
    targets = list(gpu_targets.TARGETS)
    n_variants = len(records) // len(targets)
    lines = [
        "## Triton kernels compiled ahead of time for six GPUs (issue 64)",
        "",
        f"Written by `python benchmarks/bench_gpu_aot.py` on {result['machine']}: **no GPU**, Triton "
        f"{result['triton']}'s own pipeline down to `ptxas` for each target ({n_variants} configurations × "
        f"{len(targets)} targets = {len(records)} compilations in {result['seconds'] / 60:.1f} min, "
        f"{result['workers']} processes{''.join(f'; `{k}` recompiled since' for k in result.get('recompiled', []))}). Configurations: what the wrappers launch for the block linears "
        f"(input widths {', '.join(map(str, result['ks']))}) and attention heads ({' and '.join(map(str, result['head_dims']))}) "
        f"of {', '.join(KERNEL_SHAPES)}, in bf16, fp16 and fp32. A cell: dynamic shared memory (KiB), registers "
        "per thread, spilled bytes (stores + loads) when any, and the tensor-core instruction families in the "
        "PTX where the kernel multiplies (`mma` = `mma.sync`); **✗**: does not compile (the compiler's reason), "
        "exceeds the target's shared memory per block (limit after `>`), or multiplies without tensor cores "
        "where it should. `fp32 on CUDA cores`: an fp32 `tl.dot` with `input_precision=\"ieee\"` (the Hadamard "
        "rotation and W4A16 on fp32 inputs), FMA by design; on 16-bit inputs the rotation multiplies the ±1 Hadamard "
        "in the input's dtype on tensor cores, the exact products summed in fp32. Shared-memory limits per block: "
        + ", ".join(f"sm_{t} {gpu_targets.SMEM_LIMIT[t] // 1024} KiB" for t in targets) + ".",
        "",
        ("**The capability table** (`sixbit.kernels.gpu_targets.TABLE`, what the dispatcher reads) against these "
        "results — targets where every configuration of the row compiles, fits and multiplies as it should:"),
        "",
        "| row | ok on | table lists | agrees |",
        "|---|---|---|---|",
    ]
    for row, ok, listed in table_check(records):
        lines.append(f"| {row} | {', '.join(f'sm_{t}' for t in ok) or 'none'} | "
                     f"{', '.join(f'sm_{t}' for t in listed) or 'none'} | {'yes' if ok == listed else '**no**'} |")
    lines += ["", *findings(records)]
    lines += ["", "| kernel | configuration | multiplies on | " + " | ".join(f"sm_{t}" for t in targets) + " |",
              "|---|---|---|" + "---|" * len(targets)]
    by_variant = defaultdict(dict)
    for r in records:
        by_variant[(r["kernel"], r["config"], r["multiplies"])][r["target"]] = r
    for (kernel, config, multiplies), cells in by_variant.items():
        lines.append(f"| {kernel} | {config} | {multiplies or '–'} | "
                     + " | ".join(_cell(cells[f"sm_{t}"]) for t in targets) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="compiling processes (default 2)")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--from-json", action="store_true",
                        help="write the section from the last run's records (the table rows as the code decides them now)")
    parser.add_argument("--kernel", choices=("int8_rows", "weight4", "epilogue", "int8_attention"),
                        help="recompile only this @triton.jit kernel's configurations; the others' records are the last run's")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results = ROOT / "benchmarks" / "results" / "gpu_aot.json"
    if args.from_json:
        result = json.loads(results.read_text())
        rows = {(v.kernel, v.config): v.row for v in _variants()[2]}
        for r in result["records"]:
            r["row"] = rows[r["kernel"], r["config"]]
    else:
        result = measure(args.workers, args.kernel, json.loads(results.read_text()) if args.kernel else None)
    write_text_atomic(results, json.dumps(result, indent=1))
    text = section(result)
    print(text)
    update_section(args.output, "gpu-aot", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
