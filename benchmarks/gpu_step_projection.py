"""PROJECTION, not a measurement: one denoising step (one transformer call, both CFG samples in one
batch of 2, as diffusers runs them) of CogVideoX-2B at 49 frames and Wan2.1-14B at 81 frames of
480p, in bf16 and every preset, on the GPUs of :mod:`bench_gpu_projection` (its roofline and peaks).

Each preset's path per linear is the code's own choice, asked without a GPU: the config as
:func:`sixbit.presets.for_device` runs it at the GPU's compute capability (DMPQ with ``low="auto"``
falls back to INT8 without FP4 GEMMs), then :func:`sixbit.kernels.paths.select` with the layer's
operands (a low-rank branch or a rotation the fused quantize does not take makes the input not
plain: the unfused INT8 path) and the capability's switches, as :func:`sixbit.kernels.available`
does. Used by ``bench_gpu_projection.py``; see its section for every modelling choice.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path as FilePath

import torch

from sixbit import formats, kernels
from sixbit.bench.layer_shapes import REAL_MODELS, SCALE_OF
from sixbit.kernels.cuda import CAPABILITIES
from sixbit.kernels.gpu_targets import fused_rotation
from sixbit.kernels.paths import Capabilities, Operands, Path, select
from sixbit.memory.fast_path import kept_bytes
from sixbit.nn.precision import ACT_BITS, ActMode
from sixbit.presets import PRESETS, for_device, resolve

ROOT = FilePath(__file__).resolve().parents[1]
CFG_BATCH = 2  # both models generate with classifier-free guidance: the two samples in one call
ROLE = {"FFN": "feedforward"}  # a linear's role from its REAL_MODELS name; the rest are attention


def capabilities(capability: tuple[int, int]) -> Capabilities:
    """The dispatcher's device switches answering for a GPU of ``capability``."""
    return Capabilities(*(functools.partial(fn, capability=capability) for fn in CAPABILITIES))


def skip_shares() -> dict[str, dict[str, float]]:
    """{real model: {cache method: share of block calls skipped}}, measured on the shipped shapes
    model standing in for it (BENCHMARKS.md ``cache-pareto``, 20 steps)."""
    out = {}
    for shapes, real in SCALE_OF.items():
        rows = json.loads((ROOT / "benchmarks" / "results" / f"caches-shapes-{shapes}" / "results.json").read_text())["rows"]
        for name in real:
            out[name] = {r["method"]: r["skip_share"] for r in rows}
    return out


def cache_method(name: str, config) -> str | None:
    """The ``cache-pareto`` row whose skip share stands for preset ``name``: its own row where it has
    one, else the delta cache alone at the preset's error budget (``tdc``: the default)."""
    if config.cache is None:
        return None
    default = type(config.cache)().error_budget
    return name if name == "balanced" else "tdc" if config.cache.error_budget == default else f"tdc-{config.cache.error_budget:g}"


@dataclasses.dataclass(frozen=True)
class Call:
    """One linear's call as a preset runs it: the path, per activation mode with its share of calls."""

    path: Path
    share: float
    fmt: str | None  # stored weight format (None: bf16)
    rotation: int | None
    rank: int


def layer_calls(config, role: str, k: int, n: int, caps: Capabilities, boundary: bool) -> list[Call]:
    """How preset ``config``'s layer of ``role`` (``k → n``) runs on a GPU with switches ``caps``."""
    if config.activations == "static":  # static W8A8: every block linear multiplies in INT8 with fixed scales
        return [Call(select("int8", torch.device("cuda"), Operands(static_input=True), caps), 1.0, "int8", None, 0)]
    weights = config.weights
    fmt = None if weights is None else (weights.boundary_format if boundary else weights.format_for(role))
    if fmt is None:
        return [Call(Path.FP, 1.0, None, None, 0)]
    bits = formats.get(fmt).element_bits
    rotation = weights.hadamard_block if bits <= 4 else None
    rank = weights.lowrank_rank_for(k, n) if bits <= 4 and role not in weights.weight_only_roles else 0
    ops = Operands(plain_input=rank == 0 and fused_rotation(rotation),
                   weight4=kernels.weight4_supported(formats.get(fmt).quantize(torch.zeros(1, k))))
    modes = {"fp": {"fp": 1.0}, "int8": {"int8": 1.0}, "nvfp4": {"nvfp4": 1.0}}.get(config.activations)
    if modes is None:  # DMPQ: NVFP4 on the FLOP share that brings the average to the target bits
        low, high = ACT_BITS[ActMode.NVFP4], ACT_BITS[ActMode.INT8]
        share = (high - config.dmpq.target_bits) / (high - low)
        modes = {"nvfp4": share, "int8": 1.0 - share}
    return [Call(select(mode, torch.device("cuda"), ops, caps), s, fmt, rotation, rank) for mode, s in modes.items()]


