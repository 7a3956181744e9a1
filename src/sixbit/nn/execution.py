"""How a :class:`~sixbit.nn.QuantLinear` call runs: one plan, small executors per path.

:func:`plan` asks :func:`sixbit.kernels.paths.select` — the one decision of which kernel runs,
also behind :func:`sixbit.kernels.available` — with the layer's :class:`~sixbit.kernels.paths.Operands`;
``forward`` runs the chosen path (:func:`run`) and ``execution()`` reports it (:func:`describe`),
so the three never disagree. The modes:

==========  ===========================================================================
``fp``      weight-only: dequantized weight × the input, in the input's dtype (real).
``int8``    dynamic per-token symmetric INT8 activations × per-channel INT8 weights with
            int32 accumulation — a real integer GEMM (``torch._int_mm``) where the backend
            has one, else an exact fallback with identical numerics. Weights stored in
            another format (NVFP4) are re-rounded to per-channel INT8 for the GEMM, a few
            rows at a time (no fp32 copy of the whole weight); ``cache_converted=True``
            keeps the INT8 copy instead: faster, 8 more bits per weight, counted by
            ``sixbit.summary``; :meth:`QuantLinear.pack_int8` (``sixbit.keep_int8_weights``)
            keeps it packed for oneDNN's AMX INT8 kernel on CPUs that have one.
``nvfp4``   dynamic NVFP4 activations (global scale from the input's abs-max, E4M3 scale
            per 16 along K) × NVFP4 weights. **Emulated**: no FP4 matmul exists on CPUs or
            pre-Blackwell GPUs, so both operands are dequantized and multiplied in fp32.
==========  ===========================================================================

Every path returns ``x·Wᵀ (+ branch) + bias``; :func:`finish` adds LoRAs, the bias where the path did not, the activation, and restores the
input's dtype and shape.

Static activation scales (static W8A8) come from an *input quantizer* in the layer's slot
(:func:`set_input_quantizer`): an object with ``quantize_input(x) -> [(codes, scale), ...]``
(int8 codes of the raw input, divisor included, with fp32 scales broadcastable to ``(M, 1)``;
several parts are summed, e.g. an outlier side path), ``int8_weight(layer) -> (codes (N, K) int8,
scale (N,))`` and ``describe() -> str``. Every part is multiplied with the real int8 GEMM. The
method that fits it owns it; this module only consults it (:func:`is_static`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from .token_stats import token_max, tokens_split
from ..formats import nvfp4
from ..kernels import gemm_shapes, int8_matmul
from ..kernels.gpu_targets import fused_rotation
from ..kernels.paths import MODE_OF, Capabilities, Operands, Path, select
from ..transforms import hadamard
from . import int8_inputs, lowrank, weight_views
from .precision import ActMode

#: The layer attribute holding its input quantizer: a child module, so that it follows ``.to()``
#: and :func:`sixbit.summary` counts its tensors; written only by :func:`set_input_quantizer`.
SLOT = "act_quantizer"

_MODE = {path: ActMode(mode) for path, mode in MODE_OF.items()}


class InputQuantizer(Protocol):
    """Static quantization of a layer's input (see the module docstring)."""

    def quantize_input(self, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | float]]: ...

    def int8_weight(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]: ...

    def describe(self) -> str: ...


def input_quantizer(layer: nn.Module) -> InputQuantizer | None:
    """The input quantizer in ``layer``'s slot (None: activations are quantized per call)."""
    return getattr(layer, SLOT, None)


def set_input_quantizer(layer: nn.Module, quantizer: nn.Module | None) -> None:
    """Put ``quantizer`` (an :class:`InputQuantizer` module) in ``layer``'s slot, or empty it."""
    setattr(layer, SLOT, quantizer)


def is_static(layer: nn.Module) -> bool:
    """Whether ``layer``'s INT8 calls take static scales from an input quantizer."""
    return input_quantizer(layer) is not None


def operands(layer) -> Operands:
    """What of ``layer`` the choice of kernel depends on."""
    return Operands(
        static_input=is_static(layer),
        plain_input=layer.input_divisor is None and layer.lowrank_up is None and fused_rotation(layer.hadamard_block),
        packed=layer._packed is not None,
        folded=layer._folded,
        weight4=layer._weight4,
        unpacked=layer._unpacked is not None,
        dense=layer._dense is not None,
    )


