import pytest
import torch
from diffusers.models.attention import FeedForward

import sixbit
from sixbit.nn import QuantLinear
from sixbit.runtime.fusion import HOOK_NAME, fuse_activations


def _ff(activation_fn: str, act_mode: str = "int8") -> FeedForward:
    torch.manual_seed(0)
    ff = FeedForward(64, activation_fn=activation_fn).eval()
    ff.net[0].proj = QuantLinear.from_linear(ff.net[0].proj, "int8", act_mode=act_mode)
    ff.net[2] = QuantLinear.from_linear(ff.net[2], "int8", act_mode=act_mode)
    return ff


@pytest.mark.parametrize("activation_fn", ["gelu", "gelu-approximate"])
@pytest.mark.parametrize("act_mode", ["int8", "fp"])
def test_fused_feed_forward_gives_the_unfused_output(activation_fn, act_mode):
    ff = _ff(activation_fn, act_mode)
    x = torch.randn(2, 7, 64, dtype=torch.bfloat16)
    ff.to(torch.bfloat16)
    before = ff(x)
    calls = []
    ff.net[0].proj.register_forward_hook(lambda m, args, kwargs, out: calls.append(kwargs), with_kwargs=True)
    assert fuse_activations(ff) == 1 and fuse_activations(ff) == 1  # idempotent
    fused = ff(x)
    assert calls[-1] == {"activation": "gelu-tanh" if activation_fn == "gelu-approximate" else "gelu",
                         "quantize_output": act_mode == "int8"}  # the second linear reads per-token codes
    torch.testing.assert_close(fused.float(), before.float(), rtol=2**-6, atol=2**-6)
    assert fuse_activations(ff, enabled=False) == 0
    assert torch.equal(ff(x), before) and calls[-1] == {}


def test_keep_int8_weights_fuses_and_unfuses():
    from diffusers.hooks import HookRegistry

    ff = _ff("gelu-approximate")
    sixbit.keep_int8_weights(ff)
    assert HookRegistry.check_if_exists_or_initialize(ff.net[0]).get_hook(HOOK_NAME) is not None
    sixbit.keep_int8_weights(ff, enabled=False)
    assert HookRegistry.check_if_exists_or_initialize(ff.net[0]).get_hook(HOOK_NAME) is None


def test_a_plain_linear_is_left_alone():
    ff = FeedForward(32, activation_fn="gelu-approximate")
    assert fuse_activations(ff) == 0 and not hasattr(ff.net[0], "_diffusers_hook")


@pytest.mark.skipif(not __import__("sixbit.kernels", fromlist=["amx_int8"]).amx_int8(), reason="no AMX INT8 on this CPU")
@pytest.mark.parametrize("weights", ["int8", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_first_linear_quantizes_the_second_ones_input(weights, dtype, monkeypatch):
    from sixbit import kernels

    torch.manual_seed(0)
    ff = FeedForward(64, activation_fn="gelu-approximate").eval()
    block = 32 if weights == "nvfp4" else None  # a rotating 4-bit layer: its folded copy takes codes as they come
    for i in (0, 2):
        parent, name = (ff.net[0], "proj") if i == 0 else (ff.net, "2")
        setattr(parent, name, QuantLinear.from_linear(getattr(parent, name), weights, hadamard_block=block, act_mode="int8"))
    ff.to(dtype)
    sixbit.keep_int8_weights(ff)
    assert ff.net[2].reads_token_codes()
    x = torch.randn(2, 7, 64, dtype=dtype)
    quantized = []
    real = kernels.quantize_rows
    monkeypatch.setattr(kernels, "quantize_rows", lambda t: quantized.append(t.shape) or real(t))
    fused = ff(x)
    assert quantized == [(14, 64)]  # the first linear's input only: the second's codes came from the first's epilogue
    monkeypatch.setattr(QuantLinear, "reads_token_codes", lambda self: False)
    assert torch.equal(ff(x), fused) and quantized[1:] == [(14, 64), (14, 256)]
    monkeypatch.undo()
    quantize_output = kernels.scale_epilogue_quantize
    monkeypatch.setattr(kernels, "scale_epilogue_quantize", lambda *a: quantized.append("epilogue") or quantize_output(*a))
    with torch.inference_mode():  # no version counter to tell a changed input: nothing remembered, so not made
        assert torch.equal(ff(x), fused) and "epilogue" not in quantized
    assert torch.equal(ff(x), fused) and quantized[-1] == "epilogue"