def int8_copies_kept(config, model, gpu_bytes: float) -> bool:
    """Whether the default layout (``sixbit.memory``: ``"auto"``) keeps INT8 copies of 4-bit weights
    multiplied in INT8: they fit in half the free memory, taken as the card's memory less the block
    weights as stored (text encoder, VAE and activations left out)."""
    if config.weights is None or formats.get(config.weights.weight_format).element_bits > 4:
        return False
    shapes = [(lin.n, lin.k, "gemm") for lin in model.linears] * model.layers
    stored = sum(formats.get(config.weights.weight_format).quantize(torch.zeros(2, k)).nbytes / 2 * n
                 for n, k, _ in shapes)
    return kept_bytes(shapes, "cuda") <= (gpu_bytes - stored) / 2


def plan(capability: tuple[int, int]) -> dict[str, dict]:
    """{preset: {"config", "note", "calls": {(role, k, n, boundary): [Call]}}} on a GPU of ``capability``."""
    caps = capabilities(capability)
    out = {}
    for name in PRESETS:
        config, note = for_device(resolve(name), "cuda", capability=capability)
        calls = {}
        for model in REAL_MODELS.values():
            for lin in model.linears:
                role = ROLE.get(lin.role.split()[0], "attention")
                for boundary in (False, True):
                    calls[(role, lin.k, lin.n, boundary)] = layer_calls(config, role, lin.k, lin.n, caps, boundary)
        out[name] = {"config": config, "note": note, "calls": calls}
    return out


def seconds(gpu: dict, nbytes: float, flops: dict) -> float:
    """Roofline time: the slower of moving ``nbytes`` and computing ``flops`` ({unit: FLOPs})."""
    return max([nbytes / gpu["bw"], *(f / gpu[unit] for unit, f in flops.items())])


def branch_seconds(gpu: dict, m: int, k: int, n: int, r: int, width: int) -> float:
    """The low-rank branch in ``width``-byte floats: ``x·Dᵀ`` (reads x again), then ``·Uᵀ`` to an
    (m, n) tensor the epilogue or an add reads once more."""
    unit = "bf16" if width == 2 else "fp32"
    return (seconds(gpu, width * (m * k + k * r + m * r), {unit: 2.0 * m * k * r})
            + seconds(gpu, width * (m * r + n * r + 2 * m * n), {unit: 2.0 * m * n * r}))


def call_seconds(call: Call, m: int, k: int, n: int, gpu: dict, t: dict, kept: bool) -> tuple[float, float, float]:
    """(seconds, of them the rotation's, the rotation's as an fp32 ``tl.dot``) of one linear call on
    ``m`` rows; ``t``: the single kernels' roofline (``bench_gpu_projection.kernels``); ``kept``: the
    layout keeps an INT8 copy of a 4-bit weight multiplied in INT8 (else re-rounded per call:
    the stored weight read, the codes written, then read by the GEMM)."""
    b, r = call.rotation, call.rank
    reround = 0.0 if kept or formats.get(call.fmt or "int8").element_bits > 4 else seconds(gpu, k * n * (9 / 16 + 1) + 4 * n, {})
    if call.path is Path.FP and call.fmt is None:
        return t["bf16 F.linear"], 0.0, 0.0
    if call.path is Path.INT8_FUSED:
        rot = [t[f"quantize + {key}Hadamard {b}"] - t["quantize"] if b else 0.0 for key in ("", "fp32 ")]
        return t["quantize"] + rot[0] + t["_int_mm"] + t["epilogue"] + reround, rot[0], rot[1]
    if call.path is Path.INT8_STATIC:
        return seconds(gpu, 3 * m * k, {}) + t["_int_mm"] + t["epilogue"], 0.0, 0.0
    if call.path is Path.INT8:  # bf16 input, late rotation: one bf16 GEMM by the ±1 matrix, then the quantize
        rot = seconds(gpu, 4 * m * k, {"bf16": 2.0 * m * k * b}) if b else 0.0
        rest = t["quantize"] + t["_int_mm"] + t["epilogue"] + seconds(gpu, 2 * m * n, {}) + reround
        return rest + rot + (branch_seconds(gpu, m, k, n, r, 2) if r else 0.0), rot, rot
    if call.path is Path.W4A16:  # hadamard.rotate: in fp32 (an fp32 copy of x, back to bf16)
        rot = seconds(gpu, 20 * m * k, {"fp32": 2.0 * m * k * b}) if b else 0.0
        return t["W4A16 (NVFP4)"] + rot + (branch_seconds(gpu, m, k, n, r, 2) if r else 0.0), rot, rot
    if call.path is Path.NVFP4_EMULATED:  # x to fp32, rotated; quantize, dequantize both; fp32 matmul
        rot = seconds(gpu, 8 * m * k, {"fp32": 2.0 * m * k * b}) if b else 0.0
        x = seconds(gpu, 6 * m * k + 8 * m * k + m * k * 9 / 16 + m * k * 9 / 16 + 4 * m * k, {})
        w = seconds(gpu, k * n * 9 / 16 + 4 * k * n, {})
        gemm = seconds(gpu, 4 * (m * k + k * n + m * n) + 6 * m * n, {"fp32": 2.0 * m * k * n})
        return x + w + gemm + rot + (branch_seconds(gpu, m, k, n, r, 4) if r else 0.0), rot, rot
    raise ValueError(f"no cost model for path {call.path} (weight {call.fmt}): add one to gpu_step_projection")


