import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from sixbit.kernels import int8_matmul, int8_matmul_backend, int8_matmul_reference


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 17, 5), (16, 64, 8), (33, 96, 40), (128, 256, 64)])
def test_int8_matmul_equals_reference(m, k, n):
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    out = int8_matmul(a, b)
    assert out.dtype == torch.int32
    assert torch.equal(out, int8_matmul_reference(a, b))


def test_int8_matmul_stays_exact_where_onednn_has_no_vnni():
    """Under ``ONEDNN_MAX_CPU_ISA=AVX2`` (as on CPUs without VNNI) ``torch._int_mm`` sums pairs of
    products in int16 and saturates (measured: off by up to 34364 of 117438); int8_matmul falls back."""
    code = ("import torch; from sixbit.kernels import int8_matmul, int8_matmul_backend, int8_matmul_reference\n"
            "a = torch.randint(-128, 128, (64, 256), dtype=torch.int8); b = torch.randint(-128, 128, (32, 256), "
            "dtype=torch.int8)\nassert int8_matmul_backend('cpu', 64, 256, 32) == 'float64 exact fallback'\n"
            "assert torch.equal(int8_matmul(a, b), int8_matmul_reference(a, b))")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_extremes_accumulate_exactly():
    a = torch.full((4, 4096), -128, dtype=torch.int8)
    b = torch.full((2, 4096), -128, dtype=torch.int8)
    assert (int8_matmul(a, b) == 128 * 128 * 4096).all()


def test_backend_and_errors():
    from sixbit.kernels import cpu_kind
    # without VNNI oneDNN's s8 GEMM saturates in int16
    vnni = bool({"AVX512-VNNI", "AVX-VNNI", "AMX-INT8"} & set(cpu_kind().split(";")[0].split(", ")))
    assert int8_matmul_backend("cpu", 4096, 1920, 7680) == ("torch._int_mm" if vnni else "float64 exact fallback")
    assert int8_matmul_backend("cuda", 8, 1920, 7680) == "torch._int_mm"  # M ≤ 16: padded (gemm_shapes)
    with pytest.raises(ValueError, match="int8"):
        int8_matmul(torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="inner dimensions"):
        int8_matmul(torch.zeros(2, 3, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.int8))


@pytest.fixture
def compiled(monkeypatch):
    """Every size takes the compiled kernels (fresh compilation state)."""
    from sixbit.kernels import cpu

    monkeypatch.setattr(cpu, "_MIN_ELEMENTS", 0)
    monkeypatch.setattr(cpu, "_COMPILED", {})
    monkeypatch.setattr(cpu, "_STATE", {"enabled": True, "broken": None})
    return cpu


def test_compiled_ops_are_bit_identical_to_the_eager_ones(compiled):
    from sixbit.formats import integer

    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        x = (torch.randn(37, 96) * torch.logspace(-3, 3, 37).reshape(-1, 1)).to(dtype)
        x[5] = 0  # an all-zero row: scale 1
        codes, scale = compiled.quantize_rows(x)
        ref = integer.quantize(x.float(), bits=8, granularity="token", check=False)
        assert torch.equal(codes, ref.values()) and torch.equal(scale, ref.scale)
    acc = torch.randint(-2**20, 2**20, (37, 40), dtype=torch.int32)
    xs, ws = torch.rand(37, 1), torch.rand(40)
    extra, bias = torch.randn(37, 40), torch.randn(40, dtype=torch.bfloat16)
    for args in ((None, None, torch.float32), (extra, None, torch.bfloat16), (extra, bias, torch.bfloat16),
                 (None, bias, torch.float32)):
        assert torch.equal(compiled.scale_epilogue(acc, xs, ws, *args), compiled.scale_epilogue_reference(acc, xs, ws, *args))
    for shape in ((50, 96), (37, 48)):  # other rows: the same kernel; another width: its own
        x = torch.randn(*shape)
        assert all(map(torch.equal, compiled.quantize_rows(x), compiled.quantize_rows_reference(x)))
    assert set(compiled._COMPILED) == {"_codes_and_amax[96]", "_codes_and_amax[48]",
                                       "scale_epilogue_reference"}


