"""Peak memory with and without ``sixbit.optimize.enable_memory_optimization`` → BENCHMARKS.md.

    python benchmarks/bench_memory.py                 # all configurations (a few minutes)
    python benchmarks/bench_memory.py --no-write      # print only

Every configuration runs in a fresh subprocess (``--child``), so no memory is shared or left
over between them. In the child: build the model (shipped shapes pipeline, or a random-weight
transformer with CogVideoX-2B's width), optionally quantize to NVFP4, optionally enable block
offloading to a disk folder; then ``gc.collect()`` and glibc ``malloc_trim(0)`` (the same for
every configuration, so freed heap is returned to the OS before measuring), read the resident
set (``VmRSS``) after a 1-step warm-up, reset the peak (``/proc/self/clear_refs`` ← 5) and run the sampling loop;
the peak resident set of that run is ``VmHWM``. Setup peaks (loading the weights before they go
to disk) are deliberately not in the "peak while sampling" column. CPU only: the onload device
is the CPU, so the saving is resident host memory; on a GPU the same schedule saves device
memory.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SECTION = "memory"

# (model, weights, prefetch_depth or None for no offloading)
# weights: "fp32"; "nvfp4" (weight-only, 4.5 bits); "int8" (W8A8, real int8 GEMM: the emulated
# NVFP4 path dequantizes every weight on every call, too slow on this CPU at the big width).
CONFIGS = [
    ("shapes-cogvideox", "fp32", None),
    ("shapes-cogvideox", "fp32", 1),
    ("shapes-wan", "nvfp4", None),
    ("shapes-wan", "nvfp4", 1),
    ("cogvideox-2b-width", "fp32", None),
    ("cogvideox-2b-width", "fp32", 1),
    ("cogvideox-2b-width", "fp32", 4),
    ("cogvideox-2b-width", "int8", None),
    ("cogvideox-2b-width", "int8", 1),
]
QUANT = {"nvfp4": dict(weight_format="nvfp4"), "int8": dict(weight_format="int8", act_mode="int8")}
BIG_LAYERS = 8
TEXT_TOKENS = 16


def _status(field: str) -> float:
    """A ``/proc/self/status`` field in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _big_transformer():
    """CogVideoX-2B's block shape (30 heads × 64, text 4096, time 512) with BIG_LAYERS blocks, random weights."""
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(0)
    model = CogVideoXTransformer3DModel(
        num_attention_heads=30, attention_head_dim=64, in_channels=16, out_channels=16, time_embed_dim=512,
        text_embed_dim=4096, num_layers=BIG_LAYERS, sample_width=8, sample_height=8, sample_frames=5,
        max_text_seq_length=TEXT_TOKENS,
    ).eval()
    return model


