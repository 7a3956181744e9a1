"""Attention alone on this CPU at a real video's token count: what an INT8 Q·Kᵀ path can reach
against bf16 ``scaled_dot_product_attention`` → BENCHMARKS.md (section ``attention-cpu``).

    python benchmarks/bench_attention_cpu.py              # CogVideoX-2B heads, 5,626 tokens (~2 min)
    python benchmarks/bench_attention_cpu.py --tokens 2048

The shape: CogVideoX-2B's 30 heads of 64 at 13 frames of 480×720 (4 latent frames of 60×90 =
5,400 video tokens + 226 text), CFG batch 2: ``q, k, v`` of (2, 30, 5626, 64) in bf16, random
(K with a shared offset, as DiTs have). Every row is timed in the same process, interleaved
(median of ``--repeats`` after a warm-up), and its output compared with fp32 attention:

- *bf16 SDPA*: ``torch.nn.functional.scaled_dot_product_attention``, what a user runs (a fused
  flash-attention kernel on CPUs: the score tiles never leave the cache);
- *bf16, blocked*: the same arithmetic as torch ops over blocks of 1,024 queries (Q·Kᵀ in bf16,
  softmax in fp32, P·V in bf16): what any path pays that writes the scores to memory;
- *INT8 Q·Kᵀ (oneDNN AMX), blocked*: SageAttention's method with real integer products: K
  smoothed, Q and K per token in INT8, Q·Kᵀ through oneDNN's AMX INT8 kernel with K packed per
  head, softmax in fp32, P·V in bf16; its parts timed apart;
- *sixbit's CPU path today*: :func:`sixbit.kernels.attention.int8_attention` (the emulation:
  the method's numerics in fp32 matmuls), one head at a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from report import machine_description, update_section

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1024


def _inputs(tokens: int):
    g = torch.Generator().manual_seed(0)
    shape = (2, 30, tokens, 64)
    q = (torch.randn(shape, generator=g) * 2).bfloat16()
    k = (torch.randn(shape, generator=g) * 2 + 1).bfloat16()
    return q, k, torch.randn(shape, generator=g).bfloat16()


def _blocked(q, v, parts, head, scores_of):
    """Attention over blocks of ``CHUNK`` queries: per (batch, head), ``head(b, h)`` prepares what
    ``scores_of(prepared, b, h, s)`` needs to give the fp32 scores of the block at ``s``; softmax in
    fp32, P·V in bf16. Each part's time is added to ``parts``."""
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            prepared = head(b, h)
            for s in range(0, q.shape[2], CHUNK):
                t0 = time.perf_counter()
                scores = scores_of(prepared, b, h, s)
                t1 = time.perf_counter()
                p = torch.softmax(scores, dim=-1).bfloat16()
                t2 = time.perf_counter()
                out[b, h, s:s + CHUNK] = p @ v[b, h]
                t3 = time.perf_counter()
                for name, dt in (("Q·Kᵀ", t1 - t0), ("softmax", t2 - t1), ("P·V", t3 - t2)):
                    parts[name] = parts.get(name, 0.0) + dt
    return out


def _blocked_bf16(q, k, v, parts):
    scale = q.shape[-1] ** -0.5
    return _blocked(q, v, parts, lambda b, h: k[b, h].t(),
                    lambda kt, b, h, s: (q[b, h, s:s + CHUNK] @ kt).float() * scale)


def _int8_codes(x):
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127.0
    return torch.round(x / scale).to(torch.int8), scale


def _blocked_int8(q, k, v, parts):
    from sixbit.kernels import packed_int8_matmul, pack_int8_weight

    t0 = time.perf_counter()
    kf = k.float()
    k_codes, k_scale = _int8_codes(kf - kf.mean(dim=-2, keepdim=True))
    q_codes, q_scale = _int8_codes(q.float())
    parts["quantize Q, K"] = parts.get("quantize Q, K", 0.0) + time.perf_counter() - t0
    scale = q.shape[-1] ** -0.5

    def head(b, h):  # K packed once per head for oneDNN's AMX INT8 kernel
        t0 = time.perf_counter()
        packed = pack_int8_weight(k_codes[b, h]), k_scale[b, h, :, 0].contiguous()
        parts["pack K"] = parts.get("pack K", 0.0) + time.perf_counter() - t0
        return packed

    return _blocked(q, v, parts, head, lambda packed, b, h, s: packed_int8_matmul(
        q_codes[b, h, s:s + CHUNK], *packed).mul_(q_scale[b, h, s:s + CHUNK] * scale))


