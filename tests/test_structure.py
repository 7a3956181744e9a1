"""The package's shape (issues 43 and 59, DESIGN.md "Layout"): imports flow one way, no private
name crosses a package, and every file and function stays small enough to read on a screen or two.

Read from the source with ``ast``, so nothing is imported: every ``import`` counts, at module
level or inside a function (a function-level import that hides a cycle is still a cycle), except
those under ``if TYPE_CHECKING:``, which never run. ``import a.b.c`` also runs the ``__init__`` of
``a`` and ``a.b``: the graph counts those parent packages (except the importer's own, which are
already running), so a small utility under a heavy package ``__init__`` shows as what it costs.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "sixbit"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 80
LIMITS = {"convert.py": 250, "presets.py": 150, "nn/quant_linear.py": 400}  # the issue's own targets


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _package(module: str) -> str:
    """The package a module belongs to: itself for a package's ``__init__``, else its parent."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def _imports(module: str):
    """(imported sixbit module, imported name or None) for every import statement of ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    skipped = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sixbit":
                    yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(module).split(".")[: len(_package(module).split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "sixbit":
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield (full, None) if full in MODULES else (source, alias.name)


def _parents(target: str, importer: str) -> set[str]:
    """The packages whose ``__init__`` importing ``target`` runs, less ``importer``'s own
    (running already) and the lazy top-level ``sixbit`` (it imports no module that imports back)."""
    parts = target.split(".")
    packages = {".".join(parts[:i]) for i in range(2, len(parts))}
    return {p for p in packages if not (importer == p or importer.startswith(p + "."))}


def _graph(parents: bool = True) -> dict[str, set[str]]:
    graph = {}
    for module in MODULES:
        targets = set()
        for target, _ in _imports(module):
            while target not in MODULES:  # `import sixbit.x.y` of a name: its module
                target = target.rpartition(".")[0]
            targets |= {target} | (_parents(target, module) if parents else set())
        targets.discard(module)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_the_package():
    graph = _graph()
    assert len(MODULES) > 100 and "sixbit.checkpoint" in graph["sixbit.convert"]  # `from .checkpoint import finish`
    assert {"sixbit.methods", "sixbit.methods.delta_cache"} <= graph["sixbit.eval.plots"]  # parents counted
    assert "sixbit.methods" not in graph["sixbit.methods.record"]  # but not the importer's own package
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the checker itself


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (each a set of modules that import each other):\n" + "\n".join(map(str, cycles))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_crosses_a_package():
    crossings = []
    for module in MODULES:
        for target, name in _imports(module):
            while target not in MODULES:
                target = target.rpartition(".")[0]
            if _package(target) == _package(module) or target == _package(module):
                continue
            private_module = any(_private(part) for part in target.split("."))
            if private_module or (name is not None and _private(name)):
                crossings.append(f"{module} imports {target}{'' if name is None else '.' + name}")
    assert not crossings, "private names used across packages:\n" + "\n".join(sorted(set(crossings)))


def test_files_and_functions_fit_on_a_screen_or_two():
    too_long = []
    for module, path in MODULES.items():
        text = path.read_text()
        relative = path.relative_to(SRC).as_posix()
        limit = LIMITS.get(relative, MAX_FILE_LINES)
        if text.count("\n") > limit:
            too_long.append(f"{relative}: {text.count(chr(10))} lines > {limit}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{relative}:{node.lineno} {node.name}() is {lines} lines > {MAX_FUNCTION_LINES}")
    assert not too_long, "\n".join(too_long)


# The layers, from the bottom up (DESIGN.md "Layout"): a module imports its own package's modules
# and those of the layers before it, never one above. A new package or top-level module takes its
# place here.
LAYERS = [
    "version", "files",                                     # no sixbit imports
    "formats", "transforms", "kernels", "nn", "models",     # numbers, kernels, layers, model metadata
    "config", "presets",                                    # every config, the named ones
    "runtime", "memory", "calibration", "rounding",         # steps and hooks; offload; statistics
    "lora",                                                 # LoRAs: below the builder, which refuses to replace their layers
    "builder",                                              # weights
    "methods",                                              # the runtime methods and their registry
    "preflight", "checkpoint", "footprint", "convert", "parallel", "tuning",  # the public jobs
    "integrations", "streaming",                            # diffusers' doors in; real size from files
    "eval", "zoo", "pipelines", "bench", "optimize", "cli", "__main__",  # around the library
]
# (importer, imported) pairs of layers allowed to point up, each with its reason. Keep it short.
UPWARD: dict[tuple[str, str], str] = {}


def _layer(module: str) -> str:
    return module.split(".")[1] if module != "sixbit" else "sixbit"


def test_every_package_has_a_layer():
    missing = sorted({_layer(m) for m in MODULES} - set(LAYERS) - {"sixbit"})
    assert not missing, f"place these in LAYERS (tests/test_structure.py): {missing}"


def test_imports_point_down_the_layers():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module, targets in _graph().items():
        if module == "sixbit":  # the lazy top level, above everything
            continue
        for target in targets:
            a, b = _layer(module), _layer(target)
            if b != "sixbit" and rank[b] > rank[a] and (a, b) not in UPWARD:
                upward.append(f"{module} ({a}) imports {target} ({b})")
    assert not upward, "imports pointing up the layers:\n" + "\n".join(sorted(upward))
    assert _layer("sixbit.methods.record") == "methods"  # the checker itself


def test_the_checker_sees_an_upward_import():
    rank = {name: i for i, name in enumerate(LAYERS)}
    assert rank["config"] < rank["calibration"] and rank["nn"] < rank["runtime"] < rank["methods"] < rank["convert"]


# Package __init__s that still define functions or classes, each with its reason. Keep it short.
LOGIC_IN_INIT = {
    "sixbit": "PEP 562 lazy names: `import sixbit` loads neither torch nor diffusers",
    "sixbit.integrations": "runs at `import sixbit`, before diffusers is imported: tells diffusers the backend's name",
    "sixbit.integrations.diffusers": "importing it replaces the light table entries by the real backend",
    "sixbit.zoo.shapes": "the shipped models' loaders (the zoo sits outside the library core)",
}


def test_package_inits_re_export():
    """Issue 59: a package __init__ holds imports, __all__ and constants, so a small utility under
    it never drags logic in with it."""
    found = []
    for module, path in MODULES.items():
        if path.name != "__init__.py" or module in LOGIC_IN_INIT:
            continue
        defined = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        if defined:
            found.append(f"{module}: {defined}")
    assert not found, "package __init__s that define functions or classes (move them to a module):\n" + "\n".join(found)


TOP_LEVEL_MODULES = 12  # issue 59: the top level names its jobs; the rest lives in packages


def test_the_top_level_is_small():
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}"


@pytest.mark.parametrize("path", ["convert.py", "presets.py", "nn/quant_linear.py"])
def test_the_named_modules_exist(path):
    assert (SRC / path).is_file()
