"""What CI runs (.ci/run): the README's test command, then the tests marked ``cpu_kind`` under
both capped CPU kinds (issue 61); every entry of the marked list still names tests."""

from pathlib import Path

from conftest import CPU_KIND_TESTS

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_suite_then_the_cpu_kind_tests_under_both_caps():
    script = (ROOT / ".ci" / "run").read_text()
    runs = [line for line in script.splitlines() if line.startswith("run ")]
    assert runs[0].endswith("-- -q")  # the README's `python -m pytest -q`, everything once
    assert any("ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI -- -q -m cpu_kind" in r for r in runs[1:])
    assert any("ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 -- -q -m cpu_kind" in r for r in runs[1:])


def test_every_cpu_kind_entry_names_tests():
    for entry in CPU_KIND_TESTS:
        path, _, test = entry.partition("::")
        assert (ROOT / path).exists(), f"{entry}: no such test file or folder"
        if path.endswith("/"):
            assert list((ROOT / path).glob("test_*.py")), f"{entry}: no test module in it"
        if test:
            assert f"def {test}(" in (ROOT / path).read_text(), f"{entry}: no such test"
