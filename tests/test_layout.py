"""The package's layout holds: the package map, the layer order, no import loop, the public API, named files exist.

The package map and the layers are read from `docs/architecture.md`'s table,
the one place they are written. Imports are counted the strict way: an import
inside a function counts, and importing `kit.a.b` counts as importing the
sub-package `kit.a` too (its `__init__` runs first). Only the top-level
`kit/__init__.py`, which gathers the public API, is left out of that: every
module imports it implicitly.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "kit"


def load_registries():
    """scripts/registries.py, the one place that lists the kit's modules and writes the registries."""
    spec = importlib.util.spec_from_file_location("registries", ROOT / "scripts" / "registries.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REGISTRIES = load_registries()
MODULES = REGISTRIES.kit_modules()  # every module, the vLLM stubs (data put on vLLM's import path) left out
only_a_docstring = REGISTRIES.only_a_docstring


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
    # kit.analysis.trace.walk imports the columnar walk at the top; a function-level import back would be a loop
    assert "kit.analysis.trace.columnar" in imports_of("kit.analysis.trace.walk")
    assert "kit.analysis.trace" in imports_of("kit.analysis.trace.walk")  # the sub-package's __init__ runs first


def test_sub_packages_init_import_nothing_of_the_kit_but_errors():
    for name, path in MODULES.items():
        if path.name == "__init__.py" and name != "kit":
            assert imports_of(name) <= {"kit.errors"}, name


# --- the package map and its layers (docs/architecture.md) -------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Imports that break the layer order, each allowed by name with its reason. Keep this list short.
# Imports allowed across the layer order, each with its reason; none today (the GPU workload run moved to kit.record).
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}


