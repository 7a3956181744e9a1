"""Sana-Video at real size (diffusers' default ``SanaVideoTransformer3DModel`` config, ~2B
parameters, random weights): how much smaller ``w8a8`` makes it in bf16 and in fp32, with the
convs that are linear layers on their unfolded input (the feed-forward's temporal ``conv_temp``)
left in full precision (*before*: what the pointwise-conv change alone gave) and quantized
(*after*). Issue 48 asks for at least 1.8× in bf16.

    python benchmarks/bench_sana_video_size.py [--workdir DIR] [--rss-limit-gib 10]

A bf16 folder of random weights is written once under ``--workdir``; each conversion streams it
(``sixbit.convert_pretrained``, in ``torch_dtype``) in a child process that the parent kills when
its RSS passes ``--rss-limit-gib``, then loads the checkpoint onto a meta-device model
(``sixbit.load_pretrained``) and compares ``sixbit.summary(...).tensor_bytes`` with the
full-precision model's in that dtype (every parameter and buffer, as the tests count them).
Prints one JSON line per measurement and a table; the folders are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _peak_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def child_write(folder: str) -> dict:
    """The default-config folder, random bf16 weights (bench_real_size's scales), one shard per block."""
    import accelerate
    import diffusers
    import torch

    from bench_real_size import _random
    from sixbit.files.safetensors import SafetensorsWriter

    with accelerate.init_empty_weights():
        model = diffusers.SanaVideoTransformer3DModel()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[str]] = {}
    for key in model.state_dict():
        parts = key.split(".")
        groups.setdefault(".".join(parts[:2]) if parts[0] == "transformer_blocks" else "outside", []).append(key)
    state, weight_map, total = model.state_dict(), {}, 0
    for i, (group, keys) in enumerate(groups.items()):
        file = f"diffusion_pytorch_model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        with SafetensorsWriter(out / file) as w:
            for j, key in enumerate(keys):
                w.add(key, _random(tuple(state[key].shape), torch.bfloat16, key, seed=(7919 * i + j) & 0xFFFF))
                weight_map[key] = file
                total += state[key].numel() * 2
            w.finish({"format": "pt"})
    (out / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(
        {"_class_name": "SanaVideoTransformer3DModel", "_diffusers_version": diffusers.__version__,
         **{k: v for k, v in model.config.items() if not k.startswith("_")}}))
    params = sum(t.numel() for t in state.values())
    return {"params": params, "bytes": total, "peak_gib": _peak_gib()}


def child_convert(folder: str, dtype_name: str, variant: str, output: str) -> dict:
    """One conversion: ``variant`` "before" excludes every unfoldable conv, "after" is ``w8a8``."""
    import dataclasses
    import re

    import torch

    import sixbit
    from sixbit.nn.pointwise_conv import is_unfoldable_conv
    from sixbit.presets import resolve
    from sixbit.integrations.diffusers.reading import empty_model

    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    fp = empty_model(folder).to(dtype)
    before = sixbit.summary(fp).tensor_bytes
    unfoldable = [name for name, m in fp.named_modules() if is_unfoldable_conv(m)]
    config = resolve("w8a8")
    if variant == "before":
        weights = config.weights
        config = dataclasses.replace(config, weights=dataclasses.replace(
            weights, exclude=[*weights.exclude, *(re.escape(n) for n in unfoldable)]))
    del fp
    t0 = time.perf_counter()
    sixbit.convert_pretrained(folder, config, output, None, torch_dtype=dtype, progress=False)
    seconds = time.perf_counter() - t0
    converted = sixbit.load_pretrained(output, folder)
    summary = sixbit.summary(converted)
    fp_left = summary.by_format().get("fp", {})
    kinds = {}
    for m in converted.modules():
        if isinstance(m, sixbit.QuantLinear) and type(m).__name__ != "QuantLinear":
            kinds[type(m).__name__] = kinds.get(type(m).__name__, 0) + 1
    return {"dtype": dtype_name, "variant": variant, "before_bytes": before, "after_bytes": summary.tensor_bytes,
            "ratio": before / summary.tensor_bytes, "fp_linear_bytes_left": fp_left.get("bytes", 0),
            "unfoldable_convs": len(unfoldable), "quantized_convs": kinds, "seconds": seconds,
            "peak_gib": _peak_gib()}


def _run_child(args: list[str], limit_gib: float) -> dict:
    """Run this script as a child with ``args``; kill it when its RSS passes ``limit_gib``."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            rss = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            rss = 0
        if rss / 2**20 > limit_gib:
            proc.kill()
            proc.wait()
            raise SystemExit(f"child {args[:2]} passed {limit_gib} GiB RSS and was killed")
        time.sleep(0.5)
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/sixbit-sana-video-size")
    parser.add_argument("--rss-limit-gib", type=float, default=10.0)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"), help="the markdown file to update ('' to print only)")
    args = parser.parse_args()
    if args.child:
        job, *rest = args.child
        result = child_write(*rest) if job == "write" else child_convert(*rest)
        print(json.dumps(result))
        return
    work = Path(args.workdir)
    folder = work / "fp-bf16"
    try:
        written = _run_child(["write", str(folder)], args.rss_limit_gib)
        print(json.dumps({"written": written}), flush=True)
        rows = []
        for dtype in ("bfloat16", "float32"):
            for variant in ("before", "after"):
                output = work / f"{dtype}-{variant}.safetensors"
                rows.append(_run_child(["convert", str(folder), dtype, variant, str(output)], args.rss_limit_gib))
                output.unlink(missing_ok=True)
                print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from report import machine_description, update_section

    lines = [
        "## Sana-Video at real size: convolutions quantized as GEMMs",
        "",
        f"Written by `python benchmarks/bench_sana_video_size.py` on {machine_description()}. diffusers' default "
        f"`SanaVideoTransformer3DModel` config ({written['params'] / 1e9:.3f} B parameters, random weights), converted "
        "with `w8a8` by the streamed conversion in the given dtype; bytes: every parameter and buffer "
        "(`sixbit.summary(...).tensor_bytes`) against the full-precision model in that dtype. *before*: pointwise "
        "convs quantized, the one-group convs that are GEMMs on their unfolded input (the feed-forward's temporal "
        "`conv_temp`) left in full precision; *after*: those quantized too. Issue 48 asks for ≥ 1.8× in bf16.",
        "",
        "| dtype | unfoldable convs | full precision MiB | converted MiB | smaller | fp linears/convs left MiB | peak GiB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['dtype']} | {'quantized' if r['variant'] == 'after' else 'full precision'} | "
                     f"{r['before_bytes'] / 2**20:.0f} | {r['after_bytes'] / 2**20:.0f} | {r['ratio']:.3f}× | "
                     f"{r['fp_linear_bytes_left'] / 2**20:.0f} | {r['peak_gib']:.2f} |")
    print("\n".join(lines))
    if args.output:
        update_section(args.output, "sana-video-size", "\n".join(lines))

if __name__ == "__main__":
    main()
