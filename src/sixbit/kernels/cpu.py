"""INT8 × INT8 → INT32 matrix multiplication.

``torch._int_mm`` runs a real integer GEMM (oneDNN on CPUs with AVX512-VNNI/AMX, cuBLASLt on
CUDA). Shapes it cannot take (on CUDA: M ≤ 16, or K, N not multiples of 8) go through an exact
fallback: the products of int8 values summed in float64 are exact integers while
``K · 127² < 2^53`` (any K below 5·10^11), so the int32 result is identical.
"""

from __future__ import annotations

import torch


def int8_matmul_backend(device: torch.device | str, m: int, k: int, n: int) -> str:
    """Which path :func:`int8_matmul` takes for an (m, k) × (k, n) product on ``device``."""
    device = torch.device(device)
    ok = hasattr(torch, "_int_mm") and (
        device.type == "cpu" or (device.type == "cuda" and m > 16 and k % 8 == 0 and n % 8 == 0)
    )
    return "torch._int_mm" if ok else "float64 exact fallback"


def int8_matmul_reference(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """Reference ``a @ b_tᵀ`` in int64 arithmetic, returned as int32."""
    return (a.to(torch.int64).unsqueeze(1) * b_t.to(torch.int64).unsqueeze(0)).sum(-1).to(torch.int32)


def int8_matmul(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """``a @ b_tᵀ`` for ``int8`` ``a`` of shape (M, K) and ``b_t`` of shape (N, K), as int32 (M, N)."""
    if a.dtype != torch.int8 or b_t.dtype != torch.int8 or a.dim() != 2 or b_t.dim() != 2:
        raise ValueError(
            f"int8_matmul needs two 2-D int8 tensors, got {a.dtype}{tuple(a.shape)} and "
            f"{b_t.dtype}{tuple(b_t.shape)}"
        )
    if a.shape[1] != b_t.shape[1]:
        raise ValueError(f"inner dimensions differ: {a.shape[1]} vs {b_t.shape[1]}")
    if int8_matmul_backend(a.device, a.shape[0], a.shape[1], b_t.shape[0]) == "torch._int_mm":
        return torch._int_mm(a, b_t.t())
    return (a.double() @ b_t.double().t()).to(torch.int32)
