"""The low-rank split (``sixbit.transforms.lowrank``): the best rank-r factors, and a refit
iterated from the previous branch that finds the same ones."""

import pytest
import torch

from sixbit.rounding.grid import grid_for
from sixbit.transforms import lowrank


def _residual(w, up, down):
    return float((w - up.float() @ down.float()).square().sum())


@pytest.mark.parametrize("shape", [(96, 96), (64, 160), (160, 64)])
def test_the_split_is_the_truncated_svd(shape):
    torch.manual_seed(0)
    w = torch.randn(*shape)
    up, down = lowrank.split(w, 8)
    s = torch.linalg.svdvals(w)
    assert _residual(w, up, down) == pytest.approx(float(s[8:].square().sum()), rel=1e-4)


@pytest.mark.parametrize("shape", [(96, 96), (64, 160), (160, 64)])
def test_a_refit_iterated_from_the_previous_branch_finds_the_full_splits_factors(shape):
    """SVDQuant's refit target ``W − Q(W − U·D)``: from the previous ``down`` the subspace
    iteration reaches the full split's residual (the same best rank-r approximation)."""
    torch.manual_seed(0)
    w = torch.randn(*shape) / shape[1] ** 0.5
    up, down = lowrank.split(w, 4)
    for _ in range(2):
        rest = w - up @ down
        target = w - grid_for(rest, "nvfp4", "mse").round(rest, torch.arange(shape[1]))
        exact = lowrank.split(target, 4)
        up, down = lowrank.split(target, 4, start=down.half())
        assert _residual(target, up, down) == pytest.approx(_residual(target, *exact), rel=1e-5)
        torch.testing.assert_close(up @ down, exact[0] @ exact[1], rtol=0, atol=1e-4)


def test_a_start_of_another_shape_is_refused():
    w = torch.randn(32, 48)
    with pytest.raises(ValueError, match=r"start must be a \(4, 48\) down factor"):
        lowrank.split(w, 4, start=torch.randn(4, 32))
