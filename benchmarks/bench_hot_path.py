"""Hot-path cost of a quantized linear, and torch.compile of the shipped models → BENCHMARKS.md.

    python benchmarks/bench_hot_path.py                      # both sections (see --help for sizes)
    python benchmarks/bench_hot_path.py --section linear     # only A: per-call cost of QuantLinear
    python benchmarks/bench_hot_path.py --section compile    # only B: torch.compile, eager vs compiled
    python benchmarks/bench_hot_path.py --quick --no-write   # smoke run: tiny sizes, print only

**A. Per-call cost** (section ``hot-path-linear``). One ``sixbit.nn.QuantLinear`` per setting,
built with ``QuantLinear.from_linear`` from a random fp32 ``nn.Linear`` (the shape is what
costs): W4A8 (NVFP4 weight, INT8 activations: the weight is re-rounded to INT8 on every call,
a block of rows at a time), W8A8 (INT8 weight and activations), W4A16 (NVFP4 weight only), beside a
bf16 and an fp32 ``nn.Linear``. NVFP4 weights get the presets' Hadamard rotation (the largest
block ≤ 128 dividing ``in_features``). Shapes: the distinct linear shapes inside the blocks of
the shipped tiny CogVideoX, with the rows one transformer call feeds them at the pipeline's
default size (read by hooks during a real call), and CogVideoX-2B's block linears at
2 × (226 + 4 × 32 × 32 / 4) = 2500 rows. Time: median of timed calls after one warm-up call
(at ≤ 64 rows, which fills the lazily built tables) and one profiled call at full size (which
counts as a timed call when it takes ≥ 1 s: the profiler's cost is microseconds per op); the
settings of one shape are timed round-robin (rotating order), so their ratios share the
machine's load; a setting stops at ``--runs`` timed calls or once its shape has spent
``--budget`` seconds (at least one timed call each). Memory: the profiled call runs under
``torch.profiler.profile(profile_memory=True)``, which records every allocation and free of
torch's CPU allocator with its address; pairing them gives the peak of live bytes during the
call (output included), the largest temporary (allocated and freed inside the call), what
is still held at return (the output) and the allocator traffic; a second profiled call on one
row shows what the weight side allocates per call whatever the number of tokens.
``tracemalloc`` cannot be used: torch allocates outside Python's allocator. The method is
checked at start-up on a function whose allocations are known exactly (the script stops if it
disagrees by one byte). Not seen: memory that oneDNN allocates with its own allocator (GEMM
scratchpads).

**B. torch.compile** (section ``hot-path-compile``). Each (model, setting) runs in a fresh
process with its own empty inductor cache (so compile times are cold-start times): load the
shipped pipeline, convert with ``sixbit.convert_model`` (``balanced`` calibrates on a few zoo
prompts), time generations eagerly (one warm-up, median of the rest), count graph breaks of one
transformer call with ``torch._dynamo.explain`` on the call's captured inputs, then
``pipe.transformer.compile()`` (``nn.Module.compile``: compiles the module's call in place, so
the object, its diffusers hooks and sixbit's registry entries stay as they were;
``pipe.transformer = torch.compile(pipe.transformer)`` puts an ``OptimizedModule`` in the pipeline:
generation still runs, but ``sixbit.conversion_of(pipe)`` then returns ``None``), time the first compiled generation
(compile included) and then the median of the rest, and compare the compiled video with the
eager one (same prompt, seed and steps). A failure at any stage is a row saying so, not a crash.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
SECTION_LINEAR = "hot-path-linear"
SECTION_COMPILE = "hot-path-compile"
MiB = 2**20

# ----------------------------------------------------------------------------- A: one linear

# (label, weight format or None for a plain nn.Linear, act mode or the nn.Linear's dtype).
# The bf16 nn.Linear comes first: it is every row's reference.
SETTINGS: list[tuple[str, str | None, str | torch.dtype]] = [
    ("bf16 nn.Linear", None, torch.bfloat16),
    ("fp32 nn.Linear", None, torch.float32),
    ("W8A8 (int8 / int8)", "int8", "int8"),
    ("W4A8 (nvfp4 / int8)", "nvfp4", "int8"),
    ("W4A16 (nvfp4 / fp)", "nvfp4", "fp"),
]
HADAMARD_LIMIT = 128  # the presets' hadamard_block for NVFP4 weights
COG2B_ROWS = 2 * (226 + 4 * 32 * 32 // 4)
SLOW_CALL_S = 1.0  # a profiled call at least this long counts as a timed call
COG2B_SHAPES = [("attn q/k/v/out", 1920, 1920), ("FF up", 1920, 7680), ("FF down", 7680, 1920)]


def quantized_call(linear: nn.Linear, weight_format: str, act_mode: str) -> tuple[nn.Module, Callable]:
    """Build the ``QuantLinear`` of one setting and return ``(layer, function to time)``.

    The ONE place that decides a layer's activation precision: today ``act_mode`` is a
    ``from_linear`` argument and a settable attribute; when it is decided by a precision scope
    instead, build without it here and return ``lambda x: <scope(act_mode)>: layer(x)``.
    """
    from sixbit.nn import QuantLinear
    from sixbit.transforms.hadamard import BLOCK_SIZES

    block = None
    if weight_format == "nvfp4":  # as sixbit.quantize does for the presets' hadamard_block=128
        fits = [b for b in BLOCK_SIZES if b <= HADAMARD_LIMIT and linear.in_features % b == 0]
        block = max(fits) if fits else None
    layer = QuantLinear.from_linear(linear, weight_format, hadamard_block=block, act_mode=act_mode)
    return layer, layer


def path_of(layer: nn.Module) -> str:
    """How a setting runs, from the layer itself (QuantLinear.execution) where it says."""
    if hasattr(layer, "execution"):
        return layer.execution()
    return f"{str(next(layer.parameters()).dtype).removeprefix('torch.')} F.linear (real)"


def call_memory(fn: Callable, x: torch.Tensor) -> dict:
    """Allocations of one call ``fn(x)`` on torch's CPU allocator, from the profiler's memory events.

    Returns bytes: ``peak`` (most bytes live at once during the call, its output included),
    ``largest_temp`` (the largest single allocation freed before the call returned),
    ``held`` (allocated during the call and still live after it: the output) and ``allocated``
    (the sum of every allocation: the allocator traffic).
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(x)
    del out  # freed after the profiler stopped: not part of the events
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size))
    live, open_, peak, largest, total = 0, {}, 0, 0, 0
    for _, ptr, size in sorted(events, key=lambda t: t[0]):
        live += size
        peak = max(peak, live)
        if size > 0:
            open_[ptr] = size
            total += size
        elif ptr in open_:  # freed inside the call: a temporary
            largest = max(largest, open_.pop(ptr))
    held = sum(open_.values())
    return {"peak": peak, "largest_temp": largest, "held": held, "allocated": total}


