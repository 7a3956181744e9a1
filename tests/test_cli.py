import argparse
import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from sixbit import cli, formats
from sixbit.cli import app
from sixbit.cli import args as cli_args
from sixbit.cli import commands
from sixbit.bench import harness
from sixbit.cli import build_parser
from sixbit.cli.app import run


def test_formats_json(capsys):
    assert cli.main(["formats", "--json"]) == 0
    rows = {r["format"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == formats.available()
    assert rows["nvfp4"]["bits_per_element"] == pytest.approx(4.5, abs=1e-3)  # + one fp32 per tensor
    assert rows["mxfp6_e2m3"]["bits_per_element"] == 6.25
    for dist in ("sqnr_gaussian_db", "sqnr_laplace_db"):
        assert rows["int8"][dist] > rows["mxfp6_e2m3"][dist] > rows["nvfp4"][dist] > rows["int2"][dist]


def test_formats_table_family_filter(capsys):
    assert cli.main(["formats", "--family", "mx"]) == 0
    out = capsys.readouterr().out
    assert "mxfp4" in out and "nvfp4" not in out and "int8" not in out


def test_bad_family_is_one_line_error(capsys):
    assert cli.main(["formats", "--family", "posit"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown format family 'posit'" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--debug", "formats", "--family", "posit"], ["formats", "--family", "posit", "--debug"]])
def test_debug_shows_the_traceback_and_keeps_exit_code_2(argv, capsys):
    """Issue 61: with --debug a bad input's traceback propagated, and Python exited 1 instead of 2.
    (app.run: what main runs once logging is configured, left as the other tests have it.)"""
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: unknown format family 'posit'" in err
    assert err.rstrip().splitlines()[-1].startswith("sixbit: error: unknown format family 'posit'")


def test_debug_shows_the_traceback_and_keeps_exit_code_1_for_the_unexpected(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(app, "formats_table", broken)
    assert run(["formats", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug" in err
    assert err.rstrip().splitlines()[-1] == "sixbit: unexpected error (RuntimeError): a bug"
    assert run(["formats"]) == 1
    assert "rerun with --debug for the traceback" in capsys.readouterr().err


def test_console_script_runs():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "sixbit"]
    assert script.value == "sixbit.cli:main"
    proc = subprocess.run([sys.executable, "-m", "sixbit.cli", "formats", "--family", "nvfp4"], capture_output=True, text=True, check=False,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "nvfp4" in proc.stdout


# ---- issue 22: bad input, tried as a hostile user would ------------------------------------------------------


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if a command gets as far as loading a pipeline or starting a bench."""

    def boom(*args, **kwargs):
        raise AssertionError("the bad flag should have been refused before anything loads")

    monkeypatch.setattr(commands, "load_pipeline", boom)
    monkeypatch.setattr(harness, "run_bench", boom)


GEN = ["generate", "--model", "shapes-wan", "--prompt", "a red circle moving right"]


@pytest.mark.parametrize("argv, flag", [
    (GEN + ["--steps", "0"], "--steps"),
    (GEN + ["--steps", str(10**12)], "--steps"),
    (GEN + ["--steps", "-3"], "--steps"),
    (GEN + ["--scale", "0"], "--scale"),
    (GEN + ["--scale", "100000"], "--scale"),
    (GEN + ["--seed", "99999999999999999999"], "--seed"),
    (GEN + ["--seed", "-1"], "--seed"),
    (GEN + ["--guidance", "-1"], "--guidance"),
    (GEN + ["--guidance", "nan"], "--guidance"),
    (GEN + ["--guidance", "inf"], "--guidance"),
    (GEN + ["--cache-budget", "-0.1"], "--cache-budget"),
    (GEN + ["--tile-size", "0"], "--tile-size"),
    (GEN + ["--tile-size", "100"], "--tile-size"),
    (["convert", "--model", "shapes-wan", "--steps", "0", "-o", "m.safetensors"], "--steps"),
    (["convert", "--model", "shapes-wan", "--stabilize-frames", "-1", "-o", "m.safetensors"], "--stabilize-frames"),
    (["eval", "--model", "shapes-wan", "--config", "w8a8", "--prompts", "0"], "--prompts"),
    (["eval", "--model", "shapes-wan", "--config", "w8a8", "--prompts", "49"], "--prompts"),
    (["eval", "--model", "shapes-wan", "--config", "w8a8", "--seed", str(2**64)], "--seed"),
    (["demo", "--steps", "0"], "--steps"),
    (["demo", "--seed", "1e3"], "--seed"),
    (["bench", "--steps", "1"], "--steps"),
    (["bench", "--prompts", "0"], "--prompts"),
    (["bench", "--runs", "2"], "--runs"),
    (["bench", "--guidance", "inf"], "--guidance"),
    (["bench", "--calibration-prompts", "0"], "--calibration-prompts"),
    (["bench", "--video-prompts", "-1"], "--video-prompts"),
    (["bench", "--threads", "0"], "--threads"),
])
def test_out_of_range_numbers_are_refused_at_parse_time_naming_the_flag(argv, flag, nothing_loads, tmp_path,
                                                                        monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sixbit: error: argument {flag}: must be ") and " from " in err
    assert err.count("\n") == 1 and "Traceback" not in err and "--help" in err


def test_zero_is_a_value_not_unset():
    """Guidance 0 (no CFG) reaches the pipeline; a given step count is never dropped for being falsy."""
    args = build_parser().parse_args(GEN + ["--guidance", "0"])
    assert args.guidance == 0.0
    assert cli_args.call_kwargs(args) == {"guidance_scale": 0.0}
    assert cli_args.call_kwargs(argparse.Namespace(steps=0, guidance=None)) == {"num_inference_steps": 0}
    assert build_parser().parse_args(["bench", "--video-prompts", "0"]).video_prompts == 0
    assert build_parser().parse_args(GEN + ["--seed", str(2**63 - 1)]).seed == 2**63 - 1


def test_parse_errors_are_one_line_with_exit_code_2(capsys):
    assert cli.main(["generate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model" in err and "usage:" not in err and "sixbit generate --help" in err


@pytest.mark.parametrize("baseline, methods, videos", [("fp", 11, 456), ("bf16", 12, 600)])
def test_bare_bench_prints_its_plan_and_does_not_start(baseline, methods, videos, nothing_loads, tmp_path, capsys):
    out = tmp_path / "bench"
    assert cli.main(["bench", "--baseline", baseline, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"would run {methods} methods on shapes-cogvideox" in printed and "torchao-int8dq" in printed
    assert f"speedups against {baseline}" in printed
    # bf16: one more method, timed again at the end and probed before every later method
    assert f"about {videos} videos" in printed and "--yes" in printed and "not started" in printed
    assert not out.exists()


@pytest.mark.parametrize("extra", [["--yes"], ["--methods", "fp,tdc"]])
def test_bench_starts_when_confirmed_or_named(extra, tmp_path, monkeypatch, capsys):
    started = []

    def fake_run(settings, progress=True):
        started.append(settings.methods)
        raise ValueError("stopped by the test")

    monkeypatch.setattr(harness, "run_bench", fake_run)
    assert cli.main(["bench", "--prompts", "2", "--steps", "2", "--baseline", "fp", "-o", str(tmp_path / "b"), *extra]) == 2
    assert "stopped by the test" in capsys.readouterr().err
    assert started and started[0][0] == "fp" and (extra[0] == "--yes" or started[0] == ["fp", "tdc"])


@pytest.mark.parametrize("cmd", [["bench", "--yes"], ["demo"]])
def test_output_folder_that_is_a_file_is_refused_before_any_work(cmd, nothing_loads, tmp_path, capsys):
    file = tmp_path / "taken"
    file.write_text("x")
    assert cli.main([*cmd, "-o", str(file)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and str(file) in err and err.count("\n") == 1


def test_unwritable_output_folder_is_refused_before_any_work(nothing_loads, tmp_path, monkeypatch, capsys):
    import os

    locked, real_access = tmp_path / "locked", os.access
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: os.path.abspath(p) != str(locked) and real_access(p, mode))
    assert cli.main(["bench", "--yes", "-o", str(locked / "results")]) == 2
    err = capsys.readouterr().err
    assert f"-o '{locked / 'results'}': the folder '{locked}' is not writable" in err and err.count("\n") == 1


@pytest.mark.parametrize("output", [".", "", "missing/.."])
def test_generate_output_that_names_no_file_is_refused_naming_the_flag(output, nothing_loads, tmp_path,
                                                                        monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*GEN, "-o", output]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sixbit: error: -o {output!r}: ") and "give a file path" in err and err.count("\n") == 1
