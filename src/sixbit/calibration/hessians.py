"""Input second moments of linear layers (GPTQ's Hessians), recorded while generations run.

For a layer with inputs ``x`` (rows of ``(…, K)``), ``H = E[x xᵀ]`` over every row of every
call: every denoising step and both CFG branches (a batched CFG call's rows hold both). GPTQ's
``2/n·Σ x xᵀ`` is this up to a constant factor, which changes nothing (damping is relative to
the mean diagonal). Sums are kept in fp64 (many calls of millions of rows); each layer holds
one ``K × K`` matrix, so :func:`collect` is meant for a few layers at a time (one block).
Layers fed the same input tensor (q, k and v projections) share one product, and each product
computes only its upper triangle, in column panels (fp32 GEMMs, mirrored: ~1.8× faster at
K = 8960 than the full ``xᵀx``, the same to fp32 rounding). Inputs that are bf16 (a bf16
model's activations) are multiplied by oneDNN's bf16 kernel with fp32 sums and output on CPUs
that have one (``fp32_precision = "bf16"``): their values are bf16 already, so every product
is exact and only the order of the fp32 sums changes (measured: 2.4e-6 of the largest entry,
as fp32 itself; 6.4 → 3.2 s at K = 8960 over 24,960 rows on AMX).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import torch
from torch import nn

from ..nn.pointwise_conv import features_last

_PANEL = 512  # columns per panel of the symmetric product


@dataclasses.dataclass
class InputStats:
    """What the inputs of one layer looked like: ``hessian`` (``E[x xᵀ]``, fp32 ``(K, K)``), the
    per-channel abs-max ``amax`` (``(K,)``, for smoothing) and the number of ``rows`` seen."""

    hessian: torch.Tensor
    amax: torch.Tensor
    rows: int


class _Accumulator:
    def __init__(self, k: int, device):
        self.sum = torch.zeros(k, k, dtype=torch.float64, device=device)
        self.amax = torch.zeros(k, device=device)
        self.rows = 0


def collect(model: nn.Module, run: Callable[[], object], layers: dict[str, nn.Module]) -> dict[str, InputStats]:
    """Run ``run()`` once with hooks on ``layers`` (``{name: linear or conv quantized as one}``, inside ``model``) and
    return the :class:`InputStats` of each layer that ran (a layer the generations never call
    is left out). Hooks are removed even if ``run`` raises.

    Example:
        >>> lin = nn.Linear(8, 4)
        >>> stats = collect(lin, lambda: lin(torch.ones(3, 8)), {"": lin})
        >>> stats[""].rows, float(stats[""].hessian[0, 0])
        (3, 1.0)
    """
    acc: dict[str, _Accumulator] = {}
    shared: dict = {}  # the last input tensor and its products: q, k and v see the same tensor

    def hook_for(name: str):
        def hook(module, args):
            x = features_last(module, args[0])  # a conv's channels (× kernel taps: unfolded) are its features
            if shared.get("x") is not args[0]:
                xf = x.detach().reshape(-1, x.shape[-1]).float()
                amax = xf.abs().amax(0) if xf.shape[0] else torch.zeros(xf.shape[1], device=xf.device)
                with _exact_bf16_products(x):
                    xtx = _gram(xf)
                shared.update(x=args[0], xtx=xtx, amax=amax, rows=xf.shape[0])
            a = acc.get(name)
            if a is None:
                a = acc[name] = _Accumulator(x.shape[-1], x.device)
            a.sum += shared["xtx"]
            a.amax = torch.maximum(a.amax, shared["amax"])
            a.rows += shared["rows"]
        return hook

    handles = [layer.register_forward_pre_hook(hook_for(name)) for name, layer in layers.items()]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
        shared.clear()
    return {n: InputStats((a.sum / a.rows).float(), a.amax, a.rows) for n, a in acc.items() if a.rows}


@contextlib.contextmanager
def _exact_bf16_products(x: torch.Tensor):
    """Inside: fp32 matrix products through oneDNN's bf16 kernel (fp32 sums), when ``x`` is bf16
    on a CPU that has one: the products of its values are exact there."""
    matmul = torch.backends.mkldnn.matmul
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        yield
        return
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def _gram(x: torch.Tensor) -> torch.Tensor:
    """``xᵀx`` (fp64 ``(K, K)``) of fp32 rows ``x``: each panel of columns times the columns from
    it on (the upper triangle), the lower triangle mirrored from it."""
    k = x.shape[1]
    out = torch.empty(k, k, dtype=torch.float64, device=x.device)
    for i in range(0, k, _PANEL):
        j = min(i + _PANEL, k)
        panel = x[:, i:j].T @ x[:, i:]
        out[i:j, i:] = panel
        out[j:, i:j] = panel[:, j - i:].T
    return out