def check_memory_method() -> None:
    """Stop unless :func:`call_memory` reports the exact bytes of a function whose allocations are known."""
    x = torch.ones(1000, 250)  # 1 000 000 bytes
    # (x + 1): 1 MB temporary; .mul_ in place; + x: 1 MB output, then the temporary is freed.
    got = call_memory(lambda t: (t + 1).mul_(2) + t, x)
    want = {"peak": 2_000_000, "largest_temp": 1_000_000, "held": 1_000_000}
    # allocated also counts the 0-d tensors that wrap the Python scalars (a few bytes each).
    if {k: got[k] for k in want} != want or not 2_000_000 <= got["allocated"] < 2_000_000 + 1024:
        raise SystemExit(f"memory measurement self-check failed: got {got}, expected {want}")


def tiny_cogvideox_shapes() -> tuple[list[tuple[str, int, int, int]], int]:
    """Distinct ``(layers, in, out, rows)`` of the linears inside the shipped CogVideoX's blocks,
    rows read by hooks during one transformer call at the pipeline's default size; and the
    number of blocks."""
    from sixbit.models import iter_blocks
    from sixbit.zoo.shapes import load_pipeline

    pipe = load_pipeline("cogvideox")
    seen: dict[tuple[int, int, int], list[str]] = {}
    handles, blocks = [], 0
    for _, bname, block, _ in iter_blocks(pipe.transformer):
        blocks += 1
        for name, mod in block.named_modules():
            if isinstance(mod, nn.Linear):
                def hook(m, args, name=f"{bname}.{name}"):
                    key = (m.in_features, m.out_features, args[0].numel() // m.in_features)
                    if name not in seen.setdefault(key, []):
                        seen[key].append(name)
                handles.append(mod.register_forward_pre_hook(hook))
    pipe("a red circle moving right", num_inference_steps=1, generator=torch.Generator().manual_seed(0))
    for h in handles:
        h.remove()
    rows = []
    for (k, n, m), names in sorted(seen.items(), key=lambda kv: (-kv[0][2] * kv[0][0] * kv[0][1])):
        roles = sorted({nm.split(".", 2)[2] for nm in names})
        rows.append((", ".join(roles), k, n, m))
    return rows, blocks


def _timed(fn, x) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def measure_shape(k: int, n: int, rows: int, runs: int, budget: float, log) -> list[dict]:
    """Every setting on one (in=k, out=n) shape at ``rows`` rows: time, memory, bytes."""
    torch.manual_seed(0)
    base = nn.Linear(k, n)  # fp32, like the shipped models
    cases = []
    for label, fmt, mode in SETTINGS:
        if fmt is None:
            layer = copy.deepcopy(base).to(mode)
            fn, dtype = layer, mode
            weight_bytes = layer.weight.numel() * layer.weight.element_size()
        else:
            layer, fn = quantized_call(base, fmt, mode)
            dtype = torch.float32
            weight_bytes = layer.weight_nbytes()
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)).to(dtype)
        cases.append(dict(label=label, fn=fn, x=x, path=path_of(layer), weight_bytes=weight_bytes, times=[]))
    with torch.no_grad():
        for c in cases:  # warm-up: lazily built tables (Hadamard matrix, E2M1 codebook) and kernels
            c["fn"](c["x"][: min(rows, 64)])
        for c in cases:  # one row: what is left is what the weight costs per call, whatever the tokens
            c["memory_1row"] = call_memory(c["fn"], c["x"][:1])
        start = time.perf_counter()
        for c in cases:
            t0 = time.perf_counter()
            c["memory"] = call_memory(c["fn"], c["x"])
            took = time.perf_counter() - t0
            if took >= SLOW_CALL_S:  # the profiler's per-op cost (µs) is noise at this length
                c["times"].append(took)
        rounds = 0
        while True:
            spent = time.perf_counter() - start
            need = [c for c in cases if not c["times"] or (len(c["times"]) < runs and spent < budget)]
            if not need:
                break
            shift = rounds % len(need)
            for c in need[shift:] + need[:shift]:
                c["times"].append(_timed(c["fn"], c["x"]))
            rounds += 1
    ref = statistics.median(cases[0]["times"])
    out = []
    for c in cases:
        ms = 1e3 * statistics.median(c["times"])
        out.append(dict(label=c["label"], path=c["path"], calls=len(c["times"]), ms=ms, ratio=ms / (1e3 * ref),
                        weight_bytes=c["weight_bytes"], **c["memory"],
                        peak_1row=c["memory_1row"]["peak"], allocated_1row=c["memory_1row"]["allocated"]))
        log(f"  {k}x{n} @ {rows} rows: {c['label']}: {ms:.2f} ms/call ({len(c['times'])} calls), "
            f"peak {c['memory']['peak'] / MiB:.2f} MiB, largest temp {c['memory']['largest_temp'] / MiB:.2f} MiB")
    return out


