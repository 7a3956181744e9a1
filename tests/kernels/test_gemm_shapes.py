"""torch's CUDA GEMM shape limits, met by zero padding: checked on CPU through stand-ins that
refuse what CUDA refuses (the CPU kernels themselves take any shape)."""

import logging

import pytest
import torch
from torch import nn

import sixbit
from sixbit.bench.layer_shapes import REAL_MODELS
from sixbit.builder.layers import quantized_linear
from sixbit.config import QuantConfig
from sixbit.formats import nvfp4
from sixbit.kernels import cuda, gemm_shapes, int8_matmul_reference
from sixbit.kernels.gemm_shapes import int_mm_padding, scaled_mm_padding
from sixbit.kernels.strict_ops import strict_int_mm, strict_scaled_mm

CPU_INT_MM = torch._int_mm


@pytest.fixture
def like_cuda(monkeypatch):
    """CPU calls take the CUDA code (padding, reports) and torch's GEMMs refuse what CUDA refuses."""
    monkeypatch.setattr(gemm_shapes, "enforced", lambda device: True)
    monkeypatch.setattr(torch, "_int_mm", strict_int_mm)
    monkeypatch.setattr(torch, "_scaled_mm", strict_scaled_mm)


def _codes(*shape, seed=0):
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


def test_the_cpu_kernels_take_shapes_cuda_refuses_so_the_stand_ins_check_them():
    a, b = _codes(3, 12), _codes(12, 7)
    assert torch._int_mm(a, b).shape == (3, 7)  # CPU: no check to rely on
    for bad, message in (((3, 16, 8), "greater than 16"), ((32, 12, 8), "self.size\\(1\\)"), ((32, 16, 7), "mat2.size\\(1\\)")):
        m, k, n = bad
        with pytest.raises(RuntimeError, match=message):
            strict_int_mm(_codes(m, k), _codes(k, n))
    x = torch.randn(3, 24).to(torch.float8_e4m3fn)
    w = torch.randn(20, 24).to(torch.float8_e4m3fn)
    scales = dict(scale_a=torch.ones(3, 1), scale_b=torch.ones(1, 20), out_dtype=torch.bfloat16)
    assert torch._scaled_mm(x, w.t(), **scales).shape == (3, 20)
    with pytest.raises(RuntimeError, match="divisible by 16"):
        strict_scaled_mm(x, w.t(), **scales)
    with pytest.raises(RuntimeError, match="col_major"):
        strict_scaled_mm(torch.randn(3, 32).to(torch.float8_e4m3fn), torch.randn(32, 32).to(torch.float8_e4m3fn), **scales)


@pytest.mark.parametrize("m,k,n", [(1, 36, 20), (2, 1920, 11520 // 8), (16, 64, 64), (17, 8, 8), (40, 100, 3)])
def test_padded_int_mm_returns_the_exact_integers(like_cuda, m, k, n):
    a, b = _codes(m, k, seed=1), _codes(n, k, seed=2)
    assert torch.equal(gemm_shapes.int_mm(a, b), int8_matmul_reference(a, b))
    assert torch.equal(sixbit.kernels.int8_matmul(a, b), int8_matmul_reference(a, b))  # the one INT8 GEMM entry


def test_every_real_model_linear_is_aligned_so_only_short_calls_pad():
    for model in REAL_MODELS.values():
        for lin in model.linears:
            assert int_mm_padding(lin.tokens, lin.k, lin.n) == (lin.tokens, lin.k, lin.n), (model.name, lin)
            assert scaled_mm_padding(lin.k, lin.n, fp4=True) == (lin.k, lin.n)
    assert int_mm_padding(2, 512, 11520) == (32, 512, 11520)  # CFG batch of modulation vectors


def test_fp8_linear_pads_k_and_n_on_cuda_and_writes_bf16_there(like_cuda):
    x = torch.randn(5, 40) * 3
    wq, ws = cuda.fp8_quantize_rows(torch.randn(20, 40))
    y = cuda.fp8_linear(x, wq, ws.reshape(-1), torch.bfloat16)
    ref = cuda.fp8_linear_reference(x, wq, ws.reshape(-1))
    assert y.shape == (5, 20)
    torch.testing.assert_close(y.float(), ref, rtol=2 ** -8, atol=2 ** -8 * ref.abs().max().item())
    with pytest.raises(ValueError, match="pass dtype=torch.bfloat16"):
        cuda.fp8_linear(x, wq, ws.reshape(-1), torch.float32)


@pytest.mark.parametrize("m,k,n", [(1, 48, 20), (3, 64, 32), (130, 16, 8)])
def test_nvfp4_linear_pads_and_swizzles_operands_cuda_takes(like_cuda, monkeypatch, m, k, n):
    monkeypatch.setattr(cuda, "fp4_supported", lambda device: True)
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(m, k, generator=g), nvfp4.quantize(torch.randn(n, k, generator=g))
    y = cuda.nvfp4_linear(x, w, torch.float32)
    ref = cuda.nvfp4_linear_reference(x, w)
    assert y.shape == (m, n)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())  # same products, fp32 sums


class _Blocks(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(k, n)) for _ in range(2)])


def test_a_layer_off_the_cuda_shapes_converts_runs_and_says_it_pads(like_cuda, caplog):
    model = _Blocks(36, 20)
    with caplog.at_level(logging.INFO, logger="sixbit"):
        sixbit.quantize(model, QuantConfig(weight_format="int8", act_mode="int8", role_formats={"other": "int8"}),
                        progress=False)
    assert "blocks.0.0 (in 36 → out 20): on CUDA, INT8 calls zero-pad K 36 → 40, N 20 → 24" in caplog.text
    layer = model.blocks[0][0]
    assert layer.execution().endswith("; zero-pad K 36 → 40, N 20 → 24 (torch._int_mm on CUDA needs K, N multiples of 8)")
    for tokens in (1, 16, 40):  # M ≤ 16 pads rows too
        x = torch.randn(tokens, 36)
        y = layer(x)
        with pytest.MonkeyPatch.context() as off:  # the same layer as a CPU runs it: no padding
            off.setattr(gemm_shapes, "enforced", lambda device: False)
            off.setattr(torch, "_int_mm", CPU_INT_MM)
            assert torch.equal(y, layer(x))
    note = [line for line in sixbit.summary(model).notes if line.startswith("on CUDA")]
    assert len(note) == 1 and note[0].startswith("on CUDA, 2 layer(s) have shapes torch's GEMMs take only zero-padded")
    assert "blocks.1.0: INT8 calls zero-pad K 36 → 40, N 20 → 24" in note[0]


def test_weight_only_and_aligned_layers_have_nothing_to_pad():
    config = QuantConfig(weight_format="int8", act_mode="int8")
    assert sixbit.nn.execution.cuda_notes(quantized_linear(nn.Linear(64, 32), "int8", None, config, "other")) == []
    odd = quantized_linear(nn.Linear(36, 20), "int8", None, config, "modulation")
    assert odd.weight_only and sixbit.nn.execution.cuda_notes(odd) == []
