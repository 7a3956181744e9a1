"""GPU benchmark sized for a short device loan (≤ 8 minutes on one GPU) → section ``gpu`` of BENCHMARKS.md.

    python benchmarks/gpu/run.py                      # on a GPU: measure and write the section
    python benchmarks/gpu/run.py --dry-run --output /tmp/gpu.md   # the same code on CPU, toy sizes

Installs nothing at run time. Four parts, each row checked against a time budget (rows past it
are listed as not run, never estimated):

1. **Kernel checks** — every kernel sixbit runs on this device against its reference twin, on
   bf16 inputs (the CPU tests run fp32/fp16 under Triton's interpreter): max |Δ| / max |ref|;
   the 6-bit-P attention kernels (``tl.dot_scaled``) too. A kernel that fails on this GPU fails
   in its row, and the run goes on. Then **every kernel path of a quantized linear**
   (:class:`sixbit.kernels.paths.Path`) through ``QuantLinear``, each against its mode's twin
   path, or why this device does not take it (:mod:`gpu_paths`).
2. **Per-linear times** at CogVideoX-2B and Wan2.1-14B shapes (rows = one sample's tokens at 49
   frames): bf16 ``F.linear``; INT8 W8A8 (per-token quantization of the bf16 input, Triton-fused
   on CUDA, + ``torch._int_mm`` + epilogue, i.e. everything a call does); FP8 W8A8 (row-wise
   E4M3, ``torch._scaled_mm``); W4A16 (NVFP4 weight decoded inside a Triton GEMM); NVFP4 × NVFP4
   where the GPU has FP4 tensor cores. Median of CUDA-synchronized calls after a warm-up.
3. **Attention** at CogVideoX-2B size (CFG batch 2, 30 heads, head dim 64, text + video tokens
   at 13 and 49 frames): bf16 SDPA vs sixbit's Triton INT8 attention (INT8 Q·Kᵀ, FP16 P·V; the
   quantization of Q and K included) and ``sageattention`` where installed, with each one's
   error against SDPA.
4. **Denoising steps** of a CogVideoX-2B-sized transformer (random weights, bf16, CFG batch 2)
   at 13 and 49 frames for ``fp``, ``w8a8``, ``w4a8``, ``balanced`` and ``tdc``, eager and
   ``torch.compile``: mean seconds per step over ``--steps`` steps (the cache skips some) after
   a warm-up run, and peak GPU memory. ``w4a8`` and ``balanced`` calibrate GPTQ on two
   transformer calls on random latents (random weights: there is no video to calibrate on).

``--dry-run`` runs all of it on CPU at toy sizes (no GPU needed; the test suite does this),
taking every decision an sm_90 GPU takes (:func:`gpu_paths.gpu_on_cpu`: Triton interpreted,
torch's GEMMs replaced by stand-ins that refuse what CUDA refuses; NVFP4 × NVFP4 rehearsed as
on Blackwell), with only the timing meaningless. The denoising steps take the CPU's INT8 and
full-precision paths under CUDA's GEMM limits unless ``--interpret-steps``. Not rehearsed:
compiling and timing on a GPU, ``sageattention`` (CUDA only), inductor's GPU code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:  # Triton kernels on CPU tensors: its interpreter, read when Triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmark-script support (report.py)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this script's own parts (gpu_paths.py)

import sixbit
from sixbit import formats, kernels
from sixbit.bench.layer_shapes import REAL_MODELS
from gpu_paths import failure, gpu_on_cpu, layer_paths
from report import machine_description, update_section
from sixbit.kernels import triton as tri
from sixbit.kernels.attention import int8_attention_reference, sageattention_installed
from sixbit.kernels.cuda import fp8_quantize_rows
from sixbit.kernels.triton.attention import int8_attention_triton
from sixbit.presets import for_device, resolve

COGVIDEOX_2B = dict(num_attention_heads=30, attention_head_dim=64, in_channels=16, out_channels=16, time_embed_dim=512,
                    text_embed_dim=4096, num_layers=30, sample_width=90, sample_height=60, sample_frames=49,
                    patch_size=2, max_text_seq_length=226, use_rotary_positional_embeddings=False,
                    use_learned_positional_embeddings=False)
TOY = dict(COGVIDEOX_2B, num_attention_heads=2, attention_head_dim=64, num_layers=2, text_embed_dim=64,
           time_embed_dim=64, sample_width=8, sample_height=8, max_text_seq_length=8)
SETTINGS = ("fp", "w8a8", "w4a8", "balanced", "tdc")
BASE = {False: "bf16 F.linear", True: "fp32 F.linear"}  # per-linear baseline (dry run: fp32, see linear_times)


class Budget:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_s(fn, device, runs: int) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------- 1. kernel checks

def kernel_checks(device: torch.device, dry: bool) -> list[dict]:
    """Each kernel that runs on ``device`` vs its reference twin."""
    g = torch.Generator(device="cpu").manual_seed(0)
    m, k, n = (32, 128, 64) if dry else (512, 1920, 1920)
    dtype = torch.float32 if dry and tri.runs_on(device) else torch.bfloat16  # the interpreter mishandles bf16
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = torch.randn(n, k, generator=g).to(device) / k ** 0.5
    rows = []

    def check(name, path, fn, ref):
        row = {"kernel": name, "path": path}
        rows.append(row)
        try:
            y, r = fn().float(), ref().float()
        except Exception as e:  # one kernel that fails here must not cost the loan the other rows
            row["note"] = failure(e)
            return
        row["rel_err"] = ((y - r).abs().max() / r.abs().max()).item()

    w8 = formats.get("int8").quantize(w)
    triton_here = tri.runs_on(device)
    for block in (None, 128):
        check(f"INT8 W8A8{' + Hadamard 128' if block else ''}",
              "Triton quantize + torch._int_mm + Triton epilogue" if triton_here else "torch ops (no Triton here)",
              lambda: kernels.int8_linear(x, w8.values(), w8.scale.reshape(-1), block, dtype),
              lambda: kernels.int8_linear_reference(x, w8.values(), w8.scale.reshape(-1), block, dtype))
    if kernels.cuda.fp8_supported(device):  # bf16 out: what torch's row-wise FP8 kernel writes on CUDA
        wq, ws = fp8_quantize_rows(w)
        check("FP8 W8A8 (row-wise E4M3)", "torch._scaled_mm", lambda: kernels.fp8_linear(x, wq, ws.reshape(-1), torch.bfloat16),
              lambda: kernels.fp8_linear_reference(x, wq, ws.reshape(-1), torch.bfloat16))
    for fmt in ("nvfp4", "int4-g64"):
        wq4 = formats.get(fmt).quantize(w)
        if triton_here:
            check(f"W4A16 ({fmt} weight)", "Triton dequantize-in-the-GEMM",
                  lambda: kernels.weight4_linear(x, wq4), lambda: kernels.weight4_linear_reference(x, wq4))
    if triton_here:
        q, kk, v = (torch.randn(1, 4, 150 if dry else 1000, 64, generator=g).to(device, dtype) for _ in range(3))
        check("INT8 attention (INT8 QKᵀ, FP16 PV)", "Triton, online softmax (twin within 2⁻⁹ · max abs V: P rounded to FP16 per tile)",
              lambda: int8_attention_triton(q, kk, v), lambda: int8_attention_reference(q, kk, v))
        for p in ("e2m3", "e3m2"):  # tl.dot_scaled: the GPUs without it fail here, in their row
            check(f"INT8 attention, {p.upper()} P", "Triton, P·V through tl.dot_scaled (twin: the same tiles rounded)",
                  lambda: int8_attention_triton(q, kk, v, p_format=p), lambda: int8_attention_reference(q, kk, v, p_format=p))
    if kernels.fp4_supported(device) or dry:
        wn = formats.get("nvfp4").quantize(w)
        with gpu_on_cpu(fp4=True) if dry else contextlib.nullcontext():
            check("NVFP4 × NVFP4", "torch._scaled_mm FP4" + (" (dry run: its CPU stand-in)" if dry else ""),
                  lambda: kernels.nvfp4_linear(x, wn, dtype), lambda: kernels.nvfp4_linear_reference(x, wn, dtype))
    return rows


# ---------------------------------------------------------------------------- 2. per-linear times

def _shapes(dry: bool) -> list[tuple[str, str, int, int, int]]:
    if dry:
        return [("toy", "FFN up", 128, 256, 64)]
    out = []
    for name in ("CogVideoX-2B", "Wan2.1-14B"):
        seen = set()
        for lin in REAL_MODELS[name].linears:
            if (lin.k, lin.n, lin.tokens) not in seen:
                seen.add((lin.k, lin.n, lin.tokens))
                out.append((name, lin.role, lin.k, lin.n, lin.tokens))
    return out


def _linear_cases(device: torch.device, dry: bool, k: int, n: int, m: int) -> dict:
    """precision → a callable running one linear call of shape (m, k) × (k, n) on ``device``."""
    g = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device)
    dtype = torch.float32 if dry else torch.bfloat16  # the Triton interpreter mishandles bf16
    x = torch.randn(m, k, generator=g).to(device, dtype)
    wb = w.to(dtype)
    w8 = formats.get("int8").quantize(w)
    w8v, w8s = w8.values(), w8.scale.reshape(-1)
    cases = {BASE[dry]: lambda: F.linear(x, wb),
             "INT8 W8A8": lambda: kernels.int8_linear(x, w8v, w8s, None, dtype)}
    if kernels.cuda.fp8_supported(device):
        wf, wfs = fp8_quantize_rows(w)
        cases["FP8 W8A8"] = lambda: kernels.fp8_linear(x, wf, wfs.reshape(-1), torch.bfloat16)
    w4 = formats.get("nvfp4").quantize(w)
    if kernels.weight4_fused(device) or (dry and tri.runs_on(device)):
        cases["W4A16 (NVFP4 W)"] = lambda: kernels.weight4_linear(x, w4)
    if kernels.fp4_supported(device):
        cases["NVFP4 × NVFP4"] = lambda: kernels.nvfp4_linear(x, w4, dtype)
    return cases


def linear_times(device: torch.device, dry: bool, runs: int, budget: Budget) -> list[dict]:
    rows = []
    for model, role, k, n, m in _shapes(dry):
        base = None
        for precision, fn in _linear_cases(device, dry, k, n, m).items():
            row = {"model": model, "role": role, "k": k, "n": n, "m": m, "precision": precision, "ms": None}
            rows.append(row)
            if budget.left() < 0:
                continue
            row["ms"] = ms = 1e3 * _median_s(fn, device, runs)
            base = ms if precision == BASE[dry] else base
            row.update(tflops=2 * m * k * n / ms / 1e9, speedup=base / ms if base else None)
    return rows


# ---------------------------------------------------------------------------- 3. attention

def _tokens(config: dict, frames: int) -> int:
    """Joint (text + video) tokens of one sample at ``frames`` frames."""
    latent_frames = (frames - 1) // 4 + 1
    p = config["patch_size"]
    return config["max_text_seq_length"] + latent_frames * (config["sample_height"] // p) * (config["sample_width"] // p)


def _attention_cases(device: torch.device, dry: bool, config: dict, length: int) -> tuple[dict, torch.Tensor]:
    """(kernel → a callable running one attention call of ``length`` tokens, SDPA's output)."""
    dtype = torch.float32 if dry else torch.bfloat16  # the Triton interpreter mishandles bf16
    g = torch.Generator(device="cpu").manual_seed(2)
    q, k, v = (torch.randn(2, config["num_attention_heads"], length, config["attention_head_dim"], generator=g)
               .to(device, dtype) for _ in range(3))
    cases = {f"{'fp32' if dry else 'bf16'} SDPA": lambda: F.scaled_dot_product_attention(q, k, v)}
    if tri.runs_on(device):
        cases["INT8 (sixbit Triton)"] = lambda: int8_attention_triton(q, k, v)
    if device.type == "cuda" and sageattention_installed():
        from sageattention import sageattn

        cases["INT8 (sageattention)"] = lambda: sageattn(q, k, v, tensor_layout="HND", is_causal=False)
    return cases, F.scaled_dot_product_attention(q, k, v).float()


def attention_times(device: torch.device, dry: bool, runs: int, frames_list, budget: Budget) -> list[dict]:
    """SDPA vs INT8 attention at CogVideoX-2B size (the dry run: toy size, fp32), each with its
    error against SDPA."""
    config = TOY if dry else COGVIDEOX_2B
    flops_per_token2 = 4 * 2 * config["num_attention_heads"] * config["attention_head_dim"]
    rows = []
    for frames in frames_list:
        length = _tokens(config, frames)
        cases, exact = _attention_cases(device, dry, config, length)
        base = None
        for name, fn in cases.items():
            row = {"frames": frames, "tokens": length, "kernel": name, "ms": None}
            rows.append(row)
            if budget.left() < 0:
                continue
            row["ms"] = ms = 1e3 * _median_s(fn, device, runs)
            base = ms if base is None else base  # the first case is SDPA
            err = fn().float() - exact
            row.update(tflops=flops_per_token2 * length * length / ms / 1e9, speedup=base / ms,
                       max_err=(err.abs().max() / exact.abs().max()).item(), rel_err=(err.norm() / exact.norm()).item())
    return rows


# ---------------------------------------------------------------------------- 4. denoising steps

def _transformer(config: dict, device: torch.device, dtype: torch.dtype, state: dict | None):
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = CogVideoXTransformer3DModel(**config).to(dtype)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def _inputs(config: dict, frames: int, device, dtype):
    latent_frames = (frames - 1) // 4 + 1
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(2, latent_frames, config["in_channels"], config["sample_height"], config["sample_width"], generator=g)
    text = torch.randn(2, config["max_text_seq_length"], config["text_embed_dim"], generator=g)
    return x.to(device, dtype), text.to(device, dtype)


def _run(model, x, text, steps: int):
    """``steps`` Euler steps of the flow (timesteps 999 → 0), CFG batch 2: what the cache sees in a generation."""
    with torch.no_grad():
        for i in range(steps):
            t = torch.full((2,), 999 - i * (999 // steps), device=x.device)
            v = model(hidden_states=x, encoder_hidden_states=text, timestep=t, return_dict=False)[0]
            x = x - v / steps
    return x


def _convert(model, setting: str, config: dict, device, dtype) -> str:
    """Convert ``model`` with preset ``setting`` (GPTQ calibrates on two steps at 13 frames); what
    the preset became on ``device``."""
    preset = resolve(setting)
    runs_as, note = for_device(preset, device)
    calib = _inputs(config, 13, device, dtype)
    sixbit.convert_model(model, (lambda: _run(model, *calib, 2)) if runs_as.needs_calibration else None, preset)
    return note or ""


def step_times(device: torch.device, dry: bool, steps: int, frames_list, settings, compile_settings,
               backend: str, budget: Budget) -> list[dict]:
    config = TOY if dry else COGVIDEOX_2B
    dtype = torch.bfloat16
    state = {k: v.clone() for k, v in _transformer(config, device, dtype, None).state_dict().items()}
    rows = []
    for compiled in (False, True):
        for frames in frames_list:
            for setting in settings:
                if compiled and setting not in compile_settings:
                    continue
                row = {"setting": setting, "frames": frames, "compiled": compiled}
                rows.append(row)
                if budget.left() < 0:
                    row["note"] = "not run: time budget spent"
                    continue
                model = _transformer(config, device, dtype, state)
                x, text = _inputs(config, frames, device, dtype)
                t0 = time.perf_counter()
                if setting != "fp":
                    row["note"] = _convert(model, setting, config, device, dtype)
                row["convert_s"] = time.perf_counter() - t0
                if compiled:
                    model.compile(backend=backend)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                t0 = time.perf_counter()
                _run(model, x, text, steps)  # warm-up (and compilation)
                _sync(device)
                row["first_run_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                _run(model, x, text, steps)
                _sync(device)
                row["s_per_step"] = (time.perf_counter() - t0) / steps
                if device.type == "cuda":
                    row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                del model
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------- report

def _err(row: dict) -> str:
    """A check's error, or its failure (``FAILED: <exception>``), or — for a row not run."""
    if "rel_err" in row:
        return f"{row['rel_err']:.2e}"
    note = row.get("note", "")
    return f"FAILED: {note.removeprefix('failed: ')}" if note.startswith("failed") else "—"


def section(device, checks, paths, linears, attention_rows, steps_rows, args, seconds: float) -> str:
    if device.type == "cuda":
        where = (f"GPU {torch.cuda.get_device_name(device)} (sm_{''.join(map(str, torch.cuda.get_device_capability(device)))}), "
                 f"torch {torch.__version__}, CUDA {torch.version.cuda}, Triton "
                 f"{__import__('triton').__version__ if tri.installed() else 'not installed'}")
    else:
        where = f"{machine_description()} — DRY RUN on CPU at toy sizes: the code path, not GPU numbers"
    lines = ["## GPU kernels and steps (issue 18)", "",
             f"Written by `python benchmarks/gpu/run.py{' --dry-run' if args.dry_run else ''}` on {where}, in {seconds:.0f} s. "
             "Paths per precision on this device (`sixbit.kernels.available()`): "
             f"{'; '.join(f'{k}: {v}' for k, v in kernels.available(device).items())}.", "",
             "### Kernel checks (each kernel vs its reference twin)", "",
             "| kernel | path | max abs Δ / max abs ref |", "|---|---|---:|"]
    lines += [f"| {r['kernel']} | {r['path']} | {_err(r)} |" for r in checks]
    lines += ["", "### Kernel paths of a quantized linear (`sixbit.kernels.paths.Path`, each vs its mode's twin path)", "",
              ("The dry run takes an sm_90 GPU's decisions on CPU: Triton interpreted, torch's GEMMs replaced by "
               "stand-ins that refuse what CUDA refuses (`sixbit.kernels.strict_ops`); NVFP4 rehearses Blackwell's. "
               if args.dry_run else "") + "A path not taken on this device says which the dispatcher runs instead.", "",
              "| path | mode | twin | execution here | max abs Δ / max abs twin |", "|---|---|---|---|---:|"]
    lines += [f"| {r['path']} | {r['mode']} | {r['twin']} | {r.get('execution', r.get('note', ''))} | {_err(r)} |"
              for r in paths]
    lines += ["", "### Per-linear times (one sample's tokens at 49 frames; median of synchronized calls)", "",
              f"| model | linear | K × N | rows | precision | ms | TFLOP/s | vs {BASE[args.dry_run].split()[0]} |", "|---|---|---|---:|---|---:|---:|---:|"]
    for r in linears:
        if r["ms"] is None:
            lines.append(f"| {r['model']} | {r['role']} | {r['k']} × {r['n']} | {r['m']} | {r['precision']} | not run (budget) | | |")
        else:
            sp = f"{r['speedup']:.2f}×" if r["speedup"] else "—"
            lines.append(f"| {r['model']} | {r['role']} | {r['k']} × {r['n']} | {r['m']} | {r['precision']} | "
                         f"{r['ms']:.3f} | {r['tflops']:.1f} | {sp} |")
    lines += ["", f"### Attention at CogVideoX-2B size ({'toy config, fp32' if args.dry_run else 'batch 2, 30 heads, head dim 64, bf16'}; "
              "text + video tokens; median of synchronized calls)", "",
              "| frames | tokens | kernel | ms | TFLOP/s | vs SDPA | max abs Δ / max abs SDPA | ‖Δ‖ / ‖SDPA‖ |",
              "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in attention_rows:
        if r["ms"] is None:
            lines.append(f"| {r['frames']} | {r['tokens']} | {r['kernel']} | not run (budget) | | | | |")
        else:
            sp = f"{r['speedup']:.2f}×" if r["speedup"] else "—"
            lines.append(f"| {r['frames']} | {r['tokens']} | {r['kernel']} | {r['ms']:.3f} | {r['tflops']:.1f} | {sp} | "
                         f"{r['max_err']:.2e} | {r['rel_err']:.2e} |")
    lines += ["", f"### Denoising steps of a CogVideoX-2B-sized transformer ({'toy config' if args.dry_run else '30 blocks × 1920, random weights'}, "
              f"bf16, CFG batch 2, {args.steps} steps)", ""]
    if args.dry_run:
        lines += [("Every layer on the GPU run's paths, Triton interpreted." if args.interpret_steps else
                   "Layers on the CPU's INT8 and full-precision paths, with CUDA's GEMM limits (the Triton paths: "
                   "per layer above; `--interpret-steps` runs them here too, slowly)."), ""]
    lines += ["| setting | frames | mode | s / step | vs fp = the bf16 model unconverted (same frames, same mode) | "
              "first run s (compile incl.) | peak GiB | note |",
              "|---|---:|---|---:|---:|---:|---:|---|"]
    base = {(r["frames"], r["compiled"]): r.get("s_per_step") for r in steps_rows if r["setting"] == "fp"}
    for r in steps_rows:
        mode = "compiled" if r["compiled"] else "eager"
        if "s_per_step" not in r:
            lines.append(f"| {r['setting']} | {r['frames']} | {mode} | — | — | — | — | {r.get('note', '')} |")
            continue
        b = base.get((r["frames"], r["compiled"]))
        vs = f"{b / r['s_per_step']:.2f}×" if b else "—"
        peak = f"{r['peak_gib']:.2f}" if "peak_gib" in r else "—"
        lines.append(f"| {r['setting']} | {r['frames']} | {mode} | {r['s_per_step']:.4f} | {vs} | {r['first_run_s']:.1f} | "
                     f"{peak} | {r.get('note', '')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, toy sizes: check the code path")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--budget-s", type=float, default=420.0, help="rows past this many seconds are not run")
    parser.add_argument("--runs", type=int, default=10, help="timed calls per linear")
    parser.add_argument("--steps", type=int, default=6, help="denoising steps per timed run")
    parser.add_argument("--frames", default="13,49")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--compile", default="fp,w8a8,balanced", help="settings also timed under torch.compile")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--interpret-steps", action="store_true",
                        help="dry run: the denoising steps take the Triton paths too, interpreted (slow); by default "
                             "they take the CPU's, with CUDA's GEMM limits, and the Triton paths run per layer")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry-run on CPU")
    with gpu_on_cpu() if args.dry_run else contextlib.nullcontext():  # the dry run: every decision a GPU makes
        return _measure(args, device)


def _measure(args, device: torch.device) -> int:
    t0 = time.perf_counter()
    budget = Budget(args.budget_s)
    print(kernels.available(device), flush=True)
    checks = kernel_checks(device, args.dry_run)
    print(checks, flush=True)
    paths = layer_paths(device, torch.float32 if args.dry_run else torch.bfloat16, args.dry_run)
    print(paths, flush=True)
    linears = linear_times(device, args.dry_run, 2 if args.dry_run else args.runs, budget)
    print(f"linears done at {time.perf_counter() - t0:.0f} s", flush=True)
    frames_list = [int(f) for f in args.frames.split(",") if f]
    attention_rows = attention_times(device, args.dry_run, 2 if args.dry_run else args.runs, frames_list, budget)
    print(f"attention done at {time.perf_counter() - t0:.0f} s", flush=True)
    settings = [s for s in args.settings.split(",") if s]
    with gpu_on_cpu(triton=args.interpret_steps) if args.dry_run else contextlib.nullcontext():
        steps_rows = step_times(device, args.dry_run, args.steps, frames_list, settings,
                                [s for s in args.compile.split(",") if s], args.backend, budget)
    update_section(args.output, "gpu", section(device, checks, paths, linears, attention_rows, steps_rows, args, time.perf_counter() - t0))
    print(f"wrote section 'gpu' of {args.output} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