def _per_head(fn, q, k, v):
    """``fn`` one (batch, head) at a time: all 60 heads' fp32 scores at once would take ~22 GB here."""
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            out[b:b + 1, h:h + 1] = fn(q[b:b + 1, h:h + 1], k[b:b + 1, h:h + 1], v[b:b + 1, h:h + 1])
    return out


def measure(tokens: int, repeats: int) -> dict:
    from sixbit.kernels import amx_int8
    from sixbit.kernels.attention import int8_attention

    q, k, v = _inputs(tokens)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    rows = {"bf16 SDPA": lambda parts: F.scaled_dot_product_attention(q, k, v),
            "bf16, blocked": lambda parts: _blocked_bf16(q, k, v, parts),
            "sixbit's CPU path today (emulated)": lambda parts: _per_head(int8_attention, q, k, v)}
    if amx_int8():
        rows["INT8 Q·Kᵀ (oneDNN AMX), blocked"] = lambda parts: _blocked_int8(q, k, v, parts)
    times = {name: [] for name in rows}
    parts = {name: {} for name in rows}
    errors = {}
    for i in range(repeats + 1):  # interleaved: every row once per round, the first round a warm-up
        for name, fn in rows.items():
            timed = {}
            t0 = time.perf_counter()
            out = fn(timed)
            if i:
                times[name].append(time.perf_counter() - t0)
                for part, dt in timed.items():
                    parts[name][part] = parts[name].get(part, 0.0) + dt / repeats
            errors[name] = float((out.float() - exact).norm() / exact.norm())
    return {"tokens": tokens, "repeats": repeats, "seconds": {n: statistics.median(t) for n, t in times.items()},
            "parts": parts, "errors": errors, "machine": machine_description()}


def section(r: dict) -> str:
    base = r["seconds"]["bf16 SDPA"]
    lines = ["## Attention alone on this CPU at 13 frames of 480×720 (issue 46)", "",
             f"Written by `python benchmarks/bench_attention_cpu.py`. Machine: {r['machine']}. q, k, v of "
             f"(2, 30, {r['tokens']}, 64) in bf16 (CogVideoX-2B's heads; 4 latent frames of 60×90 + 226 text tokens, "
             f"CFG batch 2), random; every row in one process, interleaved, median of {r['repeats']}. *rel. error*: "
             "against fp32 attention. *blocked*: torch ops over 1,024 queries at a time, the scores written to memory "
             "(softmax in fp32); the INT8 row quantizes Q and K per token (K smoothed by its mean), packs K per head "
             "for oneDNN's AMX INT8 kernel and runs Q·Kᵀ there (real integer products), P·V in bf16.", "",
             "| path | s | vs bf16 SDPA | rel. error | Q·Kᵀ s | softmax s | P·V s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in r["seconds"].items():
        p = r["parts"][name]
        cells = [f"{p[k]:.2f}" if k in p else "–" for k in ("Q·Kᵀ", "softmax", "P·V")]
        lines.append(f"| {name} | {s:.2f} | **{base / s:.2f}×** | {r['errors'][name]:.4f} | " + " | ".join(cells) + " |")
    int8 = r["seconds"].get("INT8 Q·Kᵀ (oneDNN AMX), blocked")
    blocked = r["seconds"]["bf16, blocked"]
    if int8 is not None:
        parts = r["parts"]["INT8 Q·Kᵀ (oneDNN AMX), blocked"]
        lines += ["", f"Check (issue 46): a CPU attention kernel ≥ 1.3× bf16 SDPA: **no** — the INT8 Q·Kᵀ path runs at "
                  f"{base / int8:.2f}× SDPA. Why, and the limit: the same arithmetic in bf16, blocked, runs at "
                  f"{base / blocked:.2f}×. INT8 operands do pay inside it (Q·Kᵀ {parts['Q·Kᵀ']:.2f} s against "
                  f"{r['parts']['bf16, blocked']['Q·Kᵀ']:.2f} s in bf16), but any path built from torch ops writes the "
                  f"(queries × keys) scores to memory and reads them back: the softmax over them alone "
                  f"({parts['softmax']:.2f} s) takes longer than SDPA's whole call, whose fused kernel keeps each tile "
                  "of scores in cache (online softmax). Beating SDPA takes a fused INT8 kernel in C++ (AMX tiles for "
                  "Q·Kᵀ, the online softmax in registers, P·V on AMX); sixbit has none, so quantized attention stays "
                  "off the CPU presets and runs there as the labelled emulation."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=5626)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    r = measure(args.tokens, args.repeats)
    (ROOT / "benchmarks" / "results" / "attention_cpu.json").write_text(json.dumps(r, indent=1))
    text = section(r)
    print(text)
    update_section(args.output, "attention-cpu", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
