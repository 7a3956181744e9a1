"""A method added from outside the package (issue 59): one package (``tests/fixtures/gain_method``)
plus one registration call, then chosen by its config's type in a ConvertConfig, converted, saved
(its config stored under its name), loaded, removed, recorded when applied late, and asked about
its capabilities by ``sixbit.parallel`` without any module there naming it."""

import json

import pytest
import torch

import sixbit
from fixtures.gain_method import GainConfig, apply_gain, register
from sixbit.config import ConvertConfig, QuantConfig
from sixbit.methods import registry
from sixbit.methods.record import remove_methods
from sixbit.runtime import hooks
from test_checkpoint import build, inputs


@pytest.fixture
def gain():
    spec = register()
    yield spec
    registry.unregister_method(spec.name)


def _config(*methods) -> ConvertConfig:
    return ConvertConfig(weights=QuantConfig(weight_format="int8"), activations="int8", methods=methods)


def _output(model) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs()).sample


def test_a_config_of_its_type_chooses_it_and_a_checkpoint_brings_it_back(gain, tmp_path):
    plain = sixbit.convert_model(build(0), None, _config())
    model = sixbit.convert_model(build(0), None, _config(GainConfig(0.5)))
    conversion = sixbit.conversion_of(model)
    assert conversion.applied["gain"] == GainConfig(0.5) and conversion.gain is conversion.methods["gain"]
    expected = _output(model)
    assert torch.equal(expected, _output(plain) * 0.5)  # it ran, with its config

    path = sixbit.save(model, tmp_path / "m.safetensors")
    stored = sixbit.read_header(path)["extensions"]["conversion"]["config"]
    assert stored["methods"] == {"gain": {"gain": 0.5}}  # stored by the method's name
    fresh = sixbit.load(path, build(1))
    assert sixbit.conversion_of(fresh).applied["gain"] == GainConfig(0.5)
    assert torch.equal(_output(fresh), expected)

    remove_methods(fresh)
    assert hooks.get(fresh, "test_output_gain") is None and sixbit.conversion_of(fresh) is None


def test_its_config_round_trips_through_json_and_is_refused_where_it_is_not_registered(gain, tmp_path):
    config = _config(GainConfig(2.0))
    data = json.loads(json.dumps(config.to_dict()))
    assert ConvertConfig.from_dict(data) == config
    assert "methods" not in _config().to_dict()  # a config without one is written as before
    with pytest.raises(ValueError, match=r"methods\.gain:.*gain must be a positive number"):
        ConvertConfig.from_dict({**data, "methods": {"gain": {"gain": -1.0}}})
    registry.unregister_method(gain.name)
    with pytest.raises(ValueError, match="no registered runtime method is called 'gain'.*register"):
        ConvertConfig.from_dict(data)
    with pytest.raises(ValueError, match="whose type no registered runtime method is chosen by"):
        _config(GainConfig(2.0))


def test_a_builtin_config_in_methods_and_two_of_one_kind_are_refused(gain):
    with pytest.raises(ValueError, match="set it as ConvertConfig.cache"):
        _config(sixbit.DeltaCacheConfig())
    with pytest.raises(ValueError, match="two GainConfig"):
        _config(GainConfig(1.0), GainConfig(2.0))


def test_applied_after_convert_it_is_saved_as_it_runs(gain, tmp_path):
    model = sixbit.convert_model(build(0), None, _config())
    apply_gain(model, GainConfig(3.0))  # no state_key, no select: recorded in the config by its type
    expected = _output(model)
    path = sixbit.save(model, tmp_path / "m.safetensors")
    assert sixbit.read_header(path)["extensions"]["conversion"]["config"]["methods"] == {"gain": {"gain": 3.0}}
    assert torch.equal(_output(sixbit.load(path, build(1))), expected)


def test_parallel_asks_its_capability_instead_of_naming_it(gain):
    from sixbit.parallel import feed_forward

    model = sixbit.convert_model(build(0), None, _config(GainConfig(0.5)))
    with pytest.raises(ValueError, match="the output gain is a test method that refuses chunks.*'gain'"):
        feed_forward.check_chunkable(model)
    remove_methods(model)
    feed_forward.check_chunkable(model)  # without it, nothing refuses