@pytest.mark.parametrize("activation", ["gelu", "gelu-tanh"])
def test_epilogue_activation_is_gelu_and_compiles_to_the_same_values(compiled, activation):
    torch.manual_seed(0)
    acc = torch.randn(37, 40).bfloat16() * 30  # a packed GEMM's bf16 output (weight scale applied)
    xs, bias = torch.rand(37, 1) * 0.1, torch.randn(40)
    y = compiled.scale_epilogue_reference(acc, xs, None, None, bias, torch.float32, activation)
    plain = compiled.scale_epilogue_reference(acc, xs, None, None, bias, torch.float32)
    approximate = "tanh" if activation == "gelu-tanh" else "none"
    torch.testing.assert_close(y, F.gelu(plain, approximate=approximate), rtol=1e-6, atol=1e-5)
    # the vectorized erf / exp may differ from aten's in the last fp32 bit (then, rarely, a bf16 rounding)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2**-8)):
        ref = compiled.scale_epilogue_reference(acc, xs, None, None, bias, dtype, activation)
        torch.testing.assert_close(compiled.scale_epilogue(acc, xs, None, None, bias, dtype, activation), ref,
                                   rtol=tol, atol=1e-5)
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        compiled.scale_epilogue_reference(acc, xs, None, None, bias, torch.float32, "relu")


