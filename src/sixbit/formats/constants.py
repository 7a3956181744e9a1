"""Numeric constants of the element and scale formats (OCP MX v1.0, NVIDIA NVFP4, OFP8)."""

from __future__ import annotations

# Largest finite magnitudes of the minifloat element formats.
F4_E2M1_MAX = 6.0
F6_E2M3_MAX = 7.5
F6_E3M2_MAX = 28.0
F8_E4M3_MAX = 448.0
F8_E5M2_MAX = 57344.0

# floor(log2(max)) of each element format: the MX scale rule's emax_elem.
EMAX_ELEM = {"e2m1": 2, "e2m3": 2, "e3m2": 4, "e4m3": 8, "e5m2": 15}

# NVFP4: 16 elements share one E4M3 scale; torchao clamps that scale to the smallest normal
# E4M3 value (2^-6) from below, and so do we, so codes and scales match its reference.
NVFP4_BLOCK = 16
E4M3_MIN_NORMAL = 2.0**-6

# MX: 32 elements share one E8M0 scale (a biased power-of-two exponent, 0xFF = NaN).
MX_BLOCK = 32
E8M0_BIAS = 127
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127

# How quantized attention's matrix P (the softmax probabilities) may enter P·V: FP16, or rounded to
# INT8 or to a 6-bit float (seed 000's "attention matrix in 6-bit dynamic floating point"), the
# low-bit ones with a scale per MX_BLOCK keys.
P_FORMATS = ("fp16", "int8", "e2m3", "e3m2")
