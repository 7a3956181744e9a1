"""What a converted model holds (:func:`summary`: layers per format, every byte, and the layout
it runs with on its device, :mod:`sixbit.memory.fast_path`)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .memory import fast_path
from .methods.record import conversion_of
from .methods.registry import methods
from .models import spec_for, transformer_of
from .nn import QuantLinear
from .nn.execution import cuda_notes
from .nn.pointwise_conv import features, is_quantizable


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
            (:func:`sixbit.presets.for_device`), when anything did; the layout the model runs
            with (:mod:`sixbit.memory.fast_path`) and its memory cost; the layers whose shapes
            torch's CUDA GEMMs take only zero-padded (:func:`sixbit.nn.execution.cuda_notes`),
            wherever the model is.
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


def summary(model: nn.Module) -> Summary:
    """Layers per format, linear-weight bytes before/after quantization, and every byte the model
    holds (as data; ``str`` reads well). ``model``: the transformer, or its pipeline (then the
    pipeline's ``.transformer``, the one every entry point converts).

    Example:
        >>> sixbit.summary(pipe).total_bytes   # doctest: +SKIP
    """
    pipe, model = model, transformer_of(model)
    title = type(model).__name__ if pipe is model else f"{type(pipe).__name__}.transformer ({type(model).__name__})"
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
    notes += [line for spec in methods() if spec.describe is not None and (line := spec.describe(model))]
    padded = [f"{name}: {'; '.join(lines)}" for name, mod in model.named_modules()
              if isinstance(mod, QuantLinear) and (lines := cuda_notes(mod))]
    if padded:
        notes.append(f"on CUDA, {len(padded)} layer(s) have shapes torch's GEMMs take only zero-padded (same results, "
                     f"one copy of the padded operands per call): {' | '.join(padded)}")
    laid_out = fast_path.planned(model)
    if laid_out is not None:
        pending = "" if fast_path.layout_of(model) is laid_out else " (at its first call there)"
        notes.append(laid_out.describe() + pending)
    return Summary(title, rows, _tensor_bytes(model), converted, notes)

