"""Real video-DiT linear shapes at 49 frames: FLOP counts and time per call per precision.

Shapes come from the published configs (diffusers ``transformer/config.json``):

* CogVideoX-2B: 30 heads × 64 (hidden 1920), 30 layers, FFN 4×; CogVideoX-5B: 48 × 64
  (3072), 42 layers. 49 frames at 480×720 → 13 latent frames of 60×90, patch 2 →
  17 550 video tokens; 226 text tokens joined to them in every attention and FFN call.
* Wan2.1-14B: 40 heads × 128 (5120), 40 layers, FFN 13 824. 49 frames at 480×832 → 13 latent
  frames of 60×104, patch (1, 2, 2) → 20 280 video tokens; self-attention, then
  cross-attention to 512 text tokens.

Per-sample modulation linears (a few rows per call) are left out: their FLOPs are
negligible. Timing (:func:`time_layers`): random weights (the shape is what matters), two
row counts per shape fitted as fixed + per-row cost and evaluated at the real rows (a real
49-frame call has ~20 000 rows: too slow to time directly on a CPU). NVFP4 × NVFP4 is
EMULATED on a device without FP4 GEMMs (dequantize both, fp32 matmul): that row measures
emulation cost, not FP4 speed.

Example:
    >>> gemm, attn = model_flops("CogVideoX-2B")
    >>> round(attn / (gemm + attn), 2)      # share of FLOPs in attention at 49 frames
    0.61
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time

import torch

from ..nn.precision import gemm_flops

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Linear:
    role: str
    k: int
    n: int
    tokens: int  # rows per call (one sample)


@dataclasses.dataclass(frozen=True)
class RealModel:
    name: str
    hidden: int
    layers: int
    video_tokens: int
    text_tokens: int
    linears: tuple[Linear, ...]  # per block
    joint: bool  # CogVideoX: one attention over text + video tokens; Wan: self + cross
    head_dim: int = 64

    def block_flops(self) -> tuple[float, float]:
        """(GEMM FLOPs, attention FLOPs) of one block call on one sample."""
        gemm = sum(gemm_flops(lin.k, lin.n, lin.tokens) for lin in self.linears)
        d = self.hidden
        if self.joint:
            length = self.video_tokens + self.text_tokens
            attention = 4.0 * length * length * d  # QKᵀ and PV
        else:
            attention = 4.0 * self.video_tokens * (self.video_tokens + self.text_tokens) * d
        return gemm, attention


def _cogvideox(name: str, heads: int, layers: int) -> RealModel:
    d, video, text = heads * 64, 13 * 30 * 45, 226
    joint = video + text
    linears = (
        Linear("attention q/k/v/out (×4)", d, d, joint),
        Linear("attention q/k/v/out (×4)", d, d, joint),
        Linear("attention q/k/v/out (×4)", d, d, joint),
        Linear("attention q/k/v/out (×4)", d, d, joint),
        Linear("FFN up", d, 4 * d, joint),
        Linear("FFN down", 4 * d, d, joint),
    )
    return RealModel(name, d, layers, video, text, linears, joint=True)


def _wan14b() -> RealModel:
    d, ffn, video, text = 5120, 13824, 13 * 30 * 52, 512
    linears = (
        *(Linear("self-attention q/k/v/out (×4)", d, d, video) for _ in range(4)),
        Linear("cross-attention q, out (×2)", d, d, video),
        Linear("cross-attention q, out (×2)", d, d, video),
        Linear("cross-attention k, v on text (×2)", d, d, text),
        Linear("cross-attention k, v on text (×2)", d, d, text),
        Linear("FFN up", d, ffn, video),
        Linear("FFN down", ffn, d, video),
    )
    return RealModel("Wan2.1-14B", d, 40, video, text, linears, joint=False, head_dim=128)


REAL_MODELS: dict[str, RealModel] = {
    m.name: m for m in (_cogvideox("CogVideoX-2B", 30, 30), _cogvideox("CogVideoX-5B", 48, 42), _wan14b())
}

#: (input widths K of the block linears, attention head dim) of every model the GPU kernels are
#: compiled for (:mod:`sixbit.kernels.triton.aot`): :data:`REAL_MODELS`, and from their diffusers
#: configs Wan2.1-1.3B (width 1536, 12 heads × 128, FFN 8960) and HunyuanVideo (3072, 24 × 128, FFN
#: 12288; a single-stream block's output linear reads attention and MLP joined: 3072 + 12288 wide).
KERNEL_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    **{m.name: (tuple(sorted({lin.k for lin in m.linears})), m.head_dim) for m in REAL_MODELS.values()},
    "Wan2.1-1.3B": ((1536, 8960), 128),
    "HunyuanVideo": ((3072, 12288, 15360), 128),
}

#: The real model each shipped shapes model stands in for in the GPU projection.
SCALE_OF = {"cogvideox": ("CogVideoX-2B", "CogVideoX-5B"), "wan": ("Wan2.1-14B",)}


def model_flops(name: str, steps: int = 50, cfg: bool = True) -> tuple[float, float]:
    """(GEMM FLOPs, attention FLOPs) of one 49-frame generation of real model ``name``."""
    if name not in REAL_MODELS:
        raise ValueError(f"unknown real model {name!r}; valid: {sorted(REAL_MODELS)}")
    m = REAL_MODELS[name]
    gemm, attention = m.block_flops()
    calls = m.layers * steps * (2 if cfg else 1)
    return gemm * calls, attention * calls


def _median_seconds(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


#: precision → how it runs here (every table row carries this label)
PRECISIONS = {
    "fp32": "nn.Linear fp32",
    "bf16": "nn.Linear bf16",
    "int8": "real: QuantLinear INT8 W, per-token INT8 A from the baseline dtype's input, integer GEMM (torch._int_mm)",
    "int8 kept": "real: the same after sixbit.keep_int8_weights (AMX CPUs: oneDNN's AMX INT8 kernel, 8 more bits/weight)",
    "nvfp4": "EMULATED: QuantLinear NVFP4 W and A, dequantize both + fp32 GEMM",
}


def _layer(precision: str, k: int, n: int, baseline: torch.dtype):
    """(layer, input dtype); INT8 takes its input in ``baseline``, the dtype the model would run in."""
    from ..nn import QuantLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=False)
    if precision == "bf16":
        return lin.to(torch.bfloat16), torch.bfloat16
    if precision in ("int8", "int8 kept"):
        layer = QuantLinear.from_linear(lin, "int8", act_mode="int8")
        if precision == "int8 kept":
            from ..memory.fast_path import keep_int8_weights

            keep_int8_weights(layer)
        return layer, baseline
    if precision == "nvfp4":
        return QuantLinear.from_linear(lin, precision, act_mode=precision), torch.float32
    return lin, torch.float32


def time_layers(models=None, rows=(128, 512), runs: int = 3, nvfp4_models=("CogVideoX-2B",),
                progress: bool = True) -> list[dict]:
    """Time each distinct (K, N) of ``models`` (default all of :data:`REAL_MODELS`) per precision.

    Each (K, N, precision) is timed at the two row counts ``rows`` (median of ``runs`` after a
    warm-up) and fitted as ``t(M) = a + b·M`` — fixed per-call costs (an emulated path
    dequantizes the whole weight on every call) stay fixed, the GEMM grows with M — then
    evaluated at each real call's rows. The EMULATED NVFP4 path is timed on ``nvfp4_models``
    only: its time is dominated by per-call weight dequantization, which says nothing about FP4
    hardware. Returns one row per (model, linear role, precision) with ``ms_per_call``,
    ``speedup`` vs ``baseline`` (the fastest full-precision dtype of this CPU,
    :func:`sixbit.kernels.fastest_float_dtype`: ``"bf16"`` or ``"fp32"``) and ``speedup_fp32``.
    """
    from tqdm.auto import tqdm

    from ..kernels import fastest_float_dtype

    names = list(models or REAL_MODELS)
    for name in names:
        if name not in REAL_MODELS:
            raise ValueError(f"unknown real model {name!r}; valid: {sorted(REAL_MODELS)}")
    m1, m2 = rows
    if not 0 < m1 < m2:
        raise ValueError(f"rows must be two increasing row counts, got {rows!r}")
    fastest = fastest_float_dtype("cpu")
    baseline = "bf16" if fastest == torch.bfloat16 else "fp32"
    jobs = sorted({(lin.k, lin.n, p) for name in names for lin in REAL_MODELS[name].linears for p in PRECISIONS
                   if p != "nvfp4" or name in nvfp4_models})
    fits = {}
    with torch.no_grad():
        for k, n, precision in tqdm(jobs, desc="layer shapes", disable=not progress):
            layer, dtype = _layer(precision, k, n, fastest)
            t1, t2 = (_median_seconds(lambda: layer(torch.randn(m, k).to(dtype)), runs) for m in (m1, m2))
            slope = (t2 - t1) / (m2 - m1)
            # timing noise can make the larger call look cheaper: then assume no fixed cost
            fits[(k, n, precision)] = (t1 - slope * m1, slope) if slope > 0 else (0.0, t2 / m2)
            logger.info("%d→%d %s: %.2f ms at %d rows, %.2f ms at %d rows", k, n, precision, 1e3 * t1, m1, 1e3 * t2, m2)
    out = []
    for name in names:
        seen = set()
        for lin in REAL_MODELS[name].linears:
            if (lin.role, lin.k, lin.n, lin.tokens) in seen:
                continue
            seen.add((lin.role, lin.k, lin.n, lin.tokens))
            seconds = {p: fits[(lin.k, lin.n, p)][0] + fits[(lin.k, lin.n, p)][1] * lin.tokens
                       for p in PRECISIONS if (lin.k, lin.n, p) in fits}
            for precision, t in seconds.items():
                out.append({
                    "model": name, "role": lin.role, "k": lin.k, "n": lin.n, "tokens": lin.tokens,
                    "precision": precision, "how": PRECISIONS[precision], "measured_rows": list(rows),
                    "ms_per_call": 1e3 * t, "baseline": baseline, "speedup": seconds[baseline] / t,
                    "speedup_fp32": seconds["fp32"] / t,
                })
    return out
