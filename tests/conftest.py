import os

# Triton kernels run on CPU tensors in Triton's interpreter, which Triton reads when it is first
# imported (torch imports it early): set before anything else.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Converted and loaded models run from their stored weights (sixbit.memory.fast_path's "compact"), so that
# the suite's numerics are the same on every CPU kind; tests/test_layout.py tests the default,
# "auto", which keeps operands that are machine-specific (AMX-packed, folded) on its own.
os.environ.setdefault("SIXBIT_LAYOUT", "compact")

import signal
import threading

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "deadline(seconds): the test fails with TimeoutError past this many seconds")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _deadline(request):
    """``@pytest.mark.deadline(seconds)``: past it, TimeoutError is raised in the test (SIGALRM, so
    also inside a blocking wait), whose cleanup then stops what it started. For tests that start
    processes: a lost signal or ranks in different collectives would otherwise wait forever."""
    marker = request.node.get_closest_marker("deadline")
    if marker is None or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return
    seconds = marker.args[0]

    def expired(signum, frame):
        raise TimeoutError(f"{request.node.nodeid} ran past its deadline of {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def heavy_tailed(*shape: int) -> torch.Tensor:
    """Laplace samples with per-row magnitudes spread over ~e^±6: outliers and tiny values."""
    lap = torch.distributions.Laplace(0.0, 1.0).sample(shape)
    return lap * torch.exp(torch.randn(*shape[:-1], 1) * 2)
