"""Offline/online transforms that make tensors easier to quantize (block Hadamard)."""
