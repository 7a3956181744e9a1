"""The config home sits low: every other package may import it, so it imports nothing above
``formats``/``nn`` (read from the source with ``ast``, function-level imports included)."""

import ast
from pathlib import Path

import sixbit

CONFIG = Path(sixbit.__file__).parent / "config"

# What the configs validate against: format names, activation modes, Hadamard block sizes and
# layer roles (``Role``: the model side's name of a layer's job). Scale rules, time-range specs and
# the shared checks live in the config package itself.
ALLOWED = {"formats", "nn", "transforms", "models.roles", "config"}


def _sixbit_imports(path: Path):
    """(line, module) of each sixbit module ``path`` imports, relative to ``sixbit``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ["config"][: max(0, 2 - node.level)]  # level 1: sixbit.config, level 2: sixbit
            target = ".".join(base + ([node.module] if node.module else []))
            names = [target] if node.module else [".".join(base + [a.name]) for a in node.names]
            yield from ((node.lineno, n) for n in names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            yield from ((node.lineno, m.removeprefix("sixbit.")) for m in modules if m.startswith("sixbit."))


def test_config_imports_nothing_above_formats_and_nn():
    files = sorted(CONFIG.glob("*.py"))
    assert len(files) >= 9
    above = [f"{p.name}:{line} imports sixbit.{module}" for p in files for line, module in _sixbit_imports(p)
             if not any(module == ok or module.startswith(ok + ".") for ok in ALLOWED)]
    assert not above, "\n".join(above)
