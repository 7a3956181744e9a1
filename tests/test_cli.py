import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from sixbit import cli, formats


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


def test_console_script_runs():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "sixbit"]
    assert script.value == "sixbit.cli:main"
    proc = subprocess.run([sys.executable, "-m", "sixbit.cli", "formats", "--family", "nvfp4"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "nvfp4" in proc.stdout
