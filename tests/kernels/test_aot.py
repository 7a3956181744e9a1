"""Issue 64: the Triton kernels compiled ahead of time for six GPUs, and the capability table the
dispatcher reads, checked against what compiles. The whole matrix is ``benchmarks/bench_gpu_aot.py``
(BENCHMARKS.md ``gpu-aot``, whose records the table is checked against); here one configuration per
table row is compiled for every target (~30 s of CPU)."""

from __future__ import annotations

import json
import logging
import pathlib

import pytest
import torch

from sixbit.kernels import attention, available, gpu_targets
from sixbit.kernels import triton as tri
from sixbit.kernels.triton import aot

TARGETS = list(gpu_targets.TARGETS)


def _pick(kernel: str, config: str) -> aot.Variant:
    return next(v for v in aot.variants(ks=(1920, 5120), head_dims=(64, 128)) if v.kernel == kernel and v.config == config)


# one configuration per Triton row of the table: the preset's rotation (the largest that fits), the
# attention at head dim 128 (the largest tiles), bf16 as the models run
SUBSET = {
    "int8_rows": _pick("int8_rows", "bf16, Hadamard 128"),
    "weight4": _pick("weight4", "bf16, NVFP4"),
    "epilogue": _pick("epilogue", "bf16, bias"),
    "int8_attention": _pick("int8_attention", "bf16, head dim 128, P fp16"),
    "int8_attention_p6": _pick("int8_attention", "bf16, head dim 128, P e2m3"),
}
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled():
    if not tri.installed():
        pytest.skip("needs triton")
    jobs = [(v, t) for v in SUBSET.values() for t in TARGETS]
    results = aot.compile_many(jobs, workers=2, timeout=300)
    return {(c.variant.row, c.target): c for c in results}


def test_the_capability_table_is_what_compiles(compiled):
    results = compiled
    for (row, target), c in results.items():
        assert c.ok == (target in gpu_targets.TABLE[row]), (row, target, c.record())


def test_the_capability_table_is_what_the_whole_matrix_recorded():
    """Every configuration × target of BENCHMARKS.md ``gpu-aot`` (its records), rows as the code decides them now."""
    records = json.loads((ROOT / "benchmarks" / "results" / "gpu_aot.json").read_text())
    ks, head_dims = records["ks"], records["head_dims"]
    rows = {(v.kernel, v.config): v.row for v in aot.variants(ks, head_dims)}
    assert {(r["kernel"], r["config"]) for r in records["records"]} == set(rows)  # the matrix is still complete
    ok = {row: set(TARGETS) for row in rows.values()}
    for r in records["records"]:
        if not r["ok"]:
            ok[rows[r["kernel"], r["config"]]].discard(int(r["target"][3:]))
    assert ok == {row: set(gpu_targets.TABLE[row]) for row in ok}
    # the 256 rotation on fp32 inputs (its fp32 Hadamard and tiles) exceeds every GPU's shared memory: never chosen
    assert not gpu_targets.TABLE["int8_rows_h256"] and not gpu_targets.fused_rotation(256)
    fp32_h256 = [r for r in records["records"] if r["config"] == "fp32, Hadamard 256"]
    assert len(fp32_h256) == len(TARGETS) and not any(r["fits"] for r in fp32_h256)


def test_six_bit_p_fails_on_ampere_and_everything_else_compiles(compiled):
    results = compiled
    for target in (80, 86):
        c = results["int8_attention_p6", target]
        assert not c.compiles and "fp8e4nv not supported" in c.error
    assert all(c.compiles and c.fits for (row, t), c in results.items() if not (row == "int8_attention_p6" and t < 89))


def test_the_kernels_that_multiply_do_it_on_tensor_cores(compiled):
    results = compiled
    family = {80: "mma.sync", 86: "mma.sync", 89: "mma.sync", 90: "wgmma", 100: "tcgen05", 120: "mma.sync"}
    for (row, target), c in results.items():
        if row in ("int8_attention", "int8_attention_p6") and c.compiles:
            # INT8 Q·Kᵀ and FP16 P·V (the 6-bit P's E4M3 values are widened to FP16 for the MMA)
            assert {f"{family[target]} s8", f"{family[target]} f16"} <= set(c.mma) or (
                target == 100 and {"tcgen05 i8", "tcgen05 f16"} <= set(c.mma)), (row, target, c.mma)
        if row == "weight4":  # its 16-row tiles are below wgmma's and tcgen05's 64: mma.sync everywhere
            assert c.mma == ("mma.sync bf16",), (target, c.mma)
        if row == "int8_rows":  # the ±1 Hadamard in bf16 times bf16 inputs, fp32 sums
            assert c.mma == ("mma.sync bf16",) and c.registers <= 255, (target, c.mma)
        if row == "epilogue":  # scales only: no product
            assert c.mma == () and c.registers and c.registers <= 255


