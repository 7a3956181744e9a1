"""What a 4-bit conversion costs, stage by stage, and what it holds in memory → BENCHMARKS.md
(sections ``conversion-profile``, ``conversion-block``, ``conversion-memory``, ``conversion-real``,
``conversion-shipped``).

    python benchmarks/bench_conversion.py                              # every part
    python benchmarks/bench_conversion.py --parts profile --before /tmp/old/src
    python benchmarks/bench_conversion.py --parts block --json /tmp/conversion.json

``--before SRC`` runs the same children on another checkout's ``src`` (e.g. the commit before a
change), so every table shows *before* and *after* side by side; ``--json`` keeps each part's
raw results, so one side can be measured again without the other. Each
measurement runs in a fresh child process (``bench_real_size``'s runner: peak RSS is the
child's ``VmHWM``, a child past ``--rss-limit-gib`` is killed).

- **profile**: the ``w4a8`` recipe on one weight of each shape of three widths (1536: Wan2.1-1.3B,
  3072: CogVideoX-5B / HunyuanVideo, 5120: Wan2.1-14B; the square attention projection and the
  FFN's up and down projections), random weights (N(0, 1/K)) and a Hessian from random inputs
  (the cost does not depend on the values). Stages, each timed once after a warm-up on a small
  weight (compiling the CPU kernels is timed apart): the input Hessian (``hessians.collect``
  over 12,480 bf16 rows, two calls of 4 latent frames at 480p, the layer's own forward
  subtracted), its Hadamard rotation, one SVD split of the low-rank branch, one MSE scale search,
  GPTQ, and ``quantize_weight`` whole (three scale searches, three SVDs, GPTQ, the packing).
- **block**: Wan2.1-1.3B's width, 2 blocks of random bf16 weights on disk, converted by
  ``sixbit.convert_pretrained`` with ``w4a8`` (GPTQ, calibrated on two calls of 4 latent frames
  at 480p) and with the round-to-nearest layout of the same formats; seconds per block, and the
  output error of the converted 2-block model against bf16 on a held-out call.
- **tune** / **dmpq**: the same folder tuned streamed (``sixbit.tune_pretrained``), and converted
  streamed with ``w4a6-dynamic`` (DMPQ fitted on the converted model), the two calls' outputs
  standing in for the videos.
- **memory**: CogVideoX-2B (random bf16 weights, built in memory) converted in memory by
  ``sixbit.convert_model`` with the ``w4a8`` layout (round to nearest): peak RSS with the
  replaced layers spilled to disk (the default), and with ``TMPDIR`` on tmpfs, which keeps them
  in memory.
- **real**: the full ``w4a8`` recipe (real GPTQ) streamed at real size: all of CogVideoX-2B, and
  2 blocks of Wan2.1-14B with the whole model's time projected from them.
- **shipped**: both shipped pipelines converted in memory with ``w4a8``, ``w4a16`` and
  ``w4a6-dynamic`` (``--shipped-presets``), calibrated as ``sixbit convert`` does by default:
  seconds, calibration pipeline calls, and held-out PSNR / SSIM against full precision
  (``--pairs``, default 8).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_real_size import (CONFIGS, ROOT, _calibration, _config, _peak_gib, _rss_gib, _run_child, child_write,  # noqa: E402
                             log, run_child_mode)

WIDTHS = {1536: 8960, 3072: 12288, 5120: 13824}  # model width → FFN width
CALIB_ROWS = 2 * 2 * 4 * 30 * 52  # two calls × batch 2 × 4 latent frames × 480p tokens (60×104 latents, patch 2)
STAGES = ("hessian", "rotate", "svd", "scale search", "gptq", "layer")


# ----------------------------------------------------------------------------- children

def _timed(fn, *args, **kwargs) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def child_profile(width: int) -> dict:
    """Seconds per stage of the w4a8 recipe on each weight shape of ``width``."""
    import importlib

    import torch
    from torch import nn

    from sixbit.calibration import hessians
    from sixbit.config import QuantConfig
    from sixbit.presets import resolve
    from sixbit.rounding import quantize_weight
    from sixbit.transforms import hadamard, lowrank

    grid = importlib.import_module("sixbit.rounding.grid")
    gptq = importlib.import_module("sixbit.rounding.gptq").gptq
    recipe: QuantConfig = resolve("w4a8").weights
    g = torch.Generator().manual_seed(0)
    small = torch.randn(256, 4096, generator=g)  # large enough to take the compiled kernels
    _, compile_s = _timed(quantize_weight, small, "nvfp4", recipe.scale_rule, torch.eye(4096), True,
                          recipe.gptq_damp, 16, recipe.lowrank_iterations)
    shapes = [(width, width), (WIDTHS[width], width), (width, WIDTHS[width])]
    rows = []
    for n, k in shapes:
        w = torch.randn(n, k, generator=g) / k ** 0.5
        x = torch.randn(CALIB_ROWS, k, generator=g).to(torch.bfloat16)
        layer = nn.Linear(k, n, dtype=torch.bfloat16)
        with torch.no_grad():
            _, forward_s = _timed(layer, x)
            stats, collect_s = _timed(hessians.collect, layer, lambda: layer(x), {"": layer})
        h = stats[""].hessian
        del x
        rank = recipe.lowrank_rank_for(k, n)
        _, rotate_s = _timed(lambda: hadamard.rotate(hadamard.rotate(h, 128).T.contiguous(), 128))
        _, svd_s = _timed(lowrank.split, w, rank)
        chosen, grid_s = _timed(grid.grid_for, w, "nvfp4", recipe.scale_rule, h.diagonal())
        _, gptq_s = _timed(gptq, w, h, chosen, damp=recipe.gptq_damp)
        _, layer_s = _timed(quantize_weight, w, "nvfp4", recipe.scale_rule, h, True, recipe.gptq_damp, rank,
                            recipe.lowrank_iterations)
        rows.append({"shape": [n, k], "rank": rank, "hessian": max(collect_s - forward_s, 0.0), "rotate": rotate_s,
                     "svd": svd_s, "scale search": grid_s, "gptq": gptq_s, "layer": layer_s})
    return {"width": width, "threads": torch.get_num_threads(), "compile_s": compile_s, "rows": rows}


def _held_out(config: dict):
    import torch

    g = torch.Generator().manual_seed(7)
    return dict(hidden_states=torch.randn(1, config["in_channels"], 2, 30, 52, generator=g).to(torch.bfloat16),
                encoder_hidden_states=torch.randn(1, 512, config["text_dim"], generator=g).to(torch.bfloat16),
                timestep=torch.tensor([500]), return_dict=False)


def _compile_kernels(recipe) -> float:
    """Seconds to compile the CPU kernels of the scale search (once per process, not per block):
    spent here so that no block's time holds them."""
    import torch

    from sixbit.rounding import quantize_weight

    _, seconds = _timed(quantize_weight, torch.randn(256, 4096), "nvfp4", recipe.scale_rule, torch.eye(4096), True,
                        recipe.gptq_damp, 16, recipe.lowrank_iterations)
    return seconds


