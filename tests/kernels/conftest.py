import os

# Triton kernels run on CPU tensors in Triton's interpreter; it reads this when kernels are
# first defined, which sixbit does on the first kernel call (nothing earlier imports them).
os.environ.setdefault("TRITON_INTERPRET", "1")
