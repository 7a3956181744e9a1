"""Pointwise (1×1) convolutions are linear layers: :class:`QuantPointwiseConv`, and the helpers
every part of the library uses to treat ``nn.Linear`` and such convolutions alike.

A ``Conv1d/2d/3d`` whose kernel is 1 in every dimension, with stride 1, no padding, dilation 1
and one group, computes ``y[n, :, p] = W·x[n, :, p] + b`` at every position ``p``: a linear
layer applied to the channel vector, with ``W`` the conv weight reshaped ``(out, in)``. Some
architectures build their feed-forward that way (Sana-Video's ``GLUMBTempConv``: a 1×1 conv up,
a depthwise 3×3 conv, a 1×1 conv down); the builder quantizes them as the linears they are.
Convolutions with a wider kernel (one group, stride 1, dilation 1, zero padding: Sana-Video's
temporal ``conv_temp``) are linear layers on their unfolded input, quantized by
:class:`~sixbit.nn.unfolded_conv.QuantUnfoldedConv`; the helpers here treat all three kinds
alike. Depthwise convolutions (``groups > 1``), strided ones and ones padded otherwise than with
zeros are not linear layers in this sense and stay in full precision.

The quantized layer takes the conv's layout ``(N, C, *spatial)`` (or ``(C, *spatial)``), moves
the channels last, runs :class:`~sixbit.nn.QuantLinear`'s path unchanged (same kernels, same
numerics: its output equals a ``QuantLinear`` on the reshaped weight called on the moved
input) and moves them back. The output's memory layout follows the input's, as a conv's does:
an input whose channels are already innermost (``channels_last``, or a permuted
channels-last tensor, as Sana-Video's feed-forward passes) gives a channels-last output, with
no copy either way; a contiguous ``NC…`` input gives a contiguous output (one copy).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .. import formats
from .quant_linear import QuantLinear
from .unfolded_conv import QuantUnfoldedConv, conv_geometry, unfold_input

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)

#: The layer kinds a checkpoint names (``"kind"`` in a layer entry; absent means ``"linear"``),
#: each with its number of spatial dimensions (``None``: a linear layer). An ``unfolded_conv*``
#: entry also names its ``kernel_size`` and ``padding``.
KINDS: dict[str, int | None] = {"linear": None, "pointwise_conv1d": 1, "pointwise_conv2d": 2, "pointwise_conv3d": 3,
                                "unfolded_conv1d": 1, "unfolded_conv2d": 2, "unfolded_conv3d": 3}


def is_pointwise_conv(module: nn.Module) -> bool:
    """Whether ``module`` is a full-precision conv that is a linear layer: kernel 1, stride 1,
    no padding, dilation 1, one group (see the module doc).

    Example:
        >>> is_pointwise_conv(nn.Conv2d(8, 4, 1)), is_pointwise_conv(nn.Conv2d(8, 8, 1, groups=8))
        (True, False)
    """
    if not isinstance(module, _CONVS) or module.groups != 1:
        return False
    no_padding = module.padding in ("valid", "same") or all(p == 0 for p in module.padding)  # same = 0 at kernel 1
    return (no_padding and all(k == 1 for k in module.kernel_size) and all(s == 1 for s in module.stride)
            and all(d == 1 for d in module.dilation))


def is_unfoldable_conv(module: nn.Module) -> bool:
    """Whether ``module`` is a full-precision conv with a wider kernel that is a linear layer on its
    unfolded input (:func:`~sixbit.nn.unfolded_conv.conv_geometry`; pointwise convs excluded).

    Example:
        >>> is_unfoldable_conv(nn.Conv2d(8, 8, (3, 1), padding=(1, 0))), is_unfoldable_conv(nn.Conv2d(8, 8, 3, groups=8))
        (True, False)
    """
    return conv_geometry(module) is not None and not is_pointwise_conv(module)


def is_quantizable(module: nn.Module) -> bool:
    """Whether the builder can replace ``module`` by a quantized layer: an ``nn.Linear``, a
    pointwise conv (:func:`is_pointwise_conv`) or an unfoldable one (:func:`is_unfoldable_conv`),
    in full precision."""
    return isinstance(module, nn.Linear) or is_pointwise_conv(module) or is_unfoldable_conv(module)


def features(module: nn.Module) -> tuple[int, int]:
    """``(in, out)`` features of the linear layer ``module`` is: an ``nn.Linear``'s, a
    :class:`QuantLinear`'s, a conv's ``(in_channels × kernel taps, out_channels)``."""
    if isinstance(module, _CONVS):
        return module.in_channels * math.prod(module.kernel_size), module.out_channels
    return module.in_features, module.out_features


def weight_2d(module: nn.Module) -> torch.Tensor:
    """The ``(out, in)`` weight of an ``nn.Linear`` or a conv, features ordered as
    :func:`features_last` orders them: a view for a linear or a pointwise conv, a copy for a
    wider kernel (the ``(out, in, *kernel)`` weight moved to ``(out, *kernel, in)``)."""
    return module.weight.movedim(1, -1).reshape(module.weight.shape[0], -1)


def conv_arguments(module: nn.Module) -> dict[str, tuple[int, ...]]:
    """``{"kernel_size", "padding"}`` of an unfoldable conv, quantized or not, as
    :func:`quantized_layer_class`'s constructor takes them; ``{}`` for any other layer."""
    if isinstance(module, QuantUnfoldedConv):
        return {"kernel_size": module.kernel_size, "padding": module.padding}
    if is_unfoldable_conv(module):
        kernel, padding = conv_geometry(module)
        return {"kernel_size": kernel, "padding": padding}
    return {}