def plan(layer, mode: ActMode, device: torch.device) -> Path:
    """The path a call of ``layer`` at ``mode`` takes on ``device``; read the device switches from
    :mod:`sixbit.kernels` at call time."""
    caps = Capabilities(kernels.fused_int8, kernels.weight4_fused, kernels.fp4_supported)
    return select(mode, device, operands(layer), caps)


def cuda_notes(layer) -> list[str]:
    """What ``layer``'s calls zero-pad on CUDA because of its shape, wherever the layer is now
    (:func:`sixbit.kernels.gemm_shapes.cuda_notes`: its INT8 and, K a multiple of 16, NVFP4 calls;
    none for a weight-only layer): conversion logs it, ``sixbit.summary`` lists it."""
    compute = not layer.weight_only
    return gemm_shapes.cuda_notes(layer.in_features, layer.out_features, int8=compute,
                                  nvfp4=compute and layer.in_features % 16 == 0)


def describe(layer, path: Path, device: torch.device) -> str:
    """``path`` in words for ``layer``, e.g. ``"int8 (real, torch._int_mm)"``; on CUDA, with the
    zero padding its shape needs there (:func:`cuda_notes`)."""
    text = _describe(layer, path, device)
    if not gemm_shapes.enforced(device) or path not in _PADDED:
        return text
    padded = [note for note in cuda_notes(layer) if note.startswith(_PADDED[path])]
    return f"{text}; {padded[0].split(' calls ', 1)[1]}" if padded else text


# the paths whose torch GEMM pads on CUDA, by the first word of their cuda_notes() line
_PADDED = {Path.INT8: "INT8", Path.INT8_FUSED: "INT8", Path.INT8_STATIC: "INT8", Path.NVFP4: "NVFP4"}


def _describe(layer, path: Path, device: torch.device) -> str:
    if _MODE[path] is ActMode.FP:
        how = {Path.W4A16: "Triton dequantize-in-the-GEMM",
               Path.FP_DENSE: "a kept dense copy, rotation and branch folded in"}.get(path, "dequantize + matmul")
        return f"fp (weight-only{' layer' if layer.weight_only else ''}: {how})"
    if path is Path.NVFP4:
        return "nvfp4 (real, torch._scaled_mm FP4)"
    if path is Path.NVFP4_EMULATED:
        return "nvfp4 (emulated: dequantize + fp32 matmul)"
    if path in (Path.INT8_PACKED, Path.INT8_FOLDED):
        folded = " (rotation and branch folded in)" if path is Path.INT8_FOLDED else ""
        return f"int8 (real, oneDNN AMX INT8 on a packed copy{folded})"
    backend = kernels.int8_matmul_backend(device, 4096, layer.in_features, layer.out_features)
    backend = f"real, {backend}" if backend == "torch._int_mm" else f"emulated with exact integers, {backend}"
    if path is Path.INT8_STATIC:
        return f"{input_quantizer(layer).describe()} ({backend})"
    fused = " + Triton fused quantize" if path is Path.INT8_FUSED else ""
    return f"int8 ({backend}{fused})"


class Call(NamedTuple):
    """What one call hands its path: the layer's input as given, the bias to add in the path
    (None with LoRAs: they come first), the dtype the path writes, the activation its INT8
    epilogue applies (None with LoRAs), and the list its packed epilogue appends the output's
    per-token codes to (``quantize_output``; None when not asked for)."""

    x: torch.Tensor
    bias: torch.Tensor | None
    dtype: torch.dtype
    activation: str | None
    codes: list | None


