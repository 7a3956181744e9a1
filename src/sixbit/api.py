"""``sixbit.quantize`` and ``sixbit.summary``: swap a model's linear layers for ``QuantLinear``."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from collections.abc import Callable

import torch
from torch import nn

from . import formats, kernels
from ._validate import report, show
from .config import QuantConfig
from .conversion import conversion_of
from .models import block_index_of, iter_blocks, spec_for
from .nn import QuantLinear
from .runtime.fusion import fuse_activations
from .transforms.hadamard import BLOCK_SIZES
from .weights.sequential import quantize_layers

logger = logging.getLogger(__name__)


def _fits(fmt_name: str, in_features: int) -> bool:
    block = formats.get(fmt_name).block_size
    return block is None or in_features % block == 0


def _hadamard_block(limit: int | None, in_features: int) -> int | None:
    """The largest supported Hadamard block ≤ ``limit`` that divides ``in_features``."""
    if limit is None:
        return None
    fits = [b for b in BLOCK_SIZES if b <= limit and in_features % b == 0]
    return max(fits) if fits else None


def _check_layer_names(model: nn.Module, config: QuantConfig) -> None:
    """Refuse ``layer_formats`` names that are not linears of ``model`` or that ``include`` /
    ``exclude`` leave out: a per-layer choice that silently did nothing would be a wrong model."""
    if not config.layer_formats:
        return
    linears = {name for name, mod in model.named_modules() if isinstance(mod, nn.Linear)}
    problems = []
    for name in config.layer_formats:
        if name not in linears:
            close = difflib.get_close_matches(name, sorted(linears), n=1)
            problems.append(f"{show(name)} is not a linear layer of the model"
                            + (f" (did you mean {close[0]!r}?)" if close else " (sixbit.summary(model) lists them)"))
        elif (config.include and not any(re.fullmatch(p, name) for p in config.include)) or any(
                re.fullmatch(p, name) for p in config.exclude):
            problems.append(f"layer_formats names {name!r}, which include/exclude leave out: drop one of the two")
    if problems:
        raise ValueError(report(f"QuantConfig.layer_formats does not fit {type(model).__name__}", problems))


def plan_layers(model: nn.Module, config: QuantConfig) -> dict[str, tuple[str, int | None, str]]:
    """``{layer name: (format, hadamard block, role)}`` for every linear to quantize."""
    spec = spec_for(model)
    blocks = {name: idx for idx, name, _, _ in iter_blocks(model, spec)}
    n_blocks = max(blocks.values()) + 1
    _check_layer_names(model, config)
    plan = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        if config.include and not any(re.fullmatch(p, name) for p in config.include):
            continue
        if any(re.fullmatch(p, name) for p in config.exclude):
            continue
        role = spec.role_of(name)
        fmt = config.format_for(role)
        idx = block_index_of(name, blocks)
        if name in config.layer_formats:
            fmt = config.layer_formats[name]
        elif fmt is not None and idx is not None and config.boundary_blocks and (
            idx < config.boundary_blocks or idx >= n_blocks - config.boundary_blocks
        ):
            fmt = config.boundary_format
        if fmt is None:
            continue
        if not _fits(fmt, mod.in_features):
            logger.warning(
                "%s: in_features=%d is not a multiple of %s's block %d; kept in full precision",
                name, mod.in_features, fmt, formats.get(fmt).block_size,
            )
            continue
        plan[name] = (fmt, _hadamard_block(config.hadamard_block, mod.in_features), role.value)
    return plan


def quantize(model: nn.Module, config: QuantConfig | None = None, calibration: Callable[[], object] | None = None,
             progress: bool = True) -> nn.Module:
    """Replace ``model``'s linear layers by packed :class:`~sixbit.nn.QuantLinear` s, in place.

    Layers are chosen by role (from the model's registered metadata, see
    :mod:`sixbit.models`), by ``include``/``exclude`` patterns and by block position, as
    described in :class:`~sixbit.QuantConfig`; its weight algorithms (scale search, GPTQ, the
    low-rank branch) run here, once (:mod:`sixbit.weights`). An error leaves the model
    unchanged. The model keeps working inside its diffusers pipeline. Returns ``model``.

    Args:
        model: the transformer.
        config: the :class:`~sixbit.QuantConfig` (default: NVFP4 attention and feed-forward).
        calibration: a callable that runs generations with ``model`` (e.g.
            ``lambda: pipe(prompts, num_inference_steps=20, generator=torch.Generator().manual_seed(0))``), needed when ``config.gptq``:
            it is run once per transformer block to record the layers' input Hessians.
        progress: show a progress bar over the layers (default ``True``).

    Example:
        >>> import torch, sixbit
        >>> from diffusers import CogVideoXTransformer3DModel
        >>> model = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=16,
        ...     in_channels=4, time_embed_dim=32, text_embed_dim=32, num_layers=2, sample_width=8,
        ...     sample_height=8, sample_frames=9)
        >>> model = sixbit.quantize(model, sixbit.QuantConfig(weight_format="nvfp4"))
        >>> sixbit.summary(model).compression > 3
        True
    """
    config = config or QuantConfig()
    if not isinstance(config, QuantConfig):
        raise ValueError(f"config must be a sixbit.QuantConfig, got {type(config).__name__}")
    plan = plan_layers(model, config)
    quantize_layers(model, plan, config, calibration if config.needs_calibration else None, progress)
    logger.info("quantized %d linear layers of %s", len(plan), type(model).__name__)
    return model


@dataclasses.dataclass
class LayerInfo:
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
    # weight-only layers never multiply in INT8; static W8A8 layers use their quantizer's weights
    layers = [m for m in model.modules()
              if isinstance(m, QuantLinear) and not m.weight_only and m.act_quantizer is None]
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
        elif isinstance(mod, nn.Linear):
            size = mod.weight.numel() * mod.weight.element_size()
            rows.append(LayerInfo(name, spec.role_of(name).value, "fp", mod.in_features, mod.out_features,
                                  size, size, f"{str(mod.weight.dtype).removeprefix('torch.')} (not quantized)"))
    converted = sum(m.converted_nbytes() for m in model.modules() if isinstance(m, QuantLinear))
    conversion = conversion_of(model)
    notes = [conversion.hardware] if conversion is not None and conversion.hardware else []
    if conversion is not None and conversion.attention is not None:
        notes.append(f"attention quantized where {conversion.config.attention.describe()}: {conversion.attention.path}")
    return Summary(type(model).__name__, rows, _tensor_bytes(model), converted, notes)