def test_a_failing_compiler_leaves_the_eager_ops(compiled, monkeypatch, caplog):
    def broken(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    x = torch.randn(8, 32)
    with caplog.at_level("WARNING"):
        codes, scale = compiled.quantize_rows(x)
    assert torch.equal(codes, compiled.quantize_rows_reference(x)[0]) and torch.equal(scale, compiled.quantize_rows_reference(x)[1])
    assert "no C++ compiler" in caplog.text and not compiled.fused_cpu(x)


def test_compiled_nvfp4_to_int8_equals_dequantize_then_round(compiled):
    from sixbit.formats import integer, nvfp4

    torch.manual_seed(0)
    w = torch.randn(24, 96) * torch.logspace(-2, 2, 24).reshape(-1, 1)
    w[3] = 0
    q = nvfp4.quantize(w)
    ref = integer.quantize(q.dequantize(), bits=8, granularity="channel", check=False)
    codes, scale = compiled.nvfp4_to_int8(q.codes, q.scales, q.global_scale, nvfp4.E2M1.table())
    assert torch.equal(codes, ref.values()) and torch.equal(scale, ref.scale.reshape(-1))
    assert "_nvfp4_codes_and_amax" in compiled._COMPILED


@pytest.mark.skipif(not __import__("sixbit.kernels", fromlist=["amx_int8"]).amx_int8(), reason="no AMX INT8 on this CPU")
@pytest.mark.parametrize("m,k,n", [(1, 16, 8), (37, 96, 40), (300, 256, 64)])
def test_packed_amx_matmul_equals_reference(m, k, n):
    from sixbit.kernels import (
        pack_int8_weight,
        packed_int8_matmul,
        packed_int8_matmul_reference,
    )

    a = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    w_scale = torch.rand(n)
    packed = pack_int8_weight(codes)
    for dtype in (torch.float32, torch.bfloat16):
        out = packed_int8_matmul(a, packed, w_scale, dtype=dtype)
        assert out.dtype == dtype and torch.equal(out, packed_int8_matmul_reference(a, codes, w_scale, dtype))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        packed_int8_matmul(a, packed, w_scale, dtype=torch.float16)


def test_compiled_weight_dequantization_equals_the_formats(compiled):
    from sixbit.formats import integer, nvfp4

    torch.manual_seed(0)
    w = torch.randn(24, 96) * torch.logspace(-2, 2, 24).reshape(-1, 1)
    q = nvfp4.quantize(w)
    i8 = integer.quantize(w, bits=8, granularity="channel")
    for dtype in (torch.float32, torch.bfloat16):
        got = compiled.nvfp4_dequantize(q.codes, q.scales, q.global_scale, nvfp4.E2M1.table(), dtype)
        assert torch.equal(got, q.dequantize(dtype))
        assert torch.equal(compiled.int8_dequantize(i8.values(), i8.scale, dtype), i8.dequantize(dtype))


def test_compiled_abs_reductions_equal_the_eager_ones(compiled):
    """The delta cache's statistics: one pass each, the eager values up to summation order."""
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        x = (torch.randn(2, 37, 96) * 3).to(dtype)
        amax, total = compiled.abs_max_sum(x)
        ref_max, ref_sum = compiled.abs_max_sum_reference(x)
        assert torch.equal(amax, ref_max) and amax.dtype == torch.float32
        torch.testing.assert_close(total, ref_sum, rtol=1e-5, atol=0)
        torch.testing.assert_close(total, x.float().abs().sum(), rtol=1e-5, atol=0)
        per_sample = compiled.abs_sum_per_sample(x)
        assert per_sample.shape == (2,)
        torch.testing.assert_close(per_sample, x.float().abs().sum((1, 2)), rtol=1e-5, atol=0)
    assert {"abs_max_sum_reference", "abs_sum_per_sample_reference"} <= set(compiled._COMPILED)


def test_in_place_epilogue_writes_into_the_accumulator(compiled):
    torch.manual_seed(0)
    acc = (torch.randn(37, 40) * 30).bfloat16()  # a packed GEMM's bf16 output (weight scale applied)
    xs, bias = torch.rand(37, 1) * 0.1, torch.randn(40)
    for activation in (None, "gelu-tanh"):
        want = compiled.scale_epilogue_reference(acc, xs, None, None, bias, torch.bfloat16, activation)
        for fn in (compiled.scale_epilogue_reference, compiled.scale_epilogue):
            a = acc.clone()
            out = fn(a, xs, None, None, bias, torch.bfloat16, activation, True)
            assert out.data_ptr() == a.data_ptr()
            torch.testing.assert_close(out, want, rtol=0 if activation is None else 2**-8, atol=0 if activation is None else 1e-5)
    with pytest.raises(ValueError, match="it must be torch.bfloat16, not torch.float32"):
        compiled.scale_epilogue_reference(acc.float(), xs, None, None, bias, torch.bfloat16, None, True)


def test_epilogue_that_quantizes_its_output_gives_the_codes_of_the_rounded_output(compiled):
    torch.manual_seed(0)
    acc = (torch.randn(37, 40) * 30).bfloat16()
    acc[3] = 0  # with no bias and GELU, an all-zero output row: scale 1
    xs, bias = torch.rand(37, 1) * 0.1, torch.randn(40)
    for activation, b in ((None, bias), ("gelu-tanh", bias), ("gelu", None)):
        for dtype in (torch.bfloat16, torch.float32):
            want = compiled.scale_epilogue_reference(acc.to(dtype), xs, None, None, b, dtype, activation)
            for fn in (compiled.scale_epilogue_quantize_reference, compiled.scale_epilogue_quantize):
                a = acc.to(dtype, copy=True)
                codes, scale = fn(a, xs, b, activation)
                torch.testing.assert_close(a, want, rtol=0 if activation is None else 2**-8,
                                           atol=0 if activation is None else 1e-5)
                # the codes of the output as written (inductor would otherwise quantize its fp32 value)
                assert all(map(torch.equal, (codes, scale), compiled.quantize_rows_reference(a)))
    assert "_epilogue_codes_and_amax[40]" in compiled._COMPILED


def test_unpacked_nvfp4_dequantization_is_bit_identical(compiled):
    from sixbit.formats import nvfp4

    torch.manual_seed(0)
    q = nvfp4.quantize(torch.randn(24, 96) * torch.logspace(-2, 2, 24).reshape(-1, 1))
    values = (q.element_values() * 2).to(torch.int8)
    assert torch.equal(values.float() / 2, q.element_values())  # twice an E2M1 value is an integer in −12…12
    for dtype in (torch.float32, torch.bfloat16):
        want = q.dequantize(dtype)
        assert torch.equal(compiled.nvfp4_unpacked_dequantize_reference(values, q.scales, q.global_scale, dtype), want)
        assert torch.equal(compiled.nvfp4_unpacked_dequantize(values, q.scales, q.global_scale, dtype), want)
    assert "nvfp4_unpacked_dequantize_reference" in compiled._COMPILED


@pytest.mark.parametrize("flags, kind", [
    ({"amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "sse2"}, "AMX-BF16, AMX-INT8, AVX512-BF16, AVX512-VNNI"),
    ({"avx512_bf16", "avx512_vnni", "avx2"}, "AVX512-BF16, AVX512-VNNI"),
    ({"avx2", "fma"}, "no AMX, AVX512-BF16 or VNNI"),
])
def test_cpu_kind_names_the_matrix_instructions_that_set_the_speeds(monkeypatch, flags, kind):
    from sixbit.kernels import cpu, cpu_kind
    for cap in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):  # the suite may run under one: tested below
        monkeypatch.delenv(cap, raising=False)
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(flags))
    assert cpu_kind() == kind


AMX_CPU = {"amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx512bw", "avx512vl",
           "avx512dq", "avx2"}


@pytest.mark.parametrize("cap, kind, amx, bf16", [
    ("AVX512_CORE_AMX", "AMX-BF16, AMX-INT8, AVX512-BF16, AVX512-VNNI", True, True),
    ("avx512_core_bf16", "AVX512-BF16, AVX512-VNNI", False, True),
    ("AVX512_CORE_VNNI", "AVX512-VNNI", False, False),
    ("AVX2", "no AMX, AVX512-BF16 or VNNI", False, False),
])
def test_cpu_kind_follows_onednns_isa_cap(monkeypatch, cap, kind, amx, bf16):
    from sixbit.kernels import amx_int8, cpu, cpu_kind, fastest_float_dtype
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(AMX_CPU))
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert cpu_kind().split(";")[0] == kind  # "; ATen AVX2" follows where ATEN_CPU_CAPABILITY caps ATen
    assert amx_int8() == (amx and hasattr(torch.ops.onednn, "qlinear_prepack"))
    assert fastest_float_dtype("cpu") == (torch.bfloat16 if bf16 else torch.float32)


