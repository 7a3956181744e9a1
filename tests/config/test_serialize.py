"""The one dataclass ↔ dict serializer of the configs, and the dict form checkpoints store.

``config_dicts_before_43.json`` holds ``ConvertConfig.to_dict()`` as the code before issue 43
wrote it (``json.dumps(preset(name).to_dict())`` and two hand-built configs with tuples, lists
and every method config): checkpoints and config files carry that form, so it must read back to
an equal config and be written again key for key.
"""

import dataclasses
import enum
import json
from pathlib import Path

import pytest

from sixbit.config import (
    Activations,
    AttentionQuantConfig,
    ConvertConfig,
    DeltaCacheConfig,
    DMPQConfig,
    QuantConfig,
    StaticW8A8Config,
)
from sixbit.config.serialize import Serializable, from_dict, to_dict
from sixbit.presets import preset

BEFORE = json.loads((Path(__file__).parent / "config_dicts_before_43.json").read_text())

# The delta cache's defaults when the file was written, before issue 62 made its error budget the
# one knob: a stored cache keeps running with them (final_fraction, age_exponent and tail_fraction, added
# later, read as 0, 1 and 0).
CACHE_THEN = DeltaCacheConfig(threshold=0.2, max_skips=2, error_budget=0.6, final_fraction=0.0, drift=0.5,
                              age_exponent=1, tail_fraction=0.0)


def _as_written(name: str, config: ConvertConfig) -> ConvertConfig:
    """``config`` (as built now) with its cache and DMPQ pricing as the presets held them when the
    file was written (DMPQ priced per cell, ``error_at="video"``, until issue 63)."""
    if config.dmpq is not None:
        config = dataclasses.replace(config, dmpq=dataclasses.replace(config.dmpq, error_at="video"))
    if config.cache is None:
        return config
    then = dict(threshold=0.3, error_budget=0.9) if name == "aggressive" else {}
    cache = dataclasses.replace(CACHE_THEN, cache_format=config.cache.cache_format, **then)
    if name == "aggressive":  # its description named its cache's threshold
        config = dataclasses.replace(config, description=config.description.replace("error budget 2", "threshold 0.3"))
    return dataclasses.replace(config, cache=cache)


# The configs the hand-built entries of the file were written from.
BUILT = {
    "attention": lambda: ConvertConfig(
        weights=QuantConfig(weight_format="int8", layer_formats={"a.b": None}), activations="int8",
        attention=AttentionQuantConfig(blocks=(1, None), steps=(2, 5)), description="custom"),
    "static-mp": lambda: ConvertConfig(
        weights=None, activations="static", cache=DeltaCacheConfig(cache_format="int8"),
        static=StaticW8A8Config.preset("w8a8-static-mp", time_ranges=[[0, 4], [5, 9], [10, 14], [15, 19]])),
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_dicts_written_before_read_back_equal_and_are_written_again_unchanged(name):
    expected = _as_written(name, BUILT[name]() if name in BUILT else preset(name))
    config = ConvertConfig.from_dict(json.loads(json.dumps(BEFORE[name])))
    assert config == expected
    assert config.to_dict() == BEFORE[name]
    assert json.dumps(config.to_dict()) == json.dumps(BEFORE[name])  # key order too


def test_nested_configs_come_back_as_their_types():
    config = ConvertConfig.from_dict(BEFORE["attention"])
    assert type(config.weights) is QuantConfig and type(config.attention) is AttentionQuantConfig
    assert config.attention.blocks == (1, None) and config.activations is Activations.INT8
    static = ConvertConfig.from_dict(BEFORE["static-mp"]).static
    assert type(static) is StaticW8A8Config and isinstance(static.alpha_grid, tuple)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Inner(Serializable):
    span: tuple[int, int] | None = None
    color: Color = Color.RED


@dataclasses.dataclass
class Outer(Serializable):
    inner: Inner | None = None
    names: list[str] = dataclasses.field(default_factory=list)
    size: int = 1

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"invalid Outer:\n  - size must be ≥ 1, got {self.size}")


def test_generic_round_trip_of_nested_dataclasses_enums_tuples_and_optionals():
    value = Outer(inner=Inner(span=(2, 3), color=Color.BLUE), names=["a"], size=4)
    data = to_dict(value)
    assert data == {"inner": {"span": [2, 3], "color": "blue"}, "names": ["a"], "size": 4}
    assert json.loads(json.dumps(data)) == data
    back = from_dict(Outer, json.loads(json.dumps(data)))
    assert back == value and back.inner.span == (2, 3) and back.inner.color is Color.BLUE
    assert Outer.from_dict({}) == Outer() and Outer.from_dict({"inner": None}).inner is None
    assert value.to_dict() == data


@pytest.mark.parametrize("data, needles", [
    ({"sise": 2}, ["unknown keys 'sise' (did you mean 'size'?)", "valid: ['inner', 'names', 'size']"]),
    ({"inner": {"colour": "red"}}, ["inner: ", "did you mean 'color'?", "valid: ['color', 'span']"]),
    ({"inner": {"color": "green"}, "what": 1}, ["color='green' is not one of ['red', 'blue']", "unknown keys 'what'"]),
    ({"inner": [1, 2]}, ["inner must be an object or null, got [1, 2]"]),
    ({"size": 0, "extra": 1}, ["size must be ≥ 1, got 0", "unknown keys 'extra'"]),
])
def test_every_problem_is_reported_at_once_with_the_allowed_keys(data, needles):
    with pytest.raises(ValueError) as e:
        from_dict(Outer, data)
    for needle in needles:
        assert needle in str(e.value)


def test_a_json_object_is_required():
    with pytest.raises(ValueError, match="a Outer must be a JSON object, got list"):
        from_dict(Outer, [1])


def test_activations_is_a_string_enum_accepting_its_values():
    config = ConvertConfig(weights=QuantConfig(weight_format="int8"), activations="int8")
    assert config.activations is Activations.INT8 and config.activations == "int8"
    assert repr(config.activations) == "'int8'" and f"{config.activations}" == "int8"
    assert json.dumps(config.to_dict()["activations"]) == '"int8"'
    assert dataclasses.replace(config, activations="fp").activations is Activations.FP
    with pytest.raises(ValueError, match=r"activations='int7' is not one of \['fp', 'int8', 'nvfp4', 'dynamic', 'static'\]"):
        ConvertConfig(activations="int7")


def test_method_configs_are_yielded_by_type():
    assert [type(c) for c in preset("balanced").method_configs()] == [DMPQConfig, DeltaCacheConfig]
    assert [type(c) for c in preset("w8a8-static").method_configs()] == [StaticW8A8Config]
    assert list(preset("w8a8").method_configs()) == []
    config = ConvertConfig.from_dict(BEFORE["attention"])
    assert list(config.method_configs()) == [config.attention]
