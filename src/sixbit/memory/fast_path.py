"""Which layout a converted model runs with on the device it runs on, decided by sixbit.

A checkpoint holds each layer's weight once, packed (4 or 8 bits), and stays device-neutral.
What a call runs fastest from depends on the machine: on CPUs the INT8 GEMM operand kept ready
(on AMX-INT8 CPUs packed for oneDNN's AMX kernel, with a 4-bit layer's rotation and low-rank
branch folded in) instead of re-rounding 4-bit weights on every call; on CUDA the INT8 copy of
4-bit weights beside the stored ones. A :class:`Layout` is that decision for one model on one
device. It is taken once, at the model's first call on a device (so a model loaded on the CPU
and moved to a GPU never packs for the CPU), by a hook that :func:`sixbit.convert_model`,
:func:`sixbit.load`, :func:`sixbit.load_pretrained` and diffusers' ``from_pretrained`` attach,
and taken again when a call comes on another device. ``summary()``, ``sixbit info`` and the
conversion's record (``conversion_of(model).layout``) report it with its memory cost.

Three choices (``layout=`` of those calls, ``--layout`` of the CLI, or the environment variable
``SIXBIT_LAYOUT`` for the default):

- ``"auto"`` (default): ``"fast"`` where its kept operands fit in half the device's free memory
  and the model's weights are not offloaded, else ``"compact"`` (the reason is reported);
  switching offloading on or off decides it again at the next call (:func:`decide_auto_again`).
  On a CPU without AMX-INT8, a model whose 4-bit weights are multiplied in INT8 (``w4a8``) stays
  ``"compact"``: there a CogVideoX-2B call's INT8 GEMMs ran no faster with INT8 copies (2.54
  against 2.61 s at 5,626 tokens), which would cost 8 bits per weight (BENCHMARKS.md ``length``).
- ``"fast"``: keep the operands (:func:`keep_int8_weights`): ``w8a8`` 1.35× and ``w4a8`` 1.33×
  bf16 at CogVideoX-2B size on an AMX CPU, against 0.90× and 0.68× without
  (BENCHMARKS.md ``cpu-speed``); 8 more bits per weight resident (``w4a8``: 4.9 → 13).
- ``"compact"``: only the stored 4- or 8-bit weights stay resident; every call re-rounds.

Folding (AMX CPUs, 4-bit presets) changes results by quantization noise, not by rounding only:
see :func:`keep_int8_weights`.

Example:
    >>> import sixbit
    >>> from sixbit.zoo.shapes import load_pipeline
    >>> pipe = load_pipeline("wan")
    >>> _ = sixbit.convert_model(pipe, None, "w8a8", layout="compact")
    >>> sixbit.layout_of(pipe) is None  # taken at the first call
    True
    >>> _ = pipe("a red circle moving right", num_inference_steps=1)
    >>> sixbit.layout_of(pipe).choice
    'compact'
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import weakref
from pathlib import Path

import torch
from diffusers.hooks import ModelHook
from torch import nn

from .. import kernels
from ..formats import nvfp4
from .weights import offloaded_by, resident_weights
from ..models import transformer_of
from ..nn import QuantLinear, execution, weight_views
from ..runtime import hooks
from ..runtime.fusion import fuse_activations
from ..runtime.wrapped import changes_model

CHOICES = ("auto", "fast", "compact")
ENVIRONMENT = "SIXBIT_LAYOUT"  # the default choice, where the calls are not given one
HOOK = "sixbit_layout"
_FREE_SHARE = 0.5  # "auto" keeps operands that fit in this share of the device's free memory
# Why "auto" keeps no INT8 copies of 4-bit weights on CPUs without AMX-INT8 (BENCHMARKS.md
# ``length``, w4a8 against w4a8 (fast) at CogVideoX-2B size, 2 cores, AVX512-VNNI; under AVX2
# caps, with no VNNI, the INT8 GEMM is the exact float64 fallback, slower still against re-rounding).
_NO_AMX_COPIES = ("there the INT8 GEMMs of a CogVideoX-2B call at 5,626 tokens took as long without them "
                  "(2.61 against 2.54 s of a 12 s call), and they hold 8 more bits per weight")


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a model runs with on one device.

    Attributes:
        choice: what was asked (``"auto"``, ``"fast"`` or ``"compact"``).
        device: the device it was decided for.
        kept: whether the INT8 operands are kept ready (``"fast"``); where the stored weights
            already are them (8-bit weights off AMX, static W8A8) that keeps 0 bytes, and ``reason``
            says there is nothing to keep.
        fold: whether rotations and low-rank branches are folded into them (AMX CPUs).
        kept_bytes: bytes the kept operands hold (``"fast"``), or would hold (``"compact"``), on this
            device's CPU kind (:func:`kept_bytes`).
        reason: why, in words.
    """

    choice: str
    device: torch.device
    kept: bool
    fold: bool
    kept_bytes: int
    reason: str

    @property
    def name(self) -> str:
        return "fast" if self.kept else "compact"

    def describe(self) -> str:
        """One line: the layout, its device, its memory cost and why."""
        mib = self.kept_bytes / 2**20
        cost = f"+{mib:.1f} MiB of kept operands" if self.kept else f"{mib:.1f} MiB of kept operands not held"
        asked = "" if self.choice == self.name else f" (asked: {self.choice})"
        return f"layout {self.name}{asked} on {device_kind(self.device)}: {cost}; {self.reason}"


