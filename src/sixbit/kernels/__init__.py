"""Fast paths per backend; each has a reference twin and a test that they agree."""

from .cpu import int8_matmul, int8_matmul_backend, int8_matmul_reference

__all__ = ["int8_matmul", "int8_matmul_backend", "int8_matmul_reference"]
