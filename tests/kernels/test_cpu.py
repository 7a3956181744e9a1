import pytest
import torch

from sixbit.kernels import int8_matmul, int8_matmul_backend, int8_matmul_reference


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 17, 5), (16, 64, 8), (33, 96, 40), (128, 256, 64)])
def test_int8_matmul_equals_reference(m, k, n):
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    out = int8_matmul(a, b)
    assert out.dtype == torch.int32
    assert torch.equal(out, int8_matmul_reference(a, b))


def test_extremes_accumulate_exactly():
    a = torch.full((4, 4096), -128, dtype=torch.int8)
    b = torch.full((2, 4096), -128, dtype=torch.int8)
    assert (int8_matmul(a, b) == 128 * 128 * 4096).all()


def test_backend_and_errors():
    assert int8_matmul_backend("cpu", 4096, 1920, 7680) == "torch._int_mm"
    assert int8_matmul_backend("cuda", 8, 1920, 7680) == "float64 exact fallback"
    with pytest.raises(ValueError, match="int8"):
        int8_matmul(torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="inner dimensions"):
        int8_matmul(torch.zeros(2, 3, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.int8))
