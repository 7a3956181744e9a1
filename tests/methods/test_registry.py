"""A method added in one place: registered here, it is installed by convert_model, removed,
saved and reloaded, without touching convert.py, conversion.py or checkpoint.py."""

import dataclasses

import pytest
import torch
from diffusers.hooks import ModelHook

import sixbit
from sixbit.conversion import remove_methods
from sixbit.methods import registry
from sixbit.runtime import hooks

HOOK = "test_call_counter"


@dataclasses.dataclass(frozen=True)
class CounterConfig:
    scale: float = 2.0


class CounterState:
    def __init__(self, config: CounterConfig):
        self.config, self.calls = config, 0


class _CounterHook(ModelHook):
    def __init__(self, state: CounterState):
        super().__init__()
        self.state = state

    def pre_forward(self, module, *args, **kwargs):
        self.state.calls += 1
        return args, kwargs


def apply_counter(model, config: CounterConfig) -> CounterState:
    remove_counter(model)
    state = CounterState(config)
    hooks.register(model, _CounterHook(state), HOOK)
    return state


def remove_counter(model) -> None:
    hooks.remove(model, HOOK)


def _load(value, model, modules) -> CounterConfig:
    if not isinstance(value, float):
        raise ValueError(f"the counter's scale {value!r} is not a number")
    return CounterConfig(value)


def _export(model):
    hook = hooks.get(model, HOOK)
    return None if hook is None else ({"version": 1}, {"scale": torch.tensor([hook.state.config.scale])})


def _prepare(model, modules, meta, tensors):
    if meta != {"version": 1} or tensors["scale"].shape != (1,):
        raise ValueError("the counter's extension is malformed")
    return lambda: None


SPEC = registry.MethodSpec(
    name="counter",
    config_type=CounterConfig,
    order=60,
    attribute=None,
    select=lambda config, extra: extra.get("counter", CounterConfig()) if config.activations == "int8" else None,
    apply=apply_counter,
    remove=remove_counter,
    state_key="counter_scale",
    dump=lambda config: config.scale,
    load=_load,
    export=_export,
    prepare=_prepare,
)


@pytest.fixture
def counter():
    registry.register_method(SPEC)
    yield SPEC
    registry.unregister_method(SPEC.name)


def _inputs():
    from test_checkpoint import inputs

    return inputs()


def _model(seed=0):
    from test_checkpoint import build

    return build(seed)


def test_a_registered_method_is_installed_removed_saved_and_loaded(counter, tmp_path):
    model = _model()
    sixbit.convert_model(model, None, "w8a8")
    conversion = sixbit.conversion_of(model)
    state = conversion.methods["counter"]
    assert conversion.applied["counter"] == CounterConfig(2.0)
    with torch.no_grad():
        expected = model(**_inputs()).sample
    assert state.calls == 1

    path = sixbit.save(model, tmp_path / "m.safetensors")
    header = sixbit.read_header(path)
    assert header["extensions"]["conversion"]["counter_scale"] == 2.0
    assert header["extensions"]["counter"] == {"version": 1}
    assert list(sixbit.checkpoint.extensions())[-2:] == ["counter", "conversion"]

    fresh = sixbit.load(path, _model(seed=1))
    loaded = sixbit.conversion_of(fresh)
    assert loaded.applied["counter"] == CounterConfig(2.0)
    with torch.no_grad():
        assert torch.equal(fresh(**_inputs()).sample, expected)
    assert loaded.methods["counter"].calls == 1

    remove_methods(fresh)
    assert hooks.get(fresh, HOOK) is None and sixbit.conversion_of(fresh) is None


def test_a_file_with_the_method_is_refused_where_it_is_not_registered(counter, tmp_path):
    model = _model()
    sixbit.convert_model(model, None, "w8a8")
    path = sixbit.save(model, tmp_path / "m.safetensors")
    registry.unregister_method(counter.name)
    fresh = _model(seed=1)
    with pytest.raises(ValueError, match="counter"):
        sixbit.load(path, fresh)
    assert sixbit.conversion_of(fresh) is None


def test_a_spec_that_does_nothing_or_half_a_pair_is_refused():
    with pytest.raises(ValueError, match="apply and remove go together"):
        dataclasses.replace(SPEC, remove=None)
    with pytest.raises(ValueError, match="state_key needs dump and load"):
        dataclasses.replace(SPEC, load=None)
    with pytest.raises(ValueError, match="does nothing"):
        dataclasses.replace(SPEC, apply=None, remove=None, export=None, prepare=None)


def test_every_builtin_method_is_registered_in_order():
    names = [spec.name for spec in registry.methods()]
    assert names == ["static_w8a8", "default_precision", "dmpq", "stabilize", "cache", "attention"]
    assert list(registry.extensions()) == ["static_w8a8", "conversion"]