def attention_seconds(model, batch: int, rows: dict, gpu: dict, density: float) -> float:
    """bf16 flash attention of one block: QKᵀ and PV (4·Lq·Lkv·d FLOPs), q, k, v read and the output
    written once; ``density``: the share of self-attention tiles computed (block-sparse)."""
    def one(lq: int, lkv: int, share: float) -> float:
        d = model.hidden
        return seconds(gpu, 2 * batch * d * (2 * lq + 2 * lkv), {"bf16": share * 4.0 * batch * lq * lkv * d})
    if model.joint:
        return one(rows["joint"], rows["joint"], density)
    return one(rows["video"], rows["video"], density) + one(rows["video"], model.text_tokens, 1.0)


def step(name: str, entry: dict | None, model, rows: dict, gpu: dict, linear_kernels, skips: dict) -> dict:
    """One step of ``model`` (``rows``: tokens per sample, ``"joint"`` or ``"video"``) under preset
    ``name`` as ``entry`` (from :func:`plan`; None: bf16), in milliseconds: linears, attention, rotation
    shares (as compiled, and as an fp32 ``tl.dot``), and the mean step with the delta cache's skips."""
    config = None if entry is None else entry["config"]
    kept = config is not None and int8_copies_kept(config, model, gpu["memory"])
    boundary = 0 if config is None or config.weights is None else config.weights.boundary_blocks
    sparse = [m for m in (config.methods if config else ()) if type(m).__name__ == "SparseAttentionConfig"]
    density = sparse[0].density if sparse else 1.0
    total = {"linears": 0.0, "rotation": 0.0, "fp32_rotation": 0.0}
    paths = {}
    for lin in model.linears:
        m = CFG_BATCH * (model.text_tokens if lin.tokens == model.text_tokens and not model.joint
                         else rows["joint" if model.joint else "video"])
        t = linear_kernels(m, lin.k, lin.n, gpu)
        role = ROLE.get(lin.role.split()[0], "attention")
        for edge in (False, True):
            blocks = 2 * boundary if edge else model.layers - 2 * boundary
            if not blocks:
                continue
            calls = [Call(Path.FP, 1.0, None, None, 0)] if entry is None else entry["calls"][(role, lin.k, lin.n, edge)]
            for call in calls:
                s, rot, rot32 = call_seconds(call, m, lin.k, lin.n, gpu, t, kept)
                total["linears"] += blocks * call.share * s
                total["rotation"] += blocks * call.share * rot
                total["fp32_rotation"] += blocks * call.share * rot32
                paths[describe(call, kept)] = paths.get(describe(call, kept), 0.0) + blocks * call.share
    attention = model.layers * attention_seconds(model, CFG_BATCH, rows, gpu, density)
    full = total["linears"] + attention
    method = None if config is None else cache_method(name, config)
    skip = skips[model.name][method] if method else 0.0
    return {"linears_ms": 1e3 * total["linears"], "attention_ms": 1e3 * attention, "step_ms": 1e3 * full,
            "rotation_share": total["rotation"] / full, "density": density, "kept": kept,
            "fp32_rotation_share": total["fp32_rotation"] / (full - total["rotation"] + total["fp32_rotation"]),
            "skip": skip, "cache_method": method, "mean_step_ms": 1e3 * full * (1.0 - skip),
            "paths": paths, "note": None if entry is None else entry["note"]}


def describe(call: Call, kept: bool) -> str:
    """A call's path in words for the table."""
    text = call.path.value
    if call.rotation and call.path is not Path.INT8_STATIC:
        text += f" + H{call.rotation}"
    if call.rank:
        text += f" + rank-{call.rank} branch"
    if call.fmt and formats.get(call.fmt).element_bits <= 4 and call.path in (Path.INT8, Path.INT8_FUSED):
        text += " (INT8 copy kept)" if kept else " (re-rounded per call)"
    return text


def int8_attention_seconds(model, batch: int, rows: dict, gpu: dict) -> float:
    """sixbit's INT8 attention kernel on one block (opt-in: ``AttentionQuantConfig``): q and k
    quantized to INT8 (one read, one write), QKᵀ on INT8 and PV on FP16 tensor cores, one after
    the other; its memory traffic overlaps."""
    def one(lq: int, lkv: int) -> float:
        d, flops = model.hidden, 2.0 * batch * lq * lkv * model.hidden
        nbytes = batch * d * (3 * (lq + lkv) + (lq + lkv) + 2 * lkv + 2 * lq)
        return max(nbytes / gpu["bw"], flops / gpu["int8"] + flops / gpu["bf16"])
    if model.joint:
        return one(rows["joint"], rows["joint"])
    return one(rows["video"], rows["video"]) + one(rows["video"], model.text_tokens)
