"""Pages handed back (sixbit.memory.allocator.page_out): a read file-mapped tensor leaves the RSS
and keeps its values; an ordinary tensor is never changed."""

import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sixbit.memory import allocator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_PAGEOUT) is Linux's")


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_a_read_mapped_tensor_leaves_the_rss_and_keeps_its_values(tmp_path):
    save_file({"w": torch.randn(16 * 2**20 // 4 * 4)}, tmp_path / "w.safetensors")  # 64 MiB
    with safe_open(tmp_path / "w.safetensors", "pt") as f:
        t = f.get_tensor("w")
    total = t.sum()  # every page read
    before = _rss_file_kib()
    allocator.page_out(t)
    assert before - _rss_file_kib() > 48 * 1024  # most of its 64 MiB left the process
    assert torch.equal(t.sum(), total)  # read from the file again, the same values


@pytest.mark.parametrize("make", [lambda: torch.randn(3, 2**20), lambda: torch.randn(2**20, 3).t(),
                                  lambda: torch.randn(7), lambda: torch.empty(0)])
def test_ordinary_tensors_keep_their_values(make):
    t = make()
    copy = t.clone()
    allocator.page_out(t)
    assert torch.equal(t, copy)
