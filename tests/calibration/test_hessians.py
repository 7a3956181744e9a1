"""Input Hessians (``sixbit.calibration.hessians``): ``E[x xᵀ]`` over every row of every call,
one product shared by the layers fed the same tensor, the symmetric product in panels."""

import torch
from torch import nn

from sixbit.calibration import hessians


def test_the_hessian_is_the_mean_second_moment_over_every_call_whatever_the_panels():
    k = 1100  # three panels of 512 columns, the last one short
    torch.manual_seed(0)
    q, v = nn.Linear(k, 8), nn.Linear(k, 8)
    xs = [torch.randn(2, 300, k) * torch.linspace(0.1, 3, k) for _ in range(2)]

    def run():
        for x in xs:
            q(x), v(x)

    stats = hessians.collect(q, run, {"q": q, "v": v})
    rows = torch.cat([x.reshape(-1, k) for x in xs]).double()
    want = rows.T @ rows / rows.shape[0]
    for name in ("q", "v"):
        got = stats[name]
        assert got.rows == 1200 and torch.equal(got.hessian, got.hessian.T)
        torch.testing.assert_close(got.hessian.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        torch.testing.assert_close(got.amax, rows.abs().amax(0).float())
