"""A conv with a wider kernel quantized as the GEMM it is (issue 48): the same numbers as a
QuantLinear on the reshaped weight called on the unfolded input, close to the conv; which convs
unfold; Hessians and tuning's proxy error read the unfolded input."""

import pytest
import torch
from torch import nn

from sixbit.calibration import hessians
from sixbit.nn import QuantLinear, QuantUnfoldedConv
from sixbit.nn.pointwise_conv import (conv_arguments, features, features_last, gemm_rows, is_quantizable,
                                      is_unfoldable_conv, kind_of, weight_2d)
from sixbit.nn.unfolded_conv import unfold_input
from sixbit.tuning.sensitivity import proxy_error

# (conv, input shape): Sana-Video's temporal conv, its Conv1d/3d cousins, a (1, k) and a full k×k
# kernel, "same" padding, no padding, padding wider than the kernel reaches
GEOMETRIES = [
    (lambda: nn.Conv2d(32, 24, (3, 1), padding=(1, 0), bias=False), (2, 32, 5, 7)),
    (lambda: nn.Conv1d(32, 24, 3), (2, 32, 9)),
    (lambda: nn.Conv3d(32, 24, (3, 1, 1), padding=(1, 0, 0)), (2, 32, 4, 3, 2)),
    (lambda: nn.Conv2d(32, 24, (1, 3), padding="same"), (2, 32, 3, 6)),
    (lambda: nn.Conv2d(32, 24, 3, padding=1), (2, 32, 4, 5)),
    (lambda: nn.Conv2d(32, 24, 2, padding=2), (1, 32, 3, 3)),
]
IDS = ["temporal-3x1", "conv1d-k3", "conv3d-3x1x1", "same-1x3", "full-3x3", "wide-padding"]


@pytest.mark.parametrize(("conv", "unfolds"), [
    (nn.Conv2d(64, 64, (3, 1), padding=(1, 0), bias=False), True),  # Sana-Video's conv_temp
    (nn.Conv1d(16, 64, 3), True),  # Wan-Animate's face encoder
    (nn.Conv3d(8, 8, (3, 1, 1), padding=(1, 0, 0)), True),
    (nn.Conv2d(8, 8, 3, padding=1), True),
    (nn.Conv2d(8, 8, (1, 3), padding="same"), True),
    (nn.Conv2d(8, 8, 3, padding="valid"), True),
    (nn.Conv2d(8, 8, 1, padding=1), True),  # 1×1, but padded: its border is the bias alone
    (nn.Conv2d(8, 8, (2, 1), padding="same"), False),  # even kernel: torch pads it unevenly
    (nn.Conv2d(8, 8, (3, 1), padding=(1, 0), padding_mode="reflect"), False),
    (nn.Conv2d(8, 8, (3, 1), padding=(1, 0), padding_mode="replicate"), False),
    (nn.Conv2d(8, 8, (3, 1), padding=(1, 0), padding_mode="circular"), False),
    (nn.Conv2d(8, 8, 3, padding=1, groups=8), False),  # depthwise
    (nn.Conv2d(8, 8, 3, padding=1, groups=2), False),
    (nn.Conv2d(8, 8, 3, stride=2), False),
    (nn.Conv2d(8, 8, 3, dilation=2), False),
    (nn.Conv3d(4, 32, (1, 2, 2), stride=(1, 2, 2)), False),  # a patch embedding
    (nn.Conv2d(8, 8, 1), False),  # pointwise: QuantPointwiseConv's
    (nn.Linear(8, 8), False),
])
def test_which_convs_unfold(conv, unfolds):
    assert is_unfoldable_conv(conv) is unfolds
    if unfolds:
        assert is_quantizable(conv) and kind_of(conv) == f"unfolded_conv{conv.weight.dim() - 2}d"


@pytest.mark.parametrize(("make", "shape"), GEOMETRIES, ids=IDS)
def test_the_unfolded_input_times_the_reshaped_weight_is_the_conv(make, shape):
    conv = make().double()
    x = torch.randn(shape, dtype=torch.float64)
    rows = features_last(conv, x)
    assert rows.shape[-1] == features(conv)[0] == conv.in_channels * conv.weight[0, 0].numel()
    assert gemm_rows(conv, x) == rows.numel() // rows.shape[-1]  # counted without unfolding
    y = rows @ weight_2d(conv).T + (0 if conv.bias is None else conv.bias)
    with torch.no_grad():
        torch.testing.assert_close(y.movedim(-1, 1), conv(x), rtol=1e-12, atol=1e-12)


def _pair(make, fmt: str, act: str, hadamard_block: int | None = None):
    """A conv quantized, and a QuantLinear built from its reshaped weight."""
    conv = make()
    linear = nn.Linear(*features(conv), bias=conv.bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight_2d(conv))
        if conv.bias is not None:
            linear.bias.copy_(conv.bias)
    qconv = QuantUnfoldedConv.from_conv(conv, fmt, hadamard_block, act_mode=act)
    return conv, qconv, QuantLinear.from_linear(linear, fmt, hadamard_block, act_mode=act)


