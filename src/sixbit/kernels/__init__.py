"""Fast paths per backend; each has a reference twin and a test that they agree.

:func:`available` says which path each precision takes on a device.
"""

from .cpu import (
    amx_int8,
    compiled_cpu_ops,
    fastest_float_dtype,
    fused_cpu,
    int8_matmul,
    int8_matmul_backend,
    int8_dequantize,
    int8_dequantize_reference,
    int8_matmul_reference,
    nvfp4_dequantize,
    nvfp4_dequantize_reference,
    nvfp4_to_int8,
    nvfp4_to_int8_reference,
    pack_int8_weight,
    packed_int8_matmul,
    packed_int8_matmul_reference,
    quantize_rows,
    quantize_rows_reference,
    scale_epilogue,
    scale_epilogue_reference,
)
from .cuda import (
    available,
    fp4_supported,
    fp8_linear,
    fp8_linear_reference,
    fused_int8,
    int8_linear,
    int8_linear_reference,
    nvfp4_linear,
    nvfp4_linear_reference,
    weight4_fused,
)
from .triton.gemm import weight4_linear, weight4_linear_reference, weight4_supported

__all__ = [
    "amx_int8", "available", "compiled_cpu_ops", "fastest_float_dtype", "fused_cpu", "quantize_rows", "quantize_rows_reference", "scale_epilogue",
    "scale_epilogue_reference", "fp4_supported", "fp8_linear", "fp8_linear_reference", "fused_int8", "int8_linear",
    "int8_linear_reference", "int8_matmul", "int8_dequantize", "int8_dequantize_reference", "nvfp4_dequantize",
    "nvfp4_dequantize_reference", "nvfp4_to_int8", "nvfp4_to_int8_reference", "pack_int8_weight",
    "packed_int8_matmul", "packed_int8_matmul_reference", "int8_matmul_backend", "int8_matmul_reference", "nvfp4_linear",
    "nvfp4_linear_reference", "weight4_fused", "weight4_linear", "weight4_linear_reference",
    "weight4_supported",
]