def test_cpu_kind_names_atens_cap_below_the_cpus_own():
    from sixbit.kernels import cpu, cpu_kind, isa
    level = torch.backends.cpu.get_cpu_capability()  # ATEN_CPU_CAPABILITY, read once by torch
    capped = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= cpu._cpu_flags() and level in ("AVX2", "DEFAULT")
    assert isa.aten_cap(cpu._cpu_flags()) == (level if capped else None)
    assert cpu_kind().endswith(f"; ATen {level}") == capped


def test_e2m1_round_is_the_format_rounding_bit_for_bit():
    from sixbit.formats.minifloat import E2M1
    from sixbit.kernels import e2m1_round

    edges = torch.tensor([0.0, -0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.2499, 0.7501, 1.9999, 3.9999, 4.0])
    x = torch.cat([edges, -edges, torch.empty(200_000).uniform_(-6, 6, generator=torch.Generator().manual_seed(0))])
    assert torch.equal(e2m1_round(x), E2M1.round(x))
    assert torch.equal(torch.signbit(e2m1_round(x)), torch.signbit(E2M1.round(x)))


@pytest.mark.parametrize("kind", ["nvfp4", "int"])
def test_compiled_block_errors_agree_with_their_reference(kind):
    from sixbit import kernels

    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 16, 16, generator=g) * 0.02
    importance = torch.rand(1, 16, 16, generator=g) + 0.1
    amax = w.abs().amax(-1, keepdim=True)
    if kind == "nvfp4":
        gs = amax.max() / (448 * 6)
        scale = (amax / 6 / gs).to(torch.float8_e4m3fn).float()
        args = (w, scale, gs, importance)
        fast, reference = kernels.nvfp4_block_errors, kernels.nvfp4_block_errors_reference
    else:
        args = (w, amax / 7 * 0.9, 7, importance)
        fast, reference = kernels.int_block_errors, kernels.int_block_errors_reference
    want = reference(*args)
    got = fast(*args, numel=1 << 24)  # counted as a large weight: compiled (where a compiler is present)
    assert want.shape == (32, 16) and bool((want > 0).all())
    assert torch.allclose(got, want, rtol=1e-5, atol=0)
    assert torch.equal(fast(*args), want)  # a small weight: the reference itself
