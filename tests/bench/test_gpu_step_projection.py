"""benchmarks/gpu_step_projection.py: each preset's projected path is the one the dispatcher chooses
for that GPU capability (``sixbit.kernels.available(capability=...)``), not a guess."""

import importlib.util
import sys
from pathlib import Path

import pytest

from sixbit.kernels import available
from sixbit.kernels.paths import Path as KernelPath
from sixbit.presets import PRESETS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_step_projection.py"


@pytest.fixture(scope="module")
def projection():
    spec = importlib.util.spec_from_file_location("gpu_step_projection", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("capability", [(9, 0), (8, 9), (8, 0)])
def test_projected_paths_follow_the_dispatcher(projection, capability):
    answer = available("cuda", capability=capability)
    plans = projection.plan(capability)
    assert set(plans) == set(PRESETS)
    paths = {name: {c.path for key, calls in p["calls"].items() if not key[3] for c in calls}  # key[3]: boundary block
             for name, p in plans.items()}
    nvfp4 = KernelPath.NVFP4 if answer["nvfp4"].startswith("real") else KernelPath.NVFP4_EMULATED
    assert paths["w4a4"] == {nvfp4}
    fused = "fused quantize" in answer["int8"]
    assert (KernelPath.INT8_FUSED in paths["w8a8"]) == fused
    assert (KernelPath.W4A16 in paths["w4a16"]) == answer["w4a16"].startswith("real")
    assert paths["w8a8-static"] == {KernelPath.INT8_STATIC}
    # balanced's DMPQ: NVFP4 where FP4 GEMMs are real, else INT8 everywhere (sixbit.presets.for_device)
    assert (nvfp4 in paths["balanced"]) == (nvfp4 is KernelPath.NVFP4)
    # a low-rank branch makes the input not plain: the W4 recipe's INT8 calls are the unfused path
    assert KernelPath.INT8 in paths["w4a8"] and KernelPath.INT8_FUSED not in paths["w4a8"]


def test_step_counts_every_block_linear_once_per_block(projection):
    from sixbit.bench.layer_shapes import REAL_MODELS

    gpu = {"bw": 1e12, "bf16": 1e14, "int8": 2e14, "fp32": 1e13, "memory": 80e9}
    plans = projection.plan((9, 0))
    model = REAL_MODELS["CogVideoX-2B"]
    skips = {model.name: {"tdc": 0.5, "balanced": 0.5, "tdc-2": 0.55}}

    def kernels(m, k, n, g):
        return {"bf16 F.linear": 1.0}

    bf16 = projection.step("bf16", None, model, {"joint": 100}, gpu, kernels, skips)
    assert bf16["paths"] == {"fp": model.layers * len(model.linears)}
    assert bf16["linears_ms"] == pytest.approx(1e3 * model.layers * len(model.linears))
    tdc = projection.step("tdc", plans["tdc"], model, {"joint": 100}, gpu, kernels, skips)
    assert tdc["mean_step_ms"] == pytest.approx(0.5 * tdc["step_ms"]) and tdc["cache_method"] == "tdc"
    # high_quality keeps its first and last block in full precision
    hq = plans["high_quality"]["calls"][("attention", 1920, 1920, True)]
    assert [c.path for c in hq] == [KernelPath.FP]
