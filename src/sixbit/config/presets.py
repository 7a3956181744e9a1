"""The named conversion presets: :data:`PRESETS` and :func:`preset`.

A preset names an intent (``"balanced"``, ``"w8a8"``, …); :func:`sixbit.presets.for_device`
turns it into what runs on a device. Every number behind a choice here is measured in
BENCHMARKS.md.

Example:
    >>> preset("w4a8").activations
    'int8'
"""

from __future__ import annotations

import copy
from typing import Any

from .convert import ConvertConfig
from .delta_cache import DeltaCacheConfig
from .dmpq import DMPQConfig
from .quant import QuantConfig
from .sparse_attention import SparseAttentionConfig
from .static_w8a8 import StaticW8A8Config

# The 4-bit weight recipe of every W4 preset, chosen by bench_weights.py (BENCHMARKS.md,
# "4-bit weights"): NVFP4 with Hadamard 128, block scales searched by Hessian-weighted MSE, GPTQ
# (needs calibration), a 16-bit low-rank branch of ≤ 0.5 bit per weight and rank ≤ 16 on the
# compute layers (rank 3–4 at the shipped models' width 192; 16 from width ~1000 up, 0.27 bit at
# 1920, 0.1 bit at 5120), and the modulation linears in NVFP4, weight-only. The rank cap is what
# brings CogVideoX-2B to the paper's 3.3× fewer bytes than bf16 (uncapped, r = 30: 3.21×);
# bench_real_size.py measures it. Embedding and output layers stay in full precision: NVFP4
# there cost 3–7 dB on the shipped models.
W4_RECIPE: dict[str, Any] = dict(scale_rule="mse", gptq=True, lowrank_bits=0.5, lowrank_max_rank=16,
                                 role_formats={"modulation": "nvfp4"})


def _w4(act: str, **quant) -> dict[str, Any]:
    recipe = {**copy.deepcopy(W4_RECIPE), **quant}
    return {"weights": QuantConfig(weight_format="nvfp4", hadamard_block=128, **recipe), "activations": act}


def _w4_rtn(act: str) -> dict[str, Any]:
    """The reference: NVFP4 rounded to nearest, attention and feed-forward only (no calibration)."""
    return {"weights": QuantConfig(weight_format="nvfp4", hadamard_block=128), "activations": act}


# Cache budgets come from the cache benchmark (BENCHMARKS.md cache-pareto): the default 1.0 skips half
# of the block calls of the full-precision shapes models at 20 steps; 2.0 skips 55 %.
_PRESETS: dict[str, dict[str, Any]] = {
    "balanced": dict(
        **_w4("dynamic"), dmpq=DMPQConfig(target_bits=6.0, low="auto"), cache=DeltaCacheConfig(),
        description="the full method: NVFP4 weights (GPTQ, searched scales, low-rank branch), DMPQ activations (NVFP4/INT8 per block and step, target 6 bits, where the device has FP4 GEMMs; INT8 elsewhere), delta cache with PDR",
    ),
    "high_quality": dict(
        weights=QuantConfig(weight_format="int8", boundary_blocks=1, boundary_format=None), activations="int8",
        description="INT8 weights and activations (real integer GEMM), first and last block in full precision, no cache",
    ),
    "aggressive": dict(
        **_w4("nvfp4"), cache=DeltaCacheConfig(error_budget=2.0, cache_format="int4-g64"),
        description="NVFP4 weights (GPTQ, searched scales, low-rank branch) and activations (emulated here), delta cache at error budget 2 with 4-bit residuals",
    ),
    "w8a8-static": dict(
        weights=None, activations="static", static=StaticW8A8Config.preset("w8a8-static"),
        description="static W8A8: every activation scale fixed offline per time range, SmoothQuant folded in",
    ),
    "w4a6-dynamic": dict(
        **_w4("dynamic"), dmpq=DMPQConfig(target_bits=6.0),
        description="NVFP4 weights (GPTQ, searched scales, low-rank branch), DMPQ activations (NVFP4/INT8 per block and step, ~6 bits), no cache",
    ),
    "w4a8": dict(**_w4("int8"), description="NVFP4 weights (GPTQ, searched scales, low-rank branch), per-token INT8 activations"),
    "w4a8-rtn": dict(**_w4_rtn("int8"), description="reference: NVFP4 weights rounded to nearest (Hadamard 128, attention and feed-forward only, no calibration), per-token INT8 activations"),
    "w4a4": dict(**_w4("nvfp4"), description="NVFP4 weights (GPTQ, searched scales, low-rank branch) and activations (emulated here)"),
    "w4a16": dict(**_w4("fp"), description="NVFP4 weights only (GPTQ, searched scales, low-rank branch), activations in full precision"),
    # The modulation linears (weight-only INT8) take CogVideoX-2B from 1.64x to 1.98x fewer bytes
    # than bf16 (they hold 20 % of its weights); measured on the shipped models at W8A16, 4 pairs:
    # -0.6 dB (CogVideoX, 52.5 dB), 0.0 dB (Wan). Embedding/output layers in INT8 cost 3-5 dB more.
    "w8a8": dict(
        weights=QuantConfig(weight_format="int8", role_formats={"modulation": "int8"}), activations="int8",
        description="INT8 weights (per channel; modulation layers weight-only) and activations (per token), real integer GEMM",
    ),
    # The length preset (issue 60): at 5.6k-17.8k tokens attention is most of a call, which
    # w8a8 and the cache leave as it is. Sparse attention starts from 15 % of the blocks and each
    # head widens where its measured error on sampled rows passes 5 % (the adaptive mode): on
    # random weights every head goes dense, so speed rows use a fixed budget instead. Measured in
    # passing on the shipped models at 4 steps (not yet a BENCHMARKS row): 0.05 kept 34-40 dB.
    "w8a8-sparse": dict(
        weights=QuantConfig(weight_format="int8", role_formats={"modulation": "int8"}), activations="int8",
        cache=DeltaCacheConfig(), methods=(SparseAttentionConfig(density=0.15, error_bound=0.05),),
        description="w8a8 with the delta cache and block-sparse attention (15 % of the blocks, each head widening "
                    "where its measured error passes 5 %; first 2 steps dense): the fastest video at length",
    ),
    "tdc": dict(
        weights=None, activations="fp", cache=DeltaCacheConfig(),
        description="delta cache only, on the full-precision model",
    ),
}


def preset(name: str) -> ConvertConfig:
    """A fresh :class:`ConvertConfig` for the preset ``name`` (see :data:`PRESETS`)."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(_PRESETS)}, a JSON file or a ConvertConfig")
    return ConvertConfig(**copy.deepcopy(_PRESETS[name]))


PRESETS: tuple[str, ...] = tuple(_PRESETS)


def calibration_free() -> tuple[str, ...]:
    """The presets that convert without calibration generations, in :data:`PRESETS` order: the
    ones :func:`sixbit.convert_pretrained` streams from a bare transformer folder."""
    return tuple(name for name in _PRESETS if not preset(name).needs_calibration)
