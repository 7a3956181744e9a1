"""Presets and JSON configs of convert_model: every preset valid, JSON good and bad."""

import json

import pytest

import sixbit
from sixbit import QuantConfig
from sixbit.presets import PRESETS, ConvertConfig, preset, resolve


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_resolves_and_round_trips_through_json(name, tmp_path):
    cfg = resolve(name)
    assert cfg.description
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg.to_dict()))
    assert resolve(path) == cfg
    assert resolve(str(path)) == cfg


def test_presets_are_independent_copies():
    a = preset("balanced")
    a.weights.role_formats["attention"] = "int8"
    a.cache.error_budget = 0.9
    b = preset("balanced")
    assert b.weights.role_formats == {"modulation": "nvfp4"} and b.cache.error_budget == 1.0


def test_preset_contents():
    assert resolve("balanced").activations == "dynamic" and resolve("balanced").cache is not None
    assert resolve("w4a6-dynamic").cache is None and resolve("w4a6-dynamic").dmpq.target_bits == 6.0
    assert resolve("w8a8-static").weights is None and resolve("w8a8-static").static is not None
    assert resolve("tdc").weights is None and resolve("tdc").activations == "fp"
    assert resolve("w4a8").weights.weight_format == "nvfp4" and resolve("w4a8").activations == "int8"
    for name in ("w4a8", "w4a4", "w4a16", "w4a6-dynamic", "balanced", "aggressive"):  # the measured 4-bit recipe
        w = resolve(name).weights
        assert (w.gptq, w.scale_rule, w.lowrank_bits, w.role_formats) == (True, "mse", 0.5, {"modulation": "nvfp4"})
        assert resolve(name).needs_calibration
    rtn = resolve("w4a8-rtn")
    assert not rtn.needs_calibration and not rtn.weights.gptq and rtn.weights.scale_rule == "absmax"
    assert rtn.calibration_reason() is None and resolve("w4a8").calibration_reason() == "GPTQ weights (gptq=True)"


def test_seed_json_shape_maps_onto_balanced(tmp_path):
    path = tmp_path / "quant_config.json"
    path.write_text(json.dumps(
        {"attention": {"bits": 8, "symmetric": False}, "residual": {"bits": 4, "group_size": 64}, "threshold": 0.01}
    ))
    cfg = resolve(path)
    assert cfg.weights.role_formats == {"modulation": "nvfp4", "attention": "int8-asym"}
    assert cfg.weights.weight_format == "nvfp4"  # feed-forward keeps the preset's format
    assert cfg.cache.cache_format == "int4-g64" and cfg.cache.threshold == 0.01
    assert cfg.activations == "dynamic"
    assert resolve({"residual": {"bits": 8}}).cache.cache_format == "int8"
    assert resolve({"attention": {"bits": 6}}).weights.role_formats == {"modulation": "nvfp4", "attention": "int6"}


def test_seed_shape_reports_every_problem():
    with pytest.raises(ValueError) as e:
        resolve({"attention": {"bits": 12}, "residual": {"bits": 3, "group_size": 7}, "threshold": -1})
    msg = str(e.value)
    assert "attention.bits" in msg and '"residual"' in msg and '"threshold"' in msg


def test_seed_shape_reports_unknown_keys_with_the_other_problems_at_once(tmp_path):
    """Issue 48: the short shape stopped at its first unknown key, so a file with a misspelt
    top-level key, a misspelt nested key and a wrong value took three runs to fix."""
    path = tmp_path / "quant_config.json"
    path.write_text(json.dumps({"attention": {"bits": 3.5, "symetric": True}, "treshold": -1}))
    with pytest.raises(ValueError) as e:
        resolve(path)
    msg = str(e.value)
    assert "unknown keys 'treshold' (did you mean 'threshold'?)" in msg
    assert "\"attention\": unknown keys 'symetric' (did you mean 'symmetric'?)" in msg
    assert '"attention.bits" must be an integer 2…8, got 3.5' in msg
    with pytest.raises(ValueError) as e:
        resolve({"attention": {"bits": 4, "symmetric": "no"}, "residual": {"bits": [4], "group_sise": 64},
                 "threshold": float("inf")})
    msg = str(e.value)
    assert '"attention.symmetric" must be true or false' in msg
    assert "\"residual\": unknown keys 'group_sise' (did you mean 'group_size'?)" in msg
    assert '"threshold" must be a finite number ≥ 0, got inf' in msg
    with pytest.raises(ValueError, match='"residual" must be one of'):  # an unhashable value: was a TypeError
        resolve({"residual": {"bits": [4]}})


def test_full_schema_reports_every_problem_at_once_including_unknown_keys(tmp_path):
    bad = {
        "weights": {"weight_format": "nvfp5", "bogus": 1},
        "activations": "int7",
        "cache": {"threshold": -1, "what": 2},
        "extra": True,
    }
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError) as e:
        resolve(path)
    msg = str(e.value)
    for needle in ("nvfp5", "bogus", "int7", "what", "extra", "bad.json"):
        assert needle in msg, needle


