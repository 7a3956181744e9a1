"""What a converted model holds (:func:`summary`: layers per format, every byte) and the INT8
weight copies it may keep for speed (:func:`keep_int8_weights`)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from . import kernels
from .conversion import conversion_of
from .models import spec_for, transformer_of
from .nn import QuantLinear, execution
from .nn.pointwise_conv import features, is_quantizable
from .runtime.fusion import fuse_activations


@dataclasses.dataclass
class LayerInfo:
    """One linear layer of :class:`Summary`: its format, bytes before and after, and the
    execution path it runs (:meth:`~sixbit.nn.QuantLinear.execution`)."""

    name: str
    role: str
    format: str  # "fp" for layers left in full precision
    in_features: int
    out_features: int
    bytes_before: int
    bytes_after: int
    execution: str


@dataclasses.dataclass
class Summary:
    """What :func:`summary` reports: per-layer rows and linear-weight bytes before/after, and
    every byte the model holds.

    Attributes:
        tensor_bytes: every parameter and buffer of the model (non-persistent ones included,
            e.g. static W8A8's extra weight variants; shared storage counted once).
        converted_bytes: weight copies quantized layers keep converted for another activation
            mode (``cache_converted=True``), not in any buffer.
        notes: what the conversion's preset became on this device
            (:func:`sixbit.presets.for_device`), when anything did.
    """

    model: str
    layers: list[LayerInfo]
    tensor_bytes: int = 0
    converted_bytes: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """Every byte the model's tensors hold."""
        return self.tensor_bytes + self.converted_bytes

    @property
    def bytes_before(self) -> int:
        return sum(r.bytes_before for r in self.layers)

    @property
    def bytes_after(self) -> int:
        return sum(r.bytes_after for r in self.layers)

    @property
    def compression(self) -> float:
        return self.bytes_before / max(self.bytes_after, 1)

    def by_format(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for r in self.layers:
            row = out.setdefault(r.format, {"layers": 0, "params": 0, "bytes": 0})
            row["layers"] += 1
            row["params"] += r.in_features * r.out_features
            row["bytes"] += r.bytes_after
        return out

    def __str__(self) -> str:
        lines = [f"sixbit summary of {self.model}: linear-layer weights (biases excluded)"]
        lines.append(f"  {'format':<16}{'layers':>7}{'params':>12}{'MiB':>10}  execution")
        executions: dict[str, set] = {}
        for r in self.layers:
            executions.setdefault(r.format, set()).add(r.execution)
        for fmt, row in self.by_format().items():
            how = "; ".join(sorted(executions[fmt]))
            lines.append(f"  {fmt:<16}{row['layers']:>7}{row['params']:>12,}{row['bytes'] / 2**20:>10.2f}  {how}")
        lines.append(
            f"  total: {self.bytes_before / 2**20:.2f} MiB before → {self.bytes_after / 2**20:.2f} MiB after "
            f"({self.compression:.2f}× smaller)"
        )
        lines.append(
            f"  all tensors the model holds: {self.total_bytes / 2**20:.2f} MiB (linear weights "
            f"{self.bytes_after / 2**20:.2f}, other parameters and buffers "
            f"{(self.tensor_bytes - self.bytes_after) / 2**20:.2f}, converted weight copies "
            f"{self.converted_bytes / 2**20:.2f})"
        )
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


def _tensor_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer of ``model``, each storage counted once."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        key = (t.device, t.untyped_storage().data_ptr()) if t.device.type != "meta" else id(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes() if t.device.type != "meta" else t.numel() * t.element_size()
    return total


def keep_int8_weights(model: nn.Module, enabled: bool = True, fold: bool = True) -> int:
    """Keep every quantized layer's INT8 GEMM operand ready, built now: an INT8 copy of weights the
    integer GEMM cannot read directly (NVFP4, MX, FP8, grouped formats: the 4-bit presets), and on
    CPUs with AMX INT8 (:func:`sixbit.kernels.amx_int8`) every layer's INT8 weight packed for
    oneDNN's AMX kernel; and each feed-forward's GELU applied inside its first linear's INT8
    epilogue (:func:`sixbit.runtime.fusion.fuse_activations`: no pass of its own over the
    (tokens, 4·hidden) output; that epilogue also makes the second linear's per-token INT8
    codes where it takes them as they come). On CPUs, weight-only NVFP4 layers (the 4-bit
    presets' modulation), which dequantize their weight on every call, keep its values unpacked,
    one int8 per weight (:meth:`~sixbit.nn.QuantLinear.unpack_nvfp4`: a multiply instead of a
    table lookup, bit-identical).
    ``enabled=False`` drops them. Returns the bytes they hold (0 after dropping them);
    :func:`summary` counts them.

    Speed against memory, on CPUs: without it each INT8 call of a 4-bit layer re-rounds its weight
    to per-channel INT8, which at CogVideoX-2B size costs more than the GEMM, and INT8 GEMMs take
    ``torch._int_mm``, which does not reach AMX (BENCHMARKS.md ``cpu-speed``). With it every layer
    holds 8 more bits per weight and a scale per row (``w4a8``: 4.9 → 13 bits; ``w8a8`` on AMX:
    8 → 16, bf16's size). Checkpoints never hold the copies.

    ``fold`` (default True; AMX CPUs): a layer that rotates its input or has a low-rank branch (the
    4-bit presets) packs the INT8 rounding of everything it computes, ``(W_q + U·D)·H``, so its
    INT8 calls are plain W8A8 ones: the input quantized per token unrotated, one GEMM, no rotation
    and no branch (at CogVideoX-2B size `w4a8` then runs at 1.33× bf16 instead of 1.21×). That
    changes results by quantization noise: on the shipped models' 16 held-out pairs, PSNR against
    full precision moved +0.5 dB (shapes-cogvideox) and −0.3 dB (shapes-wan) against the unfolded
    kept path (BENCHMARKS.md ``cpu-speed``). Calls at another precision (PDR's refreshes, DMPQ)
    still use the stored weight and branch.

    Unfolded, results differ from the model without the copies by rounding only: on AMX the two
    fp32 scale multiplies come in the other order, and on bf16 models the GEMM's output times the
    weight scale is rounded once to bf16 before the token scale (a low-rank branch, divided by the
    token scale, is added to it before that rounding: no (tokens, N) tensor of its own, and the
    scaling writes in place); the fused GELU runs in fp32 before the output's one rounding
    (unfused: after it).

    Example:
        >>> extra = sixbit.keep_int8_weights(pipe.transformer)   # doctest: +SKIP
    """
    model = transformer_of(model)  # a pipeline's transformer, as every other entry point takes
    # weight-only layers never multiply in INT8; static W8A8 layers use their quantizer's weights
    layers = [m for m in model.modules()
              if isinstance(m, QuantLinear) and not m.weight_only and not execution.is_static(m)]
    weight_only = [m for m in model.modules() if isinstance(m, QuantLinear) and m.weight_only]
    for layer in weight_only:
        layer.drop_converted()
        if enabled and next(layer.buffers()).device.type == "cpu":
            layer.unpack_nvfp4()
    for layer in layers:
        layer.cache_converted = bool(enabled)
        layer.drop_converted()
        if not enabled:
            continue
        if kernels.amx_int8() and next(layer.buffers()).device.type == "cpu":
            layer.pack_int8(fold)
        else:
            layer.int8_weight()  # builds and keeps the copy (a no-op for INT8-ready weights)
    fuse_activations(model, enabled)
    return sum(m.converted_nbytes() for m in layers + weight_only)


def summary(model: nn.Module) -> Summary:
    """Layers per format, linear-weight bytes before/after quantization, and every byte the model
    holds (as data; ``str`` reads well).

    Example:
        >>> sixbit.summary(pipe.transformer).total_bytes   # doctest: +SKIP
    """
    spec = spec_for(model)
    rows = []
    for name, mod in model.named_modules():
        if isinstance(mod, QuantLinear):
            before = mod.in_features * mod.out_features * torch.finfo(mod.source_dtype).bits // 8
            rows.append(LayerInfo(name, spec.role_of(name).value, mod.weight_format, mod.in_features,
                                  mod.out_features, before, mod.weight_nbytes(), mod.execution()))
        elif is_quantizable(mod):  # an nn.Linear or a conv quantizable as one, left in full precision
            size = mod.weight.numel() * mod.weight.element_size()
            rows.append(LayerInfo(name, spec.role_of(name).value, "fp", *features(mod),
                                  size, size, f"{str(mod.weight.dtype).removeprefix('torch.')} (not quantized)"))
    converted = sum(m.converted_nbytes() for m in model.modules() if isinstance(m, QuantLinear))
    conversion = conversion_of(model)
    notes = [conversion.hardware] if conversion is not None and conversion.hardware else []
    if conversion is not None and conversion.attention is not None:
        notes.append(f"attention quantized where {conversion.config.attention.describe()}: {conversion.attention.path}")
    return Summary(type(model).__name__, rows, _tensor_bytes(model), converted, notes)

