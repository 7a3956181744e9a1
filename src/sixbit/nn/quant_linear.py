"""``QuantLinear``: one packed weight copy, activation precision chosen once per call.

The weight is stored once, in the format it was quantized to (NVFP4 by default: 4.5 bits per
weight), as buffers named ``weight_<field>`` (``weight_codes``, ``weight_scales``, …); no
full-precision copy is kept. Each call asks :func:`sixbit.nn.precision.decide` once how it
multiplies (runtime methods answer through the model's precision scope; otherwise the layer's
own ``act_mode``, set when it is built): ``fp`` (weight-only), ``int8`` (a real integer GEMM) or
``nvfp4`` (emulated where no FP4 GEMM exists). :mod:`sixbit.nn.execution` lists the paths each
mode takes.

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
(``lowrank_up``, ``lowrank_down``) counted in :meth:`weight_nbytes`.

A ``weight_only`` layer (e.g. a modulation linear) always multiplies in full precision, whatever
the runtime methods decide for the others: its low-bit weight saves memory, not compute.

Which kernel a call runs is decided once, by :func:`sixbit.nn.execution.plan` (the same
decision :meth:`QuantLinear.execution` reports); static activation scales come from an input
quantizer in the layer's slot (:mod:`sixbit.nn.execution`), LoRAs from its
:class:`~sixbit.nn.lora_factors.LoraFactors`, row shards from :mod:`sixbit.nn.row_shards`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import formats, kernels
from ..formats import Quantized, check_finite
from ..transforms import hadamard
from . import execution, kept_operands, precision, row_shards
from .lora_factors import LoraFactors
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
        self._weight4 = kernels.weight4_supported(weight)  # the W4A16 kernel reads it (where it runs)
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
        execution.set_input_quantizer(self, None)
        self.act_mode = act_mode
        self.cache_converted = cache_converted
        self._converted: dict[str, Quantized] = {}
        self._packed: tuple[torch.Tensor, torch.Tensor] | None = None  # see pack_int8()
        self._folded = False  # the packed operand holds the rotation and the branch: see pack_int8()
        self._unpacked: torch.Tensor | None = None  # a weight-only NVFP4 weight's values: see unpack_nvfp4()
        self._dense: torch.Tensor | None = None  # the dense weight of a full-precision call: see keep_dense()
        self.lora_factors: LoraFactors | None = None  # while the layer has LoRAs: see add_lora()

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
    def stored_weight(linear: nn.Module, hadamard_block: int | None = None,
                      input_divisor: torch.Tensor | None = None) -> torch.Tensor:
        """``linear``'s fp32 weight in the space the layer stores it: rotated (``W·H``) and/or
        scaled (``W·diag(s)``), before quantization. ``linear``: an ``nn.Linear`` or a conv, whose
        ``(out, in, *kernel)`` weight is the linear's ``(out, T·in)`` once moved to ``(out, *kernel,
        in)`` (a pointwise conv's ``(out, in)``; see :mod:`sixbit.nn.unfolded_conv`)."""
        w = linear.weight.detach().float()
        w = w.movedim(1, -1).reshape(w.shape[0], -1)  # a linear's (out, in): unchanged
        if hadamard_block is not None:
            hadamard.check_block(w.shape[1], hadamard_block)
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
        branch = () if self.lowrank_up is None else (self.lowrank_up, self.lowrank_down)
        return sum(t.numel() * t.element_size() for t in branch)

    @property
    def lowrank_rank(self) -> int:
        """Rank of the low-rank branch (0: none)."""
        return 0 if self.lowrank_up is None else self.lowrank_up.shape[1]

    def converted_nbytes(self) -> int:
        """Bytes of kept operands (see :mod:`sixbit.nn.kept_operands`); 0 without them."""
        return kept_operands.converted_nbytes(self)

    def pack_int8(self, fold: bool = False) -> None:
        """Keep the INT8 GEMM operand packed for oneDNN's AMX INT8 kernel (``fold``: with the
        rotation and the branch folded in): :func:`sixbit.nn.kept_operands.pack_int8`."""
        kept_operands.pack_int8(self, fold)

    def unpack_nvfp4(self) -> bool:
        """Keep an NVFP4 weight's values unpacked (:func:`sixbit.nn.kept_operands.unpack_nvfp4`);
        returns whether the weight is NVFP4."""
        return kept_operands.unpack_nvfp4(self)

    def keep_dense(self, dtype: torch.dtype | None) -> None:
        """Keep (``None``: drop) the dense weight of full-precision calls: :func:`sixbit.nn.kept_operands.keep_dense`."""
        kept_operands.keep_dense(self, dtype)

    def drop_converted(self) -> None:
        """Free every kept conversion and packed copy (the stored weight stays)."""
        self._converted.clear()
        self._packed, self._folded, self._unpacked, self._dense = None, False, None, None

    # ---------------------------------------------------------------- LoRA adapters

    def add_lora(self, name: str, down: torch.Tensor, up: torch.Tensor, scale: float = 1.0) -> None:
        """Add a LoRA as a 16-bit side branch: ``y += scale · up · (down · x)`` on the layer's
        original input (not rotated or divided). ``down``: ``(r, in)``, ``up``: ``(out, r)``.
        Its factors are non-persistent fp16 buffers: they follow device moves (dtype casts leave
        them fp16) and are counted in ``summary()``, but checkpoints never hold them (load the
        LoRA file again)."""
        factors = self.lora_factors if self.lora_factors is not None else LoraFactors(self.in_features, self.out_features)
        factors.add(name, down, up, scale)
        self.lora_factors = factors

    def set_lora_scale(self, name: str, scale: float) -> None:
        """Change a LoRA's scale (0 switches it off: the layer then computes exactly as without it)."""
        self._lora_holder(name).set_scale(name, scale)

    def remove_lora(self, name: str) -> None:
        """Remove a LoRA and free its factors."""
        self._lora_holder(name).remove(name)
        if not self.lora_factors.scales:
            self.lora_factors = None

    def _lora_holder(self, name: str) -> LoraFactors:
        if self.lora_factors is None:
            raise ValueError(f"no LoRA called {name!r} on this layer (it has [])")
        return self.lora_factors

    @property
    def loras(self) -> dict[str, float]:
        """The LoRAs on this layer: ``{name: scale}``."""
        return {} if self.lora_factors is None else dict(self.lora_factors.scales)

    # ---------------------------------------------------------------- row shards (tensor parallelism)

    def row_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor holding one slice per output row, by name (see :func:`~sixbit.nn.row_shards.row_tensors`)."""
        return row_shards.row_tensors(self)

    def narrow_rows(self, start: int, stop: int) -> None:
        """Keep output rows ``start:stop`` only, in place: a tensor-parallel shard (kept conversions are dropped)."""
        row_shards.narrow_rows(self, start, stop)

    def set_rows(self, tensors: dict[str, torch.Tensor], out_features: int) -> None:
        """Replace the per-row tensors by ones holding ``out_features`` rows: :meth:`narrow_rows`' inverse."""
        row_shards.set_rows(self, tensors, out_features)

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
            "act_mode": self._act_mode.value,
        }

    def _apply(self, fn, recurse=True):
        """Device moves apply; dtype casts (``.to(torch.bfloat16)``, ``.half()``, ``.float()``)
        leave every tensor of the layer (packed weight and its scales, bias, branch, LoRA factors,
        static scales) in its stored dtype: casting fp32 or FP8 scales would change the weight,
        and outputs follow the input's dtype anyway. ``from_pretrained(torch_dtype=...)`` of a
        converted folder does the same."""
        self.drop_converted()  # converted copies follow the buffers' device
        return super()._apply(_keeping_dtype(fn), recurse)

    def _weight_as(self, name: str) -> Quantized:
        """The weight in format ``name`` (:func:`sixbit.nn.kept_operands.weight_as`)."""
        return kept_operands.weight_as(self, name)

    def int8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The INT8 GEMM operand: per-channel codes ``(N, K)`` int8 and scales ``(N,)`` fp32
        (:func:`sixbit.nn.kept_operands.int8_weight`)."""
        return kept_operands.int8_weight(self)

    # ---------------------------------------------------------------- compute

    def forward(self, x: torch.Tensor, mode: ActMode | str | None = None, activation: str | None = None,
                quantize_output: bool = False) -> torch.Tensor:
        """``x @ Wᵀ + b`` at ``mode`` (default: decided once for this call, see
        :mod:`sixbit.nn.precision`), then ``activation`` if given (one of
        :data:`sixbit.kernels.ACTIVATIONS`: applied inside the INT8 epilogue, no pass of its own;
        :func:`sixbit.runtime.fusion.fuse_activations` asks for it). ``quantize_output``: on the
        CPU's packed INT8 path, the epilogue also quantizes the output per token for the next
        layer, which finds those codes when its input is this output, unchanged (a feed-forward's
        second linear; same results as quantizing it there). The kernel is
        :func:`~sixbit.nn.execution.plan`'s choice."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected input with last dimension {self.in_features}, got shape {tuple(x.shape)}")
        if activation is not None and activation not in kernels.ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(kernels.ACTIVATIONS)}")
        if mode is None:
            mode = precision.decide(self, x)
        elif not isinstance(mode, ActMode):
            mode = precision.act_mode(mode)
        precision.notify(self, x, mode)
        if _CHECKS["finite"]:
            check_finite(x, "the input of a quantized linear layer")
        return execution.run(self, execution.plan(self, mode, x.device), x, activation, quantize_output)

    def reads_token_codes(self) -> bool:
        """Whether this layer's INT8 calls quantize their input per token as it comes (no rotation,
        divisor or static quantizer first; a folded packed operand holds those): then a previous
        layer's ``quantize_output`` codes serve as its own."""
        return (self._act_mode is ActMode.INT8 and not execution.is_static(self)
                and (self._folded or self._plain_int8()))

    def _plain_int8(self) -> bool:
        """Dynamic INT8 straight from the input: nothing to compute in fp32 first (the quantizer
        reads 16-bit inputs as they are)."""
        return (self.hadamard_block is None and self.input_divisor is None and self.lowrank_up is None
                and not execution.is_static(self))

    def _late_rotation(self, mode: ActMode, x: torch.Tensor) -> bool:
        """Whether a bf16 input of a rotating layer in dynamic INT8 is rotated by the quantization
        (:func:`~sixbit.nn.int8_inputs.quantized_input`: one bf16 GEMM by the ±1 matrix, the 1/√b in the token scales;
        no fp32 copy) rather than in fp32 first."""
        return (mode is ActMode.INT8 and self.hadamard_block is not None and not execution.is_static(self)
                and x.dtype == torch.bfloat16)

    def execution(self, mode: ActMode | str | None = None) -> str:
        """How a call at ``mode`` (default: the layer's own; a weight-only layer: always ``fp``) runs
        on the layer's device, e.g. ``"int8 (real, torch._int_mm)"``: :func:`~sixbit.nn.execution.plan`'s
        choice in words."""
        if self.weight_only:
            mode = ActMode.FP
        mode = self._act_mode if mode is None else precision.act_mode(mode)
        device = next(self.buffers()).device
        return execution.describe(self, execution.plan(self, mode, device), device)

    def extra_repr(self) -> str:
        bits = 8 * self.weight_nbytes() / (self.in_features * self.out_features)
        branch = f" + rank-{self.lowrank_rank} branch" if self.lowrank_rank else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight={self.weight_format}{branch} ({bits:.2f} bits), "
                f"hadamard_block={self.hadamard_block}, act={self.execution()}")


def _keeping_dtype(fn):
    """``fn`` (what ``Module._apply`` maps over tensors) with its dtype change dropped: a tensor
    ``fn`` would cast only moves to the device ``fn`` sends it to (read from a 0-element probe,
    so nothing weight-sized is cast and thrown away)."""

    def apply(t: torch.Tensor) -> torch.Tensor:
        probe = fn(t.new_empty(0))
        if not isinstance(probe, torch.Tensor) or probe.dtype == t.dtype:
            return fn(t)
        return t.to(probe.device)

    return apply