def package_map(text: str) -> dict[str, tuple[int, list[str]]]:
    """The map's rows: each package or top-level module, with its layer and the modules it names."""
    section = text.split("## Package map", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or not cells[0].isdigit():
            continue  # prose, the header or its rule
        unit = cells[1].strip("`")
        rows[unit] = (int(cells[0]), [f"{unit}.{m}" for m in re.findall(r"`([\w.]+)`", cells[2])])
    return rows


MAP = package_map(ARCHITECTURE.read_text())


def named_by_the_map(rows: dict[str, tuple[int, list[str]]]) -> set[str]:
    """Every module the map names, with the packages those live in."""
    named = set(rows)
    for _, modules in rows.values():
        for module in modules:
            while module.count("."):
                named.add(module)
                module = module.rpartition(".")[0]
    named.discard("kit")
    return named


def unit_of(module: str) -> str:
    """The map's row `module` belongs to: the longest package or module it is, or is inside."""
    return max((u for u in MAP if module == u or module.startswith(u + ".")), key=len)


def layer_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, row) for each import of a row of the same layer or a higher one, the exceptions left out."""
    found = set()
    for module, imported in graph.items():
        mine = unit_of(module)
        for target in imported:
            theirs = unit_of(target)
            if theirs != mine and MAP[theirs][0] >= MAP[mine][0]:
                found.add((module, theirs))
    return found - set(LAYER_EXCEPTIONS)


def test_the_package_map_names_every_module_and_only_those():
    modules = set(MODULES) - {"kit"}
    named = named_by_the_map(MAP)
    assert not modules - named, f"docs/architecture.md's package map does not name {sorted(modules - named)}"
    assert not named - modules, f"docs/architecture.md's package map names missing modules {sorted(named - modules)}"


def test_no_module_imports_a_higher_layer_or_its_own():
    graph = {m: imports_of(m) for m in MODULES if m != "kit"}
    assert not layer_violations(graph), sorted(layer_violations(graph))


def test_every_layer_exception_is_still_an_import():
    graph = {m: imports_of(m) for m in MODULES if m != "kit"}
    stale = {(m, u) for m, u in LAYER_EXCEPTIONS if m not in graph or u not in {unit_of(t) for t in graph[m]}}
    assert not stale, f"LAYER_EXCEPTIONS lists imports that are gone, remove them: {sorted(stale)}"


def test_the_layer_check_sees_a_lower_layer_importing_a_higher_one():
    assert MAP["kit.load"][0] < MAP["kit.analysis"][0] < MAP["kit.show"][0]
    assert layer_violations({"kit.load.rows": {"kit.analysis.tables"}}) == {("kit.load.rows", "kit.analysis")}
    assert layer_violations({"kit.errors": {"kit.progress"}}) == {("kit.errors", "kit.progress")}  # same layer
    assert not layer_violations({"kit.show.report": {"kit.analysis.tables", "kit.show.pictures"}})
    assert layer_violations({"kit.allocator.simulator": {"kit.record"}}) == {("kit.allocator.simulator", "kit.record")}


def test_the_map_check_sees_a_module_left_out_and_one_made_up():
    rows = package_map("## Package map\n\n| 1 | `kit.load` | `rows`, `trace.replay` | x |\n| 2 | `kit.cli` | — | y |\n")
    assert rows == {"kit.load": (1, ["kit.load.rows", "kit.load.trace.replay"]), "kit.cli": (2, [])}
    assert named_by_the_map(rows) == {"kit.load", "kit.load.rows", "kit.load.trace", "kit.load.trace.replay", "kit.cli"}


def unnamed_in_docstring(package: str) -> list[str]:
    """The modules directly in `package` that its `__init__` docstring does not name in backticks."""
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    named = set(re.findall(r"`(\w+)", doc))
    children = {m.rpartition(".")[2] for m in MODULES if m.rpartition(".")[0] == package}
    return sorted(children - named)


@pytest.mark.parametrize("package", [m for m, p in MODULES.items() if p.name == "__init__.py" and m != "kit"])
def test_a_sub_packages_docstring_names_each_of_its_modules(package):
    assert not unnamed_in_docstring(package), f"{package}'s docstring leaves out {unnamed_in_docstring(package)}"


# --- docs/testing.md: which test files cover which module ---------------------------------------


def test_the_package_map_and_the_test_table_are_as_the_code_makes_them(capsys):
    assert REGISTRIES.main(["--check"]) == 0, capsys.readouterr().err


def test_the_registries_see_a_stale_page_a_package_with_no_layer_and_an_untested_module(tmp_path, monkeypatch):
    reg = REGISTRIES
    page = tmp_path / "testing.md"
    page.write_text(reg.TESTING.read_text().replace("| `kit.cli` |", "| `kit.cli_gone` |"))
    monkeypatch.setattr(reg, "TESTING", page)
    assert reg.main(["--check"]) == 1
    modules = reg.kit_modules()
    with pytest.raises(reg.RegistryError, match="no layer for .'kit.newpkg'"):
        reg.package_map({**modules, "kit.newpkg": KIT / "errors.py"})
    with pytest.raises(reg.RegistryError, match="no test file imports or runs .'kit.analysis.untested'"):
        reg.test_table({**modules, "kit.analysis.untested": KIT / "errors.py"})
    assert "kit.analysis.pairing" in reg.covered_by(ROOT / "tests" / "test_diff_pairing.py", modules, {})
    assert "kit.__main__" in reg.covered_by(ROOT / "tests" / "test_ranks.py", modules, {})


def modules_in_the_test_table(text: str) -> set[str]:
    """The modules `docs/testing.md`'s table of tests names, one a row."""
    section = text.split("## Which tests cover which module", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(kit[\w.]*)` \|", section, re.M))


def test_every_module_has_its_tests_named_in_docs_testing():
    expected = {m for m, p in MODULES.items() if not (p.name == "__init__.py" and only_a_docstring(p))}
    named = modules_in_the_test_table((ROOT / "docs" / "testing.md").read_text())
    assert not expected - named, f"docs/testing.md names no tests for {sorted(expected - named)}"
    assert not named - expected, f"docs/testing.md names modules that do not exist: {sorted(named - expected)}"


def test_the_test_table_check_reads_module_rows():
    text = "## Which tests cover which module\n\n| module | tests |\n| --- | --- |\n| `kit.load.rows` | x |\n"
    text += "| `kit` | y |\n"
    assert modules_in_the_test_table(text) == {"kit.load.rows", "kit"}
    assert only_a_docstring(KIT / "load" / "__init__.py") and not only_a_docstring(KIT / "recordings" / "__init__.py")


# --- scripts/README.md: one row a script -----------------------------------------------------------

SCRIPTS = ROOT / "scripts"


def scripts_on_disk() -> set[str]:
    """Every script under scripts/, relative to it: its files, plain_programs/'s, and any other folder as one."""
    found = {p.name for p in SCRIPTS.iterdir() if p.is_file() and p.name != "README.md"}
    found |= {f"plain_programs/{p.name}" for p in (SCRIPTS / "plain_programs").glob("*.py")}
    return found | {
        f"{p.name}/" for p in SCRIPTS.iterdir() if p.is_dir() and p.name not in ("plain_programs", "__pycache__")
    }


def scripts_in_readme(text: str) -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.M))


def test_scripts_readme_lists_every_script_and_only_those():
    listed, present = scripts_in_readme((SCRIPTS / "README.md").read_text()), scripts_on_disk()
    assert not present - listed, f"scripts/README.md does not list {sorted(present - listed)}"
    assert not listed - present, f"scripts/README.md lists scripts that do not exist: {sorted(listed - present)}"


def test_the_scripts_check_sees_each_kind_of_script():
    assert {"fuzz.py", "gpu_tests.sh", "plain_programs/two_captures.py"} <= scripts_on_disk()
    assert scripts_in_readme("| script | role |\n| --- | --- |\n| `fuzz.py` | check |\n") == {"fuzz.py"}


# --- the public API: what the notebooks, the README and the docs use as kit.X -----------------

USER_FACING = sorted([*(ROOT / "notebooks").glob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def used_as_kit_attributes(text: str) -> set[str]:
    """The names `text` uses as `kit.X` or `from kit import X`, modules and dunders left out."""
    names = set(re.findall(r"(?<![\w./-])kit\.([A-Za-z_]\w*)", text))
    for imported in re.findall(r"^\s*from kit import ([^\n(]+|\([^)]*\))", text, re.M):
        names |= set(re.findall(r"\w+", imported.replace(" as ", " ").split("#")[0]))
    return {n for n in names if f"kit.{n}" not in MODULES and not n.startswith("__")}


def test_kits_public_api_is_what_the_notebooks_readme_and_docs_use():
    import kit

    used = set().union(*(used_as_kit_attributes(p.read_text()) for p in USER_FACING))
    assert not used - set(kit.__all__), f"used as kit.X but not public: {sorted(used - set(kit.__all__))}"
    assert not set(kit.__all__) - used, f"public but used nowhere: {sorted(set(kit.__all__) - used)}"
    assert all(getattr(kit, name) is not None for name in kit.__all__)


def test_the_public_api_check_reads_kit_attributes():
    text = "kit.load_snapshot(p); kit.load.rows; kit.__file__\nfrom kit import KitError, segment_table\n"
    assert used_as_kit_attributes(text) == {"load_snapshot", "KitError", "segment_table"}


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
    if rest == [""]:
        return True  # a module that exists; not imported (importing kit.__main__ would run the command line)
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


# --- one word per idea (docs/architecture.md, "Words") ------------------------------------------

RETIRED = {  # a word in a name -> why it is not used
    "variant": "a named run is a scenario",
    "replay_trace": "the kit walks a trace (walk_trace); replay is vLLM's replay graphs",
    "tracereplay": "the kit walks a trace (TraceWalk)",
}
RETIRED_MODULES = {"pairings": "the safety experiment is safety_run"}  # a pairing: model graph N, replay graph R


def names_in(path: Path, module: str) -> list[str]:
    """The module's own name, and its top-level functions, classes and constants."""
    names = [module.rpartition(".")[2]]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def words_out_of_place(module: str, names: list[str]) -> list[str]:
    """Names that use a retired word, or "policy" outside the stream rule's module."""
    bad = [f"{module}: {n} ({why})" for n in names for word, why in RETIRED.items() if _uses_word(n, word)]
    last = module.rpartition(".")[2]
    bad += [f"{module} ({why})" for word, why in RETIRED_MODULES.items() if last == word]
    if module != "kit.patch.policy":
        bad += [f"{module}: {n} (a policy is the stream rule)" for n in names if "polic" in n.lower()]
    return bad


def _uses_word(name: str, word: str) -> bool:
    """Whether `word` starts a word of `name` ("run_variant", "VARIANTS"; not "invariant", another word)."""
    return re.search(rf"(?<![a-z]){word}", name.lower()) is not None


# Data: a key, a parameter or a string constant the kit reads or writes. A scenario is `scenario` in data too.
RETIRED_KEYS = {"variant": "a named run is a scenario", "variants": "the runs are scenarios", "policies": "ditto"}
OLD_WORDS_READ = {"kit.experiments.summary": "vllm_scenario_of reads a snapshot's old `variant`"}  # the one reader
# A `policy` key is the stream rule a run captured under, in these modules and nowhere else.
POLICY_KEYS = {
    "kit.vllm_plugin": "the stream rule KIT_VLLM_PATCH asks for",
    "kit.experiments.scenarios": "the stream rule a replica scenario captures under",
    "kit.experiments.vllm.capture": "the stream rule a vLLM scenario captures under",
    "kit.experiments.vllm.recordings": "the stream rule a vLLM scenario captures under",
    "kit.experiments.summary": "the stream rule of the run summarized",
    "kit.experiments.early_aux": "the stream rule of the run looked for",
    "kit.show.safety": "the stream rule of the run shown",
    "kit.experiments.safety_run.result": "`kit safety --json`'s contract names each pairing's scenario `policy` too",
}


POLICY_MEANS = "a scenario is `scenario`; a policy is the stream rule"


def data_words_out_of_place(module: str, source: str) -> list[str]:
    """Keys (dict literals, subscripts, .get/.pop/.setdefault) and parameters that use a retired word for data."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        keys = []
        if isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant)]
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            keys = [node.slice]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("get", "pop", "setdefault"):
            keys = [a for a in node.args[:1] if isinstance(a, ast.Constant)]
        elif isinstance(node, ast.arg) and _uses_word(node.arg, "variant"):
            bad.append(f"{module}:{node.lineno}: parameter {node.arg} (a named run is a scenario)")
        for key in keys:
            if key.value in RETIRED_KEYS and module not in OLD_WORDS_READ:
                bad.append(f"{module}:{key.lineno}: key {key.value!r} ({RETIRED_KEYS[key.value]})")
            elif key.value == "policy" and module not in POLICY_KEYS:
                bad.append(f"{module}:{key.lineno}: key 'policy' ({POLICY_MEANS})")
    return bad


def test_no_key_or_parameter_uses_a_retired_word_for_data():
    bad = [b for m, p in MODULES.items() for b in data_words_out_of_place(m, p.read_text())]
    assert not bad, bad


def test_the_data_word_check_sees_an_old_key_and_a_policy_meaning_a_scenario():
    source = 'def f(variant):\n    return {"policy": variant, "x": data["variants"], "y": d.get("policies")}\n'
    assert [b.split(": ", 1)[1] for b in data_words_out_of_place("kit.analysis.x", source)] == [
        "parameter variant (a named run is a scenario)",
        "key 'policy' (a scenario is `scenario`; a policy is the stream rule)",
        "key 'variants' (the runs are scenarios)",
        "key 'policies' (ditto)",
    ]
    assert data_words_out_of_place("kit.vllm_plugin", 'x = {"policy": "pr"}') == []


def cli_commands() -> set[str]:
    from kit.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_no_module_function_or_command_name_uses_a_word_for_another_idea():
    bad = [b for m, p in MODULES.items() for b in words_out_of_place(m, names_in(p, m))]
    bad += [c for c in cli_commands() if any(word in c for word in RETIRED)]
    assert not bad, bad


def test_the_word_check_sees_a_retired_word_and_a_policy_out_of_place():
    assert words_out_of_place("kit.analysis.x", ["INVARIANT", "invariant_table", "VARIANTS"]) == [
        "kit.analysis.x: VARIANTS (a named run is a scenario)"
    ]
    assert words_out_of_place("kit.experiments.x", ["run_variant", "PAIRING_POLICIES", "run_scenario"]) == [
        "kit.experiments.x: run_variant (a named run is a scenario)",
        "kit.experiments.x: PAIRING_POLICIES (a policy is the stream rule)",
    ]
    assert words_out_of_place("kit.experiments.pairings", ["pairings", "run_pairings"]) == [
        "kit.experiments.pairings (the safety experiment is safety_run)"
    ]
    assert words_out_of_place("kit.patch.policy", ["STREAM_POLICIES", "check_policy"]) == []


# Public names that several modules define on purpose: one idea, each experiment's own (its command line,
# its recording, its scenario run, its dispatch rule's `can_run`), or the allocator's block in the
# simulator and in a snapshot's rows. Any other name defined twice is two ideas under one word.
SHARED_NAMES = {
    "main", "record", "load_recording", "recording_path", "run_scenario", "run_scenario_in_subprocess",
    "run_live", "summary_lines", "explain", "can_run", "output_names", "build_runner", "saving_line", "Block",
}  # fmt: skip


def names_defined_twice(modules: dict[str, list[str]]) -> dict[str, list[str]]:
    """Public functions and classes that more than one module defines, outside `SHARED_NAMES`: name -> modules."""
    where: dict[str, list[str]] = {}
    for module, names in modules.items():
        for name in names:
            where.setdefault(name, []).append(module)
    return {n: ms for n, ms in where.items() if len(ms) > 1 and n not in SHARED_NAMES and not n.startswith("_")}


def public_definitions(path: Path) -> list[str]:
    body = ast.parse(path.read_text()).body
    return [n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def test_no_public_function_name_is_defined_for_two_ideas():
    twice = names_defined_twice({m: public_definitions(p) for m, p in MODULES.items()})
    assert not twice, f"one name, two definitions (rename one, or add it to SHARED_NAMES if one idea): {twice}"


def test_the_twice_check_sees_a_second_definition_but_not_a_shared_or_private_name():
    modules = {"kit.a": ["shown", "record", "_helper"], "kit.b": ["shown", "record", "_helper"], "kit.c": ["x"]}
    assert names_defined_twice(modules) == {"shown": ["kit.a", "kit.b"]}


# --- byte units, defined once (kit.units) -----------------------------------------------------

UNIT_NAMES = {"KIB", "MIB", "GIB"}
UNIT_POWERS = {10, 20, 30}


def units_defined_outside(module: str, source: str) -> list[str]:
    """Where a module other than kit.units defines KIB/MIB/GIB or writes 2**10, 2**20 or 2**30 itself."""
    if module == "kit.units":
        return []
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            names = [n for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            found += [f"{module}:{node.lineno} {n.id} =" for n in names if n.id in UNIT_NAMES]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            base, exp = node.left, node.right
            if getattr(base, "value", None) == 2 and getattr(exp, "value", None) in UNIT_POWERS:
                found.append(f"{module}:{node.lineno} 2**{exp.value}")
    return found


def test_byte_units_are_defined_once():
    found = [f for m, p in MODULES.items() for f in units_defined_outside(m, p.read_text())]
    assert not found, f"import KIB/MIB/GIB from kit.units instead: {found}"


def test_the_units_check_sees_a_second_definition_and_a_bare_power():
    assert units_defined_outside("kit.x", "MIB = 1 << 20\nx = y / 2**30\nz = 1 << 20\n") == [
        "kit.x:1 MIB =",
        "kit.x:2 2**30",
    ]
    assert units_defined_outside("kit.units", "KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30") == []


# --- pool, stream and manager labels, written once (kit.analysis.names) -------------------------


def label_literals(module: str, source: str, labels: set[str]) -> list[str]:
    """String constants in code (docstrings aside) equal to one of the recorder's labels."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{module}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in labels and id(node) not in docstrings
    ]


def recorder_labels() -> set[str]:
    from kit.analysis import names

    return {value for name, value in vars(names).items() if name.endswith("_LABEL") and isinstance(value, str)}


def test_pool_stream_and_manager_labels_are_written_once():
    # The replica names its managers as vLLM does, in its own code; the recorder reads them from there.
    checked = {m: p for m, p in MODULES.items() if m != "kit.analysis.names" and not m.startswith("kit.replica")}
    found = [f for m, p in checked.items() for f in label_literals(m, p.read_text(), recorder_labels())]
    assert not found, f"use the constants of kit.analysis.names: {found}"


def test_the_label_check_sees_a_literal_but_not_a_docstring():
    source = '"""The model graphs stream."""\nstreams = {"model graphs stream": 1}\n'
    assert label_literals("kit.x", source, recorder_labels()) == ["kit.x:2 'model graphs stream'"]


# --- patching: only through kit.patch ----------------------------------------------------------


def patching_outside_kit_patch(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, target) of every attribute another object is patched at by hand: an imported module's or class's
    attribute assigned or deleted (or set with setattr/delattr), or any object's attribute given a function
    defined in the function doing it. `kit.patch.install.Patch` does this and puts everything back."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    found = []

    def target_name(node: ast.AST) -> str | None:
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id not in ("self", "cls")
        ):
            return f"{node.value.id}.{node.attr}"
        return None

    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
        nested = {n.name for n in ast.walk(function) if isinstance(n, ast.FunctionDef) and n is not function}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
                value = getattr(node, "value", None)
                flat = [e for target in targets for e in (target.elts if isinstance(target, ast.Tuple) else [target])]
                for t in flat:
                    name = target_name(t)
                    local_function = isinstance(value, ast.Name) and value.id in nested
                    if name and (name.split(".")[0] in imported or local_function):
                        found.append((node.lineno, name))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
            ):
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Name) and first.id in imported:
                    found.append((node.lineno, f"{node.func.id}({first.id}, ...)"))
    return found


# Not patches: what these set up stays for the process's life, or mirrors vLLM's own code.
NOT_PATCHES = {
    # the stand-in's process groups, set as vLLM's initialize_model_parallel sets them
    ("kit.experiments.vllm.standin", "setattr(parallel_state, ...)"),
    # the stand-in's model state, built with object.__new__ and given its methods
    ("kit.experiments.vllm.standin", "state.prepare_attn"),
    ("kit.experiments.vllm.standin", "state._prepare_replay_batch"),
    ("kit.experiments.vllm.standin", "state.replay_batch"),
    # the replica's estimate swaps its own global pool for a throwaway one, as vLLM's profile_cudagraph_memory does
    ("kit.replica.model_runner", "cudagraph_utils._global_graph_pool"),
}


def test_no_module_outside_kit_patch_patches_another_objects_attributes():
    offenders = []
    for name, path in MODULES.items():
        if name == "kit.patch" or name.startswith("kit.patch."):
            continue
        found = patching_outside_kit_patch(ast.parse(path.read_text()))
        offenders += [f"{name}:{line} {target}" for line, target in found if (name, target) not in NOT_PATCHES]
    assert offenders == []


def test_the_patching_check_finds_a_hand_made_patch():
    planted = ast.parse(
        "import torch\nfrom vllm import Coordinator\n"
        "def spy(wrapper):\n"
        "    def replay(*args):\n        pass\n"
        "    wrapper._replay = replay\n"
        "    Coordinator.graph_capture = None\n"
        "    del torch.cuda\n"
        "    setattr(torch, 'x', 1)\n"
        "    self_made = object()\n"
        "    self_made.value = 1\n"
    )
    assert [t for _, t in patching_outside_kit_patch(planted)] == [
        "wrapper._replay",
        "Coordinator.graph_capture",
        "torch.cuda",
        "setattr(torch, ...)",
    ]


def test_every_planted_bug_still_finds_its_line():
    """A mutation whose text left the code plants nothing and proves nothing (scripts/mutations.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutations", ROOT / "scripts" / "mutations.py")
    mutations = importlib.util.module_from_spec(spec)
    import sys

    sys.modules["mutations"] = mutations  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(mutations)
    finally:
        del sys.modules["mutations"]
    stale = [m.name for m in mutations.MUTATIONS if (ROOT / m.file).read_text().count(m.old) != 1]
    assert stale == []


def test_no_experiment_module_runs_past_500_lines():
    """An experiment that outgrows one module is split by what a reader looks for (kit/experiments' docstring)."""
    lines = {p: len(p.read_text().splitlines()) for p in (ROOT / "kit" / "experiments").rglob("*.py")}
    assert not {str(p.relative_to(ROOT)): n for p, n in lines.items() if n > 500 and "stubs" not in p.parts}
