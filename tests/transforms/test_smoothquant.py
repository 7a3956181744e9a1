import pytest
import torch

from sixbit.nn import QuantLinear
from sixbit.transforms import smoothquant as sq


def test_smoothing_factors_by_hand():
    s = sq.smoothing_factors(torch.tensor([4.0, 1.0, 0.0, 9.0]), torch.tensor([1.0, 4.0, 2.0, 0.0]), 0.5)
    assert s.tolist() == pytest.approx([2.0, 0.5, 1.0, 1.0])  # dead channels (no activation / weight) get 1
    assert sq.smoothing_factors(torch.tensor([8.0]), torch.tensor([2.0]), 0.0).tolist() == [0.5]  # 1 / max|W|
    assert sq.smoothing_factors(torch.tensor([8.0]), torch.tensor([2.0]), 1.0).tolist() == [8.0]  # max|x|
    assert sq.smoothing_factors(torch.tensor([1e12]), torch.tensor([1.0]), 1.0).tolist() == [sq.S_MAX]
    with pytest.raises(ValueError, match="alpha"):
        sq.smoothing_factors(torch.ones(2), torch.ones(2), 1.5)


def test_folding_leaves_the_full_precision_output_unchanged():
    torch.manual_seed(0)
    x = torch.randn(5, 16, dtype=torch.float64) * torch.logspace(-2, 2, 16, dtype=torch.float64)
    w = torch.randn(8, 16, dtype=torch.float64)
    s = sq.smoothing_factors(x.abs().amax(0), sq.weight_channel_amax(w), 0.5).double()
    folded = sq.fold(w, s).double()
    assert torch.allclose((x / s) @ folded.T, x @ w.T, rtol=1e-6, atol=1e-9)
    # smoothed activations have equal per-channel ranges at α = 1 … flattened in between
    flat = x.abs().amax(0) / sq.smoothing_factors(x.abs().amax(0), sq.weight_channel_amax(w), 1.0).double()
    assert torch.allclose(flat, torch.ones(16, dtype=torch.float64))


def test_quant_linear_input_divisor_folds_exactly_in_fp_and_helps_int8():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(40, 64)
    x[:, 3] *= 80  # an outlier channel, as in DiT activations
    s = sq.smoothing_factors(x.abs().amax(0), sq.weight_channel_amax(lin.weight), 0.5)
    layer = QuantLinear.from_linear(lin, "int8", input_divisor=s)
    ref = lin(x).detach()
    w = layer.quantized_weight().dequantize()
    assert torch.allclose(layer(x), (x / s) @ w.T + lin.bias.detach(), atol=1e-5)  # fp path divides by s
    assert layer.config()["input_divisor"] is True
    plain = QuantLinear.from_linear(lin, "int8", act_mode="int8")
    layer.act_mode = "int8"
    err_smooth = (layer(x) - ref).pow(2).mean()
    err_plain = (plain(x) - ref).pow(2).mean()
    assert err_smooth < err_plain / 2
    with pytest.raises(ValueError, match="positive"):
        QuantLinear.from_linear(lin, "int8", input_divisor=torch.zeros(64))


def test_smoothed_statistics_equal_direct_computation():
    torch.manual_seed(0)
    x = torch.randn(100, 8) * torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 50])
    s = torch.rand(8) + 0.5
    amax = x.abs().amax(0)
    assert sq.smoothed_amax(amax, s) == pytest.approx(float((x / s).abs().max()))
    rms = x.pow(2).mean().sqrt()
    const = torch.full((8,), 2.0)  # a constant divisor: exact
    assert sq.smoothed_rms(rms, amax, const) == pytest.approx(float((x / 2).pow(2).mean().sqrt()), rel=1e-5)
    # channels sharing one distribution shape: the per-channel energy estimate is exact
    scales = torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 50])
    base = torch.randn(1000, 1).expand(1000, 8)
    y = base * scales
    e = sq.channel_energy(y.pow(2).mean().sqrt(), y.abs().amax(0))
    assert torch.allclose(e, y.pow(2).mean(0), rtol=1e-4)


def test_output_error_by_hand():
    # A weight already on the INT8 grid (rows reach ±127): no weight rounding error, only the
    # activation term Δ²/12·‖W‖², relative to Σ_c E[x_c²]·‖W_c‖².
    w = torch.tensor([[127.0, -64.0], [3.0, 127.0]])
    energy = torch.tensor([[1.0, 4.0]])
    step = torch.tensor([0.5])
    err = sq.output_error(w, torch.ones(2), energy, step, 8)
    signal = 1.0 * (127**2 + 3**2) + 4.0 * (64**2 + 127**2)
    assert float(err) == pytest.approx(0.25 / 12 * float(w.pow(2).sum()) / signal, rel=1e-6)
