"""Convolutions with a wider kernel quantized as the GEMM they are: :class:`QuantUnfoldedConv`.

A ``Conv1d/2d/3d`` with one group, stride 1, dilation 1 and zero padding computes, at every
output position ``p``, ``y[n, :, p] = Σ_o W[:, :, o]·x[n, :, p + o − pad] + b`` over the kernel
offsets ``o``: a linear layer applied to the *unfolded* input, the ``T`` copies of the input
shifted by each offset (zero where the padding reaches outside it) concatenated on the channel
axis, with the weight reshaped ``(out, T·in)``. Sana-Video's feed-forward ends with such a conv
over the frame axis (``conv_temp``: a ``(3, 1)`` kernel, ``T = 3``), which holds more than half
of its feed-forward's weights; the builder quantizes it as that linear. Any kernel unfolds: an
axis-aligned one (``(k, 1)``, ``(1, k)``, ``(k, 1, 1)``) costs ``k`` copies, a full ``k×k`` one
``k²``.

**Memory**: every call builds the unfolded input, ``T`` times the input's size in its dtype
(three times ``conv_temp``'s input, the size of one feed-forward activation, in bf16 at real
size), on top of what a ``QuantLinear`` call allocates; it is freed when the call returns.
A full-precision conv needs no such copy. Calibration statistics and GPTQ's Hessians read the
same unfolded input (:func:`~sixbit.nn.pointwise_conv.features_last`), ``T·in`` features wide.

Only zero padding unfolds this way (``padding_mode="zeros"``); a conv padded otherwise, with
``padding="same"`` on an even kernel (padded unevenly), a stride, a dilation or groups stays in
full precision (:func:`conv_geometry` returns ``None``).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn

from .. import formats
from .quant_linear import QuantLinear

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def conv_geometry(conv: nn.Module) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(kernel_size, padding)`` of a full-precision conv that is a linear layer on its unfolded
    input (one group, stride 1, dilation 1, zero padding, the same on both sides of each axis), or
    ``None`` for any other module. Pointwise convs qualify too (kernel 1, padding 0).

    Example:
        >>> conv_geometry(nn.Conv2d(8, 8, (3, 1), padding=(1, 0))), conv_geometry(nn.Conv2d(8, 8, 3, stride=2))
        (((3, 1), (1, 0)), None)
    """
    if not isinstance(conv, _CONVS) or conv.groups != 1 or conv.padding_mode != "zeros":
        return None
    if any(s != 1 for s in conv.stride) or any(d != 1 for d in conv.dilation):
        return None
    kernel = tuple(int(k) for k in conv.kernel_size)
    if conv.padding == "valid":
        padding = (0,) * len(kernel)
    elif conv.padding == "same":
        if any(k % 2 == 0 for k in kernel):  # torch pads k − 1 unevenly then: left k//2 − 1, right k//2
            return None
        padding = tuple((k - 1) // 2 for k in kernel)
    else:
        padding = tuple(int(p) for p in conv.padding)
    return kernel, padding


def unfold_input(x: torch.Tensor, kernel_size: tuple[int, ...], padding: tuple[int, ...]) -> torch.Tensor:
    """The input of the linear a conv is: ``x`` of shape ``(N, C, *spatial)`` or ``(C, *spatial)``
    → ``(N, *out, T·C)`` (or ``(*out, T·C)``), features last. Feature ``t·C + c`` is channel ``c``
    shifted by the ``t``-th kernel offset (offsets in row-major order, the order of the conv
    weight ``(out, C, *kernel)`` moved to ``(out, *kernel, C)``), zero where ``padding`` reaches
    outside ``x``. One new tensor, ``T`` times ``x``'s size; no copy of ``x`` besides.

    Example:
        >>> unfold_input(torch.arange(3.0).reshape(1, 1, 3), (3,), (1,))[0]
        tensor([[0., 0., 1.],
                [0., 1., 2.],
                [1., 2., 0.]])
    """
    dims = len(kernel_size)
    rows = x.movedim(x.dim() - dims - 1, -1)  # (..., *spatial, C): a view
    lead, spatial = rows.shape[:rows.dim() - dims - 1], rows.shape[rows.dim() - dims - 1:-1]
    out = [s + 2 * p - k + 1 for s, k, p in zip(spatial, kernel_size, padding)]
    if min(out) < 1:
        raise ValueError(f"input of spatial size {tuple(spatial)} is smaller than the kernel {tuple(kernel_size)} "
                         f"with padding {tuple(padding)}")
    taps = math.prod(kernel_size)
    # zeros first: the padding is what no shifted copy writes (a memset of the new tensor)
    unfolded = rows.new_zeros(*lead, *out, taps, rows.shape[-1])
    keep = (slice(None),) * len(lead)
    for tap, offsets in enumerate(itertools.product(*(range(k) for k in kernel_size))):
        dst, src = list(keep), list(keep)
        for o, p, s, n in zip(offsets, padding, spatial, out):
            # output position i reads input i + o − p: inside the input for lo ≤ i < hi
            lo, hi = max(0, p - o), min(n, s + p - o)
            if hi <= lo:
                break
            dst.append(slice(lo, hi))
            src.append(slice(lo + o - p, hi + o - p))
        else:
            unfolded[(*dst, tap)] = rows[tuple(src)]
    return unfolded.reshape(*lead, *out, taps * rows.shape[-1])


class QuantUnfoldedConv(QuantLinear):
    """A ``Conv1d/2d/3d`` with a wider kernel quantized as the linear it is on its unfolded input
    (see the module doc): a :class:`QuantLinear` on the weight moved to ``(out, *kernel, in)``
    and reshaped ``(out, T·in)``, called on :func:`unfold_input`'s rows. Same packed formats,
    kernels and numerics as a ``QuantLinear``; the unfold (``T`` copies of the input per call) is
    the only extra step. Build with :meth:`from_conv` (or the builder).

    Example:
        >>> conv = nn.Conv2d(64, 32, (3, 1), padding=(1, 0))
        >>> q = QuantUnfoldedConv.from_conv(conv, weight_format="int8", act_mode="int8")
        >>> q(torch.randn(2, 64, 5, 7)).shape
        torch.Size([2, 32, 5, 7])
    """

    def __init__(self, *args, kernel_size: tuple[int, ...], padding: tuple[int, ...], **kwargs):
        super().__init__(*args, **kwargs)
        kernel_size, padding = tuple(kernel_size), tuple(padding)
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (*kernel_size, *padding))
        if not (ints and 1 <= len(kernel_size) <= 3 and len(padding) == len(kernel_size)
                and min(kernel_size) >= 1 and min(padding) >= 0):
            raise ValueError(f"kernel_size and padding must be 1 to 3 integers each (kernel ≥ 1, padding ≥ 0), "
                             f"got {kernel_size!r} and {padding!r}")
        if self.in_features % math.prod(kernel_size):
            raise ValueError(f"in_features {self.in_features} is not a multiple of the kernel's "
                             f"{math.prod(kernel_size)} taps {kernel_size}")
        self._kernel_size, self._padding = kernel_size, padding

    @classmethod
    def from_conv(cls, conv: nn.Module, weight_format: str = "nvfp4", hadamard_block: int | None = None,
                  act_mode: str = "fp") -> "QuantUnfoldedConv":
        """Quantize a conv's weight (see :meth:`QuantLinear.from_linear` for the arguments); the
        conv must unfold (:func:`conv_geometry`) and is not modified."""
        geometry = conv_geometry(conv)
        if geometry is None:
            raise ValueError(f"from_conv needs a conv with one group, stride 1, dilation 1 and zero padding, got {conv!r}")
        fmt = formats.get(weight_format)
        w = cls.stored_weight(conv, hadamard_block)
        return cls(fmt.quantize(w), fmt.name, conv.bias, hadamard_block, act_mode, source_dtype=conv.weight.dtype,
                   kernel_size=geometry[0], padding=geometry[1])

    def forward(self, x: torch.Tensor, mode=None, activation: str | None = None,
                quantize_output: bool = False) -> torch.Tensor:
        """The conv's output for ``x`` of shape ``(N, in, *spatial)`` or ``(in, *spatial)``:
        :meth:`QuantLinear.forward` (same arguments) on the unfolded input, channels moved back."""
        dims = self.spatial_dims
        channels = x.dim() - dims - 1
        if x.dim() not in (dims + 1, dims + 2) or x.shape[channels] != self.in_channels:
            raise ValueError(f"a Conv{dims}d with kernel {self.kernel_size} takes ({self.in_channels}, *spatial) or "
                             f"(N, {self.in_channels}, *spatial) inputs, got shape {tuple(x.shape)}")
        rows = unfold_input(x, self._kernel_size, self._padding)
        y = super().forward(rows, mode, activation, quantize_output).movedim(-1, channels)
        # a conv's output takes its input's memory format: channels-last in, channels-last out
        return y if x.movedim(channels, -1).is_contiguous() else y.contiguous()

    # the conv's attributes, which model code may read
    @property
    def spatial_dims(self) -> int:
        return len(self._kernel_size)

    @property
    def in_channels(self) -> int:
        return self.in_features // math.prod(self._kernel_size)

    @property
    def out_channels(self) -> int:
        return self.out_features

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return self._kernel_size

    @property
    def padding(self) -> tuple[int, ...]:
        return self._padding

    @property
    def stride(self) -> tuple[int, ...]:
        return (1,) * self.spatial_dims

    dilation = stride
    groups = 1
    padding_mode = "zeros"

    def config(self) -> dict[str, Any]:
        return {**super().config(), "kind": f"unfolded_conv{self.spatial_dims}d", "kernel_size": list(self._kernel_size),
                "padding": list(self._padding)}

    def extra_repr(self) -> str:
        return (f"Conv{self.spatial_dims}d kernel={self._kernel_size} padding={self._padding} as a linear on its "
                f"{math.prod(self._kernel_size)}× unfolded input: {super().extra_repr()}")


__all__ = ["QuantUnfoldedConv", "conv_geometry", "unfold_input"]