def child_block(folder: str, preset: str, output: str) -> dict:
    """Convert the 2-block folder with ``preset`` (streamed), then the converted model's output
    error against the bf16 one on a held-out call."""
    import diffusers
    import torch

    import sixbit

    config = json.loads((Path(folder) / "config.json").read_text())
    spec = _config(preset)
    calibration = _calibration(folder, 4, "60x104") if spec.needs_calibration else None
    compile_s = _compile_kernels(spec.weights) if spec.weights.needs_calibration else 0.0
    base = _rss_gib()
    result = sixbit.convert_pretrained(folder, spec, output, calibration, progress=False)
    peak, load = _peak_gib(), os.getloadavg()[1]  # the 5-minute load average: other processes on the cores
    blocks = [s for p, s in result.part_seconds.items() if p not in ("outside blocks", "calibration runs")]
    reference = diffusers.WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.bfloat16)
    converted = sixbit.load_pretrained(output, folder)
    with torch.no_grad():
        want = reference(**_held_out(config))[0].float()
        got = converted(**_held_out(config))[0].float()
    error = float((got - want).square().mean() / want.square().mean())
    return {"seconds": result.seconds, "block_s": blocks[0], "last_block_s": blocks[-1], "blocks": len(blocks),
            "compile_s": compile_s,
            "calibration_s": result.part_seconds.get("calibration runs", 0.0), "relative_mse": error,
            "peak_gib": peak, "base_gib": base, "threads": torch.get_num_threads(), "load": load}


def _returning_outputs(folder: str):
    """``_calibration``'s two calls, returning their outputs: they stand in for the videos that the
    tuner and DMPQ compare (random weights make no video)."""
    import torch

    calls = _calibration(folder, 4, "60x104")

    def calibration(transformer):
        outputs = []
        hook = transformer.register_forward_hook(lambda m, a, out: outputs.append(out[0].float()))
        try:
            calls(transformer)
        finally:
            hook.remove()
        return torch.cat(outputs)

    return calibration


