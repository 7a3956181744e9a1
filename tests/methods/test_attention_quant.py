"""Quantized attention: the kernel's reference against exact attention, and the method per block and step."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sixbit.kernels.attention import (
    _int8_blocks,
    int8_attention,
    int8_attention_reference,
)
from sixbit.methods.attention import (
    AttentionQuantConfig,
    apply_attention_quant,
    attention_quant_of,
    remove_attention_quant,
)
from sixbit.zoo.shapes import load_pipeline


def test_int8_blocks_scale_each_block_by_its_abs_max():
    x = torch.tensor([[1.0, -2.0], [0.5, 0.0], [0.0, 0.0], [127.0, 3.0], [0.25, 0.0]])  # 5 tokens, blocks of 2
    codes, scale = _int8_blocks(x, 2)
    assert scale.reshape(-1).tolist() == pytest.approx([2 / 127, 2 / 127, 1.0, 1.0, 0.25 / 127])
    assert codes.tolist() == [[64.0, -127.0], [32.0, 0.0], [0.0, 0.0], [127.0, 3.0], [127.0, 0.0]]


def test_int8_attention_is_close_to_exact_attention_and_ignores_a_key_offset():
    q, k, v = torch.randn(2, 3, 150, 64), torch.randn(2, 3, 150, 64), torch.randn(2, 3, 150, 64)
    exact = F.scaled_dot_product_attention(q, k, v)
    y = int8_attention_reference(q, k, v)
    assert ((y - exact).norm() / exact.norm()) < 0.03
    # K's shared offset (large in DiTs) is smoothed away: a large one costs nothing
    offset = 40 * torch.randn(1, 1, 1, 64)
    torch.testing.assert_close(int8_attention_reference(q, k + offset, v), y, rtol=0, atol=2e-3)
    assert ((F.scaled_dot_product_attention(q, k + offset, v) - exact).abs().max() < 1e-3)  # softmax ignores it too
    # chunking the queries changes nothing; on CPU the dispatcher runs the reference
    assert torch.equal(int8_attention_reference(q, k, v, chunk=128), y)
    assert torch.equal(int8_attention(q, k, v), y)


def test_low_bit_p_rounds_each_32_keys_on_its_own_grid():
    from sixbit.formats import mx
    from sixbit.kernels.attention import round_probabilities

    p = torch.rand(3, 64) ** 4  # probabilities: many small, a few large
    p[0, :32] = 0.0  # an all-zero block stays zero
    six = round_probabilities(p, "e2m3")
    assert torch.equal(six, mx.quantize(p, "e2m3").dequantize()) and torch.equal(six[0, :32], p[0, :32])
    eight = round_probabilities(p, "int8")
    step = p.reshape(3, 2, 32).amax(-1, keepdim=True) / 127
    codes = eight.reshape(3, 2, 32) / step.clamp_min(1e-30)
    assert torch.all((codes - codes.round()).abs() < 1e-3) and codes.max() <= 127 + 1e-3  # whole codes per block
    assert (eight - p).abs().max() <= step.max() / 2 + 1e-7


@pytest.mark.parametrize("p_format", ["int8", "e2m3", "e3m2"])
def test_low_bit_p_stays_close_to_exact_attention(p_format):
    q, k, v = torch.randn(2, 3, 150, 64), torch.randn(2, 3, 150, 64) + 2, torch.randn(2, 3, 150, 64)
    exact = F.scaled_dot_product_attention(q, k, v)
    y = int8_attention_reference(q, k, v, p_format=p_format)
    # on random inputs P is flat (150 keys of similar weight): 6-bit P's 3 mantissa bits show
    # (measured: INT8 P 1.5 %, E2M3 3.8 %, E3M2 4.6 % against 1.2 % with FP16 P)
    assert 0 < ((y - int8_attention_reference(q, k, v)).norm() / exact.norm()) < 0.05
    assert ((y - exact).norm() / exact.norm()) < 0.06
    assert torch.equal(int8_attention(q, k, v, p_format=p_format), y)  # on CPU the dispatcher runs the reference
    assert torch.equal(int8_attention_reference(q, k, v, chunk=128, p_format=p_format), y)


def test_int8_attention_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="same leading dims"):
        int8_attention_reference(torch.randn(1, 2, 5, 8), torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8))


def _generate(pipe, steps=4):
    return pipe("a red circle moving right", num_inference_steps=steps, generator=torch.Generator().manual_seed(3)).frames


@pytest.mark.parametrize("arch", ["cogvideox", "wan"])
def test_attention_quant_per_block_and_step_and_removal(arch):
    pipe = load_pipeline(arch)
    reference = _generate(pipe)
    state = apply_attention_quant(pipe.transformer, AttentionQuantConfig(blocks=(1, None), steps=(2, None)))
    video = _generate(pipe)
    assert state.path.startswith("emulated") and attention_quant_of(pipe.transformer) is state
    # steps 2, 3 of 4 in blocks 1… quantized; the rest (and steps 0, 1 everywhere) in full precision
    assert state.quantized_calls > 0 and state.full_precision_calls > state.quantized_calls // 2
    assert state.unsupported_calls == 0
    assert not np.array_equal(video, reference) and np.abs(video - reference).max() < 0.2
    # no step selected (a range of blocks past the model is refused: see below): bit-identical to full precision
    state = apply_attention_quant(pipe.transformer, AttentionQuantConfig(steps=(1000, None)))
    assert np.array_equal(_generate(pipe), reference) and state.quantized_calls == 0
    remove_attention_quant(pipe.transformer)
    assert attention_quant_of(pipe.transformer) is None and np.array_equal(_generate(pipe), reference)


def test_attention_quant_runs_p_in_the_configured_format():
    pipe = load_pipeline("wan")
    fp16 = apply_attention_quant(pipe.transformer, AttentionQuantConfig())
    video = _generate(pipe, steps=2)
    six = apply_attention_quant(pipe.transformer, AttentionQuantConfig(p_format="e2m3"))
    assert "E2M3 P" in six.path and "E2M3 P" not in fp16.path
    six_video = _generate(pipe, steps=2)
    assert six.quantized_calls > 0 and not np.array_equal(six_video, video) and np.abs(six_video - video).max() < 0.2


def test_attention_quant_leaves_masked_calls_alone():
    from sixbit.methods.attention.method import AttentionQuantState, _QuantSDPA

    state = AttentionQuantState(AttentionQuantConfig())
    q = torch.randn(1, 2, 6, 8)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    with _QuantSDPA(state):
        y = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        F.scaled_dot_product_attention(query=q, key=q, value=q)
    assert torch.equal(y, F.scaled_dot_product_attention(q, q, q, attn_mask=mask))
    assert (state.unsupported_calls, state.quantized_calls) == (1, 1)


def test_attention_quant_config_is_checked():
    with pytest.raises(ValueError, match="blocks must be None or"):
        AttentionQuantConfig(blocks=(1,))
    with pytest.raises(ValueError, match="steps must be None or"):
        AttentionQuantConfig(steps=(-1, 3))
    with pytest.raises(ValueError, match="p_format must be one of fp16, int8, e2m3, e3m2"):
        AttentionQuantConfig(p_format="fp6")
    assert AttentionQuantConfig(p_format="e3m2").describe() == "blocks all, steps all, P in E3M2"


def test_int8_attention_path_names_the_kernel_each_device_runs(monkeypatch):
    from sixbit.kernels import attention

    assert attention.int8_attention_path("cpu").startswith("emulated")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert attention.int8_attention_path("cuda").startswith("emulated")  # no INT8 tl.dot before sm_80
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert attention.int8_attention_path("cuda").startswith("real: sixbit Triton kernel")
    assert "E2M3 P with E8M0 scales" in attention.int8_attention_path("cuda", "e2m3")
    assert attention.int8_attention_path("cuda", "int8").startswith("emulated: INT8 QKᵀ and INT8 P")
    monkeypatch.setattr(attention, "sageattention_installed", lambda: True)
    assert attention.int8_attention_path("cuda").startswith("real: sageattention")
    assert attention.int8_attention_path("cuda", "e3m2").startswith("real: sixbit Triton kernel")  # not sageattention's
    assert attention.int8_attention_path("cpu").startswith("emulated")


def test_a_pipeline_is_accepted_and_blocks_beyond_the_model_are_refused():
    """Issue 48: apply_attention_quant(pipe) raised AttributeError from diffusers, and a block
    range past the model's last block was accepted and quantized nothing."""
    pipe = load_pipeline("wan")
    count = len(pipe.transformer.blocks)
    with pytest.raises(ValueError, match=rf"blocks=\({count}, None\) selects none of .* {count} blocks"):
        apply_attention_quant(pipe, AttentionQuantConfig(blocks=(count, None)))
    assert attention_quant_of(pipe.transformer) is None
    state = apply_attention_quant(pipe, AttentionQuantConfig(blocks=(count - 1, None)))
    assert attention_quant_of(pipe.transformer) is state
    remove_attention_quant(pipe)
    assert attention_quant_of(pipe.transformer) is None


