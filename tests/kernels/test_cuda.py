"""GEMMs through torch's scaled / integer matmuls ≡ their reference twins, on CPU."""

import pytest
import torch

from sixbit import formats
from sixbit.formats import nvfp4
from sixbit.kernels import available, fp8_linear, fp8_linear_reference, int8_matmul_backend, nvfp4_linear
from sixbit.kernels.cuda import (
    fp8_quantize_rows,
    nvfp4_operands,
    swizzle_block_scales,
    unswizzle_block_scales,
)


def test_fp8_scaled_mm_matches_dequantized_matmul():
    x = torch.randn(33, 64) * 4
    wq, ws = fp8_quantize_rows(torch.randn(48, 64))
    y = fp8_linear(x, wq, ws.reshape(-1))
    ref = fp8_linear_reference(x, wq, ws.reshape(-1))
    # the same E4M3 products; _scaled_mm accumulates in its own order
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
    assert fp8_linear(x, wq, ws.reshape(-1), torch.bfloat16).dtype == torch.bfloat16


def test_fp8_rows_round_trip_within_e4m3_precision():
    x = torch.randn(16, 32)
    q, s = fp8_quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (16, 1)
    assert ((q.float() * s - x).abs() <= x.abs() * 2**-4 + 1e-6).all()  # E4M3: 3 mantissa bits, RNE


def test_fp8_linear_rejects_wrong_operands():
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_linear(torch.randn(4, 16), torch.randn(8, 16), torch.ones(8))


@pytest.mark.parametrize("rows,cols", [(300, 12), (128, 4), (5, 3)])
def test_scale_swizzle_is_torchaos_blocked_layout(rows, cols):
    to_blocked = pytest.importorskip("torchao.prototype.mx_formats.utils").to_blocked
    s = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) + 1
    flat = swizzle_block_scales(s)
    assert torch.equal(flat, to_blocked(s).flatten())
    assert torch.equal(unswizzle_block_scales(flat, rows, cols), s)


def test_nvfp4_operands_carry_torchaos_packing_and_values():
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    w = torch.randn(130, 64)
    q = nvfp4.quantize(w)
    codes, scales = nvfp4_operands(q)
    assert codes.dtype == torch.float4_e2m1fn_x2 and codes.shape == (130, 32)
    # torchao packs the same E2M1 codes the same way (element 2i in the low nibble)
    unpacked = kernels.f32_to_f4_unpacked(q.element_values())
    assert torch.equal(codes.view(torch.uint8), kernels.pack_uint4(unpacked))
    # and the swizzled scales, read back, rebuild the dequantized tensor exactly
    back = unswizzle_block_scales(scales, 130, 4).float() * q.global_scale
    values = kernels.f4_unpacked_to_f32(kernels.unpack_uint4(codes.view(torch.uint8))).reshape(130, 4, 16)
    assert torch.equal((values * back.unsqueeze(-1)).reshape(130, 64), q.dequantize())


def test_nvfp4_gemm_says_where_it_runs():
    assert available("cpu")["nvfp4"].startswith("emulated")
    with pytest.raises(RuntimeError, match="Blackwell"):
        nvfp4_linear(torch.randn(4, 32), formats.get("nvfp4").quantize(torch.randn(8, 32)))


def test_available_names_every_precision_on_cpu():
    paths = available("cpu")
    assert set(paths) == {"int8", "fp8", "nvfp4", "w4a16", "attention"}
    assert paths["attention"].startswith("emulated")
    int8 = ("real: torch._int_mm + compiled quantize" if int8_matmul_backend("cpu", 4096, 4096, 4096) == "torch._int_mm"
            else "emulated (exact integers): float64 exact fallback")  # CPUs without VNNI (kernels/test_cpu.py)
    assert paths["int8"].startswith(int8) and paths["fp8"].startswith("real")
    assert ("AMX" in paths["int8"]) == __import__("sixbit.kernels", fromlist=["amx_int8"]).amx_int8()
