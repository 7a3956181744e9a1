"""``sixbit.kernels.one_thread``: one CPU thread inside, the thread count restored after."""

import pytest
import torch

from sixbit import kernels


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_thread_inside_and_restored(two_threads):
    with kernels.one_thread(torch.device("cpu")):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_restored_when_the_body_raises(two_threads):
    with pytest.raises(RuntimeError, match="boom"), kernels.one_thread(torch.device("cpu")):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_other_devices_keep_their_threads(two_threads):
    with kernels.one_thread(torch.device("meta")):
        assert torch.get_num_threads() == 2
