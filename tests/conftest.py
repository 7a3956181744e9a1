import os

# Triton kernels run on CPU tensors in Triton's interpreter, which Triton reads when it is first
# imported (torch imports it early): set before anything else.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Converted and loaded models run from their stored weights (sixbit.memory.fast_path's "compact"), so that
# the suite's numerics are the same on every CPU kind; tests/test_layout.py tests the default,
# "auto", which keeps operands that are machine-specific (AMX-packed, folded) on its own.
os.environ.setdefault("SIXBIT_LAYOUT", "compact")

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def heavy_tailed(*shape: int) -> torch.Tensor:
    """Laplace samples with per-row magnitudes spread over ~e^±6: outliers and tiny values."""
    lap = torch.distributions.Laplace(0.0, 1.0).sample(shape)
    return lap * torch.exp(torch.randn(*shape[:-1], 1) * 2)
