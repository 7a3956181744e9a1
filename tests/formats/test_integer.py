import pytest
import torch

from conftest import heavy_tailed
from sixbit.formats import integer

CASES = [
    ("tensor", None),
    ("channel", None),
    ("token", None),
    ("group", 16),
    ("group", 64),
]


def _scale_like(q, x):
    """Scale (and zero point) broadcast to x's shape."""
    shape = x.shape if q.group_size is None else (*x.shape[:-1], x.shape[-1] // q.group_size, q.group_size)
    s = q.scale.expand(shape).reshape(x.shape)
    z = None if q.zero_point is None else q.zero_point.float().expand(shape).reshape(x.shape)
    return s, z


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("gran,group", CASES)
def test_grid_error_and_idempotence(bits, symmetric, gran, group):
    x = heavy_tailed(6, 128)
    q = integer.quantize(x, bits, symmetric, gran, group)
    d = q.dequantize()
    s, z = _scale_like(q, x)
    v = q.values()
    # codes in range, and the dequantized values are exactly codes × scale
    if symmetric:
        assert v.dtype == torch.int8
        assert v.abs().max() <= 2 ** (bits - 1) - 1
        assert torch.equal(d, v.float() * s)
    else:
        assert v.min() >= 0 and v.max() <= 2**bits - 1
        assert torch.equal(d, (v.float() - z) * s)
    # error within half a step (fp32 rounding of x/s allowed for)
    assert ((x - d).abs() <= s * 0.5 * (1 + 1e-5) + 1e-12).all()
    # quantize ∘ dequantize is idempotent
    q2 = integer.quantize(d, bits, symmetric, gran, group)
    assert torch.equal(q2.values(), v)
    torch.testing.assert_close(q2.dequantize(), d, rtol=1e-6, atol=0)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_codes_are_bit_packed(bits):
    x = torch.randn(4, 64)
    q = integer.quantize(x, bits)
    assert q.codes.dtype == torch.uint8
    assert q.codes.numel() == 4 * 64 * bits // 8


def test_symmetric_codes_match_direct_formula():
    x = torch.randn(5, 32)
    q = integer.quantize(x, 4, granularity="token")
    s = x.abs().amax(-1, keepdim=True) / 7
    assert torch.equal(q.values().long(), torch.clamp(torch.round(x / s), -7, 7).long())
    assert q.scale.shape == (5, 1)


def test_asymmetric_one_sided_data_keeps_zero_exact():
    x = torch.rand(3, 32) + 0.5  # all positive
    q = integer.quantize(x, 4, symmetric=False)
    assert (q.zero_point == 0).all()
    z = integer.quantize(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), 2, symmetric=False)
    assert z.dequantize()[0, 0] == 0.0


def test_all_zero_and_zero_blocks():
    x = torch.zeros(2, 64)
    x[1, 32:] = torch.randn(32)
    for sym in (True, False):
        q = integer.quantize(x, 4, sym, "group", 32)
        d = q.dequantize()
        assert torch.equal(d[0], torch.zeros(64)) and torch.equal(d[1, :32], torch.zeros(32))


def test_bad_input():
    with pytest.raises(ValueError, match="NaN/Inf"):
        integer.quantize(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(ValueError, match="multiple of 64"):
        integer.quantize(torch.randn(2, 100), 4, granularity="group", group_size=64)
    with pytest.raises(ValueError, match="2…8"):
        integer.quantize(torch.randn(2, 8), bits=9)
    with pytest.raises(ValueError, match="granularity"):
        integer.quantize(torch.randn(2, 8), granularity="block")
    with pytest.raises(ValueError, match="group_size"):
        integer.quantize(torch.randn(2, 8), granularity="group")