def child_dmpq(folder: str, output: str) -> dict:
    """``w4a6-dynamic`` streamed on the 2-block folder: the blocks converted (GPTQ, as ``w4a8``),
    then the converted model loaded and DMPQ fitted on its generations (``_returning_outputs``)."""
    import torch

    import sixbit

    calls, runs = _returning_outputs(folder), []
    compile_s = _compile_kernels(_config("w4a6-dynamic").weights)
    base = _rss_gib()
    result = sixbit.convert_pretrained(folder, "w4a6-dynamic", output, lambda t: runs.append(1) or calls(t),
                                       progress=False)
    peak, load = _peak_gib(), os.getloadavg()[1]
    blocks = [s for p, s in result.part_seconds.items() if p not in ("outside blocks", "calibration runs", "fitting methods")]
    predictor = sixbit.conversion_of(sixbit.load_pretrained(output, folder)).predictor
    return {"seconds": result.seconds, "block_s": blocks[0], "last_block_s": blocks[-1], "blocks": len(blocks),
            "compile_s": compile_s, "calibration_s": result.part_seconds.get("calibration runs", 0.0),
            "fit_s": result.part_seconds["fitting methods"], "fit_runs": len(runs) - 1,
            "step_ranges": len(predictor.step_starts), "threshold": predictor.threshold,
            "peak_gib": peak, "base_gib": base, "threads": torch.get_num_threads(), "load": load}


def child_tune(folder: str, max_bits: str) -> dict:
    """``sixbit.tune_pretrained`` on the 2-block folder (the ``w4a8`` recipe, the default candidate
    formats), calibrated on ``_returning_outputs``."""
    import torch

    import sixbit

    calibration = _returning_outputs(folder)
    compile_s = _compile_kernels(_config("w4a8").weights)
    base = _rss_gib()
    report = sixbit.tune_pretrained(folder, calibration, max_bits=float(max_bits), base="w4a8",
                                    torch_dtype=torch.bfloat16, progress=False)
    peak, load = _peak_gib(), os.getloadavg()[1]
    return {"seconds": report.seconds, "block_s": report.block_seconds, "layers": len(report.layers),
            "formats": sorted({v or "16-bit" for row in report.variants for v in row}), "compile_s": compile_s,
            "bits": report.best["bits"], "peak_gib": peak, "base_gib": base, "threads": torch.get_num_threads(),
            "load": load}


def child_memory(preset: str) -> dict:
    """CogVideoX-2B built in memory in bf16, then ``convert_model`` with ``preset``: peak RSS."""
    import diffusers
    import torch

    import sixbit

    cls, kwargs = CONFIGS["CogVideoX-2B"]
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no fp32 copy before the conversion
    model = getattr(diffusers, cls)(**kwargs)
    torch.set_default_dtype(torch.float32)
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
    start = _rss_gib()
    t0 = time.perf_counter()
    sixbit.convert_model(model, None, _config(preset))
    seconds = time.perf_counter() - t0
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"seconds": seconds, "peak_gib": _peak_gib(), "start_gib": start, "model_bytes": model_bytes,
            "held_bytes": held, "end_gib": _rss_gib(), "tmpdir": os.environ.get("TMPDIR", "")}


def child_real(folder: str, preset: str, output: str, frames: int, side: str) -> dict:
    """A real-size folder converted by ``convert_pretrained`` with ``preset`` (GPTQ calibrated on
    two random-latent calls of ``frames`` latent frames at ``side``): time, peak RSS, bytes."""
    import torch

    import sixbit

    base = _rss_gib()
    result = sixbit.convert_pretrained(folder, _config(preset), output, _calibration(folder, frames, side), progress=False)
    blocks = [s for p, s in result.part_seconds.items() if p not in ("outside blocks", "calibration runs")]
    return {"seconds": result.seconds, "block_s": statistics.median(blocks), "blocks": len(blocks),
            "calibration_s": result.part_seconds.get("calibration runs", 0.0),
            "outside_s": result.part_seconds.get("outside blocks", 0.0), "peak_gib": _peak_gib(), "base_gib": base,
            "source_bytes": result.source_bytes, "checkpoint_bytes": result.checkpoint_bytes,
            "threads": torch.get_num_threads()}


def child_shipped(model: str, preset: str, pairs: int, offset: int) -> dict:
    """A shipped pipeline converted by ``convert_model`` with ``preset``, calibrated as ``sixbit
    convert`` does by default (8 prompts, every 6th from ``offset``, the pipeline's 20 steps):
    seconds and calibration pipeline calls; then the held-out videos' PSNR / SSIM against the
    full-precision ones."""
    import torch

    import sixbit
    from sixbit.eval.metrics import psnr, ssim
    from sixbit.zoo.shapes.judge import generate_heldout
    from sixbit.pipelines import load_pipeline
    from sixbit.zoo.shapes import all_prompts, heldout_pairs

    from sixbit.convert import calibration_runner

    pipe = load_pipeline(model)
    held = heldout_pairs(pairs)
    reference, _ = generate_heldout(pipe, held)
    prompts = all_prompts()[offset::6]
    _, generation_s = _timed(calibration_runner(prompts, pipe, {})[0])  # the calibration's videos alone, no hook
    cls, call, calls = type(pipe), type(pipe).__call__, []

    def counted(self, *args, **kwargs):
        calls.append(1)
        return call(self, *args, **kwargs)

    cls.__call__ = counted
    try:
        t0 = time.perf_counter()
        sixbit.convert_model(pipe, prompts, preset)
        seconds = time.perf_counter() - t0
    finally:
        cls.__call__ = call
    videos, _ = generate_heldout(pipe, held)  # one pipeline call: the conversion's last run
    conversion = sixbit.conversion_of(pipe.transformer)
    return {"seconds": seconds, "generation_s": generation_s, "pipeline_calls": len(calls), "psnr": psnr(videos, reference),
            "ssim": ssim(videos, reference), "pairs": pairs, "threads": torch.get_num_threads(),
            "act_bits": None if conversion is None else conversion.average_act_bits()}


