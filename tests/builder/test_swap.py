"""The one build path (:func:`sixbit.builder.build`): parts in execution order, layers swapped in
part by part, and one rollback that leaves the model as it was whichever step fails."""

import pytest
import torch

import sixbit
from sixbit.builder import OUTSIDE, LayerSwap, Recipe, build, parts_of, plan_layers
from sixbit.config import QuantConfig
from sixbit.methods.static_w8a8 import method as static_method
from sixbit.nn import QuantLinear
from fixtures.tiny_models import build_tiny, sample


class Injected(Exception):
    """The failure a test injects: nothing else raises it."""


def _snapshot(model):
    return ({k: v.detach().clone() for k, v in model.state_dict().items()},
            [(name, type(m)) for name, m in model.named_modules()])


def _assert_unchanged(model, snapshot):
    state, modules = snapshot
    assert [(name, type(m)) for name, m in model.named_modules()] == modules
    now = model.state_dict()
    assert list(now) == list(state) and all(torch.equal(now[k], state[k]) for k in state)


def test_parts_follow_the_blocks_and_put_outside_layers_first_or_with_block_zero():
    model = build_tiny("wan").model
    plan = plan_layers(model, QuantConfig(weight_format="int8", role_formats={"embedding": "int8", "output": "int8"}))
    outside = [n for n in plan if not n.startswith("blocks.")]
    assert outside  # the embedding layers lie outside the blocks
    alone = parts_of(model, plan)
    assert [p.name for p in alone] == [OUTSIDE] + [f"blocks.{i}" for i in range(len(alone) - 1)]
    assert alone[0].module is model and alone[0].layers == outside
    assert [n for p in alone for n in p.layers] == outside + [n for n in plan if n.startswith("blocks.")]
    joined = parts_of(model, plan, outside_alone=False)
    assert joined[0].name == "blocks.0"
    assert joined[0].layers == [n for n in plan if n in outside or n.startswith("blocks.0.")]  # in plan order
    assert sorted(n for p in joined for n in p.layers) == sorted(plan)


@pytest.mark.parametrize("step", ["layer", "built", "finish"])
def test_a_failing_step_puts_every_layer_back(step):
    tm = build_tiny("cogvideox")
    snapshot = _snapshot(tm.model)
    plan = plan_layers(tm.model, QuantConfig(weight_format="int8"))
    parts = parts_of(tm.model, plan)
    fail_in = parts[-1].name  # every earlier part is swapped in when it fails

    class Failing(Recipe):
        def layer(self, name, original, stats):
            if step == "layer" and name == parts[-1].layers[-1]:
                raise Injected(step)
            return torch.nn.Identity()

        def built(self, part, layers, swap):
            if step == "built" and part.name == fail_in:
                raise Injected(step)

        def finish(self, swap):
            if step == "finish":
                raise Injected(step)

    with pytest.raises(Injected):
        build(tm.model, parts, Failing())
    _assert_unchanged(tm.model, snapshot)


def test_forgotten_layers_stay_and_put_back_layers_can_return():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    first, second = model[0], model[1]
    swap = LayerSwap(model)
    swap.put({"0": torch.nn.Identity(), "1": torch.nn.Identity()})
    assert swap.original("0") is first
    swap.put_back(["1"])
    assert model[1] is second and swap.original("1") is second
    swap.forget(["0"])
    swap.rollback()
    assert isinstance(model[0], torch.nn.Identity) and model[1] is second


def test_static_w8a8_failing_mid_build_leaves_the_model_unchanged(monkeypatch):
    tm = build_tiny("cogvideox")
    data = sixbit.calibrate(tm.model, lambda: sample(tm, 4))
    snapshot = _snapshot(tm.model)
    real, fitted = static_method.fit_layer, []

    def failing(*args, **kwargs):
        fitted.append(1)
        if len(fitted) > 7:  # block 0 (six layers) is swapped in by now
            raise Injected("fit")
        return real(*args, **kwargs)

    monkeypatch.setattr(static_method, "fit_layer", failing)
    with pytest.raises(Injected):
        sixbit.apply_static_w8a8(tm.model, None, data)
    _assert_unchanged(tm.model, snapshot)
    assert not any(isinstance(m, QuantLinear) for m in tm.model.modules())