def linear_section(args, log) -> str:
    from report import machine_description

    t_start = time.perf_counter()
    check_memory_method()
    tiny, n_blocks = tiny_cogvideox_shapes()
    big_rows = 128 if args.quick else COG2B_ROWS
    groups = [("shapes-cogvideox (shipped tiny model)", role, k, n, m) for role, k, n, m in tiny]
    groups += [("CogVideoX-2B block", role, k, n, big_rows) for role, k, n in COG2B_SHAPES]
    lines = [
        "| model | layers | in → out | rows | fp32 weight MiB | setting | runs as | calls | ms / call | × bf16 nn.Linear "
        "| peak MiB | largest temp MiB | output MiB | allocated MiB | 1-row call: peak / allocated MiB | weight MiB |",
        "|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes, bf16_vs_fp32 = [], []
    for model, role, k, n, m in groups:
        log(f"{model}: {role} {k}→{n}, {m} rows")
        results = measure_shape(k, n, m, args.runs, args.budget, log)
        fp32_weight = k * n * 4
        for r in results:
            lines.append(
                f"| {model} | {role} | {k} → {n} | {m} | {fp32_weight / MiB:.2f} | {r['label']} | {r['path']} | "
                f"{r['calls']} | {r['ms']:.2f} | {r['ratio']:.2f}× | {r['peak'] / MiB:.2f} | "
                f"{r['largest_temp'] / MiB:.2f} | {r['held'] / MiB:.2f} | {r['allocated'] / MiB:.2f} | "
                f"{r['peak_1row'] / MiB:.2f} / {r['allocated_1row'] / MiB:.2f} | {r['weight_bytes'] / MiB:.3f} |"
            )
        by = {r["label"]: r for r in results}
        w4a8, w8a8, w4a16 = by["W4A8 (nvfp4 / int8)"], by["W8A8 (int8 / int8)"], by["W4A16 (nvfp4 / fp)"]
        fp32, bf16 = by["fp32 nn.Linear"], by["bf16 nn.Linear"]
        bf16_vs_fp32.append(bf16["ms"] / fp32["ms"])
        ops = 2 * m * k * n
        notes.append(
            f"- {model}, {k} → {n} at {m} rows: W4A8 takes {w4a8['ms'] / w8a8['ms']:.2f}× W8A8's time (same int8 "
            f"GEMM; W4A8 adds the NVFP4 → INT8 weight conversion and the input's Hadamard rotation). With one row, "
            f"W4A8 still allocates {w4a8['allocated_1row'] / MiB:.2f} MiB per call "
            f"({w4a8['allocated_1row'] / fp32_weight:.1f}× the fp32 weight), peak {w4a8['peak_1row'] / MiB:.2f} MiB "
            f"({w4a8['peak_1row'] / fp32_weight:.1f}×; W4A16 {w4a16['peak_1row'] / fp32_weight:.1f}×, "
            f"W8A8 {w8a8['peak_1row'] / fp32_weight:.2f}×): weight-sized temporaries, whatever the tokens. "
            f"W8A8 takes {w8a8['ms'] / fp32['ms']:.1f}× the fp32 nn.Linear's time "
            f"({ops / w8a8['ms'] / 1e6:.1f} vs {ops / fp32['ms'] / 1e6:.1f} G(FL)OP/s end to end)."
        )
    runs = "--quick" if args.quick else f"--runs {args.runs} --budget {args.budget:g}"
    body = [
        "### Hot path: per-call cost of one quantized linear (issue 15)",
        "",
        f"Written by `python benchmarks/bench_hot_path.py --section linear {runs}` on {machine_description()}, "
        f"in {time.perf_counter() - t_start:.0f} s. One `sixbit.nn.QuantLinear.from_linear` per setting from a "
        "random fp32 `nn.Linear`; input fp32 (the shipped models run in fp32) except for the bf16 `nn.Linear`, "
        "which gets bf16. NVFP4 weights carry the presets' Hadamard rotation (largest block ≤ 128 dividing `in`). "
        f"Shapes: the distinct linears inside the {n_blocks} blocks of the shipped tiny CogVideoX with the rows "
        "one transformer call gives them at the pipeline's default size (8 frames of 32×32, CFG batched: read by "
        f"hooks during a real call), and CogVideoX-2B's block linears at {big_rows} rows"
        + (" (quick run: CogVideoX-2B's real call has 2 × (226 + 4 × 32·32/4) = 2500 rows)" if args.quick else
           " = CFG 2 × (226 text + 4 latent frames × 32·32/4 patches)")
        + ".",
        "",
        "**What runs.** INT8 activations (W8A8, W4A8) run a real integer GEMM, `torch._int_mm` (int32 "
        "accumulation); W4A8 first converts the stored NVFP4 weight to INT8 codes on every call (dequantize to "
        "fp32 and re-round, ≤ 1 MiB of rows at a time: `QuantLinear.int8_weight`). W4A16 dequantizes the NVFP4 weight to the input's dtype on every call, then a real "
        "fp32 matmul. NVFP4 *activations* (not in this table) are emulated: both operands dequantized, fp32 "
        "matmul. *ms / call*: median of *calls* timed calls after a warm-up call (≤ 64 rows) and a profiled call "
        "(which counts as a timed call when it takes ≥ 1 s: the profiler costs microseconds per op); the settings "
        "of a group are timed round-robin, so their ratios share the machine's load; a group stops timing after "
        f"{args.runs} calls per setting or {args.budget:g} s (at least one call each). *× bf16 nn.Linear*: "
        "ms / call ÷ the bf16 row's of the same group.",
        "",
        "**Memory** of one call, from `torch.profiler.profile(profile_memory=True)`: every allocation and free "
        "of torch's CPU allocator during the call, with its address, paired up. *peak*: most bytes live at once "
        "during the call, the output included; *largest temp*: the largest single allocation freed before the "
        "call returned; *output*: what the call still holds at return; *allocated*: the sum of every allocation of "
        "the call (allocator traffic); *1-row call*: peak and allocated of the same layer called on one row, i.e. "
        "what the weight side costs per call whatever the number of tokens; *weight*: the layer's stored weight "
        "(packed codes + scales; bias excluded). `tracemalloc` would see none of it (torch allocates outside "
        "Python's allocator); the method is checked at start-up on a function whose allocations are known to "
        "the byte (the script stops otherwise). Not seen: oneDNN's own scratchpads inside a GEMM.",
        "",
        *lines,
        "",
        f"On this CPU the bf16 nn.Linear takes {min(bf16_vs_fp32):.1f}–{max(bf16_vs_fp32):.1f}× the fp32 one's time "
        f"(CPU capability {torch.backends.cpu.get_cpu_capability()}: no native bf16 matmul), so ratios to it flatter "
        "every row that computes in fp32; compare with the fp32 row as well.",
        "",
        *notes,
    ]
    return "\n".join(body)


# ----------------------------------------------------------------------------- B: torch.compile

COMPILE_SETTINGS = ["fp32", "bf16", "w8a8", "w4a8", "balanced"]
PROMPT, SEED = "a red circle moving right", 0


def _summary(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}"


def _heads(counter) -> list[tuple[str, int]]:
    """Dynamo's graph-break / unsupported counters by first line, with the frame it gave up on, if any."""
    out: dict[str, int] = {}
    for text, n in counter.items():
        head = str(text).strip().splitlines()[0][:160]
        skipped = re.search(r"frame skipped: (\S+) \((.+?) line (\d+)\)", str(text))
        if skipped:
            head += f" → frame skipped: {skipped.group(1)} ({Path(skipped.group(2)).name}:{skipped.group(3)})"
        out[head] = out.get(head, 0) + n
    return sorted(out.items(), key=lambda kv: -kv[1])


def _explain(transformer, args, kwargs) -> dict:
    """Graphs and graph breaks of one transformer call (dynamo's explain: traces, runs, no inductor)."""
    import torch._dynamo

    torch._dynamo.reset()
    with torch.no_grad():
        ex = torch._dynamo.explain(transformer)(*args, **kwargs)
    reasons: dict[str, int] = {}
    for r in ex.break_reasons:
        frame = r.user_stack[-1] if r.user_stack else None
        where = f"{Path(frame.filename).name}:{frame.lineno}" if frame else "?"
        reason = str(r.reason).strip().splitlines()[0][:160]
        key = f"{where} {reason}"
        reasons[key] = reasons.get(key, 0) + 1
    torch._dynamo.reset()
    return {"graphs": ex.graph_count, "breaks": ex.graph_break_count, "ops": ex.op_count, "sites": len(ex.break_reasons),
            "reasons": sorted(reasons.items(), key=lambda kv: -kv[1])}


def child(arch: str, setting: str, steps: int, runs: int, calib_prompts: int, calib_steps: int, threads: int,
          backend: str) -> dict:
    """One (model, setting): eager timings, explain, compiled timings. Every stage reports its own failure."""
    import numpy as np
    import torch._dynamo
    from torch._dynamo.utils import counters

    import sixbit
    from sixbit.eval.metrics import psnr
    from sixbit.presets import resolve
    from sixbit.zoo.shapes import all_prompts, load_pipeline

    torch.set_num_threads(threads)
    res: dict = {"arch": arch, "setting": setting}
    t0 = time.perf_counter()
    pipe = load_pipeline(arch, torch_dtype=torch.bfloat16 if setting == "bf16" else None)
    if setting not in ("fp32", "bf16"):
        calib = all_prompts()[:calib_prompts] if resolve(setting).needs_calibration else None
        sixbit.convert_model(pipe, calib, setting, calibration_kwargs={"num_inference_steps": calib_steps})
    res["setup_s"] = time.perf_counter() - t0

    captured: dict = {}

    def capture(module, args, kwargs):
        if not captured:
            clone = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
            captured["args"] = tuple(clone(a) for a in args)
            captured["kwargs"] = {k: clone(v) if not isinstance(v, tuple) else tuple(clone(t) for t in v)
                                  for k, v in kwargs.items()}

    def generate():
        t = time.perf_counter()
        frames = pipe(PROMPT, num_inference_steps=steps, generator=torch.Generator().manual_seed(SEED)).frames
        return np.asarray(frames, dtype=np.float32), time.perf_counter() - t

    handle = pipe.transformer.register_forward_pre_hook(capture, with_kwargs=True)
    _, res["eager_warmup_s"] = generate()
    handle.remove()
    eager = [generate() for _ in range(runs)]
    ref = eager[0][0]
    res["eager_s"] = [s for _, s in eager]
    res["eager_repeatable"] = all(np.array_equal(v, ref) for v, _ in eager)

    try:
        res["explain"] = _explain(pipe.transformer, captured["args"], captured["kwargs"])
    except Exception as e:  # noqa: BLE001 — the failure is the result
        res["explain_error"] = _summary(e)
        res["explain_trace"] = traceback.format_exc()[-4000:]

    torch._dynamo.reset()
    counters.clear()
    try:
        pipe.transformer.compile(backend=backend)
        first, res["compile_first_s"] = generate()
        compiled = [generate() for _ in range(runs)]
        res["compiled_s"] = [s for _, s in compiled]
        out = compiled[0][0]
        res["max_abs_diff"] = float(np.abs(out - ref).max())
        res["psnr"] = psnr(out, ref)
        res["first_equals_rest"] = bool(np.array_equal(first, out))
    except Exception as e:  # noqa: BLE001
        res["compile_error"] = _summary(e)
        res["compile_trace"] = traceback.format_exc()[-4000:]
    res["counters"] = {
        "graph_breaks_traced": sum(counters["graph_break"].values()),
        "unique_graphs": counters["stats"].get("unique_graphs", 0),
        "frames_ok": counters["frames"].get("ok", 0),
        "frames_total": counters["frames"].get("total", 0),
        "fxgraph_cache_hit": counters["inductor"].get("fxgraph_cache_hit", 0),
        "fxgraph_cache_miss": counters["inductor"].get("fxgraph_cache_miss", 0),
    }
    res["compiled_breaks"] = _heads(counters["graph_break"])
    res["skipped_frames"] = [h for h, _ in _heads(counters["unimplemented"]) if "frame skipped" in h]
    return res


def run_child(arch, setting, args, log) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps([arch, setting]), "--steps", str(args.steps),
           "--gen-runs", str(args.gen_runs), "--calib-prompts", str(args.calib_prompts),
           "--calib-steps", str(args.calib_steps), "--threads", str(args.threads), "--backend", args.backend]
    with tempfile.TemporaryDirectory(prefix="bench-hot-path-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS=str(args.threads))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            log(f"{arch} {setting}: timed out after {args.timeout} s")
            return {"arch": arch, "setting": setting, "child_error": f"timed out after {args.timeout} s "
                    "(the whole row: load, convert, eager, explain, compile)"}
    wall = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        log(f"{arch} {setting}: child failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
        return {"arch": arch, "setting": setting, "child_error": f"process exit {proc.returncode}: {tail[:300]}"}
    res = json.loads(lines[-1])
    res["wall_s"] = wall
    log(f"{arch} {setting}: {wall:.0f} s: " + json.dumps({k: v for k, v in res.items() if not k.endswith('trace')})[:1500])
    for key in ("explain_trace", "compile_trace"):
        if key in res:
            log(f"{arch} {setting} {key}:\n{res[key]}")
    return res


def _row(r: dict) -> str:
    label = {"fp32": "fp32 (no conversion)", "bf16": "bf16 (no conversion)"}.get(r["setting"], f"`{r['setting']}`")
    if "child_error" in r:
        return f"| shapes-{r['arch']} | {label} | – | – | – | – | – | – | fails: {r['child_error']} |"
    eager = statistics.median(r["eager_s"])
    ex = r.get("explain")
    breaks = f"{ex['breaks']} ({ex['graphs']} graphs, {ex['sites']} sites)" if ex else f"explain fails: {r['explain_error']}"
    if "compile_error" in r:
        return (f"| shapes-{r['arch']} | {label} | {eager:.2f} | fails: {r['compile_error']} | – | – | – | {breaks} | "
                f"setup {r['setup_s']:.0f} s |")
    comp = statistics.median(r["compiled_s"])
    p = r["psnr"]
    c = r["counters"]
    notes = f"{c['unique_graphs']} graphs compiled in {c['frames_ok']} of {c['frames_total']} frames"
    if c["fxgraph_cache_hit"]:
        notes += f" ({c['fxgraph_cache_hit']} inductor cache hits: identical graphs within the run)"
    if not r.get("eager_repeatable", True):
        notes += "; eager runs differ between themselves"
    return (f"| shapes-{r['arch']} | {label} | {eager:.2f} | {comp:.2f} | {eager / comp:.2f}× | "
            f"{r['compile_first_s']:.0f} | {r['max_abs_diff']:.2e} / {'∞' if p == float('inf') else f'{p:.1f}'} | "
            f"{breaks} | {notes} |")


def compile_section(args, log) -> str:
    from report import machine_description

    t_start = time.perf_counter()
    results = [run_child(arch, s, args, log) for arch in args.arch for s in args.preset]
    lines = [
        "| model | setting | eager s / gen | compiled s / gen | compiled ÷ eager (same setting) | first compiled gen s (compile incl.) "
        "| max abs Δ / PSNR dB vs eager | graph breaks per transformer call | notes |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
        *[_row(r) for r in results],
    ]
    reasons = []
    for r in results:
        ex = r.get("explain")
        if ex and ex["reasons"]:
            top = "; ".join(f"{n}× `{why}`" for why, n in ex["reasons"][:6])
            more = f" (+{len(ex['reasons']) - 6} more kinds)" if len(ex["reasons"]) > 6 else ""
            reasons.append(f"- shapes-{r['arch']} `{r['setting']}`: {top}{more}")
    skipped = [f"- shapes-{r['arch']} `{r['setting']}`: " + "; ".join(f"`{h}`" for h in r["skipped_frames"])
               for r in results if r.get("skipped_frames")]
    failures = [f"- shapes-{r['arch']} `{r['setting']}`: " + r.get("compile_error", r.get("child_error", ""))
                for r in results if "compile_error" in r or "child_error" in r]
    cmd = "--quick" if args.quick else (f"--backend {args.backend} --steps {args.steps} --gen-runs {args.gen_runs} "
                                        f"--calib-prompts {args.calib_prompts} --calib-steps {args.calib_steps}")
    body = [
        "### Hot path: torch.compile on the shipped models (issue 15)",
        "",
        f"Written by `python benchmarks/bench_hot_path.py --section compile {cmd}` on {machine_description()}, "
        f"in {time.perf_counter() - t_start:.0f} s. One fresh process per row, with an empty inductor cache (compile "
        f"times are cold). Each generation: one prompt, {args.steps} steps, CFG 4 (the pipeline's default), "
        f"{args.threads} CPU thread(s). Presets converted with `sixbit.convert_model(pipe, calibration_data, preset, "
        f"calibration_kwargs={{'num_inference_steps': {args.calib_steps}}})`; `balanced` calibrates on "
        f"{args.calib_prompts} zoo prompts. Compile: `pipe.transformer.compile(backend={args.backend!r})` "
        "(`nn.Module.compile`), which compiles the module's call in place, so the transformer object, its diffusers "
        "hooks and sixbit's per-transformer state stay valid (`pipe.transformer = torch.compile(...)` swaps in an "
        "`OptimizedModule`: generation still runs, but `sixbit.conversion_of(pipe)` then returns `None`). *eager / compiled s / gen*: median of "
        f"{args.gen_runs} generations, eager after one warm-up, compiled after the first compiled generation, "
        "whose time (compile included) has its own column. *max abs Δ / PSNR*: compiled video vs the eager video of "
        "the same seed (pixels in [0, 1]). *graph breaks*: `torch._dynamo.explain` on one transformer call "
        "(the first call of a generation, its inputs captured): its `graph_break_count`, with its `graph_count` and "
        "the number of break sites it lists (`break_reasons`) in brackets. INT8 rows run "
        "`torch._int_mm`; `balanced` runs as it does on a CPU (`sixbit.presets.for_device`): DMPQ's NVFP4 has no "
        "real GEMM here, so every call is INT8, with the delta cache (its skip decisions are the graph breaks: "
        "data-dependent, behind `torch.compiler.disable`).",
        "",
        *lines,
    ]
    if reasons:
        body += ["", "Graph-break reasons of one transformer call (file:line of the user code that broke, count):", "",
                 *reasons]
    if skipped:
        body += ["", "Frames dynamo gave up on in the compiled generations (they run eagerly, their callees are "
                     "compiled as frames of their own):", "", *skipped]
    if failures:
        body += ["", "Compile failures:", "", *failures]
    return "\n".join(body)


# ----------------------------------------------------------------------------- CLI


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--section", choices=["linear", "compile", "both"], default="both")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 128 rows for the 2B shapes, 1 timed call; compile: cogvideox with fp32 and "
                             "w4a8, 2 steps, 1 timed generation")
    parser.add_argument("--runs", type=int, default=5, help="A: timed calls per setting and shape (default 5)")
    parser.add_argument("--budget", type=float, default=30.0,
                        help="A: seconds of timing per shape before it stops early (default 30; at least one call each)")
    parser.add_argument("--arch", action="append", choices=["cogvideox", "wan"], help="B: models (default both)")
    parser.add_argument("--preset", action="append", help=f"B: settings (default {','.join(COMPILE_SETTINGS)})")
    parser.add_argument("--steps", type=int, default=4, help="B: denoising steps per generation (default 4)")
    parser.add_argument("--gen-runs", type=int, default=3, help="B: timed generations, eager and compiled (default 3)")
    parser.add_argument("--calib-prompts", type=int, default=2, help="B: calibration prompts of the calibrated settings (w4a8's GPTQ, balanced; default 2)")
    parser.add_argument("--calib-steps", type=int, default=2,
                        help="B: steps of the calibration runs (default 2: GPTQ runs them once per block, DMPQ per step × block range)")
    parser.add_argument("--timeout", type=int, default=1200, help="B: seconds per row before it is reported as failed")
    parser.add_argument("--backend", default="inductor",
                        help="B: torch.compile backend (default inductor; aot_eager/eager separate dynamo from inductor)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--no-write", action="store_true", help="print the sections, leave BENCHMARKS.md alone")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        arch, setting = json.loads(args.child)
        res = child(arch, setting, args.steps, args.gen_runs, args.calib_prompts, args.calib_steps, args.threads,
                    args.backend)
        print(json.dumps(res))
        return 0
    if args.quick:
        args.runs, args.budget = 1, 0.0
        args.arch, args.preset = args.arch or ["cogvideox"], args.preset or ["fp32", "w4a8"]
        args.steps, args.gen_runs, args.calib_prompts, args.calib_steps = 2, 1, 1, 2
    args.arch = args.arch or ["cogvideox", "wan"]
    args.preset = args.preset or COMPILE_SETTINGS
    torch.set_num_threads(args.threads)

    from report import update_section

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    sections = [(SECTION_LINEAR, linear_section)] if args.section in ("linear", "both") else []
    sections += [(SECTION_COMPILE, compile_section)] if args.section in ("compile", "both") else []
    for name, build in sections:  # each section is written as soon as it is measured
        text = build(args, log)
        print(text + "\n", flush=True)
        if not args.no_write:
            update_section(args.output, name, text)
            log(f"wrote section {name!r} of {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
