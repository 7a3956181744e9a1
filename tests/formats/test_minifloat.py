import itertools

import pytest
import torch

from sixbit.formats import minifloat
from sixbit.formats.minifloat import E2M1, E2M3, E3M2, E4M3, E5M2, ELEMENTS


def _positive_grid(ebits: int, mbits: int, bias: int) -> list[float]:
    """All non-negative values, written out from the textbook definition."""
    vals = []
    for e in range(2**ebits):
        for m in range(2**mbits):
            if e == 0:
                vals.append(m / 2**mbits * 2.0 ** (1 - bias))
            else:
                vals.append((1 + m / 2**mbits) * 2.0 ** (e - bias))
    return vals


def test_e2m1_table_is_the_reference_list():
    expected = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert E2M1.table().tolist() == expected
    assert torch.signbit(E2M1.table()[8])  # code 8 is negative zero


def test_fp6_tables_bit_exact():
    e2m3 = [i / 8 for i in range(8)] + [1 + i / 8 for i in range(8)] + [2 + i / 4 for i in range(8)] + [4 + i / 2 for i in range(8)]
    assert E2M3.table()[:32].tolist() == e2m3
    assert E2M3.table()[32:].tolist() == [-v for v in e2m3]
    e3m2 = [i / 16 for i in range(4)] + [2.0**k * (1 + i / 4) for k in range(-2, 5) for i in range(4)]
    assert E3M2.table()[:32].tolist() == e3m2
    assert max(e2m3) == 7.5 and max(e3m2) == 28.0
    assert _positive_grid(2, 3, 1) == e2m3 and _positive_grid(3, 2, 3) == e3m2


