"""The shipped shapes models quantize, track steps and generate through their own pipelines."""

import pytest
import torch

import sixbit
from sixbit.eval.metrics import psnr
from sixbit.zoo.shapes import load_pipeline

PROMPT = "a blue square moving up"


def _video(pipe, steps=8):
    return pipe(PROMPT, num_inference_steps=steps, generator=torch.Generator().manual_seed(5)).frames


@pytest.mark.parametrize("arch", ["cogvideox", "wan"])
def test_quantized_shipped_model_generates_close_to_fp(arch):
    pipe = load_pipeline(arch)
    ref = _video(pipe)
    tracker = sixbit.track_steps(pipe.transformer)
    seen = []
    pipe(PROMPT, num_inference_steps=3, generator=torch.Generator().manual_seed(5),
         callback_on_step_end=lambda p, i, t, kw: seen.append((tracker.info.step, tracker.info.branch)) or {})
    expected_branch = "cond_uncond" if arch == "cogvideox" else "uncond"  # the last call of each step
    assert seen == [(0, expected_branch), (1, expected_branch), (2, expected_branch)]
    assert tracker.info is None  # the pipeline's end reset the per-run state
    sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="int8"))
    int8 = _video(pipe)
    pipe = load_pipeline(arch)
    sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="nvfp4", hadamard_block=128))
    s = sixbit.summary(pipe.transformer)
    nvfp4 = _video(pipe)
    assert psnr(int8, ref) > 30 and psnr(nvfp4, ref) > 20 and psnr(int8, ref) > psnr(nvfp4, ref)
    quantized = [r for r in s.layers if r.format == "nvfp4"]
    assert sum(r.bytes_before for r in quantized) / sum(r.bytes_after for r in quantized) > 7  # fp32 → 4.5 bits
    assert s.bytes_after < s.bytes_before