def test_inconsistent_fields_are_reported():
    with pytest.raises(ValueError, match="needs quantized weights"):
        ConvertConfig(weights=None, activations="int8")
    with pytest.raises(ValueError, match="quantizes the weights itself"):
        ConvertConfig(activations="static")
    with pytest.raises(ValueError, match="dmpq is set"):
        ConvertConfig(activations="int8", dmpq=sixbit.DMPQConfig())


def test_bad_specs_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="unknown preset 'fast'.*balanced"):
        resolve("fast")
    with pytest.raises(ValueError, match="does not exist"):
        resolve(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        resolve(broken)
    with pytest.raises(ValueError, match="quant_config must be"):
        resolve(42)


def test_quant_config_becomes_weights_with_its_act_mode():
    cfg = resolve(sixbit.QuantConfig(weight_format="int8", act_mode="int8"))
    assert cfg.activations == "int8" and cfg.cache is None and cfg.weights.weight_format == "int8"


def test_balanced_runs_the_fastest_real_path_of_the_device(monkeypatch):
    from sixbit import presets

    config, note = presets.for_device(resolve("balanced"), "cpu")
    assert config.activations == "int8" and config.dmpq is None and "no real GEMM on cpu" in note
    assert config.weights == resolve("balanced").weights and config.cache == resolve("balanced").cache
    # an explicit choice runs as configured (emulated where it must be)
    for name in ("w4a6-dynamic", "aggressive", "w8a8"):
        assert presets.for_device(resolve(name), "cpu") == (resolve(name), None)
    # with FP4 GEMMs (Blackwell), DMPQ keeps NVFP4
    monkeypatch.setattr(presets, "fp4_supported", lambda device, capability=None: True)
    assert presets.for_device(resolve("balanced"), "cuda") == (resolve("balanced"), None)


def test_dmpq_low_is_checked():
    from sixbit.methods.dmpq import DMPQConfig

    with pytest.raises(ValueError, match='low must be "nvfp4" or "auto"'):
        DMPQConfig(low="int4")


# ---------------------------------------------------------------- hostile configs (issue 22)


@pytest.mark.parametrize("spec, expected", [
    ({"weights": None, "activations": "fp", "cache": {"pdr": "no"}}, ["pdr must be true or false, got 'no'"]),
    ({"weights": {"include": "attn"}, "activations": "int8"}, ["include must be a list", "got 'attn'"]),
    ({"weights": None, "activations": "fp", "cache": {"threshold": "0.1", "max_skips": -1}},
     ["threshold must be a finite number or None, got '0.1' (a string: write the value without quotes",
      "max_skips must be an integer ≥ 0 or None, got -1"]),
    ({"weights": {"gptq_damp": float("nan"), "boundary_blocks": 1.5}, "activations": "int8"},
     ["gptq_damp must be a finite number", "boundary_blocks must be an integer"]),
    ({"weights": {"act_mode": "nvfp4"}, "activations": "int8"}, ["contradicts activations='int8'"]),
    ({"weights": {"lowrank_max_rank": 8}, "activations": "int8"}, ["set lowrank_bits too"]),
    ({"weights": {"weight_formt": "int8"}, "activations": "int8"}, ["did you mean 'weight_format'?"]),
    ({"weight": {}, "activations": "int8"}, ["did you mean 'weights'?"]),
    ({"attention": {"bits": 8}, "treshold": 0.1}, ["short shape", "did you mean 'threshold'?"]),
    ({"attention": {"bits": 8}, "activations": "int8"}, ["mixes the short shape"]),
    ({}, ["config is empty", "balanced"]),
])
def test_every_wrong_field_is_named_at_once(spec, expected):
    with pytest.raises(ValueError) as e:
        resolve(spec)
    for text in expected:
        assert text in str(e.value)


def test_type_errors_name_the_field_from_python_too():
    from sixbit.methods.delta_cache import DeltaCacheConfig

    with pytest.raises(ValueError, match="threshold must be a finite number"):
        DeltaCacheConfig(threshold="0.1")
    with pytest.raises(ValueError, match="include must be a list"):
        QuantConfig(include="attn")


@pytest.mark.parametrize("text, match", [
    ('{"weights": null, "activations": "fp", "cache": {"threshold": Infinity}}', "Infinity is not standard JSON"),
    ('{"weights": null, "activations": "fp", "cache": {"threshold": NaN}}', "NaN is not standard JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"weights": ' + '"x" ' * 400_000 + "}", "at most 1048576"),
])
def test_hostile_json_files(tmp_path, text, match):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        resolve(str(path))
    assert len(str(e.value)) < 400  # named, not echoed back


def test_converting_an_empty_model_says_how(tmp_path):
    from accelerate import init_empty_weights

    from sixbit.zoo.shapes import load_pipeline

    config = load_pipeline("wan").transformer.config
    with init_empty_weights():
        model = type(load_pipeline("wan").transformer).from_config(config)
    with pytest.raises(ValueError, match="meta device.*convert_pretrained"):
        sixbit.convert_model(model, quant_config="w8a8")