# ----------------------------------------------------------------------------- tables

def _s(v: float) -> str:
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def section_profile(results: dict) -> str:
    from report import machine_description

    after = results["profile"]
    before = results.get("profile_before", {})
    threads = next(iter(after.values()))["threads"]
    lines = [
        "## Conversion cost, stage by stage: the `w4a8` recipe on one weight",
        "",
        f"Written by `python benchmarks/bench_conversion.py --parts profile` on {machine_description()}, {threads} threads. "
        "One weight of each shape (N × K: the attention projection, the FFN's up and down projections) at three "
        "model widths, random weights and a Hessian from random inputs (the cost does not depend on the values). "
        f"*Hessian*: `hessians.collect` over {CALIB_ROWS:,} bf16 rows (two calibration calls of batch 2, 4 latent "
        "frames at 480p), the layer's own forward subtracted; *rotate*: its Hadamard rotation; *SVD*, *scale search*, "
        "*GPTQ*: one of each; *layer*: `quantize_weight` whole (three scale searches and three SVDs: the low-rank "
        "branch is refit twice, then GPTQ and packing). Seconds, each stage timed once; *before*: the same child on "
        "the `--before` checkout (the code before these changes), on the same machine, its rows measured by the "
        "same script before the *after* rows (quiet both times).",
        "",
        "| width | weight N × K | rank | Hessian | rotate | SVD | scale search | GPTQ | layer | layer before | speed-up |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for width in sorted(after, key=int):
        old = {tuple(r["shape"]): r for r in before.get(width, {}).get("rows", [])}
        for r in after[width]["rows"]:
            b = old.get(tuple(r["shape"]))
            tail = f"{_s(b['layer'])} | {b['layer'] / r['layer']:.1f}×" if b else "– | –"
            lines.append(f"| {width} | {r['shape'][0]} × {r['shape'][1]} | {r['rank']} | " +
                         " | ".join(_s(r[s]) for s in STAGES) + f" | {tail} |")
    if before:
        lines += ["", "Stage by stage before (same order):", "",
                  "| width | weight N × K | Hessian | rotate | SVD | scale search | GPTQ | layer |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|"]
        for width in sorted(before, key=int):
            for r in before[width]["rows"]:
                lines.append(f"| {width} | {r['shape'][0]} × {r['shape'][1]} | " +
                             " | ".join(_s(r[s]) for s in STAGES) + " |")
    compile_s = statistics.median(v["compile_s"] for v in after.values())
    lines += ["", f"Compiling the CPU kernels of the scale search (once per process, in the warm-up): ~{compile_s:.0f} s."]
    return "\n".join(lines)


def section_block(results: dict) -> str:
    from report import machine_description

    rows = results.get("block", {})
    lines = [
        "## Conversion time per block at Wan2.1-1.3B's width, streamed",
        "",
        f"Written by `python benchmarks/bench_conversion.py --parts block` on {machine_description()}. Two Wan2.1-1.3B "
        "blocks (dim 1536, FFN 8960) with random bf16 weights on disk, converted by `sixbit.convert_pretrained`. "
        "`w4a8`: GPTQ + MSE scales + the low-rank branch, calibrated on two random-latent calls of 4 latent frames at "
        "480p (60 × 104 latents, 6,240 tokens, batch 2; each block's inputs kept once and replayed); `w4a8 (layout)`: "
        "the same formats rounded to nearest; `w4a8 (full-precision inputs)`: `w4a8` with "
        "`calibration_inputs=\"full_precision\"` (each block calibrated on the full-precision block's outputs, which "
        "the replay that gives its Hessians records: no replay of the quantized block). *s / block*: the first block (its Hessians from a replay of its kept "
        "inputs, rounding, and the replay of the quantized block that gives the next block its inputs: the work of "
        "every block but the last), the CPU kernels compiled before (*compile s*, once per process); *last block*: "
        "the same without the replay where the code skips it; *calibration*: the one full-precision pass that records "
        "the first block's inputs. "
        "*output error*: mean squared error of the converted 2-block model's output against bf16 on a held-out call, "
        "relative to the output's mean square; *vs RTN*: its ratio to the round-to-nearest layout's. *before*: the "
        "`--before` checkout, measured by the same script on the same machine, each child after the other. *load*: "
        "the machine's 5-minute load average when the conversion ended (above the core count: other processes "
        "shared the cores, and every time is longer than on a quiet machine).",
        "",
        "| code | preset | s / block | last block s | compile s | calibration s | total s | output error | vs RTN | peak GiB | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for code in ("before", "after"):
        got = rows.get(code, {})
        rtn = got.get("w4a8 (layout)", {}).get("relative_mse")
        for preset, r in got.items():
            if "error" in r:
                lines.append(f"| {code} | `{preset}` | {r['error']} | | | | | | | | |")
                continue
            ratio = f"{r['relative_mse'] / rtn:.2f}×" if rtn else "–"
            load = f"{r['load']:.1f}" if "load" in r else "–"
            lines.append(f"| {code} | `{preset}` | {_s(r['block_s'])} | {_s(r['last_block_s'])} | {_s(r['compile_s'])} | "
                         f"{_s(r['calibration_s'])} | {_s(r['seconds'])} | "
                         f"{r['relative_mse']:.3g} | {ratio} | {r['peak_gib']:.2f} | {load} |")
    if "tune" in results:
        lines += ["", *_tune_table(results["tune"])]
    if "dmpq" in results:
        lines += ["", *_dmpq_table(results["dmpq"])]
    return "\n".join(lines)


def _dmpq_table(r: dict) -> list[str]:
    """The streamed DMPQ conversion's row of ``conversion-block`` (``--parts dmpq``)."""
    if "error" in r:
        return [f"`w4a6-dynamic` streamed on the same folder: {r['error']}"]
    return [
        "**DMPQ, streamed** (`python benchmarks/bench_conversion.py --parts dmpq`): `sixbit.convert_pretrained` with "
        "`w4a6-dynamic` on the same 2-block folder: the blocks converted one at a time as by `w4a8` (GPTQ, the same "
        "two calibration calls), then the converted model loaded from its parts (mapped) and DMPQ fitted on its "
        "generations, the two calls' outputs standing in for the videos (random weights make none). *s / block* and "
        "*calibration* as above; *fit*: loading the converted model and DMPQ's whole fit (*runs*: its calibration "
        "runs, NVFP4 activations emulated on this CPU); *ranges*: the predictor's step ranges. *load* as above; "
        "measured in a run of its own." + (" Two calls make two steps: the first has no Γ and runs INT8 (half the FLOPs), so even "
                       "NVFP4 in every later call stays above 6 bits on average and the threshold is unbounded; the "
                       "fit's cost, not its choice, is what this row measures." if r["threshold"] == float("inf") else ""),
        "",
        "| job | s / block | last block s | compile s | calibration s | fit s | runs | ranges | total s | peak GiB | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| `w4a6-dynamic` | {_s(r['block_s'])} | {_s(r['last_block_s'])} | {_s(r['compile_s'])} | "
        f"{_s(r['calibration_s'])} | {_s(r['fit_s'])} | {r['fit_runs']} | {r['step_ranges']} | {_s(r['seconds'])} | "
        f"{r['peak_gib']:.2f} | {r['load']:.1f} |",
    ]


def _tune_table(r: dict) -> list[str]:
    """The streamed tuning's row of ``conversion-block`` (``--parts tune``)."""
    if "error" in r:
        return [f"`sixbit.tune_pretrained` on the same folder: {r['error']}"]
    s, blocks = r["seconds"], r["block_s"]
    formats = ", ".join(f"`{f}`" for f in r["formats"])
    return [
        f"**Tuning, streamed** (`python benchmarks/bench_conversion.py --parts tune`): `sixbit.tune_pretrained` on the "
        f"same 2-block folder, the `w4a8` recipe, candidates {formats} for each of the {r['layers']} attention and "
        f"feed-forward linears, `max_bits={r['max_bits']:g}`, calibrated on the same two calls (their outputs stand in "
        "for the videos), one block in memory. *s / block*: stage 1 per block (its Hessians replayed from the kept "
        "inputs, every candidate built with GPTQ and priced by the block's output error on up to 3 kept calls (both "
        "calls here: one block replay per candidate), the "
        "full-precision replay that feeds the next block; block 0, then the last block, which has no replay); "
        "*calibration*: the streamed run that keeps the first block's inputs; *fit*: the whole runs that map block "
        "error to output error; *search + checks*: the genetic search on the predictions and the whole runs that "
        "check its pick. *load* as above; measured in a run of its own.",
        "",
        "| job | s / block | last block s | compile s | calibration s | fit s | search + checks s | total s | bits | "
        "peak GiB | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| tune | {_s(blocks[0])} | {_s(blocks[-1])} | {_s(r['compile_s'])} | {_s(s['calibration run'])} | "
        f"{_s(s['fit'])} | {_s(s['search'] + s['pick'])} | {_s(sum(s.values()))} | {r['bits']:.2f} | "
        f"{r['peak_gib']:.2f} | {r['load']:.1f} |",
    ]


def section_memory(results: dict) -> str:
    from report import machine_description

    lines = [
        "## In-memory conversion: peak memory of `convert_model` at CogVideoX-2B size",
        "",
        f"Written by `python benchmarks/bench_conversion.py --parts memory` on {machine_description()}. CogVideoX-2B's "
        "configuration with random weights, built in memory in bf16, then `sixbit.convert_model(model, None, config)` "
        "with the `w4a8` layout (NVFP4 with the low-rank branch, rounded to nearest). Peak: the child's RSS "
        "high-water mark from just before the conversion, Python, torch and the model included; *target*: 1.3 × the "
        "model's bytes + 1 GiB. *spilled*: the replaced layers wait in a temporary file on disk (the default); "
        "*in memory*: `TMPDIR` on tmpfs, where spilling would not free memory, so they stay (as before spilling). "
        "Times are not compared here (`conversion-profile` and `conversion-block` measure them).",
        "",
        "| code | replaced layers | model GiB | RSS before GiB | peak GiB | target GiB | RSS after GiB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, r in results["memory"].items():
        if "error" in r:
            lines.append(f"| {key} | {r['error']} | | | | | |")
            continue
        model = r["model_bytes"] / 2**30
        target = 1.3 * model + 1
        mark = "✓" if r["peak_gib"] <= target else "✗"
        code, where = key.split(":")
        lines.append(f"| {code} | {where} | {model:.2f} | {r['start_gib']:.2f} | {r['peak_gib']:.2f} {mark} | "
                     f"{target:.2f} | {r['end_gib']:.2f} |")
    return "\n".join(lines)


REAL = {  # model: (blocks written, of the model's, calibration latent frames and side (480p))
    "CogVideoX-2B": (None, 30, 4, "60x90"),
    "Wan2.1-14B": (2, 40, 4, "60x104"),
}


def section_real(results: dict) -> str:
    from report import machine_description

    lines = [
        "## Real sizes with real GPTQ: the `w4a8` recipe streamed",
        "",
        f"Written by `python benchmarks/bench_conversion.py --parts real` on {machine_description()}. Random bf16 "
        "weights on disk (the shape is what costs), converted by `sixbit.convert_pretrained` with the full `w4a8` "
        "recipe (GPTQ + MSE scales + the low-rank branch, calibrated on two random-latent calls of 4 latent frames "
        "at 480p, batch 2: 480 × 720 for CogVideoX, 480 × 832 for Wan; the first block's inputs kept once and "
        "replayed block by block). *blocks*: converted here of the model's; with fewer, the model's time is projected "
        "as the calibration pass scaled to all blocks + the median block × all blocks + the layers outside the "
        "blocks (issue 45's target for Wan2.1-14B: ≤ 8 h). Peak: the child's RSS high-water mark, Python and torch "
        "included.",
        "",
        "| model | blocks | s / block | calibration s | convert s | model's time | peak GiB | checkpoint GiB | vs bf16 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, r in results.get("real", {}).items():
        if "error" in r:
            lines.append(f"| {model} | {r['error']} | | | | | | | |")
            continue
        _, total_blocks, _, _ = REAL[model]
        if r["blocks"] == total_blocks:
            whole = f"{r['seconds'] / 3600:.2f} h (measured)"
            ckpt = f"{r['checkpoint_bytes'] / 2**30:.2f}"
            ratio = f"{r['source_bytes'] / r['checkpoint_bytes']:.2f}×"
        else:
            projected = r["calibration_s"] * total_blocks / r["blocks"] + r["block_s"] * total_blocks + r["outside_s"]
            whole = f"{projected / 3600:.2f} h (projected)"
            ckpt, ratio = "–", f"{r['source_bytes'] / r['checkpoint_bytes']:.2f}× ({r['blocks']} blocks + the layers outside)"
        lines.append(f"| {model} | {r['blocks']} of {total_blocks} | {_s(r['block_s'])} | {_s(r['calibration_s'])} | "
                     f"{_s(r['seconds'])} | {whole} | {r['peak_gib']:.2f} | {ckpt} | {ratio} |")
    return "\n".join(lines)


def _before_labels(results: dict) -> str:
    """What *before* was, per preset (``--before-label``; the code before issue 45 where none was given)."""
    labels = results.get("shipped_before_label", {})
    presets = dict.fromkeys(key.split(":")[1] for key in results["shipped"].get("after", {}))
    by_label: dict[str, list[str]] = {}
    for preset in presets:
        by_label.setdefault(labels.get(preset, "the code before issue 45"), []).append(f"`{preset}`")
    return "; ".join(f"{label} ({', '.join(names)})" for label, names in by_label.items())


def section_shipped(results: dict) -> str:
    from report import machine_description

    rows = results["shipped"]
    pairs = next(r["pairs"] for by_code in rows.values() for runs in by_code.values() for r in runs if "pairs" in r)
    sets = max(len(runs) for by_code in rows.values() for runs in by_code.values())
    lines = [
        "## Conversion time and quality on the shipped models, before and after",
        "",
        f"Written by `python benchmarks/bench_conversion.py --parts shipped --calib-sets {sets}` on "
        f"{machine_description()}. Each shipped "
        "pipeline (fp32) converted by `sixbit.convert_model(pipe, prompts, preset)` with the calibration `sixbit "
        "convert` uses by default: 8 prompts (every color, shape and direction), the pipeline's 20 steps, CFG, in "
        "pipeline calls of 4 prompts. *convert s*: the whole `convert_model` call; *generation s*: those 8 videos "
        "generated once by the same pipeline with nothing converted or recorded (the least one calibration run costs); "
        "*pipeline calls*: the "
        f"calibration's (GPTQ, and DMPQ's cost map for `w4a6-dynamic`: its NVFP4 activations are EMULATED on this "
        "CPU, so its convert s measures emulation), the median over the calibration prompt sets; "
        f"PSNR / SSIM: {pairs} held-out (prompt, seed) pairs, 20 steps, against the same pipeline's full-precision "
        f"videos, the mean over the calibration prompt sets (*sets*: every 6th prompt from 0, 1, …, up to {sets - 1}; range in "
        "brackets) where there are several: one conversion's PSNR moves by up to ±1 dB with changes as small as the "
        "order of a sum; for DMPQ, at the held-out videos' mean GEMM-FLOP-weighted activation bits. *Δ PSNR*: after − before, paired by calibration set, ± its standard error (the paired "
        "differences' SD / √sets). *before*: the `--before` checkout, the same script, machine and session: "
        f"{_before_labels(results)}.",
        "",
        "| model | preset | code | sets | convert s | generation s | pipeline calls | PSNR dB | SSIM | speed-up | Δ PSNR dB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    def mean(runs, key):
        return statistics.mean(r[key] for r in runs)

    def median_s(runs):
        return statistics.median(r["seconds"] for r in runs)

    def delta(after, before):
        diffs = [a["psnr"] - b["psnr"] for a, b in zip(after, before)]
        se = f" ± {statistics.stdev(diffs) / len(diffs) ** 0.5:.2f}" if len(diffs) > 1 else ""
        return f"{statistics.mean(diffs):+.2f}{se}"

    for key in rows.get("after", {}):
        model, preset = key.split(":")
        before = [r for r in rows.get("before", {}).get(key, []) if "error" not in r]
        for code in ("before", "after"):
            runs = rows.get(code, {}).get(key, [])
            failed = [r for r in runs if "error" in r]
            if failed:
                lines.append(f"| {model} | `{preset}` | {code} | | {failed[0]['error']} | | | | | | |")
                continue
            if not runs:
                continue
            psnr = f"{mean(runs, 'psnr'):.2f}"
            if len(runs) > 1:
                psnr += f" ({min(r['psnr'] for r in runs):.2f}–{max(r['psnr'] for r in runs):.2f})"
            if preset.endswith("-dynamic") and all(r.get("act_bits") for r in runs):
                psnr += f" at {mean(runs, 'act_bits'):.2f} bits"
            tail = "| |"
            if code == "after" and before:
                tail = f"| {median_s(before) / median_s(runs):.2f}× | {delta(runs, before)} |"
            generation = statistics.median(r["generation_s"] for r in runs) if "generation_s" in runs[0] else None
            lines.append(f"| {model} | `{preset}` | {code} | {len(runs)} | {_s(median_s(runs))} | "
                         f"{'–' if generation is None else _s(generation)} | {runs[0]['pipeline_calls']} | "
                         f"{psnr} | {mean(runs, 'ssim'):.4f} {tail}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="profile,block,tune,dmpq,memory,real,shipped")
    parser.add_argument("--max-bits", type=float, default=5.0, help="the streamed tuning's target (--parts tune)")
    parser.add_argument("--shipped-presets", default="w4a8,w4a16,w4a6-dynamic")
    parser.add_argument("--pairs", type=int, default=8, help="held-out pairs per shipped model")
    parser.add_argument("--calib-sets", type=int, default=3, help="calibration prompt sets per shipped conversion "
                        "(every 6th prompt from 0, 1, …): PSNR is their mean")
    parser.add_argument("--widths", default=",".join(str(w) for w in WIDTHS))
    parser.add_argument("--before", help="another checkout's src/ to measure beside this one")
    parser.add_argument("--before-label", help="what the --before checkout is, for the shipped table's text")
    parser.add_argument("--workdir", default="/tmp/sixbit-conversion")
    parser.add_argument("--rss-limit-gib", type=float, default=20.0)
    parser.add_argument("--json", help="write raw results here (and read previous ones from it to merge)")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child_mode({"profile": child_profile, "block": child_block, "tune": child_tune, "dmpq": child_dmpq,
                               "memory": child_memory, "shipped": child_shipped,
              "real": child_real, "write": child_write}, args.child)

    from report import update_section

    results = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() else {}
    codes = {"after": ROOT / "src", **({"before": Path(args.before)} if args.before else {})}

    def run(child: list[str], src: Path, env: dict | None = None) -> dict:
        return _run_child(child, args.rss_limit_gib, log, script=__file__, src=src, env=env)

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))

    parts = args.parts.split(",")
    if "profile" in parts:
        for code, src in codes.items():
            key = "profile" if code == "after" else "profile_before"
            for width in args.widths.split(","):
                log(f"profile ({code}): width {width}")
                results.setdefault(key, {})[width] = r = run(["profile", width], src)
                log(f"{r}")
                save()
        update_section(args.output, "conversion-profile", section_profile(results))
    folder = Path(args.workdir) / "Wan2_1-1_3B-2blocks"
    if {"block", "tune", "dmpq"} & set(parts) and not (folder / "config.json").exists():
        log(f"writing 2 random Wan2.1-1.3B blocks to {folder}")
        log(f"{run(['write', 'Wan2.1-1.3B', str(folder), '2'], codes['after'])}")
    if "tune" in parts:
        log(f"tune: max_bits {args.max_bits:g}")
        results["tune"] = r = {**run(["tune", str(folder), str(args.max_bits)], codes["after"]), "max_bits": args.max_bits}
        log(f"{r}")
        save()
    if "dmpq" in parts:
        output = Path(args.workdir) / "block-dmpq.safetensors"
        log("dmpq: w4a6-dynamic, streamed")
        results["dmpq"] = r = run(["dmpq", str(folder), str(output)], codes["after"])
        log(f"{r}")
        output.unlink(missing_ok=True)
        save()
    if "block" in parts:
        if "before" not in codes:  # rows measured now are not set beside a before measured elsewhere
            results.get("block", {}).pop("before", None)
        for code, src in codes.items():
            # the code before this row's streamed conversion ignored calibration_inputs
            for preset in ("w4a8 (layout)", "w4a8") + (("w4a8 (full-precision inputs)",) if code == "after" else ()):
                output = Path(args.workdir) / f"block-{code}-{preset.replace(' ', '_')}.safetensors"
                log(f"block ({code}): {preset}")
                results.setdefault("block", {}).setdefault(code, {})[preset] = r = run(
                    ["block", str(folder), preset, str(output)], src)
                log(f"{r}")
                output.unlink(missing_ok=True)
                save()
    if {"block", "tune", "dmpq"} & set(parts):
        update_section(args.output, "conversion-block", section_block(results))
    if "memory" in parts:
        for code, src in codes.items():
            for where, env in (("spilled", {}), ("in memory", {"TMPDIR": "/dev/shm"})):
                if code == "before" and where == "spilled":
                    continue  # the code before had nowhere to spill them
                log(f"memory ({code}, {where})")
                results.setdefault("memory", {})[f"{code}:{where}"] = r = run(["memory", "w4a8 (layout)"], src, env)
                log(f"{r}")
                save()
        update_section(args.output, "conversion-memory", section_memory(results))
    if "real" in parts:
        for model, (blocks, _, frames, side) in REAL.items():
            folder = Path(args.workdir) / f"{model.replace('.', '_')}-{blocks or 'all'}"
            if not (folder / "config.json").exists():
                log(f"writing random bf16 {model} ({blocks or 'all'} blocks) to {folder}")
                log(f"{run(['write', model, str(folder), str(blocks or 'none')], codes['after'])}")
            output = Path(args.workdir) / f"real-{model}.safetensors"
            log(f"real: {model} w4a8")
            results.setdefault("real", {})[model] = r = run(["real", str(folder), "w4a8", str(output), str(frames), side],
                                                            codes["after"])
            log(f"{r}")
            output.unlink(missing_ok=True)
            save()
        update_section(args.output, "conversion-real", section_real(results))
    if "shipped" in parts:
        for preset in args.shipped_presets.split(","):
            for model in ("shapes-cogvideox", "shapes-wan"):
                for code, src in codes.items():
                    if code == "before" and args.before_label:
                        results.setdefault("shipped_before_label", {})[preset] = args.before_label
                    runs = results.setdefault("shipped", {}).setdefault(code, {})[f"{model}:{preset}"] = []
                    for offset in range(args.calib_sets):
                        log(f"shipped ({code}): {model} {preset}, calibration set {offset}")
                        r = run(["shipped", model, preset, str(args.pairs), str(offset)], src)
                        runs.append(r)
                        log(f"{r}")
                        save()
        update_section(args.output, "conversion-shipped", section_shipped(results))
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
