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


def test_bf16_inputs_take_the_bf16_kernel_and_keep_fp32_accuracy(monkeypatch):
    """A bf16 model's inputs: their products are exact in oneDNN's bf16 kernel (fp32 sums), so
    the Hessian is the fp64 one to fp32 rounding; fp32 inputs stay on the fp32 kernel, and the
    setting is put back either way."""
    k = 700
    torch.manual_seed(1)
    lin = nn.Linear(k, 4).to(torch.bfloat16)
    x = (torch.randn(3, 500, k) * torch.linspace(0.1, 3, k)).to(torch.bfloat16)
    modes, gram = [], hessians._gram
    monkeypatch.setattr(hessians, "_gram", lambda t: (modes.append(torch.backends.mkldnn.matmul.fp32_precision), gram(t))[1])
    before = torch.backends.mkldnn.matmul.fp32_precision
    got = hessians.collect(lin, lambda: lin(x), {"": lin})[""].hessian
    hessians.collect(lin.float(), lambda: lin(x.float()), {"": lin})
    rows = x.reshape(-1, k).double()
    want = rows.T @ rows / rows.shape[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert modes == (["bf16"] if bf16 else [before]) + [before]
    assert torch.backends.mkldnn.matmul.fp32_precision == before
