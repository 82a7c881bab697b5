"""Every command the kit names exists: those its recordings' provenance recorded, and those its docs show.

Provenance: every `command` of every `PROVENANCE.json` under kit/recordings
and tests/fixtures. Docs: the code (fenced blocks and inline spans) of
README.md and docs/*.md. In either, a command is `python -m kit SUBCOMMAND`
(the subcommand and each `--flag` after it must be `python -m kit`'s, read
from its parser), `python -m kit.x.y` or `python scripts/x.py` (run with
`--help`, once per distinct module or script, in this process with `runpy`: it must
exit 0 and its help must name each `--flag` the command gives it), `bash
scripts/x.sh` (the file must exist: running it would run it) and `make X` (a
target of the Makefile). A module renamed, a flag dropped or a make target
gone fails here by name.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest

from kit.cli import build_parser
from kit.recordings import RECORDINGS

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted([*RECORDINGS.rglob("PROVENANCE.json"), *(ROOT / "tests" / "fixtures").rglob("PROVENANCE.json")])
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# `python -m kit[.x.y]`, `python|bash scripts/x.py|sh`, `make X`; a module after a bare `-m` too (a recorded
# command's "(with --speculator: -m kit.experiments.scenarios ...)").
INVOCATION = re.compile(
    r"(?<![\w-])-m\s+(?P<module>kit(?:\.\w+)*)(?![\w.])"
    r"|(?:python[\d.]*|bash|sh)\s+(?P<script>scripts/[\w/.-]+\.(?:py|sh))"
    r"|(?<![\w./-])make\s+(?P<target>[a-z][\w-]*)"
)
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")
SUBCOMMAND = re.compile(r"[a-z][a-z-]*")  # anything else where one stands (`COMMAND`, `...`) is a placeholder


def invocations(command: str) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """(kind, name, flags, words) of each invocation in `command`: kind `module`, `script` or `target`; its
    `--flags` and words up to the next invocation or the end of its shell command (`|`, `;`, `&`, `#`, `(`, `)`)."""
    matches = list(INVOCATION.finditer(command))
    out = []
    for k, m in enumerate(matches):
        end = matches[k + 1].start() if k + 1 < len(matches) else len(command)
        rest = re.split(r"[|;&#()\n]", command[m.end() : end], maxsplit=1)[0]
        kind = next(name for name in ("module", "script", "target") if m.group(name))
        flags = tuple(dict.fromkeys(f.split("=")[0] for f in FLAG.findall(rest)))
        out.append((kind, m.group(kind), flags, tuple(rest.split())))
    return out


def recorded_commands(node: object) -> list[str]:
    """Every string under a key `command`, at any depth."""
    if isinstance(node, dict):
        return [c for k, v in node.items() for c in ([v] if k == "command" and isinstance(v, str) else [])] + [
            c for k, v in node.items() if k != "command" for c in recorded_commands(v)
        ]
    if isinstance(node, list):
        return [c for v in node for c in recorded_commands(v)]
    return []


def code_of(text: str) -> list[str]:
    """A Markdown text's code: each fenced block (backslash-continued lines joined) and each inline span."""
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
    blocks = [b.replace("\\\n", " ") for b in fenced.findall(text)]
    return blocks + re.findall(r"`([^`\n]+)`", fenced.sub("", text))


def named_in_docs() -> list[tuple[str, tuple]]:
    """(where, invocation) for each command the docs show."""
    out = []
    for path in DOCS:
        for code in code_of(path.read_text()):
            for line in code.splitlines():
                out += [(path.name, inv) for inv in invocations(line)]
    return out


def named_in_provenance() -> list[tuple[str, tuple]]:
    """(where, invocation) for each command a PROVENANCE.json recorded."""
    out = []
    for manifest in MANIFESTS:
        where = str(manifest.relative_to(ROOT))
        for command in recorded_commands(json.loads(manifest.read_text())):
            found = invocations(command)
            assert found, f"{where}: a command that names no module, script or make target: {command!r}"
            out += [(where, inv) for inv in found]
    return out


def kit_command_problem(flags: tuple[str, ...], words: tuple[str, ...]) -> str | None:
    """Why `python -m kit WORDS` names something `python -m kit` does not have, or None."""
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    top = {o for a in parser._actions for o in a.option_strings}
    sub = next((w for w in words if not w.startswith(("-", "["))), None)
    if sub is None or not SUBCOMMAND.fullmatch(sub):
        return None
    if sub not in subcommands:
        return f"no subcommand {sub!r}"
    known = top | {o for a in subcommands[sub]._actions for o in a.option_strings}
    missing = [f for f in flags if f not in known]
    return f"`{sub}` has no {', '.join(missing)}" if missing else None


