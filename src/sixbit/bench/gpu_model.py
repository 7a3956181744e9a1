"""PROJECTION of a run's speedup onto GPUs from the work it counted — not a measurement.

Model (deliberately simple, every term visible):

* each GEMM runs at its precision's peak tensor-core throughput; attention (QKᵀ, PV) runs at
  the BF16 peak in every method (neither the paper nor we quantize attention);
* time = Σ_precision GEMM FLOPs / peak(precision) + attention FLOPs / peak(bf16);
* projected speedup = time of the FP run / time of the method's run.

Everything else — memory traffic, quantization and Hadamard overheads, norms, kernel launch,
the VAE and text encoder — is left out, so the projection is an upper bound of what the FLOP
mix allows on a compute-bound GPU. Throughputs are relative to BF16 and come from
``shared/REFERENCE.md`` §7: Blackwell (RTX 5090, B200) runs FP4 at ≈ 4× and FP8/INT8 at ≈ 2×
BF16; Hopper (H100/H200) runs FP8/INT8 at 2× and has no FP4, so an NVFP4 × NVFP4 GEMM is
dequantized and runs at the BF16 rate. Weight-only quantization ("fp" activations) computes
in BF16 everywhere. With these ratios RTX 5090 and B200 project the same speedup; they are
listed separately so that absolute peaks can be added without changing the callers.

Two ways to feed it (:func:`project`):

* *as run*: the counted FLOPs of the tiny model itself (its 256-token sequences make
  attention a small share, unlike real video models);
* *at real scale*: the run's per-precision GEMM shares and attention share (relative to the
  FP run of the same prompts, so skipped blocks lower both) applied to a real model's GEMM and
  attention FLOPs at 49 frames (:func:`sixbit.bench.layer_shapes.model_flops`).

Example:
    >>> fp = {"gemm": {"fp": 100.0}, "attention": 100.0}
    >>> run = {"gemm": {"int8": 100.0}, "attention": 100.0}
    >>> round(projected_speedup(fp, run, GPUS["H100/H200"]), 4)   # (100 + 100) / (50 + 100)
    1.3333
"""

from __future__ import annotations

import dataclasses

LABEL = "PROJECTION (peak-throughput model, not measured)"


@dataclasses.dataclass(frozen=True)
class GPU:
    """Relative dense tensor-core throughput per GEMM precision (BF16 = 1)."""

    name: str
    family: str
    throughput: dict  # precision label ("fp", "int8", "nvfp4") → × BF16
    note: str = ""

    def seconds(self, gemm: dict[str, float], attention: float) -> float:
        """Time in BF16-peak units (FLOPs / BF16 peak) of ``gemm`` FLOPs per precision plus attention."""
        unknown = set(gemm) - set(self.throughput)
        if unknown:
            raise ValueError(f"no throughput for precision {sorted(unknown)} on {self.name}; known: {sorted(self.throughput)}")
        return sum(f / self.throughput[p] for p, f in gemm.items()) + attention / self.throughput["fp"]


_BLACKWELL = {"fp": 1.0, "int8": 2.0, "nvfp4": 4.0}
GPUS: dict[str, GPU] = {
    "RTX 5090": GPU("RTX 5090", "Blackwell", _BLACKWELL, "native NVFP4, INT8"),
    "B200": GPU("B200", "Blackwell", _BLACKWELL, "native NVFP4, INT8"),
    "H100/H200": GPU("H100/H200", "Hopper", {"fp": 1.0, "int8": 2.0, "nvfp4": 1.0},
                     "no FP4: NVFP4 GEMMs dequantized to BF16"),
}


def projected_speedup(fp: dict, run: dict, gpu: GPU) -> float:
    """``gpu`` time of ``fp`` over time of ``run``; each ``{"gemm": {precision: FLOPs}, "attention": FLOPs}``."""
    t_run = gpu.seconds(run["gemm"], run["attention"])
    return gpu.seconds(fp["gemm"], fp["attention"]) / t_run if t_run > 0 else float("inf")


def at_scale(fp: dict, run: dict, real_gemm: float, real_attention: float) -> tuple[dict, dict]:
    """Transfer ``run``'s mix onto a real model: (FP work, method work) with ``real_*`` FLOPs.

    The method's GEMM FLOPs at precision p become ``real_gemm · run_gemm[p] / Σ fp_gemm`` and its
    attention ``real_attention · run_attention / fp_attention``: what the method skipped or
    lowered on the tiny model, it skips or lowers in the same proportion on the real one.
    """
    fp_gemm = sum(fp["gemm"].values())
    attn_share = run["attention"] / fp["attention"] if fp["attention"] else 1.0
    gemm = {p: real_gemm * f / fp_gemm for p, f in run["gemm"].items()} if fp_gemm else {}
    return {"gemm": {"fp": real_gemm}, "attention": real_attention}, {"gemm": gemm, "attention": real_attention * attn_share}


def project(fp: dict, run: dict, real: dict[str, tuple[float, float]] | None = None) -> dict:
    """Projected speedups of ``run`` over ``fp`` per GPU: ``{"as run": {gpu: x}, model: {gpu: x}}``.

    ``real`` maps a real model's name to its (GEMM FLOPs, attention FLOPs) per generation.
    """
    out = {"as run": {g.name: projected_speedup(fp, run, g) for g in GPUS.values()}}
    for model, (g_real, a_real) in (real or {}).items():
        f, r = at_scale(fp, run, g_real, a_real)
        out[model] = {g.name: projected_speedup(f, r, g) for g in GPUS.values()}
    return out


def attention_share(gemm: float, attention: float, gpu: GPU) -> float:
    """Share of the FP time spent in attention on ``gpu`` under this model."""
    return attention / gpu.throughput["fp"] / gpu.seconds({"fp": gemm}, attention)
