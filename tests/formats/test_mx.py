import math

import pytest
import torch

from conftest import heavy_tailed
from sixbit.formats import mx
from sixbit.formats.constants import EMAX_ELEM
from sixbit.formats.minifloat import element

ELEMENTS = ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"]


@pytest.mark.parametrize("el", ELEMENTS)
def test_spec_scale_rule_grid_and_idempotence(el):
    x = heavy_tailed(8, 128)
    q = mx.quantize(x, el)
    fmt = element(el)
    assert q.scales.shape == (8, 4) and q.scales.dtype == torch.uint8
    assert q.codes.numel() == x.numel() * fmt.bits // 8  # FP6: 4 values in 3 bytes
    blocks = x.reshape(8, 4, 32)
    for r in range(8):
        for b in range(4):
            amax = blocks[r, b].abs().max().item()
            assert q.scales[r, b].item() - 127 == math.floor(math.log2(amax)) - EMAX_ELEM[el]
    scale = q.scale_values().repeat_interleave(32, -1)
    d = q.dequantize()
    grid = fmt.table()[torch.isfinite(fmt.table())]
    assert torch.isin(d / scale, grid).all()
    # each element is a nearest grid point of x / scale, saturated at the element max
    v = (x / scale).clamp(-fmt.max, fmt.max)
    nearest = (v.reshape(-1, 1) - grid).abs().min(1).values.reshape(v.shape)
    assert torch.equal((v - d / scale).abs(), nearest)
    q2 = mx.quantize(d, el)
    assert torch.equal(q2.codes, q.codes) and torch.equal(q2.scales, q.scales)


def test_zero_block_and_errors():
    x = torch.randn(2, 64)
    x[0, :32] = 0
    q = mx.quantize(x, "e2m1")
    assert q.scales[0, 0] == 0 and torch.equal(q.dequantize()[0, :32], torch.zeros(32))
    with pytest.raises(ValueError, match="multiple of 32"):
        mx.quantize(torch.randn(2, 48))
    with pytest.raises(ValueError, match="NaN/Inf"):
        mx.quantize(torch.full((1, 32), float("-inf")))
    with pytest.raises(ValueError, match="valid"):
        mx.quantize(torch.randn(1, 32), "e3m3")


@pytest.mark.parametrize("el", ELEMENTS)
def test_identical_to_torchao_reference(el):
    pytest.importorskip("torchao", reason="torchao is not installed (pip install torchao)")
    from torchao.prototype.mx_formats import constants as C
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    dtype = {
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
        "e2m3": C.DTYPE_FP6_E2M3,
        "e3m2": C.DTYPE_FP6_E3M2,
        "e2m1": torch.float4_e2m1fn_x2,
    }[el]
    x = heavy_tailed(32, 256)
    x[0, :32] = 0
    q = mx.quantize(x, el)
    ref = MXTensor.to_mx(x, dtype, 32)
    assert torch.equal(ref.scale.view(torch.uint8).reshape(q.scales.shape), q.scales)
    assert torch.equal(ref.dequantize(torch.float32), q.dequantize())
