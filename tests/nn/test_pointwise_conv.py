"""A pointwise conv quantized as the linear it is: same numbers as a QuantLinear on the reshaped
weight, in the conv's layout; which convs count as pointwise; Hessians read its channels."""

import pytest
import torch
from torch import nn

from sixbit.calibration import hessians
from sixbit.nn import QuantLinear, QuantPointwiseConv
from sixbit.nn.pointwise_conv import features_last, is_pointwise_conv, kind_of
from sixbit.tuning.sensitivity import proxy_error

CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
SPATIAL = {1: (6,), 2: (3, 5), 3: (2, 3, 4)}


@pytest.mark.parametrize(("conv", "pointwise"), [
    (nn.Conv2d(64, 32, 1), True),
    (nn.Conv1d(64, 32, 1, bias=False), True),
    (nn.Conv3d(64, 32, (1, 1, 1)), True),
    (nn.Conv2d(64, 32, 1, padding="same"), True),
    (nn.Conv2d(64, 64, 1, groups=64), False),  # depthwise
    (nn.Conv2d(64, 32, 1, groups=2), False),
    (nn.Conv2d(64, 32, 3, padding=1), False),
    (nn.Conv2d(64, 32, (3, 1), padding=(1, 0)), False),  # Sana-Video's temporal conv
    (nn.Conv2d(64, 32, 1, stride=2), False),
    (nn.Conv2d(64, 32, 1, padding=1), False),
    (nn.Conv3d(4, 32, (1, 2, 2), stride=(1, 2, 2)), False),  # a patch embedding
    (nn.Linear(64, 32), False),
])
def test_which_convs_are_pointwise(conv, pointwise):
    assert is_pointwise_conv(conv) is pointwise


def _pair(dims: int, fmt: str, act: str, bias: bool = True):
    """A pointwise conv quantized, and a QuantLinear built from its reshaped weight."""
    conv = CONVS[dims](64, 48, 1, bias=bias)
    linear = nn.Linear(64, 48, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.reshape(48, 64))
        if bias:
            linear.bias.copy_(conv.bias)
    qconv = QuantPointwiseConv.from_conv(conv, fmt, act_mode=act)
    return conv, qconv, QuantLinear.from_linear(linear, fmt, act_mode=act)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize(("fmt", "act"), [("int8", "int8"), ("int8", "fp"), ("nvfp4", "int8"), ("nvfp4", "fp")])
def test_the_conv_path_equals_a_quant_linear_on_the_reshaped_weight(dims, fmt, act):
    conv, qconv, qlinear = _pair(dims, fmt, act)
    assert torch.equal(qconv.weight_codes, qlinear.weight_codes)
    x = torch.randn(2, 64, *SPATIAL[dims]) * torch.exp(torch.randn(64)).reshape(64, *[1] * dims)
    got = qconv(x)
    expected = qlinear(x.movedim(1, -1)).movedim(-1, 1)
    assert got.shape == conv(x).shape and torch.equal(got, expected)
    unbatched = qconv(x[0])  # a conv also takes (C, *spatial)
    assert torch.equal(unbatched, qlinear(x[0].movedim(0, -1)).movedim(-1, 0))
    with torch.no_grad():
        reference = conv(x)
    assert float((got - reference).norm() / reference.norm()) < (0.02 if fmt == "int8" else 0.2)


def test_the_output_takes_the_inputs_memory_format():
    """As a conv's does: channels-last in (Sana-Video permutes (B, H, W, C) tensors), a channels-last
    view out with no copy; a contiguous NCHW input gives a contiguous output."""
    _, qconv, _ = _pair(2, "int8", "int8", bias=False)
    x = torch.randn(2, 64, 3, 5)
    assert qconv(x).is_contiguous()
    last = x.contiguous(memory_format=torch.channels_last)
    y = qconv(last)
    assert y.is_contiguous(memory_format=torch.channels_last) and torch.equal(y, qconv(x))


def test_it_reads_as_the_conv_it_replaced_and_refuses_other_layouts():
    conv, qconv, _ = _pair(2, "int8", "fp")
    assert (qconv.in_channels, qconv.out_channels, qconv.kernel_size, qconv.stride, qconv.padding, qconv.groups) == (
        conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.groups)
    assert kind_of(conv) == kind_of(qconv) == qconv.config()["kind"] == "pointwise_conv2d"
    assert "kind" not in QuantLinear.from_linear(nn.Linear(64, 8), "int8").config()  # files of linears unchanged
    with pytest.raises(ValueError, match="pointwise Conv2d takes"):
        qconv(torch.randn(2, 64))
    with pytest.raises(ValueError, match="pointwise conv"):
        QuantPointwiseConv.from_conv(nn.Conv2d(8, 8, 3), "int8")


def test_hessians_of_a_conv_are_those_of_its_channels():
    conv = nn.Conv2d(16, 8, 1)
    x = torch.randn(2, 16, 3, 4)
    stats = hessians.collect(conv, lambda: conv(x), {"": conv})[""]
    rows = features_last(conv, x).reshape(-1, 16)
    assert stats.rows == 2 * 3 * 4
    torch.testing.assert_close(stats.hessian, rows.T @ rows / stats.rows)
    torch.testing.assert_close(stats.amax, rows.abs().amax(0))


def test_tunings_proxy_error_of_a_conv_is_that_of_its_linear():
    conv, qconv, qlinear = _pair(2, "nvfp4", "fp")
    linear = nn.Linear(64, 48)
    linear.weight.data, linear.bias.data = conv.weight.data.reshape(48, 64).clone(), conv.bias.data.clone()
    x = torch.randn(2, 64, 3, 5)
    conv_stats = hessians.collect(conv, lambda: conv(x), {"": conv})[""]
    linear_stats = hessians.collect(linear, lambda: linear(x.movedim(1, -1)), {"": linear})[""]
    assert proxy_error(qconv, conv, conv_stats) == proxy_error(qlinear, linear, linear_stats) > 0
