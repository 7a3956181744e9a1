"""Method names: the registry, knobs, and the errors a user sees."""

import pytest

from sixbit.bench.harness import BenchSettings, resolve_model
from sixbit.bench.methods import Method, available_names, resolve


def test_unknown_method_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown method 'nope'") as err:
        resolve("nope")
    for name in ("fp", "balanced", "w8a8-static", "fbcache", "magcache", "torchao-int8dq", "quanto-qint4"):
        assert name in str(err.value)


def test_unknown_method_fails_before_anything_runs():
    with pytest.raises(ValueError, match="unknown method 'fbcash-0.1'"):
        from sixbit.bench.harness import run_bench

        run_bench(BenchSettings("shapes-wan", ["fbcache-0.1", "fbcash-0.1"], prompts=1, steps=2), progress=False)


def test_knobs():
    method, value = resolve("fbcache-0.25")
    assert method.name == "fbcache" and value == 0.25
    method, value = resolve("w8a8-static")  # a hyphenated preset is not a knob
    assert method.name == "w8a8-static" and value is None
    method, value = resolve("tdc-0.3")
    assert method.family == "sixbit" and value == 0.3
    with pytest.raises(ValueError, match="no knob"):
        resolve("quanto-qint8-2")
    with pytest.raises(ValueError, match="no knob"):
        resolve("w4a8-0.2")


def test_registry_lists_ours_and_peers():
    names = available_names()
    assert names[0] == "fp"
    assert {"balanced", "tdc", "fbcache", "magcache", "taylorseer", "pab", "fastercache"} <= set(names)


def test_missing_library_is_a_reason_not_a_crash():
    method = Method("x", "peer", "x", lambda *a: "", requires=("sixbit_no_such_module",))
    assert "sixbit_no_such_module" in method.unavailable()


def test_settings_are_checked():
    with pytest.raises(ValueError, match="runs must be ≥ 3"):
        BenchSettings("shapes-wan", ["fp"], runs=2)
    with pytest.raises(ValueError, match="prompts must be in 1..48"):
        BenchSettings("shapes-wan", ["fp"], prompts=0)
    with pytest.raises(ValueError, match="baseline must be one of"):
        BenchSettings("shapes-wan", ["fp"], baseline="fp16")
    assert BenchSettings("shapes-wan", ["tdc", "fp", "tdc"], baseline="fp").methods == ["fp", "tdc"]
    # the speed baseline runs second, right after the quality reference
    assert BenchSettings("shapes-wan", ["tdc", "bf16"], baseline="bf16").methods == ["fp", "bf16", "tdc"]


def test_default_baseline_is_the_fastest_float_dtype(monkeypatch):
    from sixbit.kernels import cpu

    for cap in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):  # a cap hides AMX (tests/kernels/test_cpu.py)
        monkeypatch.delenv(cap, raising=False)
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset({"avx512f", "amx_bf16"}))
    assert BenchSettings("shapes-wan", ["tdc"]).baseline == "bf16"
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset({"avx2"}))  # no native bf16 matmul: fp32 is fastest
    assert BenchSettings("shapes-wan", ["tdc"]).methods == ["fp", "tdc"]


def test_model_must_be_a_shapes_pipeline(tmp_path):
    with pytest.raises(ValueError, match="neither shapes-cogvideox nor shapes-wan"):
        resolve_model(str(tmp_path))
    (tmp_path / "model_index.json").write_text('{"_class_name": "CogVideoXPipeline"}')
    with pytest.raises(ValueError, match="holds a CogVideoXPipeline"):
        resolve_model(str(tmp_path))
    assert resolve_model("shapes-cogvideox") == ("cogvideox", None)


def test_cli_reports_a_bad_method_in_one_line(capsys, tmp_path):
    from sixbit.cli import main

    assert main(["bench", "--model", "shapes-wan", "--methods", "fp,bogus", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sixbit: error: unknown method 'bogus'; valid:") and "\n" not in err