@pytest.mark.parametrize(("make", "shape"), GEOMETRIES, ids=IDS)
@pytest.mark.parametrize(("fmt", "act", "hadamard_block"), [
    ("int8", "int8", None), ("int8", "fp", None), ("nvfp4", "int8", None), ("nvfp4", "fp", None), ("nvfp4", "int8", 32)])
def test_the_conv_path_equals_a_quant_linear_on_the_unfolded_input(make, shape, fmt, act, hadamard_block):
    conv, qconv, qlinear = _pair(make, fmt, act, hadamard_block)
    assert all(torch.equal(getattr(qconv, f"weight_{f}"), getattr(qlinear, f"weight_{f}")) for f in qconv._weight_fields)
    x = torch.randn(shape) * torch.exp(torch.randn(shape[1])).reshape(shape[1], *[1] * (len(shape) - 2))
    args = conv_arguments(qconv)
    got = qconv(x)
    with torch.no_grad():
        reference = conv(x)
    assert got.shape == reference.shape
    assert torch.equal(got, qlinear(unfold_input(x, **args)).movedim(-1, 1))
    assert torch.equal(qconv(x[0]), qlinear(unfold_input(x[0], **args)).movedim(-1, 0))  # a conv takes (C, *spatial) too
    assert float((got - reference).norm() / reference.norm()) < (0.02 if fmt == "int8" else 0.2)


def test_bf16_inputs_run_the_same_path():
    conv, qconv, qlinear = _pair(GEOMETRIES[0][0], "int8", "int8")
    conv, qconv, qlinear = conv.bfloat16(), qconv.bfloat16(), qlinear.bfloat16()
    x = torch.randn(2, 32, 5, 7, dtype=torch.bfloat16)
    got = qconv(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, qlinear(unfold_input(x, (3, 1), (1, 0))).movedim(-1, 1))
    with torch.no_grad():
        reference = conv(x).float()
    assert float((got.float() - reference).norm() / reference.norm()) < 0.03


def test_the_output_takes_the_inputs_memory_format():
    """Channels-last in, channels-last out; Sana-Video's permuted (B, C, F, HW) view of a
    (B, F, C, HW) tensor and a contiguous input give a contiguous output; all the same values."""
    _, qconv, _ = _pair(GEOMETRIES[0][0], "int8", "int8")
    x = torch.randn(2, 32, 5, 7)
    assert qconv(x).is_contiguous()
    last = qconv(x.contiguous(memory_format=torch.channels_last))
    assert last.is_contiguous(memory_format=torch.channels_last) and torch.equal(last, qconv(x))
    permuted = x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    y = qconv(permuted)
    assert y.is_contiguous() and torch.equal(y, qconv(x))


def test_it_reads_as_the_conv_it_replaced_and_refuses_other_layouts():
    conv, qconv, _ = _pair(GEOMETRIES[0][0], "int8", "fp")
    attributes = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                  "padding_mode")
    assert [getattr(qconv, a) for a in attributes] == [getattr(conv, a) for a in attributes]
    assert (qconv.in_features, qconv.out_features) == features(conv) == (96, 24)
    assert kind_of(conv) == kind_of(qconv) == "unfolded_conv2d"
    config = qconv.config()
    assert (config["kind"], config["kernel_size"], config["padding"]) == ("unfolded_conv2d", [3, 1], [1, 0])
    with pytest.raises(ValueError, match=r"kernel \(3, 1\) takes \(32, \*spatial\)"):
        qconv(torch.randn(2, 96, 5, 7))  # the unfolded width is not an input
    with pytest.raises(ValueError, match="smaller than the kernel"):
        QuantUnfoldedConv.from_conv(nn.Conv1d(8, 8, 3), "int8")(torch.randn(1, 8, 2))
    for other in (nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")):
        with pytest.raises(ValueError, match="zero padding"):
            QuantUnfoldedConv.from_conv(other, "int8")


def test_hessians_of_a_conv_are_those_of_its_unfolded_input():
    conv = GEOMETRIES[0][0]()
    x = torch.randn(2, 32, 5, 3)
    stats = hessians.collect(conv, lambda: conv(x), {"": conv})[""]
    rows = unfold_input(x, (3, 1), (1, 0)).reshape(-1, 96)
    assert stats.rows == 2 * 5 * 3
    torch.testing.assert_close(stats.hessian, rows.T @ rows / stats.rows)
    torch.testing.assert_close(stats.amax, rows.abs().amax(0))


def test_tunings_proxy_error_of_a_conv_is_that_of_its_linear():
    conv, qconv, qlinear = _pair(GEOMETRIES[0][0], "nvfp4", "fp")
    linear = nn.Linear(96, 24, bias=False)
    linear.weight.data = weight_2d(conv).detach().clone()
    x = torch.randn(2, 32, 5, 3)
    conv_stats = hessians.collect(conv, lambda: conv(x), {"": conv})[""]
    rows = unfold_input(x, (3, 1), (1, 0))
    linear_stats = hessians.collect(linear, lambda: linear(rows), {"": linear})[""]
    assert proxy_error(qconv, conv, conv_stats) == proxy_error(qlinear, linear, linear_stats) > 0
