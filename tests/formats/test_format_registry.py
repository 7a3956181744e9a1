import pytest
import torch

from sixbit import formats


def test_lookup_and_bits():
    assert formats.get("nvfp4").bits_per_element == 4.5
    assert formats.get("mxfp4").bits_per_element == 4.25
    assert formats.get("mxfp6_e2m3").bits_per_element == 6.25
    assert formats.get("mxfp8_e4m3").bits_per_element == 8.25
    assert formats.get("int4-g64").bits_per_element == 4.5
    assert formats.get("int8").bits_per_element == 8
    for name in ("int2", "int8-asym-g128", "fp8_e5m2-tensor", "int3-tensor", "mxfp6_e3m2"):
        assert name in formats.available()


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown format 'int9'.*nvfp4.*int4-g64"):
        formats.get("int9")


def test_duplicate_registration_refused():
    with pytest.raises(ValueError, match="already registered"):
        formats.register_format(formats.get("nvfp4"))


def _sqnr(name: str, x: torch.Tensor) -> float:
    d = formats.get(name).quantize(x).dequantize()
    return float(10 * torch.log10(x.pow(2).sum() / (d - x).pow(2).sum()))


@pytest.mark.parametrize("name", formats.available())
def test_every_format_round_trips(name):
    fmt = formats.get(name)
    x = torch.randn(16, 256)
    q = fmt.quantize(x)
    d = fmt.dequantize(q)
    assert d.shape == x.shape and d.dtype == torch.float32
    assert _sqnr(name, x) > 0.5  # less error than signal, even at 2 bits
    rebuilt = fmt.container.from_parts(q.tensors(), q.meta())
    assert torch.equal(rebuilt.dequantize(), d)
    if fmt.block_size:
        assert 8 * q.nbytes / x.numel() == pytest.approx(fmt.bits_per_element, abs=0.01)


@pytest.mark.parametrize("suffix", ["", "-tensor", "-g64", "-asym", "-asym-g32"])
def test_each_integer_bit_buys_about_6db(suffix):
    x = torch.randn(64, 512)
    sqnr = [_sqnr(f"int{b}{suffix}", x) for b in range(2, 9)]
    gains = [b - a for a, b in zip(sqnr, sqnr[1:])]
    assert all(4.5 < g < 7.5 for g in gains[1:]), gains  # 2→3 bits is special (clipping-limited)
    assert gains[0] > 3


def test_minifloat_precision_ordering():
    x = torch.randn(64, 512)
    assert _sqnr("mxfp4", x) < _sqnr("nvfp4", x) < _sqnr("mxfp6_e3m2", x) < _sqnr("mxfp6_e2m3", x)
    assert _sqnr("mxfp8_e5m2", x) < _sqnr("mxfp8_e4m3", x) < _sqnr("int8-g32", x)
