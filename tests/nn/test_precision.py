import pytest
import torch

from sixbit.nn import ActMode, QuantLinear, precision
from sixbit.nn.precision import Level, PrecisionScope


def _layer(mode="int8"):
    return QuantLinear.from_linear(torch.nn.Linear(32, 16), "nvfp4", act_mode=mode)


def test_precedence_refresh_over_step_over_default_over_the_layer():
    layer, x = _layer("fp"), torch.randn(2, 32)
    scope = PrecisionScope()
    answers = {"default": ActMode.INT8, "step": None, "refresh": None}
    scope.register(Level.REFRESH, lambda m, v: answers["refresh"])
    scope.register(Level.DEFAULT, lambda m, v: answers["default"])
    scope.register(Level.STEP, lambda m, v: answers["step"])
    assert precision.decide(layer, x) is ActMode.FP  # no active scope: the layer's own
    with precision.active(scope):
        assert precision.decide(layer, x) is ActMode.INT8
        answers["step"] = ActMode.NVFP4
        assert precision.decide(layer, x) is ActMode.NVFP4
        answers["refresh"] = ActMode.FP
        assert precision.decide(layer, x) is ActMode.FP
        assert scope.decide(layer, x, below=Level.REFRESH) is ActMode.NVFP4


def test_one_policy_per_level_and_observers_see_every_gemm():
    scope = PrecisionScope()
    first = lambda m, v: ActMode.INT8  # noqa: E731
    scope.register(Level.STEP, first)
    scope.register(Level.STEP, first)  # the same policy again: no error
    with pytest.raises(ValueError, match="already registered"):
        scope.register(Level.STEP, lambda m, v: None)
    seen = []
    scope.observers.append(lambda m, v, mode: seen.append((tuple(v.shape), mode)))
    layer = _layer("fp")
    with precision.active(scope):
        layer(torch.randn(3, 32))
        layer(torch.randn(1, 32), ActMode.NVFP4)  # an explicit mode bypasses the policies
    assert seen == [((3, 32), ActMode.INT8), ((1, 32), ActMode.NVFP4)]


def test_highest_and_mode_parsing():
    assert precision.highest(ActMode.NVFP4, ActMode.INT8) is ActMode.INT8
    assert precision.highest(ActMode.INT8, ActMode.FP, ActMode.NVFP4) is ActMode.FP
    with pytest.raises(ValueError, match="valid"):
        precision.act_mode("int4")
    assert precision.average_bits({"int8": 1.0, "nvfp4": 1.0}) == pytest.approx(6.25)
