"""The package's layout holds: no import loop among the kit's modules, and every file and module named exists.

Import loops are counted the strict way: an import inside a function counts,
and importing `kit.a.b` counts as importing the sub-package `kit.a` too (its
`__init__` runs first). Only the top-level `kit/__init__.py`, which gathers
the public API, is left out of that: every module imports it implicitly.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "kit"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(KIT.rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The kit module `name` names, or the module holding attribute `name`."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every kit module `module` imports, anywhere in it, and the sub-packages those imports run."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = resolve(name) if name.startswith("kit") else None
            while target and target != "kit":
                found.add(target)
                target = target.rpartition(".")[0]  # its parent packages' __init__ run first
    found.discard(module)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop of `graph`, as the modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_loop_among_the_kits_modules():
    graph = {m: imports_of(m) for m in MODULES if m != "kit"}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_loop_check_sees_a_loop_through_an_import_inside_a_function():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    # kit.analysis.trace.replay imports the columnar walk at the top; a function-level import back would be a loop
    assert "kit.analysis.trace.columnar" in imports_of("kit.analysis.trace.replay")
    assert "kit.analysis.trace" in imports_of("kit.analysis.trace.replay")  # the sub-package's __init__ runs first


def test_sub_packages_init_import_nothing_of_the_kit_but_errors():
    for name, path in MODULES.items():
        if path.name == "__init__.py" and name != "kit":
            assert imports_of(name) <= {"kit.errors"}, name


# --- every file and module the project names exists ---------------------------------------------

TEXT_FILES = sorted(
    [*KIT.rglob("*.py"), *(ROOT / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    + [*(ROOT / "notebooks").glob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "Makefile"]
)
PATH = re.compile(r"(?<![\w./-])((?:kit|docs|scripts|notebooks|tests|benchmarks)/[\w./-]*\w)")
MODULE = re.compile(r"(?<![\w./-])(kit(?:\.[a-z_][a-z0-9_]*)+)")
# Paths a command writes or a user makes; they need not exist in the repository.
MADE_BY_RUNS = ("build/", "tests/browser/node_modules")


def named_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in PATH.findall(text)}


def exists(path: str) -> bool:
    if any(glob in path for glob in ("*", "{", "<")):
        return True
    return (ROOT / path).exists()


def names_a_kit_object(dotted: str) -> bool:
    module = resolve(dotted)
    if module is None:
        return False
    rest = dotted[len(module) :].strip(".").split(".")
    obj = importlib.import_module(module)
    for attr in filter(None, rest):
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_named_exists(path):
    text = path.read_text()
    missing = sorted(p for p in named_paths(text) if not exists(p) and not p.startswith(MADE_BY_RUNS))
    assert not missing, f"{path.relative_to(ROOT)} names files that do not exist: {missing}"


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_kit_module_named_exists(path):
    text = path.read_text()
    missing = sorted(m for m in set(MODULE.findall(text)) if not names_a_kit_object(m))
    assert not missing, f"{path.relative_to(ROOT)} names kit modules or objects that do not exist: {missing}"


def test_the_reference_checks_catch_a_missing_file_and_module():
    assert named_paths("see `docs/no_such_page.md` and kit/load/rows.py.") == {
        "docs/no_such_page.md",
        "kit/load/rows.py",
    }
    assert not exists("docs/no_such_page.md") and exists("kit/load/rows.py")
    assert names_a_kit_object("kit.load.snapshot.load_snapshot")
    assert not names_a_kit_object("kit.snapshot.load_snapshot")  # the module before the redesign
    assert not names_a_kit_object("kit.load.snapshot.no_such_function")
