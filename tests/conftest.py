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


# The tests whose outcome depends on the CPU kind (which of AMX, AVX512-VNNI/BF16, AVX2 oneDNN and ATen
# use): marked ``cpu_kind`` here, by path or node-id prefix, and run again by .ci/run under capped kinds
# (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY), as on CPUs without AMX or AVX512. Each entry: why.
CPU_KIND_TESTS = (
    "tests/test_layout.py",  # the layout decision (fast path or compact) follows the CPU kind
    "tests/memory/",  # offloading and the layout it keeps or drops
    "tests/test_checkpoint_compat.py",  # old checkpoints load to the values written, within each kind's tolerance
    "tests/kernels/",  # the INT8/bf16 GEMMs, cpu_kind() and the caps themselves
    "tests/formats/",  # the number formats' exact rounding
    "tests/nn/test_execution.py",  # each layer's execution path per CPU kind
    "tests/nn/test_quant_linear.py",  # QuantLinear's kernels against their reference
    "tests/test_compile.py",  # inductor compiles for the vector width ATen allows
    "tests/methods/test_static_w8a8.py",  # static W8A8's integer GEMM path per CPU kind
    "tests/parallel/test_driver.py::test_the_seed_call_gives_the_unwrapped_video",  # bit for bit across processes
)


def pytest_configure(config):
    config.addinivalue_line("markers", "deadline(seconds): the test fails with TimeoutError past this many seconds")
    config.addinivalue_line("markers", "cpu_kind: numerics-, layout- or driver-sensitive to the CPU kind; .ci/run "
                                       "runs these again under capped CPU kinds (tests/conftest.py CPU_KIND_TESTS)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(CPU_KIND_TESTS):
            item.add_marker(pytest.mark.cpu_kind)


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