def run(layer, path: Path, x: torch.Tensor, activation: str | None = None,
        quantize_output: bool = False) -> torch.Tensor:
    """``layer``'s output on ``x`` through ``path`` (see ``QuantLinear.forward``)."""
    x2 = x.reshape(-1, layer.in_features)
    if path is Path.INT8_FUSED:  # CUDA: one Triton kernel rotates and quantizes the input
        w_codes, w_scale = layer.int8_weight()
        return finish(layer, x, kernels.int8_linear(x2, w_codes, w_scale, layer.hadamard_block), activation=activation)
    plain = layer.lora_factors is None  # LoRAs come before the bias: with them, the bias waits for finish()
    codes = [] if quantize_output and plain and int8_inputs.can_remember() else None
    call = Call(x, layer.bias if plain else None, x.dtype if plain else torch.float32,
                activation if plain else None, codes)
    dynamic = path in (Path.INT8, Path.INT8_PACKED, Path.INT8_FOLDED)  # their epilogue applies the activation
    if path is Path.INT8_FOLDED:  # the packed operand holds the rotation and the branch
        y = _int8_dynamic(layer, x2, None, call, x, None, packed=True)
    elif path is Path.FP_DENSE:  # so does the dense copy, and the input divisor
        y = F.linear(x2, layer._dense.to(x2.dtype), None if call.bias is None else call.bias.to(x2.dtype))
    else:
        x2, branch, late = _prepare(layer, path, x2)
        if dynamic:
            source = x if layer._plain_int8() or late else None
            y = _int8_dynamic(layer, x2, branch, call, source, layer.hadamard_block if late else None,
                              packed=path is Path.INT8_PACKED)
        else:
            y = _EXECUTORS[path](layer, x2, branch, call)
    applied = dynamic and call.activation is not None
    y = finish(layer, x, y, bias_added=plain, activation=None if applied else activation)
    return int8_inputs.remembered(y, codes)


def _prepare(layer, path: Path, x: torch.Tensor):
    """``x`` as ``path`` multiplies it (rotated, divided; fp32 where quantized from fp32), the
    low-rank branch on the unquantized input, and whether the rotation is left to the INT8
    quantization (:meth:`~sixbit.nn.QuantLinear._late_rotation`)."""
    mode = _MODE[path]
    late = layer._late_rotation(mode, x)
    if not late and (mode is ActMode.NVFP4 or (mode is ActMode.INT8 and not layer._plain_int8())):
        x = x.float()  # quantize activations from fp32, after an fp32 rotation
    if layer.hadamard_block is not None and not late:
        x = hadamard.rotate(x, layer.hadamard_block)
    divided = layer.input_divisor is not None and path is not Path.INT8_STATIC  # the quantizer folds it in
    if divided:
        x = x / layer.input_divisor.to(x.dtype)
    branch = None  # the low-rank branch as (x·Dᵀ, U): each path adds x·Dᵀ·Uᵀ as suits it
    if layer.lowrank_up is not None and late:  # x·H·Dᵀ = x·(D·H)ᵀ: the unrotated input, D rotated
        branch = lowrank.branch(x, hadamard.rotate(layer.lowrank_down, layer.hadamard_block), layer.lowrank_up)
    elif layer.lowrank_up is not None:  # the branch sees the unquantized (rotated / divided) input
        xb = x if divided or layer.input_divisor is None else x / layer.input_divisor.to(x.dtype)
        branch = lowrank.branch(xb, layer.lowrank_down, layer.lowrank_up)
    return x, branch, late


def finish(layer, x: torch.Tensor, y: torch.Tensor, bias_added: bool = False,
           activation: str | None = None) -> torch.Tensor:
    """LoRAs, bias (unless the path added it), ``activation`` (unless the path applied it), and
    the output in the input's dtype and shape."""
    if layer.lora_factors is not None:  # on the layer's original input, not the rotated / divided one
        y = layer.lora_factors.add_to(y, x.reshape(-1, layer.in_features))
    if layer.bias is not None and not bias_added:
        y = y + layer.bias.to(y.dtype)
    if activation is not None:
        y = F.gelu(y, approximate="tanh" if activation == "gelu-tanh" else "none")
    return y.to(x.dtype).reshape(*x.shape[:-1], layer.out_features)


# Each executor: ``x`` (2-D, rotated / divided), the low-rank ``branch`` output or None, the call;
# it returns ``x·Wᵀ + branch + bias`` (adds in this order), in ``call.dtype`` where it can write
# that directly (INT8), else in its compute dtype.