def test_compiling_here_says_to_use_fresh_processes():
    if not tri.interpreted():
        pytest.skip("this process compiles: the interpreter is off")
    with pytest.raises(RuntimeError, match="compile_many"):
        aot.compile_variant(SUBSET["epilogue"], 90)


def test_variants_are_what_the_wrappers_launch():
    names = {(v.kernel, v.config): v for v in aot.variants(ks=(1920, 5120), head_dims=(64, 128), dtypes=("bf16",))}
    assert dict(names["int8_attention", "bf16, head dim 64, P fp16"].constants)["DP"] == 64
    assert names["int8_attention", "bf16, head dim 128, P e3m2"].num_warps == 8  # 128 × 128 accumulators
    assert names["int8_attention", "bf16, head dim 128, P e3m2"].row == "int8_attention_p6"
    # 1920 = 2⁷·15: every rotation block up to 256 divides 5120, so both appear; per-channel INT4 per width
    assert {c for k, c in names if k == "int8_rows"} >= {"bf16, Hadamard 128", "bf16, Hadamard 256"}
    assert ("weight4", "bf16, INT4 per channel, K 1920") in names and ("weight4", "bf16, INT4 per channel, K 5120") in names


def test_capabilities_map_to_their_compiled_target():
    assert [gpu_targets.target_of(c) for c in [(7, 5), (8, 0), (8, 7), (8, 9), (9, 0), (10, 3), (11, 0), (12, 1)]] == \
        [None, 80, 86, 89, 90, 100, None, 120]
    with pytest.raises(ValueError, match="unknown GPU kernel 'fp6_mm'"):
        gpu_targets.runs("fp6_mm", (9, 0))


@pytest.mark.parametrize("capability", [(8, 0), (8, 6)])
def test_six_bit_p_on_ampere_runs_fp16_p_and_says_so(capability, monkeypatch, caplog):
    if not tri.installed():
        pytest.skip("needs triton")
    assert attention.triton_p_format("cuda", "e2m3", capability) == "fp16"
    assert attention.triton_p_format("cuda", "e3m2", (8, 9)) == "e3m2"
    sm = gpu_targets.sm(capability)
    assert attention.int8_attention_path("cuda", "e2m3", capability) == (
        f"real: sixbit Triton kernel (INT8 QKᵀ, FP16 PV, online softmax); E2M3 P does not compile for {sm}: "
        "FP16 P instead")
    assert "E2M3 P with E8M0 scales" in attention.int8_attention_path("cuda", "e2m3", (12, 0))
    monkeypatch.setattr(attention, "_LOGGED", set())
    with caplog.at_level(logging.WARNING, logger="sixbit.kernels.attention"):
        for _ in range(3):
            attention.triton_p_format("cuda", "e2m3", capability, log=True)
    assert [r.getMessage() for r in caplog.records] == [
        (f"E2M3 P does not compile for {sm} (Triton has E4M3 only from sm_89): attention runs with FP16 P instead "
        "(more accurate, no slower on this GPU)")]


def test_available_answers_for_a_capability_without_a_gpu():
    assert available("cuda", capability=(8, 6))["fp8"].startswith("not available")
    assert available("cuda", capability=(8, 9))["fp8"].startswith("real")
    assert available("cuda", capability=(9, 0))["nvfp4"].startswith("emulated")
    assert available("cuda", capability=(12, 0))["nvfp4"].startswith("real") == hasattr(torch, "float4_e2m1fn_x2")
    assert available("cuda", capability=(7, 5))["attention"].startswith("emulated")  # no Triton target before sm_80


def test_a_256_rotation_never_takes_the_fused_quantize():
    from sixbit.nn import QuantLinear
    from sixbit.nn.execution import operands

    lin = torch.nn.Linear(512, 16)
    assert operands(QuantLinear.from_linear(lin, "int8", act_mode="int8", hadamard_block=128)).plain_input
    assert not operands(QuantLinear.from_linear(lin, "int8", act_mode="int8", hadamard_block=256)).plain_input