@pytest.mark.parametrize("fmt,dtype", [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
def test_fp8_tables_match_torch_dtypes(fmt, dtype):
    ref = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    table = fmt.table()
    assert torch.equal(torch.isnan(table), torch.isnan(ref))
    finite = ~torch.isnan(ref)
    assert torch.equal(table[finite], ref[finite])
    assert table[finite].abs().max() == (float("inf") if fmt is E5M2 else 448.0)


@pytest.mark.parametrize("fmt,dtype", [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
def test_fp8_encode_matches_torch_cast(fmt, dtype):
    x = torch.randn(200_000) * torch.exp(torch.randn(200_000) * 5)  # normals, subnormals, overflow
    ref = x.clamp(-fmt.max, fmt.max).to(dtype).view(torch.uint8)
    assert torch.equal(fmt.encode(x), ref)


@pytest.mark.parametrize("fmt", list(ELEMENTS.values()), ids=list(ELEMENTS))
def test_every_value_encodes_to_itself(fmt):
    table = fmt.table()
    finite = torch.isfinite(table)
    codes = torch.arange(2**fmt.bits)[finite]
    assert torch.equal(fmt.encode(table[finite]).long(), codes)


@pytest.mark.parametrize("fmt", list(ELEMENTS.values()), ids=list(ELEMENTS))
def test_round_to_nearest_ties_to_even_and_saturate(fmt):
    table = fmt.table()
    pos = table[: 2 ** (fmt.bits - 1)]
    pos = pos[torch.isfinite(pos)]
    for lo_code, (lo, hi) in enumerate(itertools.pairwise(pos.tolist())):
        mid = (lo + hi) / 2
        even = lo if lo_code % 2 == 0 else hi
        assert fmt.round(torch.tensor([mid])).item() == even, (fmt.name, lo, hi)
        assert fmt.round(torch.tensor([-mid])).item() == -even
        # just off the midpoint goes to the nearer neighbour
        assert fmt.round(torch.tensor([mid - (hi - lo) / 8])).item() == lo
        assert fmt.round(torch.tensor([mid + (hi - lo) / 8])).item() == hi
    big = torch.tensor([fmt.max * 1.01, fmt.max * 1e3, -fmt.max * 4])
    assert fmt.round(big).tolist() == [fmt.max, fmt.max, -fmt.max]


@pytest.mark.parametrize("fmt", list(ELEMENTS.values()), ids=list(ELEMENTS))
def test_result_is_a_nearest_grid_point(fmt):
    x = (torch.rand(20_000) * 2 - 1) * fmt.max
    grid = fmt.table()[torch.isfinite(fmt.table())]
    r = fmt.round(x)
    best = (x[:, None] - grid[None, :]).abs().min(dim=1).values
    assert torch.equal((x - r).abs(), best)


@pytest.mark.parametrize("fmt", list(ELEMENTS.values()), ids=list(ELEMENTS))
def test_round_is_decode_of_encode_bit_for_bit(fmt):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(50_000, generator=g) * fmt.max * scale for scale in (1e-6, 1e-2, 0.3, 3.0)]
                  + [torch.tensor([0.0, -0.0, fmt.max, -fmt.max, 1e30, -1e30, 1e-40])])
    assert torch.equal(fmt.round(x).view(torch.int32), fmt.decode(fmt.encode(x)).view(torch.int32))


def _divided_by_quantum(fmt, x):
    """The rounding written the long way: the binade from ``frexp``, divided by its quantum,
    ``torch.round`` (ties to even), multiplied back."""
    a = x.abs().clamp(max=fmt.max)
    _, e = torch.frexp(a)  # a = m·2^e, m in [0.5, 1): floor(log2 a) = e - 1
    quantum = torch.ldexp(torch.ones_like(a), (e - 1).clamp(min=fmt.emin) - fmt.mbits)
    return torch.copysign(torch.round(a / quantum) * quantum, x)


@pytest.mark.parametrize("fmt", list(ELEMENTS.values()), ids=list(ELEMENTS))
def test_round_and_encode_across_every_fp32_binade(fmt):
    # every 997th finite fp32 bit pattern of each sign: fp32 subnormals, every binade of the format
    # and far past its largest value; the rounding reads the fp32 exponent field, so this covers its cases
    bits = torch.arange(0, 0x7F800000, 997, dtype=torch.int32)
    x = torch.cat([bits, bits | torch.tensor(-0x80000000, dtype=torch.int32)]).view(torch.float32)
    rounded = fmt.round(x).view(torch.int32)
    assert torch.equal(rounded, _divided_by_quantum(fmt, x).view(torch.int32))
    assert torch.equal(rounded, fmt.decode(fmt.encode(x)).view(torch.int32))
    codes = torch.arange(2**fmt.bits, dtype=torch.uint8)
    values = fmt.decode(codes)
    finite = torch.isfinite(values) & ~((values == 0) & (codes != 0) & (codes != 1 << (fmt.bits - 1)))
    assert torch.equal(fmt.encode(values[finite]), codes[finite])  # every code from its own value


def test_element_unknown_name():
    with pytest.raises(ValueError, match="valid"):
        minifloat.element("e9m9")


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("gran", ["tensor", "channel"])
def test_scaled_fp8(element, gran):
    x = torch.randn(8, 64) * 3
    q = minifloat.quantize_fp8(x, element, gran)
    fmt = minifloat.element(element)
    assert q.codes.dtype == torch.uint8 and q.codes.shape == x.shape
    assert q.scale.shape == ((8, 1) if gran == "channel" else ())
    d = q.dequantize()
    # the largest magnitude lands on the format's max exactly
    assert torch.allclose((x.abs().amax(-1) if gran == "channel" else x.abs().amax()), d.abs().amax(-1) if gran == "channel" else d.abs().amax())
    assert torch.equal(minifloat.quantize_fp8(d, element, gran).codes, q.codes)  # idempotent
    grid = fmt.table()[torch.isfinite(fmt.table())]
    assert torch.isin(fmt.decode(q.codes), grid).all()
    with pytest.raises(ValueError, match="NaN"):
        minifloat.quantize_fp8(torch.tensor([1.0, float("nan")]), element)
    assert torch.equal(minifloat.quantize_fp8(torch.zeros(2, 4), element).dequantize(), torch.zeros(2, 4))
