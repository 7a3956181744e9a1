import pytest
import torch

from sixbit.transforms import hadamard


@pytest.mark.parametrize("block", hadamard.BLOCK_SIZES)
def test_orthogonal_symmetric_and_normalized(block):
    h = hadamard.hadamard_matrix(block, torch.float64)
    assert torch.allclose(h @ h.T, torch.eye(block, dtype=torch.float64), atol=1e-12)
    assert torch.equal(h, h.T)
    torch.testing.assert_close(h.abs(), torch.full_like(h, block**-0.5), rtol=1e-15, atol=0)


@pytest.mark.parametrize("block", hadamard.BLOCK_SIZES)
def test_linear_output_invariant(block):
    k = 2 * block if block < 256 else 256
    w, x, b = torch.randn(48, k), torch.randn(7, 5, k), torch.randn(48)
    lin = torch.nn.functional.linear
    truth = lin(x.double(), w.double(), b.double())
    rot64 = lin(hadamard.rotate(x.double(), block), hadamard.rotate(w.double(), block), b.double())
    torch.testing.assert_close(rot64, truth, rtol=1e-12, atol=1e-12)
    # in fp32 the rotated product is as accurate as the plain fp32 product (same order of error)
    err_plain = (lin(x, w, b).double() - truth).abs().max()
    err_rot = (lin(hadamard.rotate(x, block), hadamard.rotate(w, block), b).double() - truth).abs().max()
    assert err_rot <= 4 * err_plain + 1e-6
    assert hadamard.rotate(x.double(), block).dtype == torch.float64
    assert hadamard.rotate(x.bfloat16(), block).dtype == torch.bfloat16


def test_block_diagonal_and_spreads_outliers():
    x = torch.zeros(1, 64)
    x[0, 3] = 8.0  # one outlier in the first block of 32
    y = hadamard.rotate(x, 32)
    assert torch.equal(y[0, 32:], torch.zeros(32))  # second block untouched
    assert torch.allclose(y[0, :32].abs(), torch.full((32,), 8.0 / 32**0.5))


def test_errors():
    with pytest.raises(ValueError, match="not a multiple of the Hadamard block 128; use hadamard_block=64"):
        hadamard.rotate(torch.randn(2, 192), 128)
    with pytest.raises(ValueError, match="one of"):
        hadamard.rotate(torch.randn(2, 96), 48)
    with pytest.raises(ValueError, match="hadamard_block=None"):
        hadamard.rotate(torch.randn(2, 100), 16)


def test_unnormalized_rotation_into_a_given_tensor():
    x = torch.randn(2, 5, 64).bfloat16()
    out = torch.empty_like(x)
    assert hadamard.rotate_unnormalized(x, 32, out) is out
    assert torch.equal(out, hadamard.rotate_unnormalized(x, 32))
    with pytest.raises(ValueError, match="out must be a contiguous torch.bfloat16 tensor of shape"):
        hadamard.rotate_unnormalized(x, 32, torch.empty(2, 5, 64))
