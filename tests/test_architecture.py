"""The shape of docs/ARCHITECTURE.md, checked: the folders are layers (each imports only its own
layer and the layers below it), no import circle between modules (function-level imports
included), at most 10 modules at the top of the package, none over 500 lines, no function over
50 lines (from its ``def`` to its last line), and the plug-in folders hold what they should."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "smoothcert"

# From the ground up, as in docs/ARCHITECTURE.md; a module's layer is that of its first path part.
LAYERS = [
    {"errors", "registry", "rng", "io", "tensors", "model_calls", "radii", "version", "upgrade"},
    {"stats", "noise", "data", "transforms"},
    {"smoothing", "models", "denoisers"},
    {"certifiers", "methods"},
    {"runs"},
    {"training"},
    {"evaluation"},
    {"cli", "__init__"},
]
MAX_TOP_LEVEL_MODULES = 10
MAX_LINES = 500


def layer_of(part: str) -> int:
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"smoothcert.{part} is in no layer of docs/ARCHITECTURE.md")


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path: Path) -> str:
    """``noise.base`` for src/smoothcert/noise/base.py; a package is its folder's name."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


KNOWN = {dotted(p) for p in modules()}


def imported(path: Path) -> set[str]:
    """Every smoothcert module (dotted, as :func:`dotted`) that ``path`` imports, lazily too.

    ``from a import b`` names module ``a.b`` when that is a module, else module ``a``; the
    implicit import of parent packages is Python's mechanics, not an edge."""
    own = dotted(path)
    parts = own.split(".") if own else []
    package = parts if path.name == "__init__.py" else parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + (node.module.split(".") if node.module else []))
            elif (node.module or "").split(".")[0] == "smoothcert":
                module = node.module.removeprefix("smoothcert").removeprefix(".")
            else:
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}" if module else alias.name
                found.add(sub if sub in KNOWN else module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "smoothcert":
                    found.add(alias.name.removeprefix("smoothcert").removeprefix("."))
    found.discard(own)
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_layer_and_below(path):
    own = layer_of(path.relative_to(PACKAGE).parts[0].removesuffix(".py"))
    above = {name for name in imported(path)
             if name and layer_of(name.split(".")[0]) > own}
    assert not above, f"{path.name} imports from a higher layer: {sorted(above)}"


def find_circle(graph: dict) -> list | None:
    """One import circle of ``graph`` (module -> imported modules), or None."""
    state = {}  # 1: on the path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return None


def test_find_circle_finds_one():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circle_between_modules():
    graph = defaultdict(set)
    for path in modules():
        graph[dotted(path)] |= imported(path)
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_top_of_the_package_is_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_too_long(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)}: {lines} lines"


def test_each_plugin_folder_holds_its_registrations():
    from smoothcert.certifiers import CERTIFIERS
    from smoothcert.methods import METHODS
    from smoothcert.noise import NOISES
    from smoothcert.transforms import TRANSFORMS

    for registry, folder in ((CERTIFIERS, "certifiers"), (METHODS, "methods"), (NOISES, "noise"),
                             (TRANSFORMS, "transforms")):
        for name, cls in registry.items():
            assert cls.__module__.startswith(f"smoothcert.{folder}."), (name, cls.__module__)


def test_statistics_are_torch_free():
    """``stats/`` is pure NumPy/SciPy float64: it can be checked against closed forms without a
    model, and never inherits a tensor's dtype or device."""
    for path in (PACKAGE / "stats").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {alias.name.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, (ast.Import, ast.ImportFrom))
                 for alias in (node.names if isinstance(node, ast.Import) else
                               [ast.alias(node.module or "")])}
        assert "torch" not in names, path.name


MAX_FUNCTION_LINES = 50


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (N lines, line L)`` for each function or method of ``path`` longer than ``limit``
    lines. A function's lines run from its ``def`` line to its last line, inclusive: the
    docstring, comments and blank lines inside it count, its decorators do not, and a function
    nested in another counts in both."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_long_functions_counts_from_def_to_the_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(48))
    short = tmp_path / "short.py"  # def + docstring + 48 statements: 50 lines, the limit
    short.write_text(f"@staticmethod\ndef f():\n    '''doc'''\n{body}\n")
    assert long_functions(short) == []
    long = tmp_path / "long.py"  # one more line, a comment: 51
    long.write_text("class A:\n    def g(self):\n        '''doc'''\n        # why\n"
                    + body.replace("    ", "        ") + "\n")
    assert long_functions(long) == ["g (51 lines, line 2)"]


def test_no_function_is_too_long():
    """No function or method in src/smoothcert over MAX_FUNCTION_LINES lines
    (:func:`long_functions`)."""
    found = [f"{path.relative_to(PACKAGE)}: {name}" for path in modules()
             for name in long_functions(path)]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(found)