def spatial_dims(module: nn.Module) -> int | None:
    """Spatial dimensions of a (quantized) pointwise or unfoldable conv; ``None`` for a linear layer."""
    if isinstance(module, (QuantPointwiseConv, QuantUnfoldedConv)):
        return module.spatial_dims
    if is_pointwise_conv(module) or is_unfoldable_conv(module):
        return len(module.kernel_size)
    return None


def kind_of(module: nn.Module) -> str:
    """The :data:`KINDS` entry of a linear layer, pointwise or unfoldable conv, quantized or not."""
    dims = spatial_dims(module)
    if dims is None:
        return "linear"
    return f"unfolded_conv{dims}d" if conv_arguments(module) else f"pointwise_conv{dims}d"


def features_last(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s input ``x`` with its features in the last dimension, as the linear layer it is
    takes them: ``x`` itself for a linear layer, the channels moved last (a view) for a pointwise
    conv, the unfolded input (:func:`~sixbit.nn.unfolded_conv.unfold_input`: a new tensor,
    kernel-taps times ``x``'s size) for a wider kernel. Statistics of a layer's inputs (GPTQ's
    Hessians, calibration) read them through this."""
    unfold = conv_arguments(module)
    if unfold:
        return unfold_input(x, unfold["kernel_size"], unfold["padding"])
    dims = spatial_dims(module)
    return x if dims is None else x.movedim(x.dim() - dims - 1, -1)


def gemm_rows(module: nn.Module, x: torch.Tensor) -> int:
    """Rows of the GEMM ``module`` (a linear layer, pointwise or unfoldable conv) computes on input
    ``x``: its tokens, or its output positions (without unfolding anything)."""
    unfold = conv_arguments(module)
    if not unfold:
        rows = features_last(module, x)
        return rows.numel() // max(rows.shape[-1], 1)
    kernel, padding = unfold["kernel_size"], unfold["padding"]
    spatial = x.shape[x.dim() - len(kernel):]
    return (math.prod(x.shape[:x.dim() - len(kernel) - 1])
            * math.prod(s + 2 * p - k + 1 for s, k, p in zip(spatial, kernel, padding)))


class QuantPointwiseConv(QuantLinear):
    """A pointwise ``Conv1d/2d/3d`` quantized as the linear layer it is: a :class:`QuantLinear`
    on the weight reshaped ``(out, in)`` that takes and returns the conv's layout. Build with
    :meth:`from_conv` (or the builder, which quantizes pointwise convs wherever it quantizes
    linears).

    Example:
        >>> conv = nn.Conv2d(64, 32, 1)
        >>> q = QuantPointwiseConv.from_conv(conv, weight_format="int8", act_mode="int8")
        >>> q(torch.randn(2, 64, 3, 5)).shape
        torch.Size([2, 32, 3, 5])
    """

    def __init__(self, *args, spatial_dims: int = 2, **kwargs):
        if spatial_dims not in (1, 2, 3):
            raise ValueError(f"spatial_dims must be 1, 2 or 3 (Conv1d/2d/3d), got {spatial_dims!r}")
        super().__init__(*args, **kwargs)
        self.spatial_dims = spatial_dims

    @classmethod
    def from_conv(cls, conv: nn.Module, weight_format: str = "nvfp4", hadamard_block: int | None = None,
                  act_mode: str = "fp") -> "QuantPointwiseConv":
        """Quantize a pointwise conv's weight (see :meth:`QuantLinear.from_linear` for the
        arguments); ``conv`` is not modified."""
        if not is_pointwise_conv(conv):
            raise ValueError(f"from_conv needs a pointwise conv (kernel 1, stride 1, no padding, dilation 1, one "
                             f"group), got {conv!r}")
        fmt = formats.get(weight_format)
        w = cls.stored_weight(conv, hadamard_block)
        return cls(fmt.quantize(w), fmt.name, conv.bias, hadamard_block, act_mode, source_dtype=conv.weight.dtype,
                   spatial_dims=len(conv.kernel_size))

    def forward(self, x: torch.Tensor, mode=None, activation: str | None = None,
                quantize_output: bool = False) -> torch.Tensor:
        """The conv's output for ``x`` of shape ``(N, in, *spatial)`` or ``(in, *spatial)``:
        :meth:`QuantLinear.forward` on the channels moved last (same arguments), moved back."""
        if x.dim() not in (self.spatial_dims + 1, self.spatial_dims + 2):
            raise ValueError(f"a pointwise Conv{self.spatial_dims}d takes ({self.in_features}, *spatial) or "
                             f"(N, {self.in_features}, *spatial) inputs, got shape {tuple(x.shape)}")
        channels = x.dim() - self.spatial_dims - 1
        rows = x.movedim(channels, -1)
        y = super().forward(rows, mode, activation, quantize_output).movedim(-1, channels)
        # a conv's output takes its input's memory format: channels-last in, channels-last out
        return y if rows.is_contiguous() else y.contiguous()

    # the conv's attributes, which model code reads (SANA-WM sizes its chunks by ``out_channels``)
    @property
    def in_channels(self) -> int:
        return self.in_features

    @property
    def out_channels(self) -> int:
        return self.out_features

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return (1,) * self.spatial_dims

    stride = dilation = kernel_size

    @property
    def padding(self) -> tuple[int, ...]:
        return (0,) * self.spatial_dims

    groups = 1

    def config(self) -> dict[str, Any]:
        return {**super().config(), "kind": kind_of(self)}

    def extra_repr(self) -> str:
        return f"pointwise Conv{self.spatial_dims}d as a linear: {super().extra_repr()}"


def quantized_layer_class(kind: str):
    """The constructor of a quantized layer of ``kind`` (:data:`KINDS`), with
    :class:`QuantLinear`'s arguments (and, for an ``unfolded_conv*``, :func:`conv_arguments`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown layer kind {kind!r}; this sixbit knows {sorted(KINDS)}")
    dims = KINDS[kind]
    if dims is None:
        return QuantLinear
    if kind.startswith("pointwise"):
        return lambda *args, **kwargs: QuantPointwiseConv(*args, spatial_dims=dims, **kwargs)

    def unfolded(*args, kernel_size, padding, **kwargs):
        if len(kernel_size) != dims:
            raise ValueError(f"a {kind} has a kernel of {dims} dimension(s), got kernel_size {kernel_size!r}")
        return QuantUnfoldedConv(*args, kernel_size=kernel_size, padding=padding, **kwargs)

    return unfolded


__all__ = ["KINDS", "QuantPointwiseConv", "conv_arguments", "features", "features_last", "gemm_rows", "is_pointwise_conv",
           "is_quantizable", "is_unfoldable_conv", "kind_of", "quantized_layer_class", "spatial_dims", "weight_2d"]
