"""Time one linear layer per precision at CogVideoX-2B shapes and write the table into BENCHMARKS.md.

    python benchmarks/bench_linear.py            # M = 4096 tokens, median of 5 runs after a warm-up

Shapes: CogVideoX-2B's hidden size is 1920 and its feed-forward width 7680, so its linears are
(K, N) = (1920, 1920) (attention projections), (1920, 7680) and (7680, 1920) (feed-forward).
Weights are random: only the shapes matter for time. Rows:

- fp32 / bf16: ``torch.nn.Linear``.
- int8 (real): ``QuantLinear`` with INT8 weights in ``int8`` mode — per-token activation
  quantization plus the integer GEMM (``torch._int_mm``), all included.
- int8 GEMM only: ``torch._int_mm`` on pre-quantized operands (the kernel's ceiling).
- nvfp4 weight-only: NVFP4 weights dequantized per call, fp32 GEMM (real weight-only path).
- nvfp4 (emulated): NVFP4 × NVFP4 by dequantizing both operands, fp32 GEMM — no FP4 matmul
  exists on this device, so this row measures emulation cost, not FP4 hardware speed.

Ratios are against fp32 measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from sixbit.bench.report import machine_description, update_section
from sixbit.nn import QuantLinear

SHAPES = [(1920, 1920), (1920, 7680), (7680, 1920)]


def median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_shape(m: int, k: int, n: int, reps: int) -> list[dict]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=False)
    x = torch.randn(m, k)
    lin_bf16 = torch.nn.Linear(k, n, bias=False).to(torch.bfloat16)
    x_bf16 = x.bfloat16()
    q8 = QuantLinear.from_linear(lin, "int8", act_mode="int8")
    q4 = QuantLinear.from_linear(lin, "nvfp4", act_mode="fp")
    q4a = QuantLinear.from_linear(lin, "nvfp4", act_mode="nvfp4")
    a8 = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    w8t = torch.randint(-127, 128, (n, k), dtype=torch.int8).t()
    rows = [
        ("fp32", "nn.Linear", 32.0, lambda: lin(x)),
        ("bf16", "nn.Linear", 16.0, lambda: lin_bf16(x_bf16)),
        ("int8", "real: act quant + torch._int_mm", 8 * q8.weight_nbytes() / (k * n), lambda: q8(x)),
        ("int8 GEMM only", "real: torch._int_mm", 8.0, lambda: torch._int_mm(a8, w8t)),
        ("nvfp4 weight-only", "real: dequant + fp32 GEMM", 8 * q4.weight_nbytes() / (k * n), lambda: q4(x)),
        ("nvfp4", "EMULATED: dequant both + fp32 GEMM", 8 * q4a.weight_nbytes() / (k * n), lambda: q4a(x)),
    ]
    out = []
    with torch.no_grad():
        for name, how, bits, fn in rows:
            out.append({"precision": name, "how": how, "bits": bits, "seconds": median_seconds(fn, reps)})
    fp32 = out[0]["seconds"]
    for r in out:
        r["speedup"] = fp32 / r["seconds"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=4096, help="tokens per call (default 4096)")
    parser.add_argument("--reps", type=int, default=5, help="timed runs per row; the median is reported")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    lines = [
        "## Linear layers per precision (CogVideoX-2B shapes)",
        "",
        f"Written by `python benchmarks/bench_linear.py --m {args.m} --reps {args.reps}`. "
        f"Machine: {machine_description()}. M = {args.m} tokens, median of {args.reps} runs after a "
        "warm-up, random weights. *Speedup* is fp32 time / row time, measured in the same run. "
        "Rows marked EMULATED do not run low-bit arithmetic (no FP4 matmul on this device).",
        "",
        "| K → N | precision | how it runs | bits/weight | ms/call | speedup vs fp32 |",
        "|---|---|---|---:|---:|---:|",
    ]
    for k, n in SHAPES:
        for r in bench_shape(args.m, k, n, args.reps):
            lines.append(
                f"| {k} → {n} | {r['precision']} | {r['how']} | {r['bits']:.2f} | "
                f"{1e3 * r['seconds']:.1f} | {r['speedup']:.2f}× |"
            )
            print(lines[-1], flush=True)
    update_section(args.out, "linear", "\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