def help_of(kind: str, name: str) -> tuple[int, str]:
    """`python -m NAME --help` or `python NAME --help` in this process (`runpy`, as `-m` and a script path run
    them, from the repository): its exit status and what it printed."""
    printed = io.StringIO()
    argv, path, cwd = sys.argv, list(sys.path), os.getcwd()
    sys.argv = [name, "--help"]
    status = 0
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: a module of a package already imported
            if kind == "module":
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(ROOT / name), run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else int(e.code is not None)
    except Exception as e:  # noqa: BLE001 - a module that does not import, or a script that fails: the answer
        status = 1
        printed.write(f"{type(e).__name__}: {e}")
    finally:
        sys.argv, sys.path[:] = argv, path
        os.chdir(cwd)
    return status, printed.getvalue()


@pytest.fixture(scope="module")
def named() -> list[tuple[str, tuple]]:
    return named_in_provenance() + named_in_docs()


@pytest.fixture(scope="module")
def helps(named) -> dict[tuple[str, str], tuple[int, str]]:
    """`--help` of every distinct module (but `kit` itself) and Python script named."""
    runnable = sorted(
        {(kind, name) for _, (kind, name, _, _) in named if (kind, name) != ("module", "kit") and kind != "target"}
        - {("script", name) for _, (kind, name, _, _) in named if name.endswith(".sh")}
    )
    return {kn: help_of(*kn) for kn in runnable}


def problems(named: list, helps: dict) -> list[str]:
    """What the named commands name that does not exist, one line each."""
    targets = set(re.findall(r"^([A-Za-z][\w-]*)\s*:", (ROOT / "Makefile").read_text(), re.M))
    out = []
    for where, (kind, name, flags, words) in named:
        if (kind, name) == ("module", "kit"):
            why = kit_command_problem(flags, words)
        elif kind == "target":
            why = None if name in targets else "no such make target"
        elif name.endswith(".sh"):
            why = None if (ROOT / name).is_file() else "no such script"
        else:
            status, text = helps[kind, name]
            missing = [f for f in flags if f not in text]
            why = (
                f"`--help` exits {status}: {text.strip().splitlines()[-1] if text.strip() else ''}"
                if status != 0
                else (f"its --help names no {', '.join(missing)}" if missing else None)
            )
        if why:
            out.append(f"{where}: {kind} {name}: {why}")
    return sorted(set(out))


def test_every_recorded_command_runs_its_help_and_takes_its_flags(helps):
    named = named_in_provenance()
    assert {name for _, (_, name, _, _) in named} >= {"kit.experiments.safety_run", "scripts/record_replica.py"}
    assert problems(named, helps) == []


def test_every_command_the_docs_show_exists(helps):
    named = named_in_docs()
    kinds = {kind for _, (kind, _, _, _) in named}
    assert kinds == {"module", "script", "target"} and len(named) > 50
    assert problems(named, helps) == []


def test_a_renamed_module_a_dropped_flag_and_a_missing_target_are_named(helps):
    named = [
        ("x", inv)
        for command in (
            "python -m kit.experiments.pairings --preset small --out kit/recordings/safety",
            "python -m kit.experiments.safety_run --preset small --policies all",
            "python -m kit demo --vllm --jsn",
            "python -m kit pairings",
            "make recordingz && bash scripts/nowhere.sh",
        )
        for inv in invocations(command)
    ]
    extra = {("module", "kit.experiments.pairings"): help_of("module", "kit.experiments.pairings")}
    found = problems(named, {**helps, **extra})
    expected = (
        "x: module kit: `demo` has no --jsn",
        "x: module kit: no subcommand 'pairings'",
        "x: module kit.experiments.pairings: `--help` exits 1: ",
        "x: module kit.experiments.safety_run: its --help names no --policies",
        "x: script scripts/nowhere.sh: no such script",
        "x: target recordingz: no such make target",
    )
    assert len(found) == len(expected) and all(any(line.startswith(e) for line in found) for e in expected), found


def test_invocations_read_flags_up_to_the_next_command():
    command = (
        "python scripts/record_replica.py --out DIR (with --speculator: -m kit.experiments.scenarios x --preset a)"  # noqa: E501
    )
    assert invocations(command) == [
        ("script", "scripts/record_replica.py", ("--out",), ("--out", "DIR")),
        ("module", "kit.experiments.scenarios", ("--preset",), ("x", "--preset", "a")),
    ]
    assert [inv[1] for inv in invocations("make test; python -m kit --quiet demo | pytest -m gpu")] == ["test", "kit"]
