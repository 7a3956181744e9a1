"""Quantized attention as part of a conversion: config, JSON, convert_model, checkpoints."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from fixtures.toy import ToyTransformer

import sixbit
from sixbit import AttentionQuantConfig, QuantConfig
from sixbit.cli import main
from sixbit.methods.attention import apply_attention_quant, attention_quant_of
from sixbit.presets import ConvertConfig, resolve
from sixbit.zoo.shapes import load_pipeline


def _config(attention=AttentionQuantConfig(steps=(2, None))):
    return ConvertConfig(weights=QuantConfig(weight_format="int8"), activations="int8", attention=attention)


def generate(pipe):
    return pipe("a red circle moving right", num_inference_steps=4, generator=torch.Generator().manual_seed(7)).frames


def test_attention_round_trips_through_dict_and_json_file(tmp_path):
    config = _config(AttentionQuantConfig(blocks=(1, 3), steps=(2, None)))
    assert ConvertConfig.from_dict(config.to_dict()) == config
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    assert resolve(path) == config and resolve(path).attention.steps == (2, None)
    assert json.loads(path.read_text())["attention"] == {"blocks": [1, 3], "steps": [2, None]}
    # off by default and in every preset (emulated, slower, on CPUs)
    assert ConvertConfig().attention is None
    assert all(resolve(name).attention is None for name in sixbit.PRESETS)
    assert resolve({"weights": None, "activations": "fp", "attention": None}).attention is None
    # the short shape's "attention" still means the attention layers' weight format
    short = resolve({"attention": {"bits": 8, "symmetric": False}})
    assert short.weights.role_formats["attention"] == "int8-asym" and short.attention is None


@pytest.mark.parametrize("attention, expected", [
    ({"steps": [3, 1]}, "steps=(3, 1) selects nothing"),
    ({"blocks": [-1, None]}, "blocks must be None or (start, stop) with integers ≥ 0"),
    ({"step": [2, None]}, "did you mean 'steps'?"),
    (5, "attention must be an object or null, got 5"),
])
def test_bad_attention_values_are_refused_by_name(attention, expected):
    with pytest.raises(ValueError) as e:
        resolve({"weights": None, "activations": "fp", "attention": attention})
    assert expected in str(e.value)


def test_attention_config_and_short_shape_keys_do_not_mix():
    with pytest.raises(ValueError, match=r"mixes the short shape's keys \['residual'\] with the full schema's \['attention'\]"):
        resolve({"attention": {"steps": [2, None]}, "residual": {"bits": 8}})
    with pytest.raises(ValueError, match="attention must be a AttentionQuantConfig or None"):
        ConvertConfig(attention={"steps": (2, None)})


def test_a_model_without_attention_processors_is_refused_before_it_changes():
    model = ToyTransformer()
    with pytest.raises(ValueError, match="no attention modules with a processor.*leave attention=None"):
        sixbit.convert_model(model, None, _config())
    assert sixbit.conversion_of(model) is None and not sixbit.runtime.blocks.quant_linears(model)


FRESH = textwrap.dedent(
    """
    import sys, numpy as np, torch, sixbit
    from sixbit.zoo.shapes import load_pipeline
    pipe = sixbit.load(sys.argv[1], load_pipeline("cogvideox"))
    video = pipe("a red circle moving right", num_inference_steps=4, generator=torch.Generator().manual_seed(7)).frames
    state = sixbit.conversion_of(pipe).attention
    print(state.config.steps, state.quantized_calls > 0, np.array_equal(video, np.load(sys.argv[2])))
    """
)


def test_convert_installs_saves_loads_and_clears_quantized_attention(tmp_path, capsys):
    pipe = load_pipeline("cogvideox")
    sixbit.convert_model(pipe, None, _config())
    conv = sixbit.conversion_of(pipe)
    assert conv.attention is attention_quant_of(pipe.transformer) and conv.attention.path.startswith("emulated")
    video = generate(pipe)
    # steps 2 and 3 of 4 quantized, steps 0 and 1 not
    assert conv.attention.quantized_calls > 0 and conv.attention.full_precision_calls == conv.attention.quantized_calls
    path = pipe.save(tmp_path / "attention.safetensors")
    stored = sixbit.read_header(path)["extensions"]["conversion"]["config"]["attention"]
    assert stored == {"blocks": None, "steps": [2, None]}
    assert "attention quantized where blocks all, steps 2–end: emulated" in str(sixbit.summary(pipe.transformer))
    assert main(["info", str(path)]) == 0
    assert "INT8 attention (blocks all, steps 2–end)" in capsys.readouterr().out

    np.save(tmp_path / "video.npy", video)
    proc = subprocess.run([sys.executable, "-c", FRESH, str(path), str(tmp_path / "video.npy")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("(2, None) True True"), proc.stdout  # rebuilt in a fresh process, bit-exact

    fresh = load_pipeline("cogvideox")
    apply_attention_quant(fresh.transformer, AttentionQuantConfig(blocks=(0, 1)))  # replaced by the file's
    sixbit.load(path, fresh)
    loaded = sixbit.conversion_of(fresh).attention
    assert loaded is attention_quant_of(fresh.transformer) and loaded.config == AttentionQuantConfig(steps=(2, None))
    assert np.array_equal(generate(fresh), video) and loaded.quantized_calls == conv.attention.quantized_calls

    # a file without quantized attention clears it
    plain = load_pipeline("cogvideox")
    sixbit.convert_model(plain, None, _config(attention=None))
    plain_video = generate(plain)
    assert not np.array_equal(plain_video, video)
    plain_path = plain.save(tmp_path / "plain.safetensors")
    sixbit.load(plain_path, fresh)
    assert attention_quant_of(fresh.transformer) is None and sixbit.conversion_of(fresh).attention is None
    assert np.array_equal(generate(fresh), plain_video)


# ---- issue 48: a method applied (or removed) after convert_model was not saved; the reload differed ----------


def test_attention_applied_after_convert_is_saved_and_reloads_bit_exactly(tmp_path):
    pipe = load_pipeline("cogvideox")
    sixbit.convert_model(pipe, None, _config(attention=None))
    apply_attention_quant(pipe, AttentionQuantConfig(blocks=(1, None), steps=(2, None)))
    video = generate(pipe)
    path = sixbit.save(pipe, tmp_path / "late.safetensors")
    stored = sixbit.read_header(path)["extensions"]["conversion"]["config"]["attention"]
    assert stored == {"blocks": [1, None], "steps": [2, None]}
    fresh = load_pipeline("cogvideox")
    sixbit.load(path, fresh)
    assert attention_quant_of(fresh.transformer).config == AttentionQuantConfig(blocks=(1, None), steps=(2, None))
    assert np.array_equal(generate(fresh), video)


def test_attention_removed_after_convert_stays_removed_after_a_reload(tmp_path):
    pipe = load_pipeline("cogvideox")
    sixbit.convert_model(pipe, None, _config())
    sixbit.remove_attention_quant(pipe)
    video = generate(pipe)
    path = sixbit.save(pipe, tmp_path / "removed.safetensors")
    fresh = load_pipeline("cogvideox")
    sixbit.load(path, fresh)
    assert attention_quant_of(fresh.transformer) is None and np.array_equal(generate(fresh), video)
