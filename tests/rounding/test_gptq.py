"""GPTQ against a plain reference implementation (the OBQ update with an explicit inverse,
no Cholesky, no blocks), and against round to nearest on correlated inputs."""

import pytest
import torch

from sixbit.rounding import quantize_weight
from sixbit.rounding.gptq import gptq, inverse_cholesky
from sixbit.rounding.grid import grid_for


def _reference(w, hessian, grid, damp, order):
    """Optimal Brain Quantization, one column at a time: round column j, spread its error over
    the remaining columns with the inverse Hessian, then eliminate j from the inverse."""
    w = w.double().clone()
    h = hessian.double().clone()
    h += damp * h.diagonal().mean() * torch.eye(h.shape[0], dtype=h.dtype)
    hinv = torch.linalg.inv(h)
    q = torch.zeros_like(w)
    remaining = list(order.tolist())
    for j in order.tolist():
        q[:, j] = grid.round(w[:, j:j + 1].float(), torch.tensor([j])).double()[:, 0]
        err = (w[:, j] - q[:, j]) / hinv[j, j]
        remaining.remove(j)
        if remaining:
            idx = torch.tensor(remaining)
            w[:, idx] -= err[:, None] * hinv[j, idx][None, :]
            hinv[idx[:, None], idx[None, :]] -= torch.outer(hinv[idx, j], hinv[j, idx]) / hinv[j, j]
    return q.float()


@pytest.mark.parametrize("fmt", ["nvfp4", "int4-g32", "int4"])
@pytest.mark.parametrize("act_order", [True, False])
@pytest.mark.parametrize("block", [16, 48])  # 48: lazy blocks of three sub-blocks of 16, the last block shorter
def test_gptq_matches_the_reference(fmt, act_order, block):
    g = torch.Generator().manual_seed(0)
    k = 64
    mix = torch.randn(k, k, generator=g) / k**0.5 + torch.eye(k)
    x = torch.randn(512, k, generator=g) @ mix * torch.linspace(0.2, 2.0, k)  # correlated, uneven channels
    w = torch.randn(16, k, generator=g)
    hessian = x.T @ x / x.shape[0]
    grid = grid_for(w, fmt, "mse")
    order = torch.argsort(hessian.diagonal(), descending=True) if act_order else torch.arange(k)
    ref = _reference(w, hessian, grid, 0.01, order)
    got = gptq(w, hessian, grid, block=block, damp=0.01, act_order=act_order)  # several lazy blocks
    same = (got == ref).float().mean()
    assert same > 0.99, f"only {same:.3f} of the codes agree"  # float reassociation may flip a tie or two
    assert torch.allclose(got, ref, atol=float(grid_for(w, fmt).round(w, torch.arange(k)).abs().max()) / 2)


def test_gptq_lowers_the_output_error_on_correlated_inputs():
    g = torch.Generator().manual_seed(1)
    k = 128
    x = torch.randn(2048, 16, generator=g) @ torch.randn(16, k, generator=g) + 0.1 * torch.randn(2048, k, generator=g)
    w = torch.randn(64, k, generator=g)
    hessian = x.T @ x / x.shape[0]
    for fmt in ("nvfp4", "int4-g64"):
        rtn, _ = quantize_weight(w, fmt)
        opt, _ = quantize_weight(w, fmt, "mse", hessian, use_gptq=True)
        err = lambda q: float(((x @ (q.dequantize() - w).T) ** 2).sum())  # noqa: E731
        assert err(opt) < 0.5 * err(rtn)


def test_damping_retries_then_a_clear_error():
    h = torch.zeros(8, 8)
    h[0, 0] = 1.0  # rank one: the first damping already makes it positive definite
    _, lam = inverse_cholesky(h, 0.01)
    assert lam == 0.01
    bad = torch.full((4, 4), float("nan"))
    with pytest.raises(ValueError, match="not positive definite"):
        inverse_cholesky(bad, 0.01)


def test_gptq_needs_a_matching_hessian():
    w = torch.randn(4, 32)
    with pytest.raises(ValueError, match=r"\(32, 32\) Hessian"):
        gptq(w, torch.eye(16), grid_for(w, "int4"))
    with pytest.raises(ValueError, match="needs the layer's input Hessian"):
        quantize_weight(w, "nvfp4", use_gptq=True)


@pytest.mark.parametrize("k", [40, 1100])  # 1100: the triangular inverse splits in halves (twice, unevenly)
def test_inverse_cholesky_is_the_upper_factor_of_the_damped_inverse(k):
    x = torch.randn(3 * k, k, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    h = x.T @ x / x.shape[0]
    upper, lam = inverse_cholesky(h.float(), 0.01)
    assert lam == 0.01 and torch.equal(upper, upper.triu()) and bool((upper.diagonal() > 0).all())
    damped = h + 0.01 * h.diagonal().mean() * torch.eye(k, dtype=torch.float64)
    want = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(damped)), upper=True)
    torch.testing.assert_close(upper.double(), want, rtol=0, atol=1e-4 * float(want.abs().max()))
