import pytest
import torch

from sixbit.formats.packing import pack_bits, packed_numel, unpack_bits


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 8, 64, 1001])
def test_round_trip_bit_exact(bits, n):
    codes = torch.randint(0, 2**bits, (n,), dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == packed_numel(n, bits)
    assert torch.equal(unpack_bits(packed, bits, n), codes)


def test_nibble_order_low_first():
    assert pack_bits(torch.tensor([0x1, 0x2, 0xF, 0x0]), 4).tolist() == [0x21, 0x0F]


def test_fp6_four_values_in_three_bytes():
    codes = torch.tensor([0b000001, 0b000010, 0b000011, 0b111111])
    packed = pack_bits(codes, 6)
    assert packed.numel() == 3
    word = sum(int(b) << (8 * i) for i, b in enumerate(packed.tolist()))
    assert [(word >> (6 * i)) & 63 for i in range(4)] == codes.tolist()


def test_bad_packed_length():
    with pytest.raises(ValueError, match="uint8"):
        unpack_bits(torch.zeros(5, dtype=torch.uint8), 4, 12)
    with pytest.raises(ValueError):
        pack_bits(torch.zeros(4), 9)
