"""Triton kernels: fused per-token INT8 quantization (optionally with the online Hadamard
rotation), the INT8 GEMM's scale epilogue, 4-bit-weight (NVFP4 / INT4) dequantize-in-the-GEMM, and
INT8 attention (:mod:`.attention`).

Triton is optional (``pip install triton``). Kernels run on CUDA tensors, or on CPU tensors when
``TRITON_INTERPRET=1`` was set before Triton was first imported (the interpreter: slow, exact;
this is how CI tests them). Each kernel has a reference twin in torch (``*_reference``) and a test
that they agree. The kernel modules import Triton only when a kernel is first called.
"""

from .availability import installed, interpreted, jit, require, runs_on

__all__ = ["installed", "interpreted", "jit", "require", "runs_on"]
