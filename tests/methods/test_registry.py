"""A method added in one place: registered here, it is installed by convert_model, removed,
saved and reloaded, without touching convert.py, conversion.py or checkpoint.py."""

import dataclasses

import pytest
import torch
from diffusers.hooks import ModelHook

import sixbit
from sixbit.methods.record import remove_methods
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
    assert list(sixbit.methods.registry.extensions())[-2:] == ["counter", "conversion"]

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
    with pytest.raises(ValueError, match="record writes what installed reads"):
        dataclasses.replace(SPEC, installed=_counter_config, record=lambda config, applied: config)


def _counter_config(model):
    hook = hooks.get(model, HOOK)
    return None if hook is None else hook.state.config


def test_a_method_applied_after_convert_is_saved_as_it_runs(counter, tmp_path):
    """Issue 48: a method applied (apply_x) after convert_model was not in the conversion record,
    so the checkpoint reloaded without it. With ``installed`` the record is read off the model."""
    registry.register_method(dataclasses.replace(counter, installed=_counter_config))
    model = _model()
    sixbit.convert_model(model, None, "w8a8")
    apply_counter(model, CounterConfig(3.0))
    path = sixbit.save(model, tmp_path / "m.safetensors")
    assert sixbit.read_header(path)["extensions"]["conversion"]["counter_scale"] == 3.0
    assert sixbit.conversion_of(sixbit.load(path, _model(seed=1))).applied["counter"] == CounterConfig(3.0)


def test_builtin_methods_applied_after_convert_reload_bit_exactly(tmp_path):
    from sixbit.methods.delta_cache import DeltaCacheConfig, enable_delta_cache
    from sixbit.methods.stabilize import StabilizeConfig, apply_stabilizer
    from sixbit.zoo.shapes import load_pipeline

    def video(pipe):
        return pipe("a red circle moving right", num_inference_steps=6, generator=torch.Generator().manual_seed(1)).frames

    pipe = load_pipeline("cogvideox")
    sixbit.convert_model(pipe, None, "w8a8")
    skips = DeltaCacheConfig(threshold=100.0, error_budget=100.0, warmup_steps=2, warmup_fraction=0.0, final_steps=0)
    cache = enable_delta_cache(pipe.transformer, skips)
    apply_stabilizer(pipe.transformer, StabilizeConfig(deadzone=0.3))
    expected = video(pipe)
    assert cache.report().skip_share > 0  # the cache acts on this run
    path = sixbit.save(pipe, tmp_path / "late.safetensors")
    fresh = load_pipeline("cogvideox")
    sixbit.load(path, fresh)
    conversion = sixbit.conversion_of(fresh)
    assert conversion.cache.config == skips and conversion.stabilizer.deadzone == 0.3
    assert (video(fresh) == expected).all()


def test_a_change_a_checkpoint_cannot_store_is_refused_before_writing(tmp_path):
    from sixbit.methods.dmpq import FixedAssignment, apply_dmpq

    model = _model()
    sixbit.convert_model(model, None, "w8a8")
    apply_dmpq(model, FixedAssignment([]))  # a baseline policy: nothing a checkpoint can hold
    with pytest.raises(ValueError) as error:
        sixbit.save(model, tmp_path / "m.safetensors")
    assert str(error.value) == ("the runtime method 'dmpq' was applied or removed after convert_model in a way a "
                                "checkpoint cannot store: save before changing it, or convert with it in the ConvertConfig")
    assert not (tmp_path / "m.safetensors").exists()


def test_methods_on_a_model_convert_model_did_not_convert_are_named_at_save(tmp_path, caplog):
    from sixbit.methods.attention import apply_attention_quant

    model = _model()
    sixbit.quantize(model, sixbit.QuantConfig(weight_format="int8"))
    apply_attention_quant(model)
    with caplog.at_level("WARNING", logger="sixbit.methods.record"):
        sixbit.save(model, tmp_path / "m.safetensors")
    assert caplog.messages == ["the runtime method(s) ['attention'] of this model, which convert_model did not convert, "
                               "are not stored: apply them again after sixbit.load, or convert with them (ConvertConfig)"]


def test_every_builtin_method_is_registered_in_order():
    names = [spec.name for spec in registry.methods()]
    assert names == ["static_w8a8", "default_precision", "dmpq", "stabilize", "cache", "attention", "sparse_attention"]
    assert list(registry.extensions()) == ["static_w8a8", "conversion"]
