"""``sixbit tune`` on a shipped model: a config that ``sixbit convert`` takes, and its plot."""

from __future__ import annotations

import json

import pytest

from sixbit import read_header
from sixbit.cli import main
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
