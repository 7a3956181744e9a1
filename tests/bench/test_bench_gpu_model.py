"""The GPU projection and the real-model FLOP counts, checked by hand."""

import pytest

from sixbit.bench import gpu_model
from sixbit.bench.layer_shapes import REAL_MODELS, model_flops

FP = {"gemm": {"fp": 600.0}, "attention": 400.0}


def test_projection_by_hand():
    run = {"gemm": {"fp": 100.0, "int8": 200.0, "nvfp4": 300.0}, "attention": 400.0}
    # Blackwell: 100/1 + 200/2 + 300/4 + 400/1 = 675 vs 1000
    assert gpu_model.projected_speedup(FP, run, gpu_model.GPUS["B200"]) == pytest.approx(1000 / 675)
    assert gpu_model.projected_speedup(FP, run, gpu_model.GPUS["RTX 5090"]) == pytest.approx(1000 / 675)
    # Hopper has no FP4: NVFP4 GEMMs at the BF16 rate: 100 + 100 + 300 + 400 = 900
    assert gpu_model.projected_speedup(FP, run, gpu_model.GPUS["H100/H200"]) == pytest.approx(1000 / 900)


def test_skipped_work_and_scale_transfer():
    # a cache that skipped half the blocks: half the GEMMs and half the attention
    run = {"gemm": {"fp": 300.0}, "attention": 200.0}
    out = gpu_model.project(FP, run, {"big": (9000.0, 1000.0)})
    assert out["as run"]["B200"] == pytest.approx(2.0)
    assert out["big"]["H100/H200"] == pytest.approx(2.0)
    # INT8 everywhere at a scale where attention is 10% of FP time: 10000 / (4500 + 1000)
    out = gpu_model.project(FP, {"gemm": {"int8": 600.0}, "attention": 400.0}, {"big": (9000.0, 1000.0)})
    assert out["big"]["B200"] == pytest.approx(10000 / 5500)
    assert out["as run"]["B200"] == pytest.approx(1000 / 700)


def test_unknown_precision_is_an_error():
    with pytest.raises(ValueError, match="no throughput for precision"):
        gpu_model.GPUS["B200"].seconds({"fp8": 1.0}, 0.0)


def test_real_model_flops_by_hand():
    m = REAL_MODELS["CogVideoX-2B"]
    length, d = 17550 + 226, 1920
    gemm, attention = m.block_flops()
    assert gemm == pytest.approx(2 * length * (4 * d * d + 2 * d * 4 * d))
    assert attention == pytest.approx(4 * length * length * d)
    g, a = model_flops("CogVideoX-2B", steps=50, cfg=True)
    assert g == pytest.approx(gemm * 30 * 50 * 2)
    wan = REAL_MODELS["Wan2.1-14B"]
    gw, aw = wan.block_flops()
    lv, lt, d = 20280, 512, 5120
    assert gw == pytest.approx(2 * (6 * lv * d * d + 2 * lt * d * d + 2 * lv * d * 13824))
    assert aw == pytest.approx(4 * lv * (lv + lt) * d)
    with pytest.raises(ValueError, match="unknown real model"):
        model_flops("Sora")


def test_layer_table_labels_emulation_and_projection():
    from sixbit.bench.layer_shapes import PRECISIONS
    from sixbit.bench.outputs import layer_markdown

    row = {"model": "CogVideoX-2B", "role": "FFN up", "k": 1920, "n": 7680, "tokens": 17776, "precision": "nvfp4",
           "how": PRECISIONS["nvfp4"], "measured_rows": [128, 512], "ms_per_call": 12.5, "baseline": "bf16", "speedup": 0.25, "speedup_fp32": 0.5}
    md = layer_markdown([row], "test machine")
    assert "EMULATED" in md and "PROJECTION" in md and "| 1920 → 7680 | 17,776 |" in md
    assert "| ms/call | × bf16 | × fp32 |" in md and "| 12.5 | 0.25× | 0.50× |" in md  # the baseline is named
