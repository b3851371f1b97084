"""The layers of docs/ARCHITECTURE.md, checked: each module imports only its own layer and the
layers below it, no two modules share a name, and the plug-in folders hold what they should."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "smoothcert"

# From the ground up, as in docs/ARCHITECTURE.md; a module's layer is that of its first path part.
LAYERS = [
    {"errors", "registry", "rng", "io", "tensors", "radii", "version"},
    {"stats"},
    {"noise", "sound_noise"},
    {"sampling"},
    {"smoothing"},
    {"sigma_optimization", "attacks"},
    {"certifiers"},
    {"methods"},
    {"data", "image_folders", "models", "recipes", "distributed"},
    {"runs"},
    {"training", "train"},
    {"metrics", "plots", "report", "analysis", "demo"},
    {"cli", "__init__"},
]


def layer_of(part: str) -> int:
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"smoothcert.{part} is in no layer of docs/ARCHITECTURE.md")


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def imported(path: Path) -> set[str]:
    """The first path part of every smoothcert module that ``path`` imports (lazily too)."""
    package = path.relative_to(PACKAGE).parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[: len(package) - node.level + 1])
            parts = base + (node.module.split(".") if node.module else [])
            if parts:
                found.add(parts[0])
            else:  # "from . import x" at the top: x is a module
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("smoothcert."):
            found.add(node.module.split(".")[1])
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_layer_and_below(path):
    own = layer_of(path.relative_to(PACKAGE).parts[0].removesuffix(".py"))
    above = {name for name in imported(path) if layer_of(name.removesuffix(".py")) > own}
    assert not above, f"{path.name} imports from a higher layer: {sorted(above)}"


def test_no_two_modules_share_a_name():
    names = [p.stem for p in modules() if p.stem != "__init__"]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_each_plugin_folder_holds_its_registrations():
    from smoothcert.certifiers import CERTIFIERS
    from smoothcert.methods import METHODS

    for registry, folder in ((CERTIFIERS, "certifiers"), (METHODS, "methods")):
        for name, cls in registry.items():
            assert cls.__module__.startswith(f"smoothcert.{folder}."), (name, cls.__module__)
    statistics = {p.stem for p in (PACKAGE / "stats").glob("*.py")} - {"__init__"}
    assert statistics == {"binomial", "sequential_tests", "margins"}


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