def _big_loop(model, steps: int) -> None:
    """A batched-CFG plain sampling loop: 2 latent frames of 16 channels × 8×8, TEXT_TOKENS text tokens."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 16, 8, 8, generator=g)
    text = torch.randn(2, TEXT_TOKENS, 4096, generator=g)
    with torch.no_grad():
        for t in torch.linspace(999, 1, steps):
            x = x - 0.01 * model(x, encoder_hidden_states=text, timestep=t.expand(2).long())[0]


def child(name: str, weights: str, depth: int | None, steps: int) -> dict:
    import sixbit
    from sixbit.optimize import enable_memory_optimization

    torch.set_num_threads(2)
    pipe = None
    if name.startswith("shapes-"):
        from sixbit.zoo.shapes import load_pipeline

        pipe = load_pipeline(name.removeprefix("shapes-"))
        model = pipe.transformer
    else:
        model = _big_transformer()
    if weights in QUANT:
        sixbit.quantize(model, sixbit.QuantConfig(**QUANT[weights]))
    nbytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    memory, folder = None, tempfile.mkdtemp(prefix="bench-memory-")
    if depth is not None:
        memory = enable_memory_optimization(pipe or model, prefetch_depth=depth, onload_device="cpu",
                                            offload_device=folder)

    def sample(steps: int) -> None:
        if pipe is None:
            _big_loop(model, steps)
            return
        pipe("a red circle moving right", num_inference_steps=steps, generator=torch.Generator().manual_seed(0))

    sample(1)  # warm-up: first-call costs (allocator, one-time kernels) stay out of both columns
    _trim()
    rest = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    sample(steps)
    result = {"weights_mib": nbytes / 2**20, "rest_mib": rest, "peak_mib": _status("VmHWM"),
              "groups": memory.groups if memory else None, "stats": vars(memory.stats) if memory else None}
    if memory is not None:
        memory.disable()
    return result


def _row(name, weights, depth, r) -> str:
    how = "none" if depth is None else f"group offload to disk, prefetch_depth={depth}"
    stats = r["stats"]
    resident = "all" if stats is None else f"≤ {stats['max_resident_groups']} of {r['groups']}"
    return (f"| {name} | {weights} | {r['weights_mib']:.1f} | {how} | {resident} | {r['rest_mib']:.0f} | "
            f"{r['peak_mib']:.0f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--no-write", action="store_true", help="print the table, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    if args.child:
        name, weights, depth = json.loads(args.child)
        print(json.dumps(child(name, weights, depth, args.steps)))
        return 0

    from report import machine_description, update_section

    torch.set_num_threads(2)
    lines = [
        "| model | weights | weight MiB | memory optimization | block groups resident | RSS at rest (MiB) "
        "| peak RSS while sampling (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    results = {}
    for name, weights, depth in CONFIGS:
        cmd = [sys.executable, __file__, "--child", json.dumps([name, weights, depth]), "--steps", str(args.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"configuration {name} {weights} depth={depth} failed")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results[(name, weights, depth)] = r
        lines.append(_row(name, weights, depth, r))
        print(lines[-1], file=sys.stderr)

    savings = []
    for (name, weights, depth), r in results.items():
        base = results.get((name, weights, None))
        if depth is not None and base is not None:
            savings.append(f"- {name} {weights}, prefetch_depth={depth}: peak while sampling "
                           f"{base['peak_mib']:.0f} → {r['peak_mib']:.0f} MiB "
                           f"({base['peak_mib'] - r['peak_mib']:+.0f} MiB saved, "
                           f"{r['peak_mib'] / base['peak_mib']:.0%} of the baseline).")
    body = "\n".join([
        "### Memory: block offloading to disk (`sixbit.optimize`)",
        "",
        f"Written by `python benchmarks/bench_memory.py` on {machine_description()}.",
        f"One fresh process per row; {args.steps} denoising steps (CFG on). `cogvideox-2b-width`: random "
        f"weights, CogVideoX-2B's block shape (1920 wide, text 4096) with {BIG_LAYERS} of its 30 blocks, "
        f"2 latent frames of 8×8 and {TEXT_TOKENS} text tokens (small activations, so the weights dominate), "
        "a plain sampling loop with batched CFG. Weights: fp32; nvfp4 = weight-only NVFP4; int8 = W8A8 "
        "with a real int8 GEMM (all through `sixbit.quantize`). RSS at rest: after setup (weights loaded, "
        "quantized, offloaded), a 1-step warm-up generation, `gc` and `malloc_trim`. Peak while sampling: "
        "`VmHWM` reset just before the loop. The shipped shapes models are pixel-space: no VAE, so no tiling here. "
        "Offloading is bit-exact (tested), so quality is unchanged. Its time cost is not reported: the one-command "
        "regeneration runs this beside other benchmarks on 2 shared cores, where wall times mean little.",
        "",
        *lines,
        "",
        *savings,
    ])
    print(body)
    if not args.no_write:
        update_section(args.output, SECTION, body)
        print(f"wrote section {SECTION!r} of {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