def _int8_dynamic(layer, x, branch, call: Call, source, block, packed: bool):
    """Per-token codes, the integer GEMM, one epilogue (scales, branch, bias, the activation,
    output dtype); compiled into single passes on large CPU inputs, bit-identical to the eager
    ops (an activation's exponential: to the last fp32 bit). ``block``: the Hadamard block ``x``
    is still to be rotated by; ``source``: the layer's input when ``x`` is it unchanged, so that
    layers given the same input (attention's q, k, v) quantize it once. ``packed``: multiply
    through the kept AMX operand (the weight scale applied inside)."""
    codes, scale = int8_inputs.quantized_input(x, source, block)
    if not packed:
        w_codes, w_scale = layer.int8_weight()
        return kernels.scale_epilogue(int8_matmul(codes, w_codes), scale, w_scale, lowrank.full(branch), call.bias,
                                      call.dtype, call.activation)
    acc = kernels.packed_int8_matmul(codes, *layer._packed,
                                     dtype=torch.bfloat16 if call.dtype == torch.bfloat16 else torch.float32)
    if acc.dtype != call.dtype:
        return kernels.scale_epilogue(acc, scale, None, lowrank.full(branch), call.bias, call.dtype, call.activation)
    # no new (tokens, N) tensor after the GEMM's own: at real sizes each is fresh pages from
    # the OS, which cost more than the pass itself. The branch goes into the GEMM's output
    # divided by the token scale (one more rounding to ``dtype``), the epilogue writes in place.
    if branch is not None:
        lowrank.add_branch(acc, branch, scale)
    if call.codes is not None:
        call.codes.append(kernels.scale_epilogue_quantize(acc, scale, call.bias, call.activation))
        return acc
    return kernels.scale_epilogue(acc, scale, None, None, call.bias, call.dtype, call.activation, inplace=True)


def _int8_static(layer, x, branch, call: Call):
    """Static: the input quantizer's codes and scales; each part is one real int8 GEMM."""
    quantizer = input_quantizer(layer)
    w_codes, w_scale = quantizer.int8_weight(layer)
    y = None
    for codes, scale in quantizer.quantize_input(x):
        part = int8_matmul(codes, w_codes).float().mul_(scale)
        y = part if y is None else y.add_(part)
    return lowrank.add(y.mul_(w_scale.reshape(1, -1)), branch, call.bias)


def _fp(layer, x, branch, call: Call):
    return lowrank.add(F.linear(x, weight_views.dequantize(layer.quantized_weight(), x.dtype)), branch, call.bias)


def _fp_unpacked(layer, x, branch, call: Call):
    stored = layer.quantized_weight()
    w = kernels.nvfp4_unpacked_dequantize(layer._unpacked, stored.scales, stored.global_scale, x.dtype)
    return lowrank.add(F.linear(x, w), branch, call.bias)


def _w4a16(layer, x, branch, call: Call):
    return lowrank.add(kernels.weight4_linear(x, layer.quantized_weight()), branch, call.bias)  # decoded in the GEMM


def _nvfp4_scale(x: torch.Tensor) -> torch.Tensor | None:
    """The per-tensor scale from every rank's tokens when a sequence-parallel model splits them."""
    return nvfp4.global_scale_for(token_max(x.detach().abs().amax())) if tokens_split() else None


def _nvfp4(layer, x, branch, call: Call):
    y = kernels.nvfp4_linear(x, layer._weight_as("nvfp4"), torch.float32, _nvfp4_scale(x))  # FP4 tensor cores
    return lowrank.add(y, branch, call.bias)


def _nvfp4_emulated(layer, x, branch, call: Call):
    """Emulated: no FP4 GEMM here; dequantize both operands and multiply in fp32."""
    xq = nvfp4.round_trip(x, _nvfp4_scale(x), check=False)
    return lowrank.add(F.linear(xq, layer._weight_as("nvfp4").dequantize()), branch, call.bias)


_EXECUTORS: dict[Path, Callable[..., torch.Tensor]] = {
    Path.FP: _fp,
    Path.FP_UNPACKED: _fp_unpacked,
    Path.W4A16: _w4a16,
    Path.INT8_STATIC: _int8_static,
    Path.NVFP4: _nvfp4,
    Path.NVFP4_EMULATED: _nvfp4_emulated,
}
