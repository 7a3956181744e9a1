"""sixbit inside other libraries: :mod:`sixbit.integrations.diffusers` (the quantization backend)."""
