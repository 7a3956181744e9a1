"""Speed against bf16 at real size on this CPU: one transformer call of a CogVideoX-2B-sized model
per precision, a profile of that call by op kind, and a 20-step ``balanced`` run → BENCHMARKS.md
(section ``cpu-speed``).

    python benchmarks/bench_cpu_speed.py                  # ~25 min on 2 cores
    python benchmarks/bench_cpu_speed.py --quick          # 2 blocks, 3 steps: checks the script
    python benchmarks/bench_cpu_speed.py --update --settings "w8a8,w8a8 (compact)" --step-settings "" --interleave
                                                          # rerun rows, each against interleaved bf16 calls
    python benchmarks/bench_cpu_speed.py --frames 4 --side 60x90 --name cpu-speed-480p \
        --json benchmarks/results/cpu_speed_480p.json --settings w8a8,w4a8 --steps 2 --step-settings balanced \
        --fold-pairs 0 --before "" --interleave          # 13 frames of 480×720 (issue 46): ~30 min

Each preset row is the model as a user gets it from the preset alone: ``convert_model`` or
``load_pretrained`` with no other call, so sixbit's per-machine layout (:mod:`sixbit.memory.fast_path`,
``"auto"``) decides what runs; *(compact)* rows ask for ``layout="compact"`` (the stored weights
alone), *+ kept INT8* rows call ``sixbit.keep_int8_weights`` by hand (``fold=False``: *unfolded*).

The model: CogVideoX-2B's configuration with random bf16 weights, written once as a diffusers
folder (``bench_real_size.py``'s writer) and loaded with ``from_pretrained``; the call: 4 latent
frames of 32×32 (1024 video tokens) + 226 text tokens, CFG batch 2, as a user's pipeline makes it.
Every setting runs in a fresh process (a guard kills it past ``--rss-limit-gib``): load, convert,
one warm-up call (it also compiles the fused CPU kernels), then the median of ``--repeats`` calls.
*rel. error*: ``‖y − y_bf16‖ / ‖y_bf16‖`` of the call's output against the bf16 model's.

The 4-bit rows use the ``w4a8`` preset's formats and branch ranks with round-to-nearest values
(``w4a8 (layout)`` of ``bench_real_size.py``): GPTQ and the scale search change values, not the
work. ``balanced`` on a CPU is those weights with INT8 activations (no FP4 GEMM here:
``sixbit.presets.for_device``) and the delta cache; its 20-step run is a plain sampling loop
(DDIM, guidance 6) timed step by step. Weights are random, so how often the cache skips here says
little about a trained model; the skip share is reported beside the time. Right before each step
the bf16 model is called on the same inputs in the same process: the per-step ratio is against
those interleaved calls, so the machine's drift over the minutes of a run cancels. On random
weights the residuals change too much per step for the cache to skip at all, so ``balanced +
kept INT8 (every allowed skip)`` also runs the loop with the cache's threshold and error budget
set to infinity and a 5-step warm-up: it then skips every step its cap (2 in a row) allows after
the warm-up, 50 % of block calls at 20 steps, the share the shipped trained models skip in their
pipelines from threshold ≈ 0.25 up (BENCHMARKS.md ``cache-pareto``; the default 0.2 skips 45 %
there; a plain loop does not tell the cache its step count, so the pipelines' 20 % warm-up and
final step become the fixed 5 steps here). That times a trained model's skip pattern at this
size; the quality of such skips is measured on the trained models, not here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench_real_size import _config, _peak_gib, _run_child, log, run_child_mode

ROOT = Path(__file__).resolve().parents[1]
MODEL = "CogVideoX-2B"
KEPT = " + kept INT8"  # sixbit.keep_int8_weights by hand: the INT8 GEMM operand kept ready (AMX-packed here)
UNFOLDED = " (unfolded)"  # keep_int8_weights(fold=False): rotation and low-rank branch run per call
COMPACT = " (compact)"  # layout="compact": the stored weights alone (sixbit.memory.fast_path)
SETTINGS = ("bf16", "fp32", "w8a8", "w8a8" + COMPACT, "w4a8", "w4a8" + COMPACT, "w4a8" + COMPACT + KEPT + UNFOLDED)
EVERY_SKIP = " (every allowed skip)"  # threshold and error budget at infinity: a trained model's skip pattern
STEP_SETTINGS = ("balanced", "balanced" + EVERY_SKIP)
KINDS = ("16-bit GEMM", "integer GEMM", "activation quantization", "dequantization epilogue", "weight unpack (4 → 8 bit)",
         "Hadamard", "low-rank branch", "attention", "norms", "GELU")


# ----------------------------------------------------------------------------- children

def _load(folder: str, setting: str, blocks: int | None, w4a8: str | None):
    """The model in ``setting``; the 4-bit ones from ``w4a8``, a ``w4a8 (layout)`` checkpoint made by
    ``sixbit.convert_pretrained`` (converted here instead when ``None``: the SVDs of the low-rank
    branches take minutes at full size, once is enough)."""
    import diffusers
    import torch

    import sixbit
    from sixbit.presets import resolve

    dtype = torch.float32 if setting == "fp32" else torch.bfloat16
    every_skip, setting = setting.endswith(EVERY_SKIP), setting.removesuffix(EVERY_SKIP)
    unfolded, setting = setting.endswith(UNFOLDED), setting.removesuffix(UNFOLDED)
    kept, setting = setting.endswith(KEPT), setting.removesuffix(KEPT)
    compact, setting = setting.endswith(COMPACT), setting.removesuffix(COMPACT)
    layout = {"layout": "compact"} if compact else {}  # as picked: no argument (an older sixbit has none)
    if setting in ("w4a8", "balanced"):
        if w4a8 is not None:
            model = sixbit.load_pretrained(w4a8, folder, **layout)
        else:
            model = diffusers.CogVideoXTransformer3DModel.from_pretrained(folder, torch_dtype=dtype)
            model.transformer_blocks = model.transformer_blocks[:blocks]
            sixbit.convert_model(model, None, _config("w4a8 (layout)"), **layout)
        if setting == "balanced":  # on a CPU: these weights, INT8 activations, the delta cache
            config = resolve("balanced")
            if every_skip:  # skip whenever the warm-up and the cap allow; warm-up 5: see the module doc
                config.cache.threshold = config.cache.error_budget = float("inf")
                config.cache.warmup_steps = 5
            sixbit.enable_delta_cache(model, config.cache)
    else:
        model = diffusers.CogVideoXTransformer3DModel.from_pretrained(folder, torch_dtype=dtype)
        if setting == "w8a8":
            sixbit.convert_model(model, None, "w8a8", **layout)
        elif setting not in ("bf16", "fp32"):
            raise ValueError(f"unknown setting {setting!r}")
    if kept:
        sixbit.keep_int8_weights(model, fold=not unfolded)
    if blocks is not None:
        model.transformer_blocks = model.transformer_blocks[:blocks]
    return model.eval().requires_grad_(False)


def _latent_size(side) -> tuple[int, int]:
    """``--side`` as latent (height, width): ``"32"`` is 32 × 32, ``"60x90"`` 60 × 90 (480 × 720)."""
    h, _, w = str(side).partition("x")
    return int(h), int(w or h)


def _inputs(dtype, frames: int, side):
    import torch

    g = torch.Generator().manual_seed(0)
    return dict(hidden_states=torch.randn(2, frames, 16, *_latent_size(side), generator=g).to(dtype),
                encoder_hidden_states=torch.randn(2, 226, 4096, generator=g).to(dtype),
                timestep=torch.tensor([500, 500]))


class _Profile:
    """Wall time per op kind: wraps the functions each kind goes through (only the outermost
    wrapped call on the stack is timed, so a 16-bit GEMM inside the low-rank branch is the branch's)."""

    def __init__(self):
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.depth = 0

    def wrap(self, kind, fn):
        def timed(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[kind] += time.perf_counter() - t0
                self.depth -= 1
        return timed

    @contextlib.contextmanager
    def installed(self):
        import torch.nn.functional as F

        import sixbit.kernels
        import sixbit.methods.sparse_attention.method as sparse_attention
        import sixbit.nn.execution as execution
        import sixbit.nn.quant_linear as ql
        from sixbit.transforms import hadamard

        try:
            from sixbit.nn import lowrank
        except ImportError:  # an older sixbit (--before): the branch's functions lived in quant_linear
            lowrank = ql

        targets = [(F, "linear", "16-bit GEMM"), (ql, "int8_matmul", "integer GEMM"),
                   (execution, "int8_matmul", "integer GEMM"),  # torch._int_mm, where no AMX kernel is packed
                   (sixbit.kernels, "packed_int8_matmul", "integer GEMM"),
                   (sixbit.kernels, "int8_linear_reference", "integer GEMM"),  # --before: quantize + GEMM + epilogue
                   (sixbit.kernels, "quantize_rows", "activation quantization"),
                   (sixbit.kernels, "scale_epilogue", "dequantization epilogue"),
                   # a feed-forward's first epilogue, which also quantizes the second linear's input
                   (sixbit.kernels, "scale_epilogue_quantize", "dequantization epilogue"),
                   (ql.QuantLinear, "int8_weight", "weight unpack (4 → 8 bit)"), (hadamard, "rotate", "Hadamard"),
                   (hadamard, "rotate_unnormalized", "Hadamard"), (F, "gelu", "GELU"),
                   (lowrank, "low_rank", "low-rank branch"), (lowrank, "branch", "low-rank branch"),
                   (lowrank, "full", "low-rank branch"), (lowrank, "add_branch", "low-rank branch"),
                   (F, "scaled_dot_product_attention", "attention"),
                   (sparse_attention, "block_sparse_attention", "attention"),  # inside SDPA's wrapper when hooked
                   (F, "layer_norm", "norms"), (F, "group_norm", "norms")]
        targets = [t for t in targets if hasattr(t[0], t[1])]  # an older sixbit (--before) lacks some
        saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]
        try:
            for obj, name, kind in targets:
                setattr(obj, name, self.wrap(kind, getattr(obj, name)))
            yield self
        finally:
            for obj, name, fn in saved:
                setattr(obj, name, fn)


def child_call(folder: str, setting: str, repeats: int, blocks: int | None, frames: int, side: str, ref: str,
               w4a8: str | None, interleave: int = 0) -> dict:
    """Time one transformer call in ``setting``; profile one more; compare with the bf16 output.
    ``interleave``: also load the bf16 model and time one of its calls right before each call
    (``base_s``: their median), so the machine's drift cancels; the peak RSS then holds both models."""
    import torch

    import sixbit

    t0 = time.perf_counter()
    model = _load(folder, setting, blocks, w4a8)
    load_s = time.perf_counter() - t0
    inputs = _inputs(next(model.parameters()).dtype, frames, side)
    base = _load(folder, "bf16", blocks, None) if interleave and setting != "bf16" else None
    base_inputs = _inputs(torch.bfloat16, frames, side)
    times, base_times = [], []
    with torch.no_grad():
        for i in range(repeats + 1):
            if base is not None:
                t0 = time.perf_counter()
                base(**base_inputs, return_dict=False)
                base_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = model(**inputs, return_dict=False)[0]
            times.append(time.perf_counter() - t0)
        with _Profile().installed() as prof:
            t0 = time.perf_counter()
            model(**inputs, return_dict=False)
            total = time.perf_counter() - t0
    from safetensors.torch import load_file, save_file

    out = out.float()
    if setting == "bf16":
        save_file({"y": out}, ref)
        rel = 0.0
    else:
        y = load_file(ref)["y"]
        rel = float((out - y).norm() / y.norm())
    converted = sixbit.summary(model).converted_bytes if setting not in ("bf16", "fp32") else 0
    laid_out = getattr(sixbit, "layout_of", lambda m: None)(model)  # what sixbit chose here (None: an older sixbit)
    return {"call_s": statistics.median(times[1:]), "first_s": times[0], "load_s": load_s, "rel_error": rel,
            "profile": prof.seconds, "profile_total_s": total, "tensor_gib": sum(
                t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) / 2**30,
            "converted_gib": converted / 2**30, "peak_gib": _peak_gib(),
            "layout": None if laid_out is None else laid_out.describe(),
            **({"base_s": statistics.median(base_times[1:]), "interleaved": True} if base_times else {})}


def child_steps(folder: str, setting: str, steps: int, blocks: int | None, frames: int, side: str,
                w4a8: str | None) -> dict:
    """A ``steps``-step DDIM loop with batched CFG after one warm-up call; each step timed, and right
    before it one call of the bf16 model on the same inputs (``base_step_s``): the baseline
    interleaved, so the machine's drift over the minutes of the run cancels."""
    import diffusers
    import torch

    from sixbit.methods.delta_cache import DeltaCache
    from sixbit.runtime import track_steps
    from sixbit.runtime.blocks import attached

    model = _load(folder, setting, blocks, w4a8)
    base = _load(folder, "bf16", blocks, None)
    dtype = next(model.parameters()).dtype
    tracker = track_steps(model, batched_cfg=True)
    scheduler = diffusers.CogVideoXDDIMScheduler(timestep_spacing="trailing", prediction_type="v_prediction")
    scheduler.set_timesteps(steps)
    inputs = _inputs(dtype, frames, side)
    latents = inputs["hidden_states"][:1]
    text = inputs["encoder_hidden_states"]
    times, base_times = [], []
    with torch.no_grad():
        for m in (base, model):  # warm-up: the first call compiles the fused CPU kernels
            m(hidden_states=torch.cat([latents, latents]), encoder_hidden_states=text,
              timestep=scheduler.timesteps[0].expand(2), return_dict=False)
        tracker.new_generation()
        for t in scheduler.timesteps:
            t0 = time.perf_counter()
            base(hidden_states=torch.cat([latents, latents]), encoder_hidden_states=text, timestep=t.expand(2),
                 return_dict=False)
            base_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = model(hidden_states=torch.cat([latents, latents]), encoder_hidden_states=text,
                        timestep=t.expand(2), return_dict=False)[0]
            uncond, cond = out.float().chunk(2)
            latents = scheduler.step(uncond + 6.0 * (cond - uncond), t, latents.float()).prev_sample.to(dtype)
            times.append(time.perf_counter() - t0)
    caches = list(attached(model, DeltaCache))
    skipped = caches[0].report().skip_share if caches else None
    return {"step_s": times, "mean_step_s": statistics.mean(times), "base_step_s": base_times,
            "base_s": statistics.mean(base_times), "skip_share": skipped, "peak_gib": _peak_gib()}


def child_fold(pairs: int) -> dict:
    """PSNR against full precision on ``pairs`` held-out pairs of both shipped models (fp32, the
    shapes pipelines' 20 steps, CFG 4) of ``w4a8`` (GPTQ on 8 calibration prompts) as converted,
    with kept INT8 unfolded, and folded: what ``fold`` costs in quality where it can be measured."""
    import torch

    import sixbit
    from sixbit.bench.harness import calibration_pairs, heldout_pairs
    from sixbit.eval.metrics import psnr
    from sixbit.zoo.shapes.judge import generate_heldout
    from sixbit.zoo.shapes import load_pipeline

    held, out = heldout_pairs(pairs), {}
    for arch in ("cogvideox", "wan"):
        with torch.no_grad():
            fp, _ = generate_heldout(load_pipeline(arch), held, 20, 4.0)
            pipe = load_pipeline(arch)
            sixbit.convert_model(pipe, [p for p, _ in calibration_pairs(8)], "w4a8")
            rows = {}
            for name, fold in (("w4a8", None), ("w4a8" + KEPT + UNFOLDED, False), ("w4a8" + KEPT, True)):
                if fold is not None:
                    sixbit.keep_int8_weights(pipe.transformer, enabled=False)
                    sixbit.keep_int8_weights(pipe.transformer, fold=fold)
                videos, _ = generate_heldout(pipe, held, 20, 4.0)
                rows[name] = [psnr(v, r) for v, r in zip(videos, fp)]
        out[arch] = rows
    return out


# ----------------------------------------------------------------------------- parent

def section(r: dict) -> str:
    base = r["baseline"]
    calls = r["calls"]
    b = calls[base]["call_s"]
    later = sorted({c.get("run", 0) for c in calls.values() if not c.get("interleaved")} - {0})
    h, w = _latent_size(r["side"])
    title, command = "Speed against bf16 at real size (CPU, issue 24)", ""
    if (h, w) != (32, 32):  # another resolution: its own section
        title = f"Speed against bf16 at {r['frames']} latent frames of {h}×{w} ({8 * h}×{8 * w} pixels; CPU, issue 46)"
        command = f" --frames {r['frames']} --side {r['side']} --name {r['name']}"
    lines = [
        f"## {title}",
        "",
        f"Written by `python benchmarks/bench_cpu_speed.py{command}`. Machine: {r['machine']}. One transformer call of a "
        f"{MODEL}-sized model (random bf16 weights from a diffusers folder; {r['frames']} latent frames of "
        f"{h}×{w} ({r['frames'] * h * w // 4:,} video tokens) + 226 text tokens, CFG batch 2), each setting in a fresh process, median of "
        f"{'–'.join(map(str, sorted({c.get('repeats', 2) for c in calls.values()})))} calls after a warm-up. **Baseline: {base}**, the fastest full-precision dtype this CPU runs "
        f"(fp32 kept as a column). *rel. error*: the call's output against the bf16 model's. 4-bit rows: the `w4a8` "
        "preset's formats and branch ranks, round-to-nearest values (GPTQ changes values, not the work). "
        "Preset rows (`w8a8`, `w4a8`, `balanced`) are the model **as picked**: `convert_model` or `load_pretrained` "
        "and no other call, so sixbit's per-machine layout (`sixbit.memory.fast_path`, `\"auto\"`) decides what runs (on this "
        "CPU kind: the INT8 GEMM operand kept ready, packed for oneDNN's AMX INT8 kernel, which `torch._int_mm` does "
        "not reach, rotations and branches folded in; 8 more bits per weight resident, counted by `summary()`). "
        f"*{COMPACT.strip(' ()')}*: `layout=\"compact\"`, the stored low-bit weights alone, re-rounded per call; "
        f"*{KEPT.removeprefix(' + ')}*: `sixbit.keep_int8_weights` called by hand (*unfolded*: `fold=False`).",
        "",
        f"| setting | s / call | vs {base} | vs fp32 | rel. error vs bf16 | weights + views GiB | peak RSS GiB | first call s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, c in calls.items():
        if "error" in c:
            lines.append(f"| {name} | {c['error']} | | | | | | |")
            continue
        fp32 = f"{calls['fp32']['call_s'] / c['call_s']:.2f}×" if "call_s" in calls.get("fp32", {}) and not (c.get("run") or c.get("interleaved")) else "–"
        mark = "‡" if c.get("interleaved") else "†" * c.get("run", 0)
        lines.append(f"| {name}{mark} | {c['call_s']:.2f} | **{c.get('base_s', b) / c['call_s']:.2f}×** | {fp32} | "
                     f"{c['rel_error']:.4f} | {c['tensor_gib'] + c['converted_gib']:.2f} | {c['peak_gib']:.2f} | "
                     f"{c['first_s']:.1f} |")
    interleaved = [c for c in calls.values() if c.get("interleaved")]
    if interleaved:
        lines.append(f"\n‡ Timed against a {base} call on the same inputs right before each call, in the same process "
                     "(the machine's drift cancels); its ratio is against those calls "
                     f"({', '.join(format(c['base_s'], '.2f') for c in interleaved)} s), its peak RSS holds both models.")
    for run in later:
        lines.append(f"\n{'†' * run} Rerun later (`--update`) with its own {base} call in the same run "
                     f"({next(c['base_s'] for c in calls.values() if c.get('run') == run):.2f} s): its ratio is against that.")
    lines += ["", "Profile of one call (s; wall time inside each kind of op, the rest is *other*: modulation "
              "arithmetic, residual adds, reshapes, embeddings; *GELU*: the feed-forward's own pass, which the kept-INT8 "
              "rows run inside the dequantization epilogue, with the quantization of the second feed-forward linear's input; "
              "*n/a*: not profiled in that row's run):", "",
              "| setting | " + " | ".join(KINDS) + " | other | total |", "|---|" + "---:|" * (len(KINDS) + 2)]
    for name, c in calls.items():
        if "error" in c:
            continue
        p = c["profile"]
        other = c["profile_total_s"] - sum(p.values())
        lines.append(f"| {name} | " + " | ".join("n/a" if k not in p else f"{p[k]:.2f}" if p[k] else "–" for k in KINDS)
                     + f" | {other:.2f} | {c['profile_total_s']:.2f} |")
    st = r.get("steps")
    if st:
        steps = len(next(iter(st.values())).get("step_s", []))
        lines += ["", f"{steps}-step run (DDIM, batched CFG, guidance 6), mean s per denoising step, against a "
                  f"{base} call on the same inputs timed right before each step in the same process:", "",
                  f"| setting | s / step | {base} s / call, interleaved | vs {base} | skipped block calls |",
                  "|---|---:|---:|---:|---:|"]
        for name, s in st.items():
            if "error" in s:
                lines.append(f"| {name} | {s['error']} | | | |")
                continue
            share = "–" if s["skip_share"] is None else f"{100 * s['skip_share']:.0f} %"
            lines.append(f"| {name} | {s['mean_step_s']:.2f} | {s['base_s']:.2f} | "
                         f"**{s['base_s'] / s['mean_step_s']:.2f}×** | {share} |")
        if any(name.endswith(EVERY_SKIP) for name in st):
            lines += ["", f"*{EVERY_SKIP.strip(' ()')}*: the cache's threshold and error budget at infinity and a "
                      "5-step warm-up, so it skips every step its cap (2 in a row) allows after it: 50 % of block "
                      "calls, the share the shipped trained models skip in their pipelines from threshold ≈ 0.25 up "
                      "(`cache-pareto`; the default 0.2: 45 %); on these random weights the default threshold skips "
                      "nothing. It times a trained model's skip pattern at this size; the quality of those skips is "
                      "measured on the trained models, not here."]
    fold = r.get("fold")
    if fold:
        names = list(next(iter(fold.values())))
        n = len(next(iter(next(iter(fold.values())).values())))
        lines += ["", f"*fold* (`keep_int8_weights(fold=True)`, the default; *unfolded*: `fold=False`): a rotating or "
                  "branched layer packs the INT8 rounding of `(W_q + U·D)·H`, so its INT8 calls quantize the input "
                  "unrotated and run one GEMM, no rotation or branch. What that does to quality, on the shipped "
                  f"models (fp32, {n} held-out pairs, 20 steps, CFG 4; `w4a8` with GPTQ on 8 calibration prompts), "
                  "PSNR against full precision, mean (min) dB:", "",
                  "| model | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for arch, rows in fold.items():
            lines.append(f"| shapes-{arch} | " + " | ".join(
                f"{statistics.mean(v):.2f} ({min(v):.2f})" for v in rows.values()) + " |")
    layouts = {c["layout"] for c in calls.values() if c.get("layout") and "(asked: auto)" in c["layout"]}
    lines += ["", "What sixbit chose for the rows as picked: " + "; ".join(f"`{x}`" for x in sorted(layouts)) + "."] if layouts else []
    lines += ["", "Checks (issues 24 and 46, on this CPU kind; no other kind measured): " + "; ".join(_checks(r)) + "."]
    if _latent_size(r["side"]) != (32, 32):
        lines[-1] += (" Issue 46 asks `w8a8` *with quantized attention* for ≥ 1.5×: on this CPU quantized attention is "
                      "slower than bf16 SDPA (`attention-cpu`), so it is off the CPU presets and that row would be slower "
                      "still; attention is the *attention* column of the profile above.")
    return "\n".join(lines) + "\n"


def _checks(r: dict) -> list[str]:
    base, calls, out = r["baseline"], r["calls"], []
    bars = (("w8a8", 1.3), ("w4a8", 1.25)) if _latent_size(r["side"]) == (32, 32) else (("w8a8", 1.5),)
    for setting, bar in bars:
        c = calls.get(setting, {})
        if "call_s" in c:
            ratio = c.get("base_s", calls[base]["call_s"]) / c["call_s"]
            out.append(f"`{setting}` as picked ≥ {bar}× {base}: **{'yes' if ratio >= bar else 'no'}** ({ratio:.2f}×)")
    for name, s in r.get("steps", {}).items():
        if "mean_step_s" in s:
            ratio = s["base_s"] / s["mean_step_s"]
            out.append(f"`{name}` ≥ 2× {base} per step: **{'yes' if ratio >= 2 else 'no'}** ({ratio:.2f}×)")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="steps of the balanced run (0: skip it)")
    parser.add_argument("--step-settings", default=",".join(STEP_SETTINGS))
    parser.add_argument("--fold-pairs", type=int, default=16, help="held-out pairs of the shipped models on which "
                        "kept INT8 is scored folded and unfolded (0: skip)")
    parser.add_argument("--interleave", action="store_true", help="time each setting's calls against a bf16 call "
                        "right before each, in the same process (both models resident)")
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--side", default="32", help="latent height×width: 32 (32 × 32) or 60x90 (480 × 720 pixels)")
    parser.add_argument("--name", default="cpu-speed", help="BENCHMARKS.md section to write (another --side: "
                        "cpu-speed-480p, with --json benchmarks/results/cpu_speed_480p.json)")
    parser.add_argument("--workdir", default="/tmp/sixbit-real-size")
    parser.add_argument("--rss-limit-gib", type=float, default=20.0)
    parser.add_argument("--before", default="37540da", help="also time --before-settings with sixbit at this git "
                        "revision (before issue 24's changes; '' to skip)")
    parser.add_argument("--before-settings", default="w8a8", help="w4a8 before re-rounded its weight in eager ops "
                        "on every call: minutes per call at this size")
    parser.add_argument("--update", action="store_true", help="rerun --settings (and the baseline) into the existing "
                        "--json: the other rows stay, each row's ratio against the baseline call of its own run")
    parser.add_argument("--section", action="store_true", help="only write the section from --json")
    parser.add_argument("--quick", action="store_true", help="2 blocks, 3 steps, 1 repeat: checks the script")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "cpu_speed.json"))
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.child:
        return run_child_mode({"call": child_call, "steps": child_steps, "fold": child_fold}, args.child)

    import torch

    from report import machine_description, update_section
    from sixbit.kernels import fastest_float_dtype

    if args.section:
        update_section(args.output, args.name, section(json.loads(Path(args.json).read_text())))
        return 0

    folder = Path(args.workdir) / MODEL.replace(".", "_")
    if not (folder / "config.json").exists():
        log(f"writing random bf16 weights to {folder}")
        log(_run_child(["write", MODEL, str(folder), "none"], args.rss_limit_gib, log))
    blocks = "2" if args.quick else "none"
    if args.quick:
        args.repeats, args.steps = 1, min(args.steps, 3)
    ref = str(Path(args.workdir) / "cpu-speed-bf16-output.safetensors")
    w4a8 = "none"
    if not args.quick:
        w4a8 = str(Path(args.workdir) / f"{MODEL}-w4a8-layout.safetensors")
        if not Path(w4a8).exists():
            log("converting to the w4a8 layout (streamed, once)")
            log(_run_child(["convert", str(folder), "w4a8 (layout)", w4a8, "2", "16"], args.rss_limit_gib, log))
    settings = [s for s in args.settings.split(",") if s]
    base = {torch.bfloat16: "bf16", torch.float32: "fp32"}[fastest_float_dtype("cpu")]
    r = {"baseline": base, "machine": machine_description(), "frames": args.frames, "side": args.side, "name": args.name,
         "calls": {}, "steps": {}}
    previous = json.loads(Path(args.json).read_text()) if args.update else None
    os.environ.pop("SIXBIT_LAYOUT", None)  # the rows as picked take sixbit's default, whatever this shell says
    for setting in dict.fromkeys(["bf16", *settings]):  # bf16 first: its output is the reference
        log(f"one call: {setting}")
        r["calls"][setting] = c = _run_child(["call", str(folder), setting, str(args.repeats), blocks, str(args.frames),
                                              str(args.side), ref, w4a8, str(int(args.interleave))],
                                             args.rss_limit_gib, log, script=__file__)
        c["repeats"] = args.repeats
        log(f"{setting}: {json.dumps(c)}")
    if args.before:  # the same settings with the package as it was: what the changes bought, same run
        import subprocess

        tree = Path(args.workdir) / f"sixbit-{args.before}"
        if not tree.exists():  # that revision's package, unpacked beside the weights
            tree.mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "src"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for setting in args.before_settings.split(","):
            name = f"{setting} (sixbit {args.before})"
            log(f"one call: {name}")
            r["calls"][name] = c = _run_child(["call", str(folder), setting, str(args.repeats), blocks, str(args.frames),
                                               str(args.side), ref, w4a8], args.rss_limit_gib, log, script=__file__,
                                              src=tree / "src")
            log(f"{name}: {json.dumps(c)}")
    if args.steps:
        for setting in filter(None, args.step_settings.split(",")):
            log(f"{args.steps} steps: {setting}")
            r["steps"][setting] = s = _run_child(["steps", str(folder), setting, str(args.steps), blocks, str(args.frames),
                                                  str(args.side), w4a8], args.rss_limit_gib, log, script=__file__)
            log(f"{setting}: {json.dumps(s)}")
    if args.fold_pairs and not args.quick:
        log(f"fold quality on the shipped models ({args.fold_pairs} pairs)")
        r["fold"] = _run_child(["fold", str(args.fold_pairs)], args.rss_limit_gib, log, script=__file__)
    if previous is not None:
        run = 1 + max(c.get("run", 0) for c in previous["calls"].values())
        for c in r["calls"].values():
            if not c.get("interleaved"):  # interleaved rows carry their own baseline
                c.update(run=run, base_s=r["calls"][base]["call_s"])
        previous["calls"].update({k: v for k, v in r["calls"].items() if k != base})
        previous["steps"].update(r["steps"])
        previous.update({k: r[k] for k in ("fold",) if k in r})
        r = previous
    text = section(r)
    if args.quick:
        print(text)
        return 0
    Path(args.json).write_text(json.dumps(r, indent=1))
    update_section(args.output, args.name, text)
    log(f"wrote section {args.name} of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
