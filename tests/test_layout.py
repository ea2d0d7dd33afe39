"""The package's layout by role (CONTRIBUTING.md): few modules at the root, one name per module, every factory
registered as an entry point, no private name reached across packages, no benchmark shipped in the wheel."""

import ast
import configparser
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).parents[1]
PACKAGE = REPO / "spacy_conceptnorm"

# Private names of other libraries that have no public spelling: torch's CPU feature tests, thinc's forward
# function (wrapped for bf16 autocast), spaCy's listener linking (as `spacy assemble` does), transformers' model
# construction without random initialization (the recognizer's weights), os._exit in a forked child.
THIRD_PARTY_PRIVATE = {
    "_is_avx512_bf16_supported", "_is_amx_tile_supported", "_func", "_link_components", "_from_config", "_exit",
}  # fmt: skip


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def package_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else ""


def test_at_most_five_modules_at_the_root():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 5, root


def test_no_two_modules_share_a_name():
    names = Counter(p.name for p in modules() if p.name != "__init__.py")
    assert [name for name, n in names.items() if n > 1] == []


def test_benchmarks_live_beside_the_package():
    assert (REPO / "benchmarks").is_dir()
    assert not list(PACKAGE.rglob("benchmarks"))
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert setup["options.packages.find"]["include"].split() == ["spacy_conceptnorm*"]


def test_text_holds_no_spacy():
    for path in (PACKAGE / "text").glob("*.py"):
        imports = [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.ImportFrom)]
        assert not [n.module for n in imports if n.module and n.module.split(".")[0] in {"spacy", "thinc"}], path


def test_every_factory_has_an_entry_point():
    factories = set()
    for path in modules():
        factories |= set(re.findall(r'@Language\.factory\(\s*"(\w+)"', path.read_text(encoding="utf-8")))
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    entry_points = {
        line.split("=")[0].strip() for line in setup["options.entry_points"]["spacy_factories"].strip().splitlines()
    }
    assert factories and factories == entry_points


def private_names_defined(paths: list[Path]) -> set[str]:
    """The private names a group of modules defines: functions, classes, assigned names and attributes."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_no_private_name_is_used_across_packages():
    by_package: dict[str, list[Path]] = {}
    for path in modules():
        by_package.setdefault(package_of(path), []).append(path)
    own = {package: private_names_defined(paths) for package, paths in by_package.items()}
    found = []
    for path in modules():
        allowed = own[package_of(path)] | THIRD_PARTY_PRIVATE
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level + bool(node.module):
                names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                found += [f"{path.relative_to(REPO)}:{node.lineno} imports {n}" for n in names if n not in allowed]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if node.attr not in allowed:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} uses .{node.attr}")
    assert found == []
