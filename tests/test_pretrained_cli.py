"""The command line on a bare transformer folder (config.json + shards, no model_index.json):
calibration-free presets stream from it; whatever needs the pipeline (calibration, generation)
is refused in one line that says what does work and what to pass instead (issue 48: it said
"not a pipeline folder")."""

import os

import pytest

from sixbit import checkpoint, streaming
from sixbit.cli import commands, main
from sixbit.pipelines import load_pipeline
from sixbit.presets import PRESETS, calibration_free, preset
from fixtures.tiny_models import build_tiny


@pytest.fixture(scope="module")
def transformer_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bare") / "transformer"
    build_tiny("wan").model.save_pretrained(folder, max_shard_size="8KB")
    return folder


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sixbit: error: "), err
    return err


def test_calibration_free_presets_are_computed_from_the_table():
    free = calibration_free()
    assert free == tuple(name for name in PRESETS if not preset(name).needs_calibration)
    assert "w8a8" in free and "w4a8-rtn" in free and "w4a8" not in free and "balanced" not in free


@pytest.mark.parametrize("config", ["w4a8", "balanced", "w8a8-static"])
def test_convert_with_a_calibrated_preset_names_the_presets_that_stream(config, transformer_folder, tmp_path, capsys):
    out = tmp_path / "q.safetensors"
    assert main(["convert", "--model", str(transformer_folder), "--config", config, "-o", str(out)]) == 2
    err = _one_line_error(capsys)
    assert "not a diffusers pipeline folder" not in err
    assert f"--model '{transformer_folder}' is a transformer folder" in err
    assert f"only calibration-free presets stream from it ({', '.join(calibration_free())})" in err
    assert f"{config!r} needs calibration" in err and "pass the pipeline folder that holds it" in err
    assert os.listdir(tmp_path) == []  # nothing written


def test_convert_with_stabilized_frames_is_refused_naming_the_pipeline_folder(transformer_folder, tmp_path, capsys):
    assert main(["convert", "--model", str(transformer_folder), "--config", "w8a8", "--stabilize-frames",
                 "-o", str(tmp_path / "q.safetensors")]) == 2
    err = _one_line_error(capsys)
    assert "--stabilize-frames does not stream from it" in err and "pass the pipeline folder" in err
    assert os.listdir(tmp_path) == []


def test_convert_streams_a_transformer_folder_even_with_an_unused_calib(transformer_folder, tmp_path, capsys):
    out = tmp_path / "q.safetensors"
    assert main(["convert", "--model", str(transformer_folder), "--config", "w8a8", "--calib", "unused.txt",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "streaming" in text and "--calib is not used: 'w8a8' needs no calibration" in text
    assert checkpoint.read_header(out)["model_class"] == "WanTransformer3DModel"


@pytest.mark.parametrize("command", [
    ["generate", "--prompt", "a red circle moving right"],
    ["eval", "--prompts-file", "prompts.txt"],
])
@pytest.mark.parametrize("quantized", [True, False])
def test_generate_and_eval_say_a_pipeline_folder_is_needed(command, quantized, transformer_folder, tmp_path,
                                                           monkeypatch, capsys):
    def loads(*args, **kwargs):
        raise AssertionError("a transformer folder should be refused before anything loads")

    monkeypatch.setattr(streaming, "load_pretrained", loads)
    monkeypatch.setattr(commands, "load_pipeline", loads)
    extra = ["--quantized", str(tmp_path / "q.safetensors")] if quantized else []
    if command[0] == "eval" and not quantized:
        extra = ["--config", "w8a8"]
    output = ["-o", str(tmp_path / "v.mp4")] if command[0] == "generate" else []
    assert main([command[0], "--model", str(transformer_folder), *extra, *command[1:], *output]) == 2
    err = _one_line_error(capsys)
    assert f"--model '{transformer_folder}' is a transformer folder" in err and "cannot generate on its own" in err
    assert "pass the pipeline folder that holds it (model_index.json beside transformer/)" in err
    assert ("with the same --quantized checkpoint" in err) == quantized
    assert os.listdir(tmp_path) == []


def test_load_pipeline_says_what_a_transformer_folder_is(transformer_folder):
    with pytest.raises(ValueError, match=r"is a transformer folder \(config.json, no model_index.json\), not a pipeline"):
        load_pipeline(str(transformer_folder))
