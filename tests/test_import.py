"""What ``import sixbit`` does (issue 48): it is quick, loads neither torch nor diffusers until a
name is used, resolves every public name as the eager imports did, and never touches the
user's warning filters or logging configuration (only the ``sixbit`` command may)."""

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import sixbit

SRC = Path(sixbit.__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False,
                          timeout=300)


def test_import_loads_neither_torch_nor_diffusers():
    proc = _python("import sys, sixbit; print(sorted(m for m in ('torch', 'diffusers', 'torchao') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_every_public_name_resolves_to_its_module():
    for module, names in sixbit._EXPORTS.items():
        source = importlib.import_module(f"sixbit.{module}")
        for name in names:
            assert getattr(sixbit, name) is getattr(source, name), name
    assert sixbit.formats is importlib.import_module("sixbit.formats")
    assert {"quantize", "formats", "__version__"} <= set(dir(sixbit))
    assert sixbit.optimize.enable_memory_optimization  # any submodule, as an attribute
    from sixbit import QuantConfig, convert_model  # noqa: F401  (from-imports go through __getattr__)


def test_a_moved_module_resolves_with_a_warning():
    """Modules moved in issue 59 keep their old attribute path, deprecated."""
    import warnings

    for old, new in sixbit._MOVED.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert getattr(sixbit, old) is importlib.import_module(f"sixbit.{new}")
        assert any(issubclass(w.category, DeprecationWarning) and f"sixbit.{new}" in str(w.message) for w in caught), old
    assert not hasattr(importlib.import_module("sixbit"), "_no_module_here")


def test_unknown_name_is_an_attribute_error():
    for name in ("no_such_name", "_private"):
        try:
            getattr(sixbit, name)
        except AttributeError as e:
            assert name in str(e)
        else:
            raise AssertionError(f"sixbit.{name} resolved")


def test_type_checking_imports_mirror_the_lazy_table():
    tree = ast.parse((SRC / "sixbit" / "__init__.py").read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    seen = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1
        seen.setdefault(node.module, []).extend(a.name for a in node.names)
    modules = seen.pop(None)
    assert sorted(modules) == ["formats"]
    assert {m: sorted(n) for m, n in seen.items()} == {m: sorted(n) for m, n in sixbit._EXPORTS.items()}


_CONFIG_UNCHANGED = """
import importlib.util, logging, warnings
import torch, diffusers, diffusers.hooks  # third-party import-time changes are theirs, not sixbit's
if importlib.util.find_spec("torchao"):
    import torchao

def state():
    names = ("", "sixbit", "torch", "torch.utils._pytree", "torchao", "diffusers", "transformers")
    loggers = {n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
               for n in names}
    return list(warnings.filters), loggers, logging.root.manager.disable

before = state()
import sixbit, sixbit.optimize, sixbit.pipelines
for name in sixbit.__all__:
    getattr(sixbit, name)
after = state()
assert after == before, (before, after)
print("unchanged")
"""


def test_import_leaves_warning_filters_and_logging_alone():
    proc = _python(_CONFIG_UNCHANGED)
    assert proc.returncode == 0 and proc.stdout.strip() == "unchanged", proc.stderr[-3000:]