STEPS_OUTSIDE = ("quantized attention's steps=(2, None) selects no step of this 2-step run (steps 0–1): its attention "
                 "runs in full precision; choose steps that start below 2, or steps=None for every step")


def test_a_steps_window_past_the_run_is_warned_about_once_at_the_first_call(caplog):
    """Issue 48: steps=(50, None) with a 3-step generation was accepted and quantized nothing,
    without a word. The step count is only known when a run starts: a pipeline says it at its
    first call."""
    pipe = load_pipeline("wan")
    state = apply_attention_quant(pipe, AttentionQuantConfig(steps=(2, None)))
    with caplog.at_level("WARNING", logger="sixbit.methods.attention.method"):
        _generate(pipe, steps=3)  # selects step 2: nothing to say
        assert caplog.messages == [] and state.quantized_calls > 0
        _generate(pipe, steps=2)
        _generate(pipe, steps=2)  # once per step count, not once per run
        assert caplog.messages == [STEPS_OUTSIDE]
        calls = []
        pipe.transformer.register_forward_hook(lambda *_: calls.append(len(caplog.messages)))
        state.quantized_calls = 0
        _generate(pipe, steps=1)
        assert calls[0] == 2 and "1-step run (step 0)" in caplog.messages[1]  # warned within the run's first call
    assert state.quantized_calls == 0


def test_a_plain_loop_is_told_when_its_run_ends(caplog):
    """Without a pipeline's cache context the step count is known once the run ends (the next
    one starts, or the tracker is told)."""
    pipe = load_pipeline("wan")
    apply_attention_quant(pipe, AttentionQuantConfig(steps=(2, None)))
    g = torch.Generator().manual_seed(1)
    inputs = {"hidden_states": torch.randn(1, 3, 4, 32, 32, generator=g),
              "encoder_hidden_states": torch.randn(1, 10, 64, generator=g), "return_dict": False}
    with caplog.at_level("WARNING", logger="sixbit.methods.attention.method"), torch.no_grad():
        for t in (900, 500):  # two steps
            pipe.transformer(**inputs, timestep=torch.tensor([t]))
        assert caplog.messages == []
        pipe.transformer(**inputs, timestep=torch.tensor([900]))  # a new run: the last one had 2 steps
        assert caplog.messages == [STEPS_OUTSIDE]
    remove_attention_quant(pipe)
    from sixbit.runtime.context import tracker_of

    tracker_of(pipe.transformer).new_generation()  # removed: it no longer listens
    assert len(caplog.messages) == 1
