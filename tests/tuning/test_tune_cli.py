"""``sixbit tune`` on a shipped model: a config that ``sixbit convert`` takes, and its plot."""

from __future__ import annotations

import json
import types

import pytest
from fixtures.tiny_base import sample
from fixtures.tiny_models import build_tiny

from sixbit import ConvertConfig, QuantConfig, pipelines, read_header
from sixbit.cli import main
from sixbit.cli.tune import NOT_REACHED
from sixbit.presets import resolve


def test_tune_writes_a_config_that_convert_takes(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moving right\n")
    config, plot, out = tmp_path / "tuned.json", tmp_path / "map.png", tmp_path / "model.safetensors"
    assert main(["tune", "--model", "shapes-wan", "--base", "w4a8-rtn", "--formats", "int4-g64,int8,16-bit",
                 "--calib", str(prompts), "--steps", "1", "--max-bits", "6", "--population", "4",
                 "--generations", "1", "--plot", str(plot), "-o", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "tuned 40 layers to ≤ 6 bits per weight" in printed and "uniform int8" in printed
    tuned = resolve(str(config))
    assert len(tuned.weights.layer_formats) == 40 and set(tuned.weights.layer_formats.values()) <= {"int4-g64", "int8", None}
    assert plot.stat().st_size > 1000
    assert main(["convert", "--model", "shapes-wan", "--config", str(config), "--steps", "1", "-o", str(out)]) == 0
    layers = read_header(out)["layers"]
    for name, fmt in tuned.weights.layer_formats.items():
        assert (layers[name]["weight_format"] if name in layers else None) == fmt
    assert json.loads(config.read_text())["activations"] == "int8"


def test_streamed_tune_writes_the_in_memory_config(tmp_path, capsys):
    """``--streamed``: the shipped model's transformer read from its folder one block at a time,
    the same config written."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moving right\n")
    common = ["tune", "--model", "shapes-wan", "--base", "w4a8-rtn", "--formats", "int4-g64,int8,16-bit", "--calib",
              str(prompts), "--steps", "1", "--max-bits", "6", "--population", "4", "--generations", "1"]
    assert main(common + ["-o", str(tmp_path / "memory.json")]) == 0
    assert main(common + ["--streamed", "-o", str(tmp_path / "streamed.json")]) == 0
    assert "one block in memory" in capsys.readouterr().out
    assert (tmp_path / "streamed.json").read_text() == (tmp_path / "memory.json").read_text()


def test_streamed_tune_needs_a_local_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--model", "owner/name", "--streamed", "--max-bits", "5", "-o", "tuned.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a local folder" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "tuned.json").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--max-bits", "5", "--min-psnr", "30"], "not allowed with argument"),
    (["--max-bits", "5", "-o", "tuned.txt"], "written as a .json file"),
    (["--max-bits", "0.5"], "--max-bits"),
])
def test_tune_bad_input_is_one_line(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["tune", "--model", "shapes-wan"] + (["-o", "tuned.json"] if "-o" not in argv else [])
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "tuned.json").exists()



class TinyPipeline:
    """What ``sixbit tune`` loads, around a tiny fixture transformer: called with prompts, it
    runs :func:`fixtures.tiny_base.sample` and returns its latents as ``.frames``."""

    def __init__(self, name: str):
        self.tm = build_tiny(name)
        self.transformer, self.calls = self.tm.model, 0

    def __call__(self, prompts, generator=None, num_inference_steps=1, **kwargs):
        self.calls += 1
        return types.SimpleNamespace(frames=sample(self.tm, steps=num_inference_steps))


@pytest.fixture
def tiny_pipe(monkeypatch, tmp_path):
    """``--model tiny`` loads a tiny CogVideoX; the base quantizes its modulation layers too, so
    even every tuned layer at 16 bits leaves an error (no assignment reaches 99 dB)."""
    pipe = TinyPipeline("cogvideox")
    monkeypatch.setattr(pipelines, "load_pipeline", lambda *args, **kwargs: pipe)
    base = ConvertConfig(weights=QuantConfig(weight_format="int4-g16", role_formats={"modulation": "int4-g16"}),
                         activations="fp")
    (tmp_path / "base.json").write_text(json.dumps(base.to_dict()))
    (tmp_path / "prompts.txt").write_text("a red circle moving right\n")
    return pipe


def _tune(tmp_path, *argv: str) -> int:
    return main(["tune", "--model", "tiny", "--base", str(tmp_path / "base.json"), "--calib",
                 str(tmp_path / "prompts.txt"), "--steps", "1", "--population", "4", "--generations", "1", *argv])


def test_an_unreached_min_psnr_writes_the_config_and_exits_3(tiny_pipe, tmp_path, capsys):
    """Issue 48: ``--min-psnr 99`` exited 0, so a script could not tell the target was missed."""
    config = tmp_path / "tuned.json"
    assert _tune(tmp_path, "--formats", "int8,16-bit", "--min-psnr", "99", "-o", str(config)) == NOT_REACHED == 3
    captured = capsys.readouterr()
    assert "(NOT reached)" in resolve(str(config)).description  # written all the same
    assert f"wrote {config}" in captured.out
    err = captured.err.strip().splitlines()[-1]
    assert err.startswith("sixbit: --min-psnr 99 dB was NOT reached") and f"exit code {NOT_REACHED}" in err
    assert "holds it all the same" in err


def test_a_reached_target_exits_0(tiny_pipe, tmp_path, capsys):
    config = tmp_path / "tuned.json"
    assert _tune(tmp_path, "--formats", "int8,16-bit", "--min-psnr", "5", "-o", str(config)) == 0
    assert "NOT reached" not in resolve(str(config)).description and "NOT reached" not in capsys.readouterr().err


def test_a_budget_below_every_format_is_refused_before_stage_1(tiny_pipe, tmp_path, capsys):
    """Issue 48: ``--max-bits 2`` was refused only after stage 1 had run every layer in every format."""
    assert _tune(tmp_path, "--formats", "int4-g16,int8", "--max-bits", "2", "-o", str(tmp_path / "tuned.json")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sixbit: error: max_bits=2 is below the fewest bits the candidate formats allow")
    assert "give max_bits ≥ 6.00" in err and len(err.splitlines()) == 1
    assert tiny_pipe.calls == 0 and not (tmp_path / "tuned.json").exists()


def test_tune_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    assert f"{NOT_REACHED} --min-psnr was not reached" in " ".join(capsys.readouterr().out.split())
