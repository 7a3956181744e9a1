"""Which kernel a linear call runs: the one decision behind :class:`~sixbit.nn.QuantLinear`'s
forward, its ``execution()`` report and :func:`sixbit.kernels.available`.

The choice depends on the activation precision (``"fp"``, ``"int8"``, ``"nvfp4"``), the device,
and a few facts about the layer's operands (:class:`Operands`), never on the input's values, so
it is plain Python that ``torch.compile`` traces:

=======================  ==================================================================
``fp``                   :attr:`Path.FP_DENSE` on a kept dense copy (rotation, divisor and
                         branch folded in); :attr:`Path.W4A16` where the Triton
                         dequantize-in-the-GEMM kernel runs and reads the weight, else
                         :attr:`Path.FP_UNPACKED` on kept unpacked NVFP4 values, else
                         :attr:`Path.FP` (dequantize + matmul).
``int8``                 :attr:`Path.INT8_STATIC` with an input quantizer (static scales);
                         :attr:`Path.INT8_FUSED` on CUDA with Triton when nothing but a rotation
                         comes before the quantization; on CPUs a kept packed operand
                         (:attr:`Path.INT8_FOLDED`, :attr:`Path.INT8_PACKED`); else
                         :attr:`Path.INT8` (per-token codes, ``torch._int_mm``).
``nvfp4``                :attr:`Path.NVFP4` on FP4 tensor cores, else :attr:`Path.NVFP4_EMULATED`.
=======================  ==================================================================

The device's capabilities come in as :class:`Capabilities` so that the caller decides where
they are read from (the layer reads :mod:`sixbit.kernels`' public switches).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple

import torch


class Path(str, enum.Enum):
    """A kernel path of one linear call."""

    FP = "fp"
    FP_UNPACKED = "fp-unpacked"
    FP_DENSE = "fp-dense"
    W4A16 = "w4a16"
    INT8 = "int8"
    INT8_FUSED = "int8-fused"
    INT8_PACKED = "int8-packed"
    INT8_FOLDED = "int8-folded"
    INT8_STATIC = "int8-static"
    NVFP4 = "nvfp4"
    NVFP4_EMULATED = "nvfp4-emulated"


#: The activation precision each path multiplies at.
MODE_OF: dict[Path, str] = {
    Path.FP: "fp", Path.FP_UNPACKED: "fp", Path.FP_DENSE: "fp", Path.W4A16: "fp",
    Path.INT8: "int8", Path.INT8_FUSED: "int8", Path.INT8_PACKED: "int8", Path.INT8_FOLDED: "int8",
    Path.INT8_STATIC: "int8",
    Path.NVFP4: "nvfp4", Path.NVFP4_EMULATED: "nvfp4",
}


class Operands(NamedTuple):
    """What of a layer the choice of kernel depends on.

    ``static_input``: an input quantizer gives the activation codes (static scales);
    ``plain_input``: nothing but a Hadamard rotation comes between the input and its per-token
    quantization (no input divisor, no low-rank branch), and the fused kernel takes the rotation's
    block (:func:`sixbit.kernels.gpu_targets.fused_rotation`); ``packed`` / ``folded``: a packed INT8
    operand is kept for oneDNN's AMX kernel (folded: rotation and branch inside it);
    ``weight4``: the stored weight is one the W4A16 kernel reads; ``unpacked``: NVFP4 values are
    kept unpacked; ``dense``: the dense weight a full-precision call multiplies is kept.
    """

    static_input: bool = False
    plain_input: bool = True
    packed: bool = False
    folded: bool = False
    weight4: bool = False
    unpacked: bool = False
    dense: bool = False


class Capabilities(NamedTuple):
    """The device switches the choice reads, each ``fn(device) -> bool``."""

    fused_int8: Callable[[torch.device], bool]
    weight4_fused: Callable[[torch.device], bool]
    fp4_supported: Callable[[torch.device], bool]


def _fp(ops: Operands, device: torch.device, caps: Capabilities) -> Path:
    if ops.dense:
        return Path.FP_DENSE
    if ops.weight4 and caps.weight4_fused(device):
        return Path.W4A16
    return Path.FP_UNPACKED if ops.unpacked else Path.FP


def _int8(ops: Operands, device: torch.device, caps: Capabilities) -> Path:
    if ops.static_input:
        return Path.INT8_STATIC
    if ops.plain_input and caps.fused_int8(device):
        return Path.INT8_FUSED
    if device.type == "cpu" and ops.folded:
        return Path.INT8_FOLDED
    if device.type == "cpu" and ops.packed:
        return Path.INT8_PACKED
    return Path.INT8


def _nvfp4(ops: Operands, device: torch.device, caps: Capabilities) -> Path:
    return Path.NVFP4 if caps.fp4_supported(device) else Path.NVFP4_EMULATED


_BY_MODE = {"fp": _fp, "int8": _int8, "nvfp4": _nvfp4}


def select(mode: str, device: torch.device, ops: Operands, caps: Capabilities) -> Path:
    """The path a call at ``mode`` (``"fp"``, ``"int8"``, ``"nvfp4"``) takes on ``device``.

    Example:
        >>> from sixbit.kernels import cuda
        >>> select("nvfp4", torch.device("cpu"), Operands(), cuda.CAPABILITIES).value
        'nvfp4-emulated'
    """
    choose = _BY_MODE.get(mode)
    if choose is None:
        raise ValueError(f"unknown activation mode {mode!r}; valid: {sorted(_BY_MODE)}")
    return choose(ops, device, caps)
