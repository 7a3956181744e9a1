"""Which of the CPU's matrix instructions torch may use, under the caps a user can set.

torch's bf16 and INT8 GEMMs go through oneDNN, which honours ``ONEDNN_MAX_CPU_ISA`` (or the older
``DNNL_MAX_CPU_ISA``): on an AMX CPU, ``AVX512_CORE_VNNI`` keeps it on AVX512-VNNI, ``AVX2`` on
AVX2 (checked with ``ONEDNN_VERBOSE=1``). ATen's own vectorized kernels (reductions, softmax,
activations) follow ``ATEN_CPU_CAPABILITY``. Both change speeds and roundings, so
:func:`sixbit.kernels.cpu_kind` names what is usable, not what the CPU has.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MATRIX_FLAGS = {"amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8", "amx_fp16": "AMX-FP16", "avx512_bf16": "AVX512-BF16",
                "avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI"}  # /proc/cpuinfo flag → name
_VNNI, _BF16 = {"avx512_vnni"}, {"avx512_vnni", "avx512_bf16"}
_FP16 = _BF16 | {"avx_vnni"}
_AMX = _FP16 | {"amx_int8", "amx_bf16"}
CAPS = {  # oneDNN's ISA names (cpu_isa_t) → the matrix flags it may use up to that cap
    "SSE41": set(), "AVX": set(), "AVX2": set(), "AVX512_CORE": set(), "AVX2_VNNI": {"avx_vnni"},
    "AVX2_VNNI_2": {"avx_vnni"}, "AVX512_CORE_VNNI": _VNNI, "AVX512_CORE_BF16": _BF16, "AVX512_CORE_FP16": _FP16,
    "AVX10_1_512": _FP16, "AVX512_CORE_AMX": _AMX, "AVX10_1_512_AMX": _AMX,
}
_NO_CAP = ("", "ALL", "DEFAULT", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16")
_ATEN_LEVELS = ("DEFAULT", "AVX2", "AVX512")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's flags (/proc/cpuinfo); empty where there is none."""
    try:
        return frozenset(next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                               if line.startswith("flags")), []))
    except OSError:  # not Linux: no cheap way to ask
        return frozenset()


@torch.compiler.assume_constant_result  # traced models take it as a constant (no file read in the graph)
def int_mm_exact() -> bool:
    """Whether ``torch._int_mm`` is exact here: oneDNN reaches VNNI or AMX. Without them its s8
    GEMM sums pairs of products in int16 and saturates (measured under ONEDNN_MAX_CPU_ISA=AVX2)."""
    return bool(usable(cpu_flags()) & {"avx512_vnni", "avx_vnni", "amx_int8"})


def onednn_cap() -> str | None:
    """oneDNN's ISA cap from the environment, upper-cased (``None``: none, or one that caps nothing)."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if cap in CAPS:
        return cap
    if cap not in _NO_CAP:
        log.warning("ONEDNN_MAX_CPU_ISA=%s is not an ISA sixbit knows: taken as no cap", cap)
    return None


def usable(flags: frozenset[str]) -> frozenset[str]:
    """``flags`` (/proc/cpuinfo's) less the matrix instructions oneDNN's cap keeps torch from using."""
    cap = onednn_cap()
    return flags if cap is None else flags - (set(MATRIX_FLAGS) - CAPS[cap])


def aten_cap(flags: frozenset[str]) -> str | None:
    """ATen's kernel level (``torch.backends.cpu.get_cpu_capability()``) where it is below what
    ``flags`` allow (``ATEN_CPU_CAPABILITY=avx2`` on an AVX512 CPU: ``"AVX2"``), else ``None``."""
    best = "AVX512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags else "AVX2" if "avx2" in flags else "DEFAULT"
    level = torch.backends.cpu.get_cpu_capability()
    if level in _ATEN_LEVELS and _ATEN_LEVELS.index(level) < _ATEN_LEVELS.index(best):
        return level
    return None


def inductor_options() -> dict:
    """The vector width inductor compiles sixbit's CPU kernels for, named in their options: the
    one it picks under ``ATEN_CPU_CAPABILITY`` (0: scalar). Named, it is part of the key of
    inductor's on-disk FX graph cache, which otherwise is not: a kernel cached by an AVX512 run was
    reused under ``ATEN_CPU_CAPABILITY=avx2`` and wrote garbage (NaN, 1e31; torch 2.13, measured)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return {"cpp.simdlen": pick_vec_isa().bit_width()}
