"""Packaging: `pip install -e .` builds in an isolated environment without torch, so the
version must be readable without importing the package (CI stop 49 failed on exactly this)."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_version_attr_is_a_literal_in_a_module_that_imports_nothing():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attr.rpartition(".")
    path = ROOT / "src" / Path(*module.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], (
        f"{path.name} imports something: setuptools would have to execute it to read the version"
    )
    values = [n.value for n in tree.body if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    assert len(values) == 1 and isinstance(values[0], ast.Constant) and isinstance(values[0].value, str)


def test_package_version_is_the_packaged_one():
    import sixbit
    from sixbit.version import __version__

    assert sixbit.__version__ == __version__
