"""The low-rank split (``sixbit.transforms.lowrank``): the best rank-r factors."""

import pytest
import torch

from sixbit.transforms import lowrank


@pytest.mark.parametrize("shape", [(96, 96), (64, 160), (160, 64)])
def test_the_split_is_the_truncated_svd(shape):
    torch.manual_seed(0)
    w = torch.randn(*shape)
    up, down = lowrank.split(w, 8)
    s = torch.linalg.svdvals(w)
    assert float((w - up @ down).square().sum()) == pytest.approx(float(s[8:].square().sum()), rel=1e-4)
