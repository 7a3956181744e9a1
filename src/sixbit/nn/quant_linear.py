"""``QuantLinear``: one packed weight copy, activation precision chosen once per call.

The weight is stored once, in the format it was quantized to (NVFP4 by default: 4.5 bits per
weight), as buffers named ``weight_<field>`` (``weight_codes``, ``weight_scales``, …); no
full-precision copy is kept. Each call asks :func:`sixbit.nn.precision.decide` once how it
multiplies (runtime methods answer through the model's precision scope; otherwise the layer's
own ``act_mode``, set when it is built):

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

The forward reads nothing back to the host (``torch.compile``-friendly): inputs are not
checked for NaN/Inf on every call; :func:`debug_checks` turns the check on.

With ``hadamard_block`` set, the weight is rotated offline (``W·H``) and each input online
(``x·H``) before quantization; in exact arithmetic the output is unchanged.

With ``input_divisor`` set (a per-input-channel vector ``s``, e.g. SmoothQuant's), the stored
weight is ``W·diag(s)`` and every input is divided by ``s`` first; in exact arithmetic the
output is unchanged. It is a buffer, so checkpoints carry it.

With a low-rank branch (``lowrank=(up, down)``, SVDQuant), the stored weight is the residual
``W − up·down`` and every call adds ``(x·downᵀ)·upᵀ`` computed from the unquantized input (after
the rotation / division, in its dtype); ``up (N, r)`` and ``down (r, K)`` are 16-bit buffers
(``lowrank_up``, ``lowrank_down``) counted in :meth:`weight_nbytes`. LoRA factors can be appended
to the branch (rotated like the weight).

A ``weight_only`` layer (e.g. a modulation linear) always multiplies in full precision, whatever
the runtime methods decide for the others: its low-bit weight saves memory, not compute.

An ``act_quantizer`` (optional child module, e.g. static W8A8's) replaces the dynamic per-token
quantization of the ``int8`` path. It provides ``quantize_input(x) -> [(codes, scale), ...]``
(int8 codes of the raw input, divisor included, with fp32 scales broadcastable to ``(M, 1)``;
several parts are summed, e.g. an outlier side path), ``int8_weight(layer) -> (codes (N, K)
int8, scale (N,))`` and ``describe() -> str``. Every part is multiplied with the real int8 GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import formats, kernels
from .._distributed import token_max, tokens_split
from ..formats import Quantized, check_finite, integer, nvfp4
from ..kernels import int8_matmul, int8_matmul_backend
from ..transforms import hadamard
from . import int8_inputs, lowrank, precision, weight_views
from .precision import EMULATED, ActMode

_CHECKS = {"finite": False}


def debug_checks(enabled: bool = True) -> None:
    """Check every quantized linear's input for NaN/Inf (a clear ``ValueError`` naming the count).

    Off by default: the check reads a value back to the host on every call, which stalls a
    GPU and breaks ``torch.compile`` graphs. Weights are always checked at conversion.
    """
    _CHECKS["finite"] = bool(enabled)


class QuantLinear(nn.Module):
    """Drop-in for ``nn.Linear`` with a packed low-bit weight. Build with :meth:`from_linear`.

    Example:
        >>> import torch
        >>> lin = torch.nn.Linear(64, 32)
        >>> q = QuantLinear.from_linear(lin, weight_format="nvfp4", hadamard_block=32, act_mode="int8")
        >>> q(torch.randn(5, 64)).shape
        torch.Size([5, 32])
    """

    def __init__(
        self,
        weight: Quantized,
        weight_format: str,
        bias: torch.Tensor | None = None,
        hadamard_block: int | None = None,
        act_mode: ActMode | str = ActMode.FP,
        cache_converted: bool = False,
        source_dtype: torch.dtype = torch.float32,
        input_divisor: torch.Tensor | None = None,
        lowrank: tuple[torch.Tensor, torch.Tensor] | None = None,
        weight_only: bool = False,
    ):
        super().__init__()
        self.source_dtype = source_dtype  # dtype of the weight it replaced (for byte accounting)
        self.weight_format = formats.get(weight_format).name
        if not isinstance(weight, formats.get(weight_format).container):
            raise ValueError(f"weight container {type(weight).__name__} does not match format {weight_format!r}")
        w_shape = tuple(weight.shape)
        if len(w_shape) != 2:
            raise ValueError(f"QuantLinear needs a 2-D (out, in) weight, got shape {w_shape}")
        self.out_features, self.in_features = w_shape
        if hadamard_block is not None:
            hadamard.check_block(self.in_features, hadamard_block)
        self.hadamard_block = hadamard_block
        for name, tensor in weight.tensors().items():
            self.register_buffer(f"weight_{name}", tensor)
        self._weight_fields = tuple(weight.tensors())
        self._weight_meta = weight.meta()
        self._container = type(weight)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        if input_divisor is not None:
            input_divisor = input_divisor.detach().float().reshape(-1).clone()
            if input_divisor.numel() != self.in_features or not bool((input_divisor > 0).all()):
                raise ValueError(f"input_divisor must hold {self.in_features} positive values, got {tuple(input_divisor.shape)}")
            if hadamard_block is not None:
                raise ValueError("input_divisor and hadamard_block cannot be combined (the rotation mixes channels)")
        self.register_buffer("input_divisor", input_divisor)
        up, down = (None, None) if lowrank is None else lowrank
        if lowrank is not None and (up.dim() != 2 or down.dim() != 2 or up.shape[0] != self.out_features
                                    or down.shape[1] != self.in_features or up.shape[1] != down.shape[0]):
            raise ValueError(f"lowrank must be (up ({self.out_features}, r), down (r, {self.in_features})), "
                             f"got {tuple(up.shape)} and {tuple(down.shape)}")
        self.register_buffer("lowrank_up", None if up is None else up.detach().clone())
        self.register_buffer("lowrank_down", None if down is None else down.detach().clone())
        self.weight_only = bool(weight_only)
        self.act_quantizer: nn.Module | None = None
        self.act_mode = act_mode
        self.cache_converted = cache_converted
        self._converted: dict[str, Quantized] = {}
        self._packed: tuple[torch.Tensor, torch.Tensor] | None = None  # see pack_int8()
        self._folded = False  # the packed operand holds the rotation and the branch: see pack_int8()
        self._unpacked: torch.Tensor | None = None  # a weight-only NVFP4 weight's values: see unpack_nvfp4()
        self._loras: dict[str, float] = {}  # adapter name → scale; factors in buffers lora_<name>_down/_up

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        weight_format: str = "nvfp4",
        hadamard_block: int | None = None,
        act_mode: ActMode | str = ActMode.FP,
        cache_converted: bool = False,
        input_divisor: torch.Tensor | None = None,
    ) -> "QuantLinear":
        """Quantize ``linear``'s weight (rotated first when ``hadamard_block`` is set).

        Args:
            linear: the layer to replace; it is not modified.
            weight_format: a name from ``sixbit.formats.available()`` (default ``"nvfp4"``,
                4.5 bits; ``"int8"`` is 8 bits and nearly lossless).
            hadamard_block: ``None`` (default) or a power of two 16…256 dividing
                ``in_features``; rotation flattens outliers (better low-bit accuracy) at the
                cost of one small matmul per call.
            act_mode: the layer's own activation precision (``"fp"``, ``"int8"``, ``"nvfp4"``),
                used where no runtime method decides (see :mod:`sixbit.nn.precision`).
            cache_converted: keep weights converted for another act mode (e.g. NVFP4 → INT8)
                instead of converting on every call: faster, more memory. Off by default.
            input_divisor: ``None`` (default) or positive ``(in_features,)`` ``s``: the weight
                ``W·diag(s)`` is stored and inputs are divided by ``s`` (SmoothQuant folding,
                which moves activation outliers into the weight).
        """
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"from_linear needs an nn.Linear, got {type(linear).__name__}")
        fmt = formats.get(weight_format)
        w = cls.stored_weight(linear, hadamard_block, input_divisor)
        return cls(
            fmt.quantize(w), fmt.name, linear.bias, hadamard_block, act_mode, cache_converted, linear.weight.dtype,
            input_divisor,
        )

    @staticmethod
    def stored_weight(linear: nn.Linear, hadamard_block: int | None = None,
                      input_divisor: torch.Tensor | None = None) -> torch.Tensor:
        """``linear``'s fp32 weight in the space the layer stores it: rotated (``W·H``) and/or
        scaled (``W·diag(s)``), before quantization."""
        w = linear.weight.detach().float()
        if hadamard_block is not None:
            hadamard.check_block(linear.in_features, hadamard_block)
            w = hadamard.rotate(w, hadamard_block)
        if input_divisor is not None:
            w = w * input_divisor.detach().float().reshape(1, -1)
        return w

    # ---------------------------------------------------------------- state

    @property
    def act_mode(self) -> ActMode:
        """The layer's own precision: what a call runs at when no runtime method decides.

        A configuration, set when the layer is built (or by the user before running): runtime
        methods never write it, they answer through the precision scope instead.
        """
        return self._act_mode

    @act_mode.setter
    def act_mode(self, value: ActMode | str) -> None:
        self._act_mode = precision.act_mode(value)

    @property
    def emulated(self) -> bool:
        """Whether the layer's own ``act_mode`` emulates low-bit arithmetic (dequantize + fp matmul)."""
        return EMULATED[self._act_mode]

    def quantized_weight(self) -> Quantized:
        """The stored weight as its format's container (no copy)."""
        # fields checked at construction: no validation here (it runs on every call, and traces)
        tensors = {name: getattr(self, f"weight_{name}") for name in self._weight_fields}
        return self._container(**tensors, **self._weight_meta)

    def weight_nbytes(self) -> int:
        """Bytes of the weight: packed codes and scales, plus the low-rank branch (bias excluded)."""
        return self.quantized_weight().nbytes + self.lowrank_nbytes()

    def lowrank_nbytes(self) -> int:
        """Bytes of the 16-bit low-rank branch (0 without one)."""
        if self.lowrank_up is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.lowrank_up, self.lowrank_down))

    @property
    def lowrank_rank(self) -> int:
        """Rank of the low-rank branch (0: none)."""
        return 0 if self.lowrank_up is None else self.lowrank_up.shape[1]

    def converted_nbytes(self) -> int:
        """Bytes of weight copies converted for another activation mode and kept
        (``cache_converted=True``) or packed for the AMX INT8 kernel (:meth:`pack_int8`); 0 otherwise."""
        packed = 0 if self._packed is None else self.out_features * (self.in_features + 4)
        unpacked = 0 if self._unpacked is None else self._unpacked.numel()
        return sum(q.nbytes for q in self._converted.values()) + packed + unpacked

    def pack_int8(self, fold: bool = False) -> None:
        """Keep the INT8 GEMM operand packed once for oneDNN's AMX INT8 kernel
        (:func:`sixbit.kernels.amx_int8`): N·K bytes and a scale per row, counted by
        :meth:`converted_nbytes`; CPU calls then multiply through it, bit-identical up to the
        order of the two fp32 scale multiplies. It replaces a kept INT8 copy; moving the layer or
        cutting its rows drops it.

        ``fold``: for a layer that rotates its input or has a low-rank branch, pack instead the
        per-channel INT8 rounding of the whole function it computes, ``(W_q + U·D)·H`` (the
        stored weight plus its branch, rotated back: ``H·H = I``), so that an INT8 call is the
        plain one — the input quantized per token as it comes, one GEMM, no rotation, no branch.
        Not bit-identical: the activations are quantized unrotated, and the INT8 rounding is of
        that sum rather than of the stored weight (a layer with an input divisor or a static
        quantizer is packed unfolded)."""
        fold = (fold and self.input_divisor is None and self.act_quantizer is None
                and (self.hadamard_block is not None or self.lowrank_up is not None))
        codes, scale = self._folded_int8() if fold else self.int8_weight()
        self._packed, self._folded = (kernels.pack_int8_weight(codes), scale.float().clone()), fold
        self._converted.pop("int8", None)

    def _folded_int8(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel INT8 codes ``(N, K)`` and scales ``(N,)`` of ``(W_q + U·D)·H``."""
        def fold(part: Quantized, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
            w = part.dequantize()
            if self.lowrank_up is not None:
                w = w + self.lowrank_up[rows].float() @ self.lowrank_down.float()
            if self.hadamard_block is not None:
                w = hadamard.rotate(w, self.hadamard_block)
            return kernels.quantize_rows_reference(w)

        return weight_views.by_row_blocks(self.quantized_weight(), self.out_features, self.in_features, fold)

    def unpack_nvfp4(self) -> bool:
        """Keep an NVFP4 weight's E2M1 values unpacked, one int8 per weight (twice each value: the
        integers −12…12, exact), for a layer that dequantizes its weight on every call (weight-only
        layers: modulation): the dequantization is then a multiply instead of a table lookup per
        nibble, bit-identical (:func:`sixbit.kernels.nvfp4_unpacked_dequantize`). N·K bytes,
        counted by :meth:`converted_nbytes`; moving the layer or cutting its rows drops them.
        Returns whether the weight is NVFP4 (else nothing is kept)."""
        stored = self.quantized_weight()
        if not isinstance(stored, nvfp4.NVFP4Quantized) or stored.codes.dim() != 2:
            return False
        self._unpacked = (stored.element_values() * 2).to(torch.int8)
        return True

    def drop_converted(self) -> None:
        """Free every kept conversion and packed copy (the stored weight stays)."""
        self._converted.clear()
        self._packed, self._folded, self._unpacked = None, False, None

    # ---------------------------------------------------------------- LoRA adapters

    def add_lora(self, name: str, down: torch.Tensor, up: torch.Tensor, scale: float = 1.0) -> None:
        """Add a LoRA as a 16-bit side branch: ``y += scale · up · (down · x)`` on the layer's
        original input (not rotated or divided). ``down``: ``(r, in)``, ``up``: ``(out, r)``.
        Its factors are non-persistent buffers: they follow ``.to()`` and are counted in
        ``summary()``, but checkpoints never hold them (load the LoRA file again)."""
        if name in self._loras:
            raise ValueError(f"this layer already has a LoRA called {name!r}: unload it first")
        r = down.shape[0]
        if down.dim() != 2 or up.dim() != 2 or down.shape[1] != self.in_features or up.shape != (self.out_features, r):
            raise ValueError(f"a LoRA for this {self.in_features}→{self.out_features} layer needs down (r, {self.in_features}) "
                             f"and up ({self.out_features}, r), got {tuple(down.shape)} and {tuple(up.shape)}")
        down, up = lowrank.branch_factors(down, up)
        self.register_buffer(f"lora_{name}_down", down, persistent=False)
        self.register_buffer(f"lora_{name}_up", up, persistent=False)
        self._loras[name] = float(scale)

    def set_lora_scale(self, name: str, scale: float) -> None:
        """Change a LoRA's scale (0 switches it off: the layer then computes exactly as without it)."""
        if name not in self._loras:
            raise ValueError(f"no LoRA called {name!r} on this layer (it has {sorted(self._loras)})")
        self._loras[name] = float(scale)

    def remove_lora(self, name: str) -> None:
        """Remove a LoRA and free its factors."""
        if self._loras.pop(name, None) is None:
            raise ValueError(f"no LoRA called {name!r} on this layer (it has {sorted(self._loras)})")
        delattr(self, f"lora_{name}_down")
        delattr(self, f"lora_{name}_up")

    @property
    def loras(self) -> dict[str, float]:
        """The LoRAs on this layer: ``{name: scale}``."""
        return dict(self._loras)

    # ---------------------------------------------------------------- row shards (tensor parallelism)

    def row_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor holding one slice per output row, by attribute name: the weight's per-row
        fields (codes, block or channel scales), the bias, the up factors of the low-rank branch
        and of LoRAs. Per-tensor fields (NVFP4's global scale) are not among them."""
        stored = self.quantized_weight()
        if self.out_features < 2:
            raise ValueError("a layer with one output row has no row shards")
        one = stored.rows(0, 1).tensors()  # a field whose shape a row range changes is per-row
        out = {f"weight_{n}": t for n, t in stored.tensors().items() if one[n].shape != t.shape}
        if self.bias is not None:
            out["bias"] = self.bias
        if self.lowrank_up is not None:
            out["lowrank_up"] = self.lowrank_up
        out.update({f"lora_{n}_up": getattr(self, f"lora_{n}_up") for n in self._loras})
        return out

    def narrow_rows(self, start: int, stop: int) -> None:
        """Keep output rows ``start:stop`` only, in place: a tensor-parallel shard. The packed
        formats' blocks and groups run along the input dimension, so any row range holds whole
        ones; per-tensor scales are kept; kept conversions are dropped."""
        if not 0 <= start < stop <= self.out_features:
            raise ValueError(f"rows {start}:{stop} are not a range of this layer's {self.out_features} rows")
        if self.act_quantizer is not None:
            raise ValueError("a layer with static activation scales (static W8A8) cannot be split by rows")
        try:
            part = self.quantized_weight().rows(start, stop).tensors()
        except NotImplementedError as e:
            raise ValueError(f"this {self.weight_format} weight cannot be split by rows: {e}") from None
        rows = {}
        for name, t in self.row_tensors().items():
            field = name.removeprefix("weight_")
            rows[name] = (part[field] if name.startswith("weight_") else t[start:stop]).clone()
        self.set_rows(rows, stop - start)

    def set_rows(self, tensors: dict[str, torch.Tensor], out_features: int) -> None:
        """Replace the per-row tensors (:meth:`row_tensors`' names, all of them) by ones holding
        ``out_features`` rows: :meth:`narrow_rows`' inverse when given every shard's rows in order."""
        if set(tensors) != set(self.row_tensors()):
            raise ValueError(f"set_rows needs exactly {sorted(self.row_tensors())}, got {sorted(tensors)}")
        for name, t in tensors.items():
            setattr(self, name, nn.Parameter(t, requires_grad=False) if name == "bias" else t)
        self.out_features = out_features
        if "shape" in self._weight_meta:
            self._weight_meta = {**self._weight_meta, "shape": [out_features, self.in_features]}
        self.drop_converted()

    def config(self) -> dict[str, Any]:
        """JSON-serialisable description used by checkpoints."""
        return {
            "in_features": self.in_features,
            "out_features": self.out_features,
            "weight_format": self.weight_format,
            "hadamard_block": self.hadamard_block,
            "bias": self.bias is not None,
            "source_dtype": str(self.source_dtype).removeprefix("torch."),
            "weight_meta": self._weight_meta,
            "input_divisor": self.input_divisor is not None,
            "lowrank_rank": self.lowrank_rank,
            "lowrank_dtype": None if self.lowrank_up is None else str(self.lowrank_up.dtype).removeprefix("torch."),
            "weight_only": self.weight_only,
        }

    def _apply(self, fn, recurse=True):
        self.drop_converted()  # converted copies follow the buffers' device and dtype
        return super()._apply(fn, recurse)

    def _weight_as(self, name: str) -> Quantized:
        """The weight in format ``name`` (the stored one, or a kept conversion, or a fresh one)."""
        stored = self.quantized_weight()
        if name == self.weight_format:
            return stored
        cached = self._converted.get(name)
        if cached is None:
            cached = formats.get(name).quantize(stored.dequantize())
            if self.cache_converted:
                self._converted[name] = cached
        return cached

    def int8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The INT8 GEMM operand: per-channel codes ``(N, K)`` int8 and scales ``(N,)`` fp32.

        Integer weights of ≤ 8 bits per channel already are such codes (no re-rounding). Other
        formats are re-rounded to INT8 per output channel, a block of rows at a time so no fp32
        temporary is larger than ~1 MiB; the result is identical to converting the whole
        weight at once (each row's scale depends only on that row).
        """
        stored = self.quantized_weight()
        if weight_views.fits_int8_gemm(stored):
            return stored.values(), stored.scale.reshape(-1)
        cached = self._converted.get("int8")
        if cached is None:
            numel = self.out_features * self.in_features
            codes, scale = weight_views.by_row_blocks(stored, self.out_features, self.in_features,
                                                      lambda part, rows: weight_views.to_int8(part, numel))
            if not self.cache_converted:
                return codes, scale
            cached = integer.IntQuantized(codes.reshape(-1).view(torch.uint8), scale.reshape(-1, 1),
                                          (self.out_features, self.in_features), 8, True, "channel")
            self._converted["int8"] = cached
        return cached.values(), cached.scale.reshape(-1)

    # ---------------------------------------------------------------- compute

    def forward(self, x: torch.Tensor, mode: ActMode | None = None, activation: str | None = None,
                quantize_output: bool = False) -> torch.Tensor:
        """``x @ Wᵀ + b`` at ``mode`` (default: decided once for this call, see
        :mod:`sixbit.nn.precision`), then ``activation`` if given (one of
        :data:`sixbit.kernels.ACTIVATIONS`: applied inside the INT8 epilogue, no pass of its own;
        :func:`sixbit.runtime.fusion.fuse_activations` asks for it). ``quantize_output``: on the
        CPU's packed INT8 path, the epilogue also quantizes the output per token for the next
        layer, which finds those codes when its input is this output, unchanged (a feed-forward's
        second linear; same results as quantizing it there)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected input with last dimension {self.in_features}, got shape {tuple(x.shape)}")
        if activation is not None and activation not in kernels.ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(kernels.ACTIVATIONS)}")
        if mode is None:
            mode = precision.decide(self, x)
        precision.notify(self, x, mode)
        if _CHECKS["finite"]:
            check_finite(x, "the input of a quantized linear layer")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        # the output's per-token codes, if asked for and the INT8 path makes them (none after LoRAs)
        codes = [] if quantize_output and not self._loras and int8_inputs.can_remember() else None
        if self._fused_int8(mode, x2):  # CUDA: one Triton kernel rotates and quantizes the input
            w_codes, w_scale = self.int8_weight()
            y = kernels.int8_linear(x2, w_codes, w_scale, self.hadamard_block)
            return self._finish(x, y, lead, activation=activation)
        if self._folded and mode is ActMode.INT8 and x2.device.type == "cpu":  # see pack_int8(fold=True)
            bias, fused = (None, None) if self._loras else (self.bias, activation)
            y = self._forward_int8(x2, None, bias, torch.float32 if self._loras else x.dtype, fused, x, out_codes=codes)
            y = self._finish(x, y, lead, bias_added=not self._loras, activation=None if fused else activation)
            return int8_inputs.remembered(y, codes)
        late = self._late_rotation(mode, x2)
        if not late and (mode is ActMode.NVFP4 or (mode is ActMode.INT8 and not self._plain_int8())):
            x2 = x2.float()  # quantize activations from fp32, after an fp32 rotation
        if self.hadamard_block is not None and not late:
            x2 = hadamard.rotate(x2, self.hadamard_block)
        static = self.act_quantizer is not None and mode is ActMode.INT8
        divided = self.input_divisor is not None and not static  # the static quantizer folds it into its scale
        if divided:
            x2 = x2 / self.input_divisor.to(x2.dtype)
        branch = None  # the low-rank branch as (x·Dᵀ, U): each path adds x·Dᵀ·Uᵀ as suits it
        if self.lowrank_up is not None and late:  # x·H·Dᵀ = x·(D·H)ᵀ: the unrotated input, D rotated
            branch = lowrank.branch(x2, hadamard.rotate(self.lowrank_down, self.hadamard_block), self.lowrank_up)
        elif self.lowrank_up is not None:  # the branch sees the unquantized (rotated / divided) input
            xb = x2 if divided or self.input_divisor is None else x2 / self.input_divisor.to(x2.dtype)
            branch = lowrank.branch(xb, self.lowrank_down, self.lowrank_up)
        # LoRAs come before the bias: with them, the bias waits for _finish
        bias = None if self._loras else self.bias
        dtype = torch.float32 if self._loras else x.dtype
        fused = None  # the activation applied by the INT8 epilogue (not after LoRAs: they come first)
        if mode is ActMode.INT8 and self.act_quantizer is None:
            fused = None if self._loras else activation
            y = self._forward_int8(x2, branch, bias, dtype, fused, x if self._plain_int8() or late else None,
                                   self.hadamard_block if late else None, codes)
        else:
            y = _PATHS[mode](self, x2, branch, bias, dtype)
        y = self._finish(x, y, lead, bias_added=not self._loras, activation=None if fused else activation)
        return int8_inputs.remembered(y, codes)

    def _finish(self, x: torch.Tensor, y: torch.Tensor, lead, bias_added: bool = False,
                activation: str | None = None) -> torch.Tensor:
        """LoRAs, bias (unless the path added it), ``activation`` (unless the path applied it), and
        the output in the input's dtype and shape."""
        if self._loras:  # on the layer's original input, not the rotated / divided one
            xo = x.reshape(-1, self.in_features).to(y.dtype)
            for name, scale in self._loras.items():
                if scale:  # a LoRA at scale 0 adds nothing, not even rounding
                    y = y + scale * lowrank.low_rank(xo, getattr(self, f"lora_{name}_down"),
                                                     getattr(self, f"lora_{name}_up"))
        if self.bias is not None and not bias_added:
            y = y + self.bias.to(y.dtype)
        if activation is not None:
            y = F.gelu(y, approximate="tanh" if activation == "gelu-tanh" else "none")
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def reads_token_codes(self) -> bool:
        """Whether this layer's INT8 calls quantize their input per token as it comes (no rotation,
        divisor or static quantizer first; a folded packed operand holds those): then a previous
        layer's ``quantize_output`` codes serve as its own."""
        return (self._act_mode is ActMode.INT8 and self.act_quantizer is None
                and (self._folded or self._plain_int8()))

    def _plain_int8(self) -> bool:
        """Dynamic INT8 straight from the input: nothing to compute in fp32 first (the quantizer
        reads 16-bit inputs as they are)."""
        return (self.hadamard_block is None and self.input_divisor is None and self.lowrank_up is None
                and self.act_quantizer is None)

    def _late_rotation(self, mode: ActMode, x: torch.Tensor) -> bool:
        """Whether a bf16 input of a rotating layer in dynamic INT8 is rotated by the quantization
        (:func:`~sixbit.nn.int8_inputs.quantized_input`: one bf16 GEMM by the ±1 matrix, the 1/√b in the token scales;
        no fp32 copy) rather than in fp32 first."""
        return (mode is ActMode.INT8 and self.hadamard_block is not None and self.act_quantizer is None
                and x.dtype == torch.bfloat16)

    def _fused_int8(self, mode: ActMode, x: torch.Tensor) -> bool:
        """Whether this call takes the fused Triton INT8 path (CUDA; nothing between the rotation
        and the quantization: no divisor, static quantizer or low-rank branch)."""
        return (mode is ActMode.INT8 and self.act_quantizer is None and self.input_divisor is None
                and self.lowrank_up is None and kernels.fused_int8(x.device))

    # Each path: ``x`` (2-D, rotated / divided), the low-rank ``branch`` output or None, the
    # ``bias`` to add or None; it returns ``x·Wᵀ + branch + bias`` (adds in this order), in ``dtype``
    # where it can write that directly (INT8), else in its compute dtype.

    def _forward_fp(self, x, branch, bias, dtype):
        stored = self.quantized_weight()
        if kernels.weight4_fused(x.device) and kernels.weight4_supported(stored):
            y = kernels.weight4_linear(x, stored)  # the 4-bit weight decoded inside the GEMM
        elif self._unpacked is not None:
            y = F.linear(x, kernels.nvfp4_unpacked_dequantize(self._unpacked, stored.scales, stored.global_scale, x.dtype))
        else:
            y = F.linear(x, weight_views.dequantize(stored, x.dtype))
        return lowrank.add(y, branch, bias)

    def _forward_int8(self, x, branch, bias, dtype, activation=None, source=None, block=None, out_codes=None):
        """``activation`` is applied by the dynamic path's epilogue (the static one takes None);
        ``block``: the Hadamard block ``x`` is still to be rotated by (see :meth:`_late_rotation`);
        ``source``: the layer's input before reshaping when ``x`` is it unchanged, so that layers
        given the same input (attention's q, k, v) quantize it once; ``out_codes``: a list the packed
        path appends the output's per-token codes and scales to (``forward``'s ``quantize_output``)."""
        if self.act_quantizer is not None:
            # Static: the quantizer's codes and scales; each part is one real int8 GEMM.
            w_codes, w_scale = self.act_quantizer.int8_weight(self)
            y = None
            for codes, scale in self.act_quantizer.quantize_input(x):
                part = int8_matmul(codes, w_codes).float().mul_(scale)
                y = part if y is None else y.add_(part)
            return lowrank.add(y.mul_(w_scale.reshape(1, -1)), branch, bias)
        # per-token codes, the integer GEMM, one epilogue (scales, branch, bias, output dtype);
        # compiled into single passes on large CPU inputs, bit-identical to the eager ops (an
        # activation's exponential: to the last fp32 bit)
        codes, scale = int8_inputs.quantized_input(x, source, block)
        if self._packed is not None and x.device.type == "cpu":  # AMX: the weight scale applied inside
            acc = kernels.packed_int8_matmul(codes, *self._packed,
                                             dtype=torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
            if acc.dtype != dtype:
                return kernels.scale_epilogue(acc, scale, None, lowrank.full(branch), bias, dtype, activation)
            # no new (tokens, N) tensor after the GEMM's own: at real sizes each is fresh pages from
            # the OS, which cost more than the pass itself. The branch goes into the GEMM's output
            # divided by the token scale (one more rounding to ``dtype``), the epilogue writes in place.
            if branch is not None:
                lowrank.add_branch(acc, branch, scale)
            if out_codes is not None:
                out_codes.append(kernels.scale_epilogue_quantize(acc, scale, bias, activation))
                return acc
            return kernels.scale_epilogue(acc, scale, None, None, bias, dtype, activation, inplace=True)
        w_codes, w_scale = self.int8_weight()
        return kernels.scale_epilogue(int8_matmul(codes, w_codes), scale, w_scale, lowrank.full(branch), bias, dtype,
                                      activation)

    def _forward_nvfp4(self, x, branch, bias, dtype):
        # the per-tensor scale from every rank's tokens when a sequence-parallel model splits them
        scale = nvfp4.global_scale_for(token_max(x.detach().abs().amax())) if tokens_split() else None
        if kernels.fp4_supported(x.device):  # FP4 tensor cores
            y = kernels.nvfp4_linear(x, self._weight_as("nvfp4"), torch.float32, scale)
        else:  # Emulated: no FP4 GEMM here; dequantize both operands and multiply in fp32.
            y = F.linear(nvfp4.quantize(x, scale, check=False).dequantize(), self._weight_as("nvfp4").dequantize())
        return lowrank.add(y, branch, bias)

    def execution(self, mode: ActMode | str | None = None) -> str:
        """How a call at ``mode`` (default: the layer's own) runs, e.g. ``"int8 (real, torch._int_mm)"``."""
        if self.weight_only:
            return "fp (weight-only layer: dequantize + matmul)"
        mode = self._act_mode if mode is None else precision.act_mode(mode)
        device = next(self.buffers()).device
        if mode is ActMode.INT8:
            backend = int8_matmul_backend(device, 4096, self.in_features, self.out_features)
            if self.act_quantizer is not None:
                return f"{self.act_quantizer.describe()} (real, {backend})"
            if self._packed is not None and device.type == "cpu":
                folded = " (rotation and branch folded in)" if self._folded else ""
                return f"int8 (real, oneDNN AMX INT8 on a packed copy{folded})"
            fused = " + Triton fused quantize" if kernels.fused_int8(device) else ""
            return f"int8 (real, {backend}{fused})"
        if mode is ActMode.NVFP4:
            if kernels.fp4_supported(device):
                return "nvfp4 (real, torch._scaled_mm FP4)"
            return "nvfp4 (emulated: dequantize + fp32 matmul)"
        if kernels.weight4_fused(device) and kernels.weight4_supported(self.quantized_weight()):
            return "fp (weight-only: Triton dequantize-in-the-GEMM)"
        return "fp (weight-only: dequantize + matmul)"

    def extra_repr(self) -> str:
        bits = 8 * self.weight_nbytes() / (self.in_features * self.out_features)
        branch = f" + rank-{self.lowrank_rank} branch" if self.lowrank_rank else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, weight={self.weight_format}{branch} ({bits:.2f} bits), "
            f"hadamard_block={self.hadamard_block}, act={self.execution()}"
        )


_PATHS: dict[ActMode, Callable[..., torch.Tensor]] = {
    ActMode.FP: QuantLinear._forward_fp,
    ActMode.INT8: QuantLinear._forward_int8,
    ActMode.NVFP4: QuantLinear._forward_nvfp4,
}
