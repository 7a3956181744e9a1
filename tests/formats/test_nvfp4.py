import pytest
import torch

from conftest import heavy_tailed
from sixbit.formats import nvfp4
from sixbit.formats.minifloat import E2M1


def _unpack(q):
    lo, hi = q.codes & 0xF, q.codes >> 4
    return torch.stack([lo, hi], -1).reshape(q.shape)


def test_container_layout():
    x = torch.randn(4, 3, 64)
    q = nvfp4.quantize(x)
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (4, 3, 32)
    assert q.scales.dtype == torch.float8_e4m3fn and q.scales.shape == (4, 3, 4)
    assert q.global_scale.dtype == torch.float32
    assert q.global_scale == x.abs().amax() / (6 * 448)
    assert q.shape == x.shape and nvfp4.dequantize(q).shape == x.shape


def test_low_nibble_holds_the_even_element():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 6.0, -1.0  # E2M1 codes 7 and 0b1010 once the block scale is 1
    q = nvfp4.quantize(x, global_scale=1.0)
    assert q.scales.float().item() == 1.0
    assert q.codes[0, 0].item() == 0x7 | (0xA << 4)


def test_reference_formula_and_grid():
    x = heavy_tailed(16, 256)
    q = nvfp4.quantize(x)
    g = q.global_scale
    block_scale = (x.reshape(16, 16, 16).abs().amax(-1) / 6 / g).clamp(2**-6, 448)
    assert torch.equal(q.scales, block_scale.to(torch.float8_e4m3fn))
    scale = (q.scales.float() * g).repeat_interleave(16, -1)
    d = q.dequantize()
    e2m1 = E2M1.decode(_unpack(q))
    assert torch.isin(e2m1, E2M1.table()).all()
    assert torch.equal(d, e2m1 * scale)  # every value is an E2M1 value times its block's scale


def test_error_within_half_step_and_idempotent():
    x = heavy_tailed(8, 512)
    q = nvfp4.quantize(x)
    scale = (q.scales.float() * q.global_scale).repeat_interleave(16, -1)
    u = (x / scale).abs()
    half_step = torch.where(u < 2, 0.25, torch.where(u < 4, 0.5, 1.0))
    assert ((x - q.dequantize()).abs() <= half_step * scale * (1 + 1e-5)).all()
    q2 = nvfp4.quantize(q.dequantize(), global_scale=q.global_scale)
    assert torch.equal(q2.codes, q.codes)
    assert torch.equal(q2.scales.view(torch.uint8), q.scales.view(torch.uint8))


def test_zeros():
    q = nvfp4.quantize(torch.zeros(2, 32))
    assert q.global_scale == 1.0 and torch.equal(q.dequantize(), torch.zeros(2, 32))
    x = torch.randn(2, 32)
    x[0, :16] = 0
    assert torch.equal(nvfp4.quantize(x).dequantize()[0, :16], torch.zeros(16))


def test_bad_input():
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.quantize(torch.randn(2, 24))
    with pytest.raises(ValueError, match="NaN/Inf"):
        nvfp4.quantize(torch.full((1, 16), float("nan")))
    with pytest.raises(ValueError, match="global_scale"):
        nvfp4.quantize(torch.randn(1, 16), global_scale=0.0)


def test_identical_to_torchao_reference():
    pytest.importorskip("torchao", reason="torchao is not installed (pip install torchao)")
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    for x in (torch.randn(64, 256), heavy_tailed(64, 256), torch.randn(32, 128) * 1e-5):
        x[1, :16] = 0
        q = nvfp4.quantize(x)
        ref = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(x.abs().amax()))
        assert torch.equal(ref.qdata.view(torch.uint8), q.codes)
        assert torch.equal(ref.scale.view(torch.uint8).reshape(q.scales.shape), q.scales.view(torch.uint8))
        assert torch.equal(ref.dequantize(torch.float32), q.dequantize())


def test_block_scales_are_the_scales_quantize_chooses():
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(5)) * 3
    scales, gs = nvfp4.block_scales(x)
    q = nvfp4.quantize(x)
    assert torch.equal(scales.view(torch.uint8), q.scales.view(torch.uint8)) and torch.equal(gs, q.global_scale)
    scales, gs = nvfp4.block_scales(x, global_scale=0.01)
    assert torch.equal(scales.view(torch.uint8), nvfp4.quantize(x, global_scale=0.01).scales.view(torch.uint8))


@pytest.mark.parametrize("global_scale", [None, 0.003])
def test_round_trip_is_the_dequantized_quantization_bit_for_bit(global_scale):
    """What the emulated NVFP4 GEMM multiplies, without building codes: zeros (both signs),
    ties, saturation, tiny blocks and a block that clips, in fp32 and bf16."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=g) * torch.logspace(-6, 2, 64)
    x[0, :16] = 0.0
    x[0, 16:32] = -0.0
    x[1, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * 0.01  # ties on a block's grid
    x[2, :16] = 1e-30
    for t in (x, x.bfloat16(), x.reshape(2, 3, 64)):
        want = nvfp4.quantize(t, global_scale).dequantize()
        got = nvfp4.round_trip(t, global_scale)
        assert got.dtype == torch.float32 and got.shape == t.shape
        assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))
