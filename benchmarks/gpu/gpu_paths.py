"""The GPU script's rehearsal on CPU, and its check of every kernel path of a quantized linear.

:func:`gpu_on_cpu` makes a CPU take every decision a GPU run takes (``--dry-run``): the
dispatcher's switches say what an sm_90 GPU says (Triton fused INT8 quantize and epilogue, Triton
W4A16; ``fp4=True``: Blackwell's FP4 GEMM too), Triton runs in its interpreter, torch's GEMMs
refuse what CUDA refuses (:mod:`sixbit.kernels.strict_ops`) and sixbit pads for them as it does
on CUDA. What it cannot stand in for: compiling and timing the kernels on a GPU, and
``sageattention`` (CUDA only).

:func:`layer_paths`: each :class:`~sixbit.kernels.paths.Path` through ``QuantLinear`` on the
device — a layer built to take it, the dispatcher asked whether it does, then its output against
its mode's twin path (torch ops: ``fp`` dequantize + matmul, ``int8`` per-token codes ×
``torch._int_mm``, ``nvfp4`` dequantize both + fp32 matmul).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
from torch import nn

from sixbit import kernels
from sixbit.kernels import gemm_shapes
from sixbit.kernels import triton as tri
from sixbit.kernels.paths import MODE_OF, Path
from sixbit.kernels.strict_ops import strict_int_mm, strict_scaled_mm
from sixbit.nn import ActMode, QuantLinear, execution


@contextlib.contextmanager
def gpu_on_cpu(fp4: bool = False, triton: bool = True):
    """CPU calls take the GPU run's paths (see the module docstring) while inside; ``triton=False``:
    all but the Triton ones (the CPU's INT8 and full-precision paths instead, with CUDA's GEMM
    limits): an interpreted kernel per linear call is slow on a whole model."""
    triton_runs = tri.runs_on if triton else (lambda device: False)
    switches = ((kernels, "fused_int8", triton_runs), (kernels, "weight4_fused", triton_runs),
                (kernels, "fp4_supported", lambda device: fp4), (kernels.cuda, "fp4_supported", lambda device: fp4),
                (gemm_shapes, "enforced", lambda device: True),
                (torch, "_int_mm", strict_int_mm), (torch, "_scaled_mm", strict_scaled_mm))
    with contextlib.ExitStack() as stack:
        for target, name, value in switches:
            stack.enter_context(mock.patch.object(target, name, value))
        yield


_TWIN = {"fp": Path.FP, "int8": Path.INT8, "nvfp4": Path.NVFP4_EMULATED}


def _layer(path: Path, device: torch.device) -> QuantLinear | str:
    """A small layer whose calls at ``path``'s mode take ``path`` where it exists (K 48 keeps the
    W4A16 kernel, whose tile is 32 wide, from reading an NVFP4 weight), or why none is built."""
    if path in (Path.INT8_PACKED, Path.INT8_FOLDED) and not (device.type == "cpu" and kernels.amx_int8()):
        return "needs a CPU with AMX INT8 (oneDNN's packed operand)"
    if path is Path.INT8_STATIC:
        return "needs a fitted static W8A8 input quantizer (sixbit.convert_model with static activations)"
    torch.manual_seed(0)
    k = 48 if path is Path.FP_UNPACKED else 64
    linear = nn.Linear(k, 40)
    fmt = "int8" if path in (Path.FP, Path.INT8) else "nvfp4"
    block = 32 if path in (Path.INT8_FUSED, Path.FP_DENSE, Path.INT8_FOLDED) else None
    divisor = torch.rand(k) + 0.5 if path is Path.INT8 else None  # not a plain input: no fused quantize
    layer = QuantLinear.from_linear(linear, fmt, block, act_mode=MODE_OF[path], input_divisor=divisor).to(device)
    if path is Path.FP_UNPACKED:
        layer.unpack_nvfp4()
    elif path is Path.FP_DENSE:
        layer.keep_dense(torch.float32)
    elif path in (Path.INT8_PACKED, Path.INT8_FOLDED):
        layer.pack_int8(fold=path is Path.INT8_FOLDED)
    return layer


def layer_paths(device: torch.device, dtype: torch.dtype, dry: bool) -> list[dict]:
    """One row per :class:`Path`: whether the dispatcher takes it here, and its max abs Δ / max
    abs of its twin path (a failure is recorded in the row: the other rows still run)."""
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    rows = []
    for path in Path:
        row = {"path": path.value, "mode": MODE_OF[path], "twin": _TWIN[MODE_OF[path]].value}
        rows.append(row)
        layer = _layer(path, device)
        if isinstance(layer, str):
            row["note"] = layer
            continue
        inputs = x[:, :layer.in_features]
        blackwell = dry and path is Path.NVFP4  # the dry run rehearses Blackwell's FP4 GEMM as well
        with gpu_on_cpu(fp4=True) if blackwell else contextlib.nullcontext():
            chosen = execution.plan(layer, ActMode(MODE_OF[path]), device)
            if chosen is not path:
                row["note"] = f"not taken on this device: the dispatcher runs {chosen.value}"
                continue
            try:
                y = layer(inputs).float()
                ref = execution.run(layer, _TWIN[MODE_OF[path]], inputs).float()
            except Exception as e:  # one broken path must not cost the loan the other rows
                row["note"] = failure(e)
                continue
            row["execution"] = layer.execution() + (" (rehearsed: Blackwell's FP4 GEMM)" if blackwell else "")
        row["rel_err"] = ((y - ref).abs().max() / ref.abs().max()).item()
    return rows


def failure(e: Exception) -> str:
    """A failed row's note: the exception's type and first line."""
    return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
