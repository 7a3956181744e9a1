"""The ``sixbit`` command shows only its own lines (issue 48): other libraries' import-time
warnings (torchao's extensions, torch's ``_pytree`` deprecation, diffusers' torchao notice) stay
out, their errors still show, and ``--debug`` lets everything through. Run in fresh processes,
as a user runs the command: in-process the libraries are imported and configured already."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sixbit.cli import build_parser, logs

SRC = Path(__file__).resolve().parents[1] / "src"
NOISE = ("torchao", "_pytree", "Failed to load")
# Set by the user, these change what the libraries print; set by an in-process `main` they leak here.
LOGGING_ENV = ("TORCH_LOGS", "DIFFUSERS_VERBOSITY", "TRANSFORMERS_VERBOSITY")


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LOGGING_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=False)


# `demo` with one step: the full path (pipeline load, sampling, judge, video) in ~15 s instead of
# ~50 s for the default 20 steps on this CPU.
@pytest.mark.parametrize("argv", [["--help"], ["demo", "--steps", "1", "-o", "{tmp}"]], ids=["help", "demo"])
def test_command_prints_only_its_own_lines(argv, tmp_path):
    proc = _python("-m", "sixbit", *(a.format(tmp=tmp_path / "demo") for a in argv))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert not [word for word in NOISE if word in proc.stdout]
    assert proc.stdout.startswith("usage: sixbit" if argv == ["--help"] else "model:")


def test_debug_lets_the_other_libraries_through():
    raw = _python("-c", "import sixbit.cli.app")  # what the command imports, with nothing configured
    assert raw.returncode == 0, raw.stderr
    markers = [m for m in ("Failed to load", "_pytree", "Unable to import `torchao`") if m in raw.stderr]
    if not markers:
        pytest.skip("importing diffusers prints nothing here (no torchao, or its extensions load)")
    proc = _python("-m", "sixbit", "formats", "--family", "nvfp4", "--debug")  # after the command, too
    assert proc.returncode == 0, proc.stderr
    assert [m for m in markers if m in proc.stderr] == markers, proc.stderr
    assert "nvfp4" in proc.stdout


_ERRORS_STILL_SHOW = """
import logging, warnings
from sixbit.cli import logs
logs.configure(debug=False)
with logs.quiet_imports(debug=False):
    import sixbit.cli.app
for name in ("torchao", "torch.utils._pytree", "diffusers.models", "transformers.modeling_utils", "numpy"):
    logging.getLogger(name).warning("a warning from %s", name)
    logging.getLogger(name).error("an error from %s", name)
logging.getLogger("sixbit.memory").warning("a warning from sixbit")
warnings.warn("a warning after the imports")
"""


def test_other_libraries_errors_and_sixbit_warnings_still_show():
    proc = _python("-c", _ERRORS_STILL_SHOW)
    assert proc.returncode == 0, proc.stderr
    for name in ("torchao", "torch.utils._pytree", "diffusers.models", "transformers.modeling_utils", "numpy"):
        assert f"an error from {name}" in proc.stderr and f"a warning from {name}" not in proc.stderr
    assert "a warning from sixbit" in proc.stderr and "a warning after the imports" in proc.stderr


@pytest.mark.parametrize("argv, debug", [
    (["--debug", "formats"], True),
    (["formats", "--debug"], True),
    (["formats"], False),
    (["generate", "--prompt", "x", "--", "--debug"], False),
])
def test_debug_is_global_and_known_before_parsing(argv, debug):
    assert logs.wants_debug(argv) is debug
    if "--" not in argv:
        assert build_parser().parse_args(argv).debug is debug