def device_kind(device: torch.device | str) -> str:
    """The device and what decides its speed: ``"cpu (AMX-BF16, AMX-INT8, ...)"``, ``"cuda:0 (NVIDIA H200, sm_90)"``."""
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{device} ({torch.cuda.get_device_name(device)}, sm_{major}{minor})"
    return f"{device} ({kernels.cpu_kind()})" if device.type == "cpu" else str(device)


def default_choice() -> str:
    """The choice where none is given: ``$SIXBIT_LAYOUT``, else ``"auto"``."""
    return check_choice(os.environ.get(ENVIRONMENT, "auto"), f"${ENVIRONMENT}")


def check_choice(choice: str | None, what: str = "layout") -> str:
    """``choice`` checked (``None``: the default)."""
    if choice is None:
        return default_choice()
    if choice not in CHOICES:
        raise ValueError(f"{what} must be one of {', '.join(CHOICES)}, got {choice!r}")
    return choice


def kept_bytes(shapes, device: torch.device | str) -> int:
    """Bytes the kept operands of layers ``(out_features, in_features, kind)`` take on ``device``,
    ``kind`` one of ``"gemm"`` (INT8 calls of weights the INT8 GEMM cannot read: an INT8 copy,
    codes and a scale per row), ``"int8"`` (per-channel INT8 weights: packed for AMX on AMX CPUs,
    read as stored elsewhere), ``"weight_only"`` (CPUs: NVFP4 values unpacked, one int8 each),
    ``"static"`` (static W8A8) and ``"none"`` (weight-only layers of other formats): nothing kept.
    What :func:`apply` keeps there, byte for byte."""
    device = torch.device(device)
    cpu, amx = device.type == "cpu", device.type == "cpu" and kernels.amx_int8()
    per_layer = {"gemm": lambda n, k: n * (k + 4), "static": lambda n, k: 0, "none": lambda n, k: 0,
                 "int8": lambda n, k: n * (k + 4) if amx else 0,
                 "weight_only": lambda n, k: n * k if cpu else 0}
    return sum(per_layer[kind](n, k) for n, k, kind in shapes)


