"""sixbit convert / generate / eval / info on the shipped model, help texts, one-line errors."""

import json
import shutil
import subprocess
import sys

import pytest

from sixbit import read_header
from sixbit.cli import commands
from sixbit.cli import main
from sixbit.zoo.shapes import WEIGHTS_DIR


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    prompts = folder / "prompts.txt"
    prompts.write_text("# calibration prompts\na red circle moving right\na blue square moving up\n")
    out = folder / "model.safetensors"
    assert main(["convert", "--model", "shapes-cogvideox", "--config", "balanced", "--calib", str(prompts),
                 "--steps", "3", "-o", str(out)]) == 0
    return out


def test_convert_writes_a_checkpoint_with_its_conversion(converted, capsys):
    header = read_header(converted)
    conv = header["extensions"]["conversion"]
    assert conv["calibration"] == {"source": "prompts", "count": 2}
    # balanced on this CPU: DMPQ's NVFP4 has no real GEMM here, every call runs INT8 (no predictor)
    assert conv["config"]["activations"] == "int8" and conv["predictor"] is None and "INT8" in conv["hardware"]
    assert main(["info", str(converted)]) == 0
    out = capsys.readouterr().out
    assert "CogVideoXTransformer3DModel" in out and "nvfp4" in out and conv["hardware"] in out
    assert main(["info", str(converted), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model_class"] == "CogVideoXTransformer3DModel"


def test_generate_with_quantized_checkpoint_and_cache(converted, tmp_path, capsys):
    out = tmp_path / "video.mp4"
    assert main(["generate", "--model", "shapes-cogvideox", "--quantized", str(converted), "--prompt",
                 "a green triangle moving left", "--steps", "6", "--cache", "tdc", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    written = out if out.exists() else out.with_suffix(".gif")
    assert written.stat().st_size > 0 and "judge:" in printed and "blocks skipped" in printed
    assert "EMULATED" not in printed  # balanced runs real INT8 GEMMs on this CPU


def test_convert_calibrates_the_delta_cache_to_a_psnr_and_info_says_what_it_chose(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moving right\na blue square moving up\n")
    out = tmp_path / "tdc.safetensors"
    assert main(["convert", "--model", "shapes-wan", "--config", "tdc", "--cache-min-psnr", "30", "--calib", str(prompts),
                 "--steps", "8", "-o", str(out)]) == 0
    assert "delta cache: error budget" in capsys.readouterr().out
    cache = read_header(out)["extensions"]["conversion"]["config"]["cache"]
    assert cache["min_psnr"] == 30 and cache["calibrated"]["psnr_bound"] >= 30
    assert cache["error_budget"] == cache["calibrated"]["error_budget"] > 0
    assert main(["info", str(out)]) == 0
    assert f"delta cache error budget {cache['error_budget']:g}, calibrated to 30 dB (" in capsys.readouterr().out


def test_eval_reports_quality_vs_full_precision(tmp_path, capsys):
    assert main(["eval", "--model", "shapes-wan", "--config", "w4a8-rtn", "--prompts", "2", "--steps", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["videos"] == 2 and 5 < result["psnr_db"] < 99 and 0 < result["ssim"] <= 1
    assert set(result["adherence"]) == {"reference", "converted"}
    assert result["emulated"] is False  # w4a8: real integer GEMMs


def test_json_config_file_is_accepted(tmp_path, capsys):
    cfg = tmp_path / "quant_config.json"
    cfg.write_text(json.dumps({"attention": {"bits": 8, "symmetric": False}, "residual": {"bits": 4, "group_size": 64},
                               "threshold": 0.01}))
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--model", "shapes-wan", "--config", str(cfg), "--steps", "2", "-o", str(out)]) == 0
    formats = {c["weight_format"] for c in read_header(out)["layers"].values()}
    assert formats == {"int8-asym", "nvfp4"}


@pytest.mark.parametrize("argv, needle", [
    (["convert", "--model", "shapes-wan", "--config", "nope", "-o", "x.safetensors"], "unknown preset 'nope'"),
    (["convert", "--model", "no/such/dir", "-o", "x.safetensors"], "neither a shipped model"),
    (["convert", "--model", "shapes-wan", "--config", "w4a8", "-o", "x.bin"], "sixbit writes no .bin files"),
    (["info", "missing.safetensors"], "no checkpoint"),
    (["eval", "--model", "shapes-wan"], "exactly one of --quantized"),
])
def test_bad_input_is_one_line_with_exit_code_2(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("cmd", ["convert", "generate", "eval", "info", "demo", "formats", "bench", "tune"])
def test_every_command_has_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0 and "usage: sixbit " + cmd in capsys.readouterr().out


def test_errors_exit_2_without_traceback_from_the_shell():
    proc = subprocess.run([sys.executable, "-m", "sixbit.cli", "info", "missing.safetensors"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "no checkpoint" in proc.stderr


# ---- issue 44: convert writes a diffusers folder by default; info reads files and folders ----


@pytest.fixture(scope="module")
def as_file_and_folder(tmp_path_factory):
    """shapes-wan converted in memory twice: into the single file and into a pipeline folder."""
    out = tmp_path_factory.mktemp("w8a8")
    for path in (out / "w8a8.safetensors", out / "pipe"):
        assert main(["convert", "--model", "shapes-wan", "--config", "w8a8", "-o", str(path)]) == 0
    return out / "w8a8.safetensors", out / "pipe"


def test_convert_writes_a_pipeline_folder_that_info_describes_as_the_file(as_file_and_folder, capsys):
    file, pipe = as_file_and_folder
    assert sorted(p.name for p in pipe.iterdir()) == ["model_index.json", "scheduler", "text_encoder", "transformer"]
    capsys.readouterr()
    shown = {}
    for path in (file, pipe, pipe / "transformer"):
        assert main(["info", str(path)]) == 0
        first, *rest = capsys.readouterr().out.splitlines()
        shown[path] = rest
        assert main(["info", str(path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == read_header(file)
    assert shown[file] == shown[pipe] == shown[pipe / "transformer"] and "WanTransformer3DModel" in shown[file][0]


def test_a_converted_folder_generates_as_a_pipeline_and_as_quantized(as_file_and_folder, tmp_path, monkeypatch):
    from sixbit.eval import media

    file, pipe = as_file_and_folder
    videos = []
    monkeypatch.setattr(media, "write_video", lambda video, path, scale=1: videos.append(video) or path)
    for argv in (["--model", str(pipe)], ["--model", "shapes-wan", "--quantized", str(pipe / "transformer")],
                 ["--model", "shapes-wan", "--quantized", str(file)]):
        assert main(["generate", *argv, "--prompt", "a red circle moving right", "--steps", "2",
                     "-o", str(tmp_path / "v.mp4")]) == 0
    assert len(videos) == 3 and (videos[0] == videos[1]).all() and (videos[1] == videos[2]).all()


def test_a_pipeline_folder_streams_into_a_pipeline_folder(tmp_path, capsys):
    source = tmp_path / "wan"
    shutil.copytree(WEIGHTS_DIR / "wan", source)
    out = tmp_path / "out"
    assert main(["convert", "--model", str(source), "--config", "w8a8", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "streaming" in printed and f"sixbit generate --model {out}" in printed
    assert (out / "model_index.json").is_file() and (out / "text_encoder" / "config.json").is_file()
    assert main(["info", str(out)]) == 0
    assert "converted diffusers folder (transformer/)" in capsys.readouterr().out


def test_converting_into_the_model_folder_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    _no_loading(monkeypatch)
    before = sorted(p.name for p in (WEIGHTS_DIR / "wan").rglob("*"))
    for out in (WEIGHTS_DIR / "wan", WEIGHTS_DIR / "wan" / "q"):
        assert main(["convert", "--model", "shapes-wan", "--config", "w8a8", "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "model folder" in err and "choose a folder outside it" in err
    assert sorted(p.name for p in (WEIGHTS_DIR / "wan").rglob("*")) == before


def test_info_on_a_folder_that_holds_no_converted_model(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "WanTransformer3DModel"}))
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no sixbit-converted model" in err and "sixbit convert" in err
    assert main(["info", str(tmp_path / "empty")]) == 2  # neither a file nor a folder
    assert "no checkpoint" in capsys.readouterr().err


# ---- issue 22: an output that cannot be written is refused before the work, and never reported as written ----


def _no_loading(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the output should have been refused before the pipeline loads")

    monkeypatch.setattr(commands, "load_pipeline", boom)


@pytest.mark.parametrize("cmd, name", [
    (["generate", "--model", "shapes-wan", "--prompt", "a red circle moving right"], "video.mp4"),
    (["convert", "--model", "shapes-wan", "--config", "w8a8"], "model.safetensors"),
])
def test_output_that_is_a_folder_is_refused_up_front(cmd, name, tmp_path, monkeypatch, capsys):
    _no_loading(monkeypatch)
    (tmp_path / name).mkdir()
    assert main([*cmd, "-o", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"-o '{tmp_path / name}': it is a folder" in err and "give a file path" in err


def test_output_in_an_unwritable_folder_is_refused_up_front(tmp_path, monkeypatch, capsys):
    import os

    _no_loading(monkeypatch)
    locked, real_access = tmp_path / "locked", os.access
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: os.path.abspath(p) != str(locked) and real_access(p, mode))
    assert main(["generate", "--model", "shapes-wan", "--prompt", "a red circle moving right",
                 "-o", str(locked / "sub" / "v.mp4")]) == 2
    err = capsys.readouterr().err
    assert "not writable" in err and str(locked) in err and not (locked / "sub").exists()


def test_a_write_that_fails_after_generating_is_an_error_not_success(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(commands, "check_output_file", lambda *a, **k: None)  # reach the writer itself
    target = tmp_path / "v.mp4"
    target.mkdir()
    (target.with_suffix(".gif")).mkdir()
    assert main(["generate", "--model", "shapes-wan", "--prompt", "a red circle moving right", "--steps", "1",
                 "-o", str(target)]) == 2
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]  # after the progress bars
    assert "generated" not in captured.out and last.startswith("sixbit: error: cannot write") and "is a folder" in last
