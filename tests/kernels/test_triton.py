"""Triton kernels ≡ their reference twins, on CPU under the interpreter (small shapes).

The interpreter mis-handles bfloat16 tensors, so 16-bit inputs here are fp16; the GPU benchmark
(``benchmarks/gpu/run.py``) checks bf16 on a real GPU.
"""

import pytest
import torch

from sixbit import formats
from sixbit.kernels import triton as tri

pytestmark = pytest.mark.skipif(not tri.runs_on("cpu"), reason="needs triton with TRITON_INTERPRET=1")


@pytest.mark.parametrize("m,k", [(1, 16), (5, 64), (37, 192), (17, 100)])
def test_int8_rows_match_reference_bit_for_bit(m, k):
    from sixbit.kernels.triton.quantize import (
        quantize_rows_int8,
        quantize_rows_int8_reference,
    )

    x = torch.randn(m, k) * torch.logspace(-3, 3, m).reshape(-1, 1)
    x[0] = 0  # an all-zero row gets scale 1
    codes, scale = quantize_rows_int8(x)
    ref_codes, ref_scale = quantize_rows_int8_reference(x)
    assert torch.equal(scale, ref_scale) and torch.equal(codes, ref_codes)
    assert scale[0].item() == 1.0 and not codes[0].any()


@pytest.mark.parametrize("k,block", [(64, 16), (256, 128), (96, 32)])
def test_int8_rows_with_fused_hadamard_match_rotate_then_quantize(k, block):
    from sixbit.kernels.triton.quantize import (
        quantize_rows_int8,
        quantize_rows_int8_reference,
    )

    x = torch.randn(20, k, dtype=torch.float16)
    codes, scale = quantize_rows_int8(x, block)
    ref_codes, ref_scale = quantize_rows_int8_reference(x, block)
    # the rotation sums in another order than torch's matmul: scales agree to an fp32 ulp or
    # two, a code may move by one where its value sits on a rounding boundary
    torch.testing.assert_close(scale, ref_scale, rtol=1e-6, atol=0)
    diff = (codes.int() - ref_codes.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-2


@pytest.mark.parametrize("fmt,k", [("nvfp4", 96), ("int4", 64), ("int4-g64", 128), ("int4-g16", 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_weight4_linear_matches_dequantize_then_linear(fmt, k, dtype):
    from sixbit.kernels import weight4_linear, weight4_linear_reference

    w = formats.get(fmt).quantize(torch.randn(40, k))
    x = torch.randn(7, k).to(dtype)
    y, ref = weight4_linear(x, w), weight4_linear_reference(x, w)
    assert y.dtype == dtype and y.shape == (7, 40)
    # the same products summed in fp32 in another order, rounded once to the output dtype
    tol = 1e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(y, ref, rtol=tol, atol=tol)


def test_weight4_linear_rejects_what_it_cannot_read():
    from sixbit.kernels import weight4_linear

    with pytest.raises(ValueError, match="NVFP4 or symmetric"):
        weight4_linear(torch.randn(2, 64), formats.get("int8").quantize(torch.randn(8, 64)))
    with pytest.raises(ValueError, match="x of shape"):
        weight4_linear(torch.randn(2, 32), formats.get("nvfp4").quantize(torch.randn(8, 64)))


@pytest.mark.parametrize("bias", [False, True])
def test_int8_epilogue_matches_reference(bias):
    from sixbit.kernels.triton.gemm import int8_epilogue, int8_epilogue_reference

    acc = torch.randint(-40000, 40000, (19, 33), dtype=torch.int32)
    xs, ws = torch.rand(19, 1), torch.rand(33)
    b = torch.randn(33) if bias else None
    assert torch.equal(int8_epilogue(acc, xs, ws, b, torch.float32), int8_epilogue_reference(acc, xs, ws, b, torch.float32))


@pytest.mark.parametrize("block", [None, 32])
def test_int8_linear_fused_path_matches_reference(block):
    from sixbit.kernels import int8_linear, int8_linear_reference

    w = formats.get("int8").quantize(torch.randn(24, 64))
    x = torch.randn(9, 64)
    y = int8_linear(x, w.values(), w.scale.reshape(-1), block)
    ref = int8_linear_reference(x, w.values(), w.scale.reshape(-1), block)
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)


def test_quant_linear_takes_the_triton_paths_where_they_run(monkeypatch):
    """With the CUDA switches on (here: the interpreter), QuantLinear routes INT8 calls through
    the fused quantize (rotation included) and weight-only calls through the 4-bit GEMM, with
    the reference path's numerics."""
    from sixbit import kernels
    from sixbit.nn import QuantLinear
    from sixbit.nn.precision import ActMode

    q = QuantLinear.from_linear(torch.nn.Linear(64, 40), "nvfp4", hadamard_block=32, act_mode="int8")
    x = torch.randn(2, 5, 64)
    ref_int8, ref_fp = q(x), q(x, mode=ActMode.FP)
    monkeypatch.setattr(kernels, "fused_int8", lambda device: True)
    monkeypatch.setattr(kernels, "weight4_fused", lambda device: True)
    assert "Triton" in q.execution() and "Triton" in q.execution("fp")
    torch.testing.assert_close(q(x), ref_int8, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q(x, mode=ActMode.FP), ref_fp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length,dim,dtype,block_q,block_k", [
    (37, 16, torch.float32, 16, 16),   # ragged: the last query and key blocks are masked
    (64, 32, torch.float16, 32, 16),
    (37, 32, torch.float16, 16, 32),
    (50, 24, torch.float32, 16, 16),   # a head dim that is no power of two: padded in the kernel
    (40, 64, torch.float16, 32, 16),   # the head dims of the real models (CogVideoX, Wan)
    (20, 128, torch.float32, 16, 16),
])
def test_int8_attention_kernel_matches_reference(length, dim, dtype, block_q, block_k):
    import torch.nn.functional as F

    from sixbit.kernels.attention import int8_attention_reference
    from sixbit.kernels.triton.attention import ATOL, int8_attention_triton

    q, k, v = (torch.randn(1, 2, length, dim).to(dtype) for _ in range(3))
    k = k + 3.0  # a shared key offset, as DiTs have: smoothed away before quantizing
    y = int8_attention_triton(q, k, v, block_q=block_q, block_k=block_k)
    ref = int8_attention_reference(q, k, v, block_q=block_q, block_k=block_k)
    assert y.dtype == dtype and y.shape == (1, 2, length, dim)
    # the scores are identical; P is rounded to FP16 per tile against the running max (kernel)
    # instead of after normalization (reference): ATOL · max|V| (see the kernel's module)
    torch.testing.assert_close(y.float(), ref.float(), rtol=0, atol=ATOL * v.float().abs().max().item())
    # both are INT8 attention: within 3 % (relative norm) of exact attention
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    for out in (y, ref):
        assert ((out.float() - exact).norm() / exact.norm()) < 0.03


def test_int8_attention_kernel_masks_ragged_lengths():
    from sixbit.kernels.attention import int8_attention_reference
    from sixbit.kernels.triton.attention import ATOL, int8_attention_triton

    # 20 queries and 45 keys: both last blocks partial, and independently so
    q, k, v = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 45, 16), torch.randn(1, 2, 45, 16)
    y = int8_attention_triton(q, k, v, block_q=16, block_k=16)
    ref = int8_attention_reference(q, k, v, block_q=16, block_k=16)
    torch.testing.assert_close(y, ref, rtol=0, atol=ATOL * v.abs().max().item())
    # a full query block does not see the masked rows after it
    assert torch.equal(int8_attention_triton(q[..., :17, :], k, v, block_q=16, block_k=16)[..., :16, :], y[..., :16, :])
    # the last key of a partial block counts: one more key of huge value moves every output
    v_more = torch.cat([v, 1e4 * torch.ones(1, 2, 1, 16)], dim=2)
    k_more = torch.cat([k, k[..., :1, :]], dim=2)
    assert (int8_attention_triton(q, k_more, v_more, block_q=16, block_k=16) - y).abs().min() > 1


def test_int8_attention_kernel_takes_the_layout_diffusers_hands_over():
    from sixbit.kernels.triton.attention import int8_attention_triton

    q, k, v = (torch.randn(1, 37, 2, 32).transpose(1, 2) for _ in range(3))  # (B, L, H, D) viewed as (B, H, L, D)
    assert not q.is_contiguous()
    assert torch.equal(int8_attention_triton(q, k, v, block_q=16, block_k=16),
                       int8_attention_triton(q.contiguous(), k.contiguous(), v.contiguous(), block_q=16, block_k=16))


def test_int8_attention_kernel_rejects_bad_inputs():
    from sixbit.kernels.triton.attention import int8_attention_triton

    x = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="same leading dims"):
        int8_attention_triton(x, torch.randn(1, 3, 8, 16), torch.randn(1, 3, 8, 16))
    with pytest.raises(ValueError, match=r"\(B, H, L, D\)"):
        int8_attention_triton(x[0], x[0], x[0])
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        int8_attention_triton(x, x, x, block_k=24)