def free_memory(device: torch.device | str) -> int | None:
    """Free bytes on ``device`` (``MemAvailable`` on Linux CPUs), or ``None`` where unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        line = next(s for s in Path("/proc/meminfo").read_text().splitlines() if s.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def decide(shapes, device: torch.device | str, choice: str | None = None, offloaded: str | None = None) -> Layout:
    """The :class:`Layout` for layers of ``shapes`` (see :func:`kept_bytes`) on ``device``, without
    changing anything; ``offloaded`` names an offloading of the weights ("auto" then stays compact)."""
    device, choice = torch.device(device), check_choice(choice)
    size = kept_bytes(shapes, device)
    fold = device.type == "cpu" and kernels.amx_int8()
    gain = _gain(shapes, device, fold, size)
    if choice == "compact":
        return Layout(choice, device, False, False, size, "the stored weights alone, re-rounded on every call (asked)")
    if choice == "fast" or size == 0:
        return Layout(choice, device, True, fold, size, gain)
    if offloaded:
        return Layout(choice, device, False, False, size, f"the weights are offloaded ({offloaded}): kept operands "
                      "would undo it; layout='fast' keeps them anyway")
    if device.type == "cpu" and not fold and any(kind == "gemm" for *_, kind in shapes):
        return Layout(choice, device, False, False, size, f"INT8 copies of 4-bit weights do not pay on a CPU "
                      f"without AMX-INT8: {_NO_AMX_COPIES}; layout='fast' keeps them anyway")
    free = free_memory(device)
    if free is not None and size > _FREE_SHARE * free:
        return Layout(choice, device, False, False, size, f"kept operands would take more than half of the "
                      f"{free / 2**30:.1f} GiB free on {device}; layout='fast' keeps them anyway")
    return Layout(choice, device, True, fold, size, gain)


def _gain(shapes, device: torch.device, fold: bool, size: int) -> str:
    """Why ``"fast"`` pays on ``device``, in words: what it keeps there, or that it keeps nothing."""
    if fold:
        return ("INT8 operands packed for oneDNN's AMX INT8 kernel, rotations and branches folded in: measured "
                "fastest on AMX CPUs")
    if size == 0:
        return (f"nothing to keep on {device_kind(device)}: the INT8 GEMM reads the stored weights as they are; "
                "each feed-forward's GELU runs in its linear's INT8 epilogue")
    copies = "INT8 copies of 4-bit weights instead of re-rounding them on every INT8 call"
    if device.type != "cpu":
        return copies
    if not any(kind == "gemm" for *_, kind in shapes):
        return "NVFP4 weight-only values unpacked: a multiply instead of a table lookup on every call"
    return f"{copies} (asked: on this CPU kind, without AMX-INT8, {_NO_AMX_COPIES})"


@changes_model("keep_int8_weights")
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
    :func:`summary` counts them. The model's :class:`Layout` becomes ``"fast"`` (or ``"compact"``)
    on its device, as if asked: sixbit does not change it until a call comes on another device.

    This is what the ``"fast"`` layout does (sixbit's default where it fits: see :mod:`sixbit.memory.fast_path`).
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
    device = _device_of(model)
    kept = _keep(model, enabled, fold)
    fold = fold and enabled and device.type == "cpu" and kernels.amx_int8()
    _LAYOUTS[model] = Layout("fast" if enabled else "compact", device, bool(enabled), fold,
                             kept if enabled else kept_bytes(_shapes(model), device), "asked (keep_int8_weights)")
    return kept


def _keep(model: nn.Module, enabled: bool, fold: bool) -> int:
    # weight-only layers never multiply in INT8; static W8A8 layers use their quantizer's weights
    layers = [m for m in model.modules()
              if isinstance(m, QuantLinear) and not m.weight_only and not execution.is_static(m)]
    weight_only = [m for m in model.modules() if isinstance(m, QuantLinear) and m.weight_only]
    # built from the real weights: a disk-offloaded model's offloaded groups hold zero placeholders
    with resident_weights(model) if enabled and offloaded_by(model) else contextlib.nullcontext():
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


_LAYOUTS: weakref.WeakKeyDictionary[nn.Module, Layout] = weakref.WeakKeyDictionary()
_CHOICES: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def layout_of(model) -> Layout | None:
    """The :class:`Layout` a converted model (or a pipeline's transformer) runs with, once decided
    (at its first call on a device, or by :func:`apply`); ``None`` before."""
    return _LAYOUTS.get(transformer_of(model))


def planned(model) -> Layout | None:
    """The layout the model runs with, or, before its first call, the one it would get on the
    device its weights are on now; ``None`` for a model sixbit does not lay out."""
    model = transformer_of(model)
    if model in _LAYOUTS:
        return _LAYOUTS[model]
    if model not in _CHOICES:
        return None
    return decide(_shapes(model), _device_of(model), _CHOICES[model], offloaded_by(model))


def decide_auto_again(model) -> None:
    """Forget ``model``'s layout where ``"auto"`` decided it, so that its next call decides again:
    what switching offloading on or off calls (``"auto"`` keeps no operands while the weights are
    offloaded). A layout asked for (``"fast"``, ``"compact"``, :func:`keep_int8_weights`) stays."""
    model = transformer_of(model)
    layout = _LAYOUTS.get(model)
    if layout is not None and layout.choice == "auto":
        del _LAYOUTS[model]


def apply(model, device: torch.device | str | None = None, choice: str | None = None) -> Layout:
    """Decide the layout of ``model`` on ``device`` (default: where its weights are) and build it
    now: what the first call on a device does by itself. Returns the :class:`Layout`."""
    model = transformer_of(model)
    choice = check_choice(choice if choice is not None else _CHOICES.get(model))
    device = _device_of(model) if device is None else torch.device(device)
    layout = decide(_shapes(model), device, choice, offloaded_by(model))
    kept = _keep(model, layout.kept, layout.fold) if layout.kept or _held(model) else 0
    layout = dataclasses.replace(layout, kept_bytes=kept) if layout.kept else layout
    _LAYOUTS[model] = layout
    return layout


def attach(model, choice: str | None = None) -> None:
    """Lay ``model`` out as ``choice`` (default: :func:`default_choice`) at its first call on each
    device (a hook on the transformer). A model already attached is given the new choice and
    decided again at its next call."""
    model = transformer_of(model)
    choice = check_choice(choice)
    if not any(isinstance(m, QuantLinear) for m in model.modules()):
        return  # nothing quantized: nothing to lay out
    _CHOICES[model] = choice
    _LAYOUTS.pop(model, None)
    if hooks.get(model, HOOK) is None:
        hooks.register(model, _LayoutHook(), HOOK)


class _LayoutHook(ModelHook):
    """Before a call: the layout for the device the call runs on, decided once per device."""

    @torch.compiler.disable
    def pre_forward(self, module, *args, **kwargs):
        device = next((t.device for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
        layout = _LAYOUTS.get(module)
        if device is not None and device.type != "meta" and (layout is None or layout.device != device):
            apply(module, device)
        return args, kwargs


def _shapes(model: nn.Module) -> list[tuple[int, int, str]]:
    kind = lambda m: (("weight_only" if isinstance(m.quantized_weight(), nvfp4.NVFP4Quantized) else "none")  # noqa: E731
                      if m.weight_only else "static" if execution.is_static(m)
                      else "int8" if weight_views.fits_int8_gemm(m.quantized_weight()) else "gemm")
    return [(m.out_features, m.in_features, kind(m)) for m in model.modules() if isinstance(m, QuantLinear)]


def _held(model: nn.Module) -> bool:
    return any(m.converted_nbytes() for m in model.modules() if isinstance(m, QuantLinear))


def _device_of(model: nn.Module) -> torch.device:
    return next((t.device for t in model.buffers() if t.device.type != "meta"), torch.device("cpu"))


__all__ = ["CHOICES", "ENVIRONMENT", "Layout", "apply", "attach", "check_choice", "decide", "decide_auto_again",
           "default_choice", "device_kind", "free_memory", "keep_int8_weights", "kept_bytes", "layout_of", "planned"]
