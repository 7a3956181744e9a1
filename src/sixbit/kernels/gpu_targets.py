"""Which sixbit GPU kernel runs on which NVIDIA GPU: one table, read by every CUDA dispatch decision.

The Triton rows are what :mod:`sixbit.kernels.triton.aot` measures by compiling each kernel for
each target without a GPU (BENCHMARKS.md ``gpu-aot``; ``tests/kernels/test_aot.py`` compiles a
subset and checks this table against it): a kernel is listed for a target only where every
configuration the wrappers launch compiles, fits the target's shared memory, and multiplies on
tensor cores wherever it multiplies in 16 or 8 bits. The ``torch._scaled_mm`` rows are cuBLAS's
requirements (FP8 from Ada, FP4 on Blackwell).

=======================  =====================================================================
``int8_rows``            fused per-token INT8 quantize (Hadamard rotation fused in, blocks ≤ 128)
``int8_rows_h256``       the same with a 256 rotation: 136 KiB of shared memory on 16-bit inputs
                         (fits sm_80/90/100 only), 272 KiB on fp32 ones (fits none): listed nowhere,
                         so such layers quantize in torch ops
``epilogue``             the INT8 GEMM's scale epilogue
``weight4``              NVFP4 / INT4 weights decoded inside the GEMM (W4A16)
``int8_attention``       INT8 Q·Kᵀ, FP16 P·V, online softmax
``int8_attention_p6``    the same with P as a 6-bit float (E2M3 / E3M2) through ``tl.dot_scaled``:
                         its values travel as E4M3, which Triton has only from sm_89 ("type
                         fp8e4nv not supported in this architecture" on sm_80 / sm_86)
``fp8_scaled_mm``        ``torch._scaled_mm`` with E4M3 operands
``nvfp4_scaled_mm``      ``torch._scaled_mm`` with NVFP4 operands
=======================  =====================================================================

A device's compute capability is matched to the compiled target of the same major version
with the largest minor not above it (sm_87 reads sm_86's row, sm_103 sm_100's, sm_121
sm_120's); a capability with none (before sm_80, or a major version not compiled for) runs no
Triton kernel. The capability is read from the device only when none is given, so every
question ("on sm_80, what runs?") can be asked without a GPU.

Example:
    >>> runs("int8_attention_p6", (8, 0)), runs("int8_attention_p6", (9, 0)), runs("weight4", (7, 5))
    (False, True, False)
"""

from __future__ import annotations

import torch

#: The compiled targets (compute capability × 10 + minor) and a GPU of each.
TARGETS: dict[int, str] = {80: "A100", 86: "RTX 30xx / A6000", 89: "RTX 40xx / L40S", 90: "H100 / H200",
                           100: "B200", 120: "RTX 50xx"}

#: Shared memory one block may use (opt-in), bytes: 1 KiB below each SM's carve-out maximum,
#: reserved by the system (NVIDIA's Ampere tuning guide: 164 KB on A100, 100 KB on 8.6; CUTLASS's
#: SM*_SMEM_CAPACITY_BYTES: (164 − 1), (100 − 1), (228 − 1) KiB for sm_90 and sm_100, (100 − 1) for 8.9 and 12.0).
SMEM_LIMIT: dict[int, int] = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024,
                              120: 99 * 1024}

_ALL = frozenset(TARGETS)
#: kernel → the targets it runs on (the one table; see the module docstring).
TABLE: dict[str, frozenset[int]] = {
    "int8_rows": _ALL,
    "int8_rows_h256": frozenset(),
    "epilogue": _ALL,
    "weight4": _ALL,
    "int8_attention": _ALL,
    "int8_attention_p6": frozenset({89, 90, 100, 120}),
    "fp8_scaled_mm": frozenset({89, 90, 100, 120}),
    "nvfp4_scaled_mm": frozenset({100, 120}),
}


def capability_of(device: torch.device | str, capability: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """``capability`` when given, else ``device``'s compute capability (``None`` for a CPU, or
    where CUDA is absent)."""
    if capability is not None:
        return tuple(capability)
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def target_of(capability: tuple[int, int] | None) -> int | None:
    """The compiled target whose row decides for ``capability`` (``None``: none does)."""
    if capability is None:
        return None
    major, minor = capability
    same = [t for t in TARGETS if t // 10 == major and t % 10 <= minor]
    return max(same) if same else None


def runs(kernel: str, capability: tuple[int, int] | None) -> bool:
    """Whether ``kernel`` (a :data:`TABLE` row) is chosen on a GPU of ``capability``."""
    if kernel not in TABLE:
        raise ValueError(f"unknown GPU kernel {kernel!r}; the table has {', '.join(TABLE)}")
    return target_of(capability) in TABLE[kernel]


def int8_rows_row(hadamard_block: int | None) -> str:
    """The :data:`TABLE` row of the fused quantize with a rotation of ``hadamard_block``."""
    return "int8_rows_h256" if hadamard_block == 256 else "int8_rows"


def fused_rotation(hadamard_block: int | None) -> bool:
    """Whether the fused quantize takes a rotation of ``hadamard_block`` on some GPU (every block
    but 256, which fits no GPU's shared memory at every input dtype)."""
    return bool(TABLE[int8_rows_row(hadamard_block)])


def sm(capability: tuple[int, int]) -> str:
    """``(8, 6)`` → ``"sm_86"``."""
    return f"sm_{capability[0]}{capability[1]}"