@pytest.mark.parametrize("p_format", ["e2m3", "e3m2"])
@pytest.mark.parametrize("length,block_q,block_k", [(150, 32, 64), (45, 16, 32)])  # ragged key tiles
def test_int8_attention_kernel_with_6bit_p_matches_its_twin(p_format, length, block_q, block_k):
    import torch.nn.functional as F

    from sixbit.kernels.attention import int8_attention_reference
    from sixbit.kernels.triton.attention import int8_attention_triton

    q, k, v = torch.randn(1, 2, length, 32) * 2, torch.randn(1, 2, length, 32) * 2 + 1, torch.randn(1, 2, length, 32)
    y = int8_attention_triton(q, k, v, block_q=block_q, block_k=block_k, p_format=p_format)
    ref = int8_attention_reference(q, k, v, block_q=block_q, block_k=block_k, p_format=p_format)
    # the twin rounds the same tiles against the same running max: only fp32 summation order differs
    # (measured ≤ 3.2e-7 · max|V|); rounding P another way (normalized first) would differ by ~1e-2
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-5 * v.abs().max().item())
    fp16 = int8_attention_reference(q, k, v, block_q=block_q, block_k=block_k)
    exact = F.scaled_dot_product_attention(q, k, v)
    error = lambda out: ((out - exact).norm() / exact.norm()).item()  # noqa: E731
    assert error(fp16) < error(ref) < 2 * error(fp16)  # 6-bit P costs something, not everything


def test_int8_attention_kernel_refuses_p_formats_it_cannot_run():
    from sixbit.kernels.triton.attention import int8_attention_triton

    x = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="int8 P: the reference"):
        int8_attention_triton(x, x, x, p_format="int8")
    with pytest.raises(ValueError, match="block_k must be a multiple of 32"):
        int8_attention_triton(x, x, x, block_k=16, p_format="e2m3")
