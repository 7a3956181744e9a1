"""Static W8A8 at run time: per-call parameter selection, the static quantizer, checkpoints.

Split from :mod:`sixbit.methods.static_w8a8.method` (configuration and fitting). Here:

* :class:`StaticW8A8State` — which calibrated step and branch slot the current call uses,
  read from the model's step tracker once per transformer call (reset with every generation);
* :class:`StaticActQuantizer` — the input quantizer of one :class:`~sixbit.nn.QuantLinear`
  (:mod:`sixbit.nn.execution`'s slot, which routes the layer's INT8 calls to the static path):
  static per-tensor scales (python floats fixed offline), SmoothQuant divisor folded in;
* :func:`range_parameters` / :func:`static_w8a8_info` — what a runtime prefetches per range,
  and what was chosen;
* the ``"static_w8a8"`` checkpoint extension (export / restore).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ...config import time_ranges as tr
from ...formats import Quantized, integer
from ...formats.packing import pack_bits
from ...nn import QuantLinear, execution
from ...runtime.context import BATCHED, StepInfo, StepTracker, track_steps

_SLOT = {"cond": 1, "uncond": 2}


class StaticW8A8State:
    """Shared by every static layer of one model: the method's metadata and the current selection.

    ``selection`` is ``(calibrated step index, slot)`` where slot is an int (one branch for the
    whole batch) or ``(first half slot, second half slot)`` for batched CFG.
    """

    def __init__(self, timesteps: list[float], ranges: list[tuple[int, int]], per_branch: bool, config: dict):
        self.timesteps = [float(t) for t in timesteps]
        self.ranges = [tuple(r) for r in ranges]
        self.step_range = tr.range_of_steps(self.ranges)
        self.per_branch = per_branch
        self.config = config
        self.layers: dict[str, dict[str, Any]] = {}
        self.selection: tuple[int, int | tuple[int, int]] | None = None
        self._info: StepInfo | None = None
        self.tracker: StepTracker | None = None  # set by install(): where calls find their step

    def reset(self) -> None:
        self.selection = None
        self._info = None

    def select(self, info: StepInfo | None) -> None:
        """Select the parameters of the call described by ``info`` (cached per call)."""
        if info is None:
            raise ValueError(
                "a static W8A8 layer ran outside a tracked transformer call: call the transformer itself "
                "(its step tracker tells the layer which time range and CFG branch it is in)"
            )
        if info is self._info:
            return
        step = tr.nearest_step(self.timesteps, info.timestep)
        if not self.per_branch:
            slot: int | tuple[int, int] = 0
        elif info.branch == BATCHED:
            slot = (_SLOT["uncond"], _SLOT["cond"])  # diffusers batches [uncond, cond]
        else:
            slot = _SLOT.get(info.branch, 0)  # other names (custom contexts) use pooled scales
        self.selection, self._info = (step, slot), info

    def current(self) -> tuple[int, int | tuple[int, int]]:
        """The selection of the transformer call in progress (from the tracker, once per call)."""
        if self.tracker is not None:
            self.select(self.tracker.info)
        if self.selection is None:
            self.select(None)
        return self.selection


def install(state: StaticW8A8State, tracker: StepTracker) -> None:
    """Let the static layers read their step and branch from ``tracker``; reset with each generation."""
    state.tracker = tracker
    tracker.on_new_generation(state.reset)


class StaticActQuantizer(nn.Module):
    """Static activation quantizer of one layer (see :class:`~sixbit.nn.QuantLinear`).

    Holds, for every calibrated step and branch slot, a clip threshold ``T`` and abs-max ``A``
    of the smoothed input ``x / s``; the step's activation scale is ``T / qmax`` and, with a
    side path, outliers ``x/s − clip(x/s, ±T)`` are quantized with scale ``(A − T) / side_qmax``.
    Weight variants (TSQ: one per distinct smoothing vector) beyond the first are held as int8
    codes; variant 0 is the layer's own packed weight, read from the layer (never copied).
    Buffers are non-persistent: the checkpoint extension stores them.
    """

    def __init__(self, state, divisors, weights: list[Quantized], threshold, amax, qmax, range_variant, side_bits=None):
        super().__init__()
        self._state = state
        self.register_buffer("divisors", divisors.float().clone(), persistent=False)
        self.register_buffer("inv_divisors", 1.0 / self.divisors, persistent=False)
        extra = weights[1:]
        n, k = weights[0].shape
        self.register_buffer("extra_codes", torch.stack([w.values().to(torch.int8) for w in extra]) if extra
                             else torch.empty(0, n, k, dtype=torch.int8), persistent=False)
        self.register_buffer("extra_scales", torch.stack([w.scale.float().reshape(-1) for w in extra]) if extra
                             else torch.empty(0, n), persistent=False)
        self.register_buffer("threshold", threshold.float().clone(), persistent=False)
        self.register_buffer("amax", amax.float().clone(), persistent=False)
        self.weight_bits = weights[0].bits
        self.qmax = [int(q) for q in qmax]
        self.range_variant = [int(v) for v in range_variant]
        self.variant_of_step = [self.range_variant[r] for r in state.step_range]
        self.side_bits = side_bits
        # Static scales as python floats: fixed offline, no tensor reads or reductions per call.
        side_qmax = 2 ** (side_bits - 1) - 1 if side_bits else 0
        self._table = []
        for t, (thr_row, amax_row) in enumerate(zip(self.threshold.tolist(), self.amax.tolist())):
            row = []
            for thr, top in zip(thr_row, amax_row):
                thr = thr if thr > 0 else 1.0  # an all-zero input: any scale gives code 0
                side = (top - thr) / side_qmax if side_bits and top > thr * (1 + 1e-6) else 0.0
                row.append((thr / self.qmax[t], thr, side))
            self._table.append(row)
        self._side_qmax = side_qmax

    def attach(self, layer: QuantLinear) -> None:
        """Make this the input quantizer of ``layer``: its INT8 calls then take the static path."""
        execution.set_input_quantizer(layer, self)

    def describe(self) -> str:
        acts = sorted(set(q.bit_length() + 1 for q in self.qmax))
        text = (
            f"static W{self.weight_bits}A{'/'.join(map(str, acts))}: per-tensor static scales, "
            f"{len(self._state.ranges)} time range(s), {self.divisors.shape[0]} weight variant(s), int8 GEMM"
        )
        return text + (f" + {self.side_bits}-bit outlier side path (second dense int8 GEMM)" if self.side_bits else "")

    def variant(self, v: int, layer: QuantLinear) -> tuple[torch.Tensor, torch.Tensor]:
        """INT8 codes ``(N, K)`` and scales ``(N,)`` of weight variant ``v`` (0: ``layer``'s own)."""
        if v == 0:
            return layer.int8_weight()
        return self.extra_codes[v - 1], self.extra_scales[v - 1]

    def int8_weight(self, layer: QuantLinear) -> tuple[torch.Tensor, torch.Tensor]:
        step, _ = self._state.current()
        return self.variant(self.variant_of_step[step], layer)

    def _quantize(self, xs: torch.Tensor, step: int, slot: int):
        scale, thr, side_scale = self._table[step][slot]
        qmax = self.qmax[step]
        # round(x / Δ) saturated at ±qmax: identical to quantizing x clipped to ±T (T = qmax·Δ).
        codes = torch.round(xs * (1.0 / scale)).clamp_(-qmax, qmax).to(torch.int8)
        side = None
        if side_scale > 0:
            resid = xs - xs.clamp(-thr, thr)
            side = torch.round(resid * (1.0 / side_scale)).clamp_(-self._side_qmax, self._side_qmax).to(torch.int8)
        return codes, scale, side, side_scale

    def quantize_input(self, x: torch.Tensor) -> list[tuple[torch.Tensor, Any]]:
        step, slot = self._state.current()
        xs = x * self.inv_divisors[self.variant_of_step[step]]
        if isinstance(slot, int):
            codes, scale, side, side_scale = self._quantize(xs, step, slot)
            parts = [(codes, scale)]
            if side is not None:
                parts.append((side, side_scale))
            return parts
        if xs.shape[0] % 2:
            raise ValueError(f"a batched-CFG call needs an even number of rows, got {xs.shape[0]}")
        half = xs.shape[0] // 2
        q = [self._quantize(xs[:half], step, slot[0]), self._quantize(xs[half:], step, slot[1])]
        scales = torch.tensor([q[0][1]] * half + [q[1][1]] * half, device=xs.device).reshape(-1, 1)
        parts = [(torch.cat([q[0][0], q[1][0]]), scales)]
        if q[0][2] is not None or q[1][2] is not None:
            side = [p[2] if p[2] is not None else torch.zeros_like(p[0]) for p in q]
            side_scales = torch.tensor([q[0][3]] * half + [q[1][3]] * half, device=xs.device).reshape(-1, 1)
            parts.append((torch.cat(side), side_scales))
        return parts


def _static_layers(model: nn.Module) -> dict[str, QuantLinear]:
    return {
        n: m for n, m in model.named_modules()
        if isinstance(m, QuantLinear) and isinstance(execution.input_quantizer(m), StaticActQuantizer)
    }


def _state_of(model: nn.Module, layers: dict[str, QuantLinear] | None = None) -> StaticW8A8State:
    layers = _static_layers(model) if layers is None else layers
    if not layers:
        raise ValueError("this model has no static W8A8 layers: run sixbit.apply_static_w8a8 first")
    return execution.input_quantizer(next(iter(layers.values())))._state


def range_parameters(model: nn.Module, range_index: int) -> dict[str, dict[str, Any]]:
    """Everything the static layers need during time range ``range_index``, per layer.

    A runtime can fetch range ``r + 1`` while range ``r`` runs (the source preloads the next
    range's parameters next to the current ones). Per layer: ``steps`` (calibrated step
    indices of the range), ``divisor`` ``(K,)``, ``weight_codes`` ``(N, K)`` int8 and
    ``weight_scale`` ``(N,)`` of the range's weight variant, ``act_scale`` and ``side_scale``
    ``(steps, 3)`` per step × slot (all, cond, uncond), ``act_bits``.

    Example:
        >>> nxt = sixbit.range_parameters(pipe.transformer, 1)          # doctest: +SKIP
        >>> nxt["transformer_blocks.0.attn1.to_q"]["act_scale"].shape   # doctest: +SKIP
        torch.Size([5, 3])
    """
    layers = _static_layers(model)
    state = _state_of(model, layers)
    if not 0 <= range_index < len(state.ranges):
        raise ValueError(f"range_index must be in 0…{len(state.ranges) - 1}, got {range_index}")
    first, last = state.ranges[range_index]
    out = {}
    for name, layer in layers.items():
        q = execution.input_quantizer(layer)
        v = q.range_variant[range_index]
        rows = q._table[first : last + 1]
        codes, scale = q.variant(v, layer)
        out[name] = {
            "steps": list(range(first, last + 1)),
            "divisor": q.divisors[v],
            "weight_codes": codes,
            "weight_scale": scale,
            "act_scale": torch.tensor([[c[0] for c in row] for row in rows]),
            "side_scale": torch.tensor([[c[2] for c in row] for row in rows]),
            "act_bits": q.qmax[first].bit_length() + 1,
        }
    return out


@dataclasses.dataclass
class StaticW8A8Info:
    """What :func:`~sixbit.apply_static_w8a8` chose: ``layers[name]`` has ``alpha``,
    ``weight_bits``, ``variants``, ``extra_weight_bytes`` (packed bytes of the TSQ weight
    copies beyond the layer's own) and ``param_bytes`` (divisors and scale tables as stored)."""

    config: dict
    ranges: list[tuple[int, int]]
    timesteps: list[float]
    layers: dict[str, dict[str, Any]]

    @property
    def extra_weight_bytes(self) -> int:
        return sum(v["extra_weight_bytes"] for v in self.layers.values())

    @property
    def param_bytes(self) -> int:
        return sum(v["param_bytes"] for v in self.layers.values())


def static_w8a8_info(model: nn.Module) -> StaticW8A8Info:
    """What :func:`~sixbit.apply_static_w8a8` (or a loaded checkpoint) set up on ``model``.

    Example:
        >>> info = sixbit.static_w8a8_info(pipe.transformer)   # doctest: +SKIP
        >>> info.extra_weight_bytes                            # TSQ's per-range weight copies  # doctest: +SKIP
    """
    layers = _static_layers(model)
    state = _state_of(model, layers)
    rows = {}
    for name, layer in layers.items():
        q = execution.input_quantizer(layer)
        per_variant = layer.weight_nbytes()
        rows[name] = {
            **state.layers.get(name, {}),
            "variants": q.divisors.shape[0],
            "extra_weight_bytes": per_variant * (q.divisors.shape[0] - 1),
            "param_bytes": 4 * (q.divisors.numel() + q.threshold.numel() + q.amax.numel()),
        }
    return StaticW8A8Info(state.config, state.ranges, state.timesteps, rows)


# ---------------------------------------------------------------- checkpoint extension


def _export(model: nn.Module):
    layers = _static_layers(model)
    if not layers:
        return None
    state = _state_of(model, layers)
    tensors, meta_layers = {}, {}
    for name, layer in layers.items():
        q = execution.input_quantizer(layer)
        for field in ("divisors", "threshold", "amax"):
            tensors[f"{name}/{field}"] = getattr(q, field)
        for v in range(1, q.divisors.shape[0]):
            tensors[f"{name}/w{v}_codes"] = pack_bits(q.extra_codes[v - 1], q.weight_bits)
            tensors[f"{name}/w{v}_scale"] = q.extra_scales[v - 1].reshape(-1, 1)
        meta_layers[name] = {"qmax": q.qmax, "range_variant": q.range_variant, "side_bits": q.side_bits,
                             "info": state.layers.get(name, {})}
    meta = {"version": 1, "timesteps": state.timesteps, "ranges": [list(r) for r in state.ranges],
            "per_branch": state.per_branch, "config": state.config, "layers": meta_layers}
    return meta, tensors


def _prepare(model: nn.Module, modules: dict[str, nn.Module], meta: dict, tensors: dict[str, torch.Tensor]):
    """Check the stored static W8A8 state against ``modules`` and build its quantizers; the installer."""
    if meta.get("version") != 1:
        raise ValueError(f"unsupported static_w8a8 checkpoint state version {meta.get('version')!r}")
    state = StaticW8A8State(meta["timesteps"], meta["ranges"], meta["per_branch"], meta["config"])
    built = {}
    for name, info in meta["layers"].items():  # validate and build everything before attaching
        layer = modules.get(name)
        if not isinstance(layer, QuantLinear) or not isinstance(layer.quantized_weight(), integer.IntQuantized):
            raise ValueError(f"static_w8a8 state names layer {name!r}, which is not an integer QuantLinear here")
        try:
            divisors = tensors[f"{name}/divisors"]
            w0 = layer.quantized_weight()
            weights = [w0] + [
                integer.IntQuantized(tensors[f"{name}/w{v}_codes"], tensors[f"{name}/w{v}_scale"], w0.shape,
                                     w0.bits, True, "channel")
                for v in range(1, divisors.shape[0])
            ]
            quantizer = StaticActQuantizer(state, divisors, weights, tensors[f"{name}/threshold"],
                                           tensors[f"{name}/amax"], info["qmax"], info["range_variant"], info["side_bits"])
        except (KeyError, ValueError, RuntimeError, IndexError) as e:
            raise ValueError(f"static_w8a8 state of layer {name!r} is incomplete or malformed: {e}") from None
        state.layers[name] = info.get("info", {})
        built[layer] = quantizer

    def attach() -> None:
        for layer, quantizer in built.items():
            quantizer.to(layer.weight_codes.device).attach(layer)
            layer.act_mode = "int8"  # the layers' own precision: static INT8 (a configuration)
        install(state, track_steps(model))

    return attach

