"""The JSON recordings of the replica's experiments, their provenance, and each scenario in a fresh process.

`kit.experiments.safety_run`, `readwrite_run`, `drafter_run` and `alternatives` share this:
reading a recording back (`read_recording`: one-line errors for a missing
file, one not JSON, one its schema check refuses; `source_line` for where it
was recorded), writing one (`write_recording`: `<preset>.json` and its
`PROVENANCE.json` entry, both atomically, through `kit.record.provenance`),
paths as the repository shows them (`repo_path`), and running each scenario as
`python -m MODULE --scenario NAME --preset P --out F` in a fresh process
(`run_in_subprocess`, `run_each`): patches and the graph pool are per
process. `run_fresh` is the one way the experiments start a process: with a
time limit, past which the child is killed and answers as failed. Every
module's `record` starts with `record_each` (the folder, the runs, the
recording's provenance) and `split_pairs`; `recording_main` is each
module's command line.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kit import progress
from kit.errors import KitError
from kit.fileio import atomic_write
from kit.record.provenance import add_entry
from kit.recordings import RECORDINGS

FRESH_PROCESS_TIMEOUT_S = 1800.0  # the longest scenario (a large preset's pairings) takes a few minutes


def run_fresh(argv: list[str], timeout_s: float = FRESH_PROCESS_TIMEOUT_S) -> subprocess.CompletedProcess:
    """`argv` in a fresh process, its output captured; one that runs past `timeout_s` is killed and answers as
    failed (return code -9), with what it had said and a last line saying why."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        said = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
        note = f"\nkit: error: killed after {timeout_s:.0f} s (its time limit)"
        return subprocess.CompletedProcess(argv, -9, said[0], said[1] + note)


def repo_path(path: str | Path) -> str:
    """`path` relative to the repository when it is inside it (provenance and source lines)."""
    try:
        return str(Path(path).resolve().relative_to(RECORDINGS.parents[1]))
    except ValueError:
        return str(path)


def trim_frames(raw: dict, keep: int = 6) -> None:
    """Keep the innermost `keep` stack frames of every segment, block and trace entry (recordings ship with the kit)."""
    for seg in raw["segments"]:
        seg["frames"] = seg.get("frames", [])[:keep]
        for block in seg["blocks"]:
            block["frames"] = block.get("frames", [])[:keep]
    for trace in raw.get("device_traces") or []:
        for entry in trace:
            entry["frames"] = entry.get("frames", [])[:keep]


# --- reading -----------------------------------------------------------------------------------


def read_recording(
    path: Path,
    what: str,
    missing: str,
    schema_problem: Callable[[Any], str | None],
    where: Callable[[Path], str] = repo_path,
) -> dict:
    """The JSON at `path`, checked: KitError `missing` without a file, `<where(path)>: not <what> (...)` else."""
    from kit.recordings import shipped, shipped_bytes

    if shipped(path) is None:
        raise KitError(missing)
    try:
        data = json.loads(shipped_bytes(path).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise KitError(f"{where(path)}: not {what} (not JSON: {e})") from None
    current_words(data)  # a recording in the words of before reads as one in today's
    problem = schema_problem(data)
    if problem:
        raise KitError(f"{where(path)}: not {what} ({problem})")
    return data


# Before the kit settled on one word, a recording called a scenario `policy` (safety, read/write: then a run's
# `scenario` was the replica scenario it ran, now `replica_scenario`) or `variant` (the drafter's), and the
# runs `policies` or `variants`. Recordings made so are read as they are; this is the one place that knows.
_OLD_RUNS = ("policies", "variants")


def current_words(data: Any) -> Any:
    """A recording (or one kept run) with the words it was written in made today's, in place; anything else as is."""
    if not isinstance(data, dict):
        return data
    for old in _OLD_RUNS:
        if old in data and "scenarios" not in data:
            data["scenarios"] = data.pop(old)
    runs = data.get("scenarios")
    for item in [data, *(runs.values() if isinstance(runs, dict) else []), *(data.get("pairs") or [])]:
        if isinstance(item, dict):
            _scenario_named(item)
    return data


def _scenario_named(item: dict) -> None:
    for old in ("policy", "variant"):
        if isinstance(item.get(old), str):
            if "scenario" in item:
                item["replica_scenario"] = item.pop("scenario")
            item["scenario"] = item.pop(old)


def load_shipped(path: Path, preset: str, command: str, schema_problem: Callable[[Any], str | None]) -> dict:
    """A recording `python -m kit COMMAND` shows, checked, with its `source` line (`--live` makes a missing one)."""
    missing = (
        f"no {command} recording for preset {preset!r} ({repo_path(path)}); run `python -m kit {command} --live "
        f"--preset {preset}` on a GPU"
    )
    what = f"{'an' if command[0] in 'aeiou' else 'a'} {command} recording"
    data = read_recording(path, what, missing, schema_problem)
    data["source"] = source_line(data, path)
    return data


def source_line(data: dict, path: Path) -> str:
    """`recorded on GPU, torch V, DATE (path)`, from the provenance; says so if it predates vLLM's sizing."""
    prov = data["provenance"]
    when = f"{prov.get('gpu', '?')}, torch {prov.get('torch', '?')}, {prov.get('date', '?')}"
    return f"recorded on {when} ({repo_path(path)})" + (f"; {EARLIER_SIZING}" if predates_vllm_sizing(data) else "")


EARLIER_SIZING = (
    "recorded with the kit's earlier replay sizing (one replay graph of N/2 rows per model graph, the presets now "
    "called *_half), before the presets took vLLM's: re-record with `make safety-recordings` on a GPU"
)


def predates_vllm_sizing(data: dict) -> bool:
    """Whether a replica recording was made before the presets took vLLM's replay sizing (its config has no
    `replay_sizing`; a recording with no config at all is one of those: every later one records it)."""
    runs = list((data.get("scenarios") or {}).values())
    configs = [data.get("config")] + [run.get("config") for run in runs if isinstance(run, dict)]
    found = [c for c in configs if isinstance(c, dict)]
    return not found or any("replay_sizing" not in c for c in found)


# --- writing -----------------------------------------------------------------------------------


def write_recording(data: dict, out_dir: Path, preset: str, **entry: Any) -> Path:
    """`data` into `out_dir/<preset>.json`; its `PROVENANCE.json` entry: provenance, `entry`, sha256."""
    text = json.dumps(data, indent=1) + "\n"
    path = out_dir / f"{preset}.json"
    with atomic_write(path) as f:
        f.write(text)
    add_entry(out_dir, path.name, {**data["provenance"], **entry}, text.encode())
    return path


def write_run(result: dict, out: str | Path) -> None:
    """One scenario's run, as `--out` of a single run gets it."""
    with atomic_write(out) as f:
        f.write(json.dumps(result, indent=1) + "\n")


# --- each scenario in a fresh process -----------------------------------------------------------


def run_in_subprocess(module: str, name: str, preset: str, out: Path, failed: str) -> dict:
    """`python -m module --scenario name --preset preset --out out` in a fresh process; what it wrote to `out`.

    On failure, KitError `<failed> failed: <the child's error>` (`child_error`).
    """
    done = run_fresh([sys.executable, "-m", module, "--scenario", name, "--preset", preset, "--out", str(out)])
    if done.returncode != 0:
        raise KitError(f"{failed} failed: {child_error(done.stderr or done.stdout)}")
    return json.loads(out.read_text())


def child_error(output: str) -> str:
    """The error a failed child process printed, in one line.

    The raised exception's own line (the last unindented `...Error: ...` or
    `kit: error: ...`), not whatever came last: torch ends a CUDA error with
    advice ("Compile with `TORCH_USE_CUDA_DSA`..."). A device-side assert's
    first message (the kernel, the file and the failed condition) is added,
    since the exception only says that one fired.
    """
    lines = [line.rstrip() for line in output.strip().splitlines()]
    raised = [
        line for line in lines
        if line.startswith("kit: error: ") or re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*:", line)
    ]  # fmt: skip
    error = raised[-1].removeprefix("kit: error: ") if raised else (lines[-1] if lines else "no output")
    asserted = next((line for line in lines if "Assertion `" in line and "failed" in line), None)
    if asserted:
        error += f" (first device-side assert: {asserted.strip()})"
    return error


# Where `run_each` keeps each run's file when the command line names a folder (`--runs`); None: a temporary one.
RUNS_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar("RUNS_DIR", default=None)


def run_each(
    names: Iterable[str], run_one: Callable[[str, str, Path], dict], preset: str, prefix: str
) -> dict[str, dict]:
    """`run_one(name, preset, out)` for every name, each into a file of a folder; runs by name.

    The folder is temporary unless `RUNS_DIR` names one (`--runs`). There each
    run is `<preset>-<name>.json`, and a run whose file is already there is read,
    not run again: a recording cut off by a time limit resumes where it stopped.
    """
    names = list(names)
    label = f"{prefix.strip('-')} ({preset}), one process each"

    def run_all(folder: Path) -> dict[str, dict]:
        runs = {}
        for name in progress.track(names, label):
            out = folder / f"{preset}-{name}.json"
            runs[name] = _kept_run(out) if out.exists() else run_one(name, preset, out)
        return runs

    if RUNS_DIR.get() is not None:
        return run_all(output_dir(RUNS_DIR.get()))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return run_all(Path(tmp))


def record_each(
    module: str, names: Iterable[str], run_one: Callable[[str, str, Path], dict], preset: str, out_dir: str | Path
) -> tuple[Path, dict[str, dict], dict]:
    """What every recording module's `record` starts with: `out_dir` made, and `run_each` of `names` into it.

    Returns the folder, the runs by name, and the recording's provenance: the
    first run's, with the command that records them all
    (`python -m MODULE --preset P --out DIR`).
    """
    out_dir = output_dir(out_dir)
    runs = run_each(names, run_one, preset, f"kit-{module.rsplit('.', 1)[-1]}-")
    first = next(iter(runs.values()))
    command = f"python -m {module} --preset {preset} --out {repo_path(out_dir)}"
    return out_dir, runs, {**first["provenance"], "command": command}


def split_pairs(runs: dict[str, dict]) -> tuple[list[dict], dict[str, dict]]:
    """Every run's `pairs` in one list, and each run's other keys by name."""
    pairs = [pair for run in runs.values() for pair in run["pairs"]]
    return pairs, {name: {k: v for k, v in run.items() if k != "pairs"} for name, run in runs.items()}


def _kept_run(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise KitError(f"{path}: a kept run that cannot be read ({e}); delete it to run it again") from None


def output_dir(out_dir: str | Path) -> Path:
    """`out_dir` resolved and made."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def _prog() -> str | None:
    """`python -m kit.experiments.X` where this process runs a kit package's `__main__`; else argparse's own."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", "") or ""
    return f"python -m {name.removesuffix('.__main__')}" if name.startswith("kit.") else None


def recording_main(
    argv: list[str] | None,
    *,
    description: str,
    old_flag: str,
    names: str,
    run_one: Callable[[str, str], dict],
    said: Callable[[str, dict], str],
    record: Callable[[str, Path], Path],
    summary: Callable[[str, Path], list[str]],
) -> int:
    """A recording module's command line: `--scenario NAME` runs one in this process into `--out`, else all of them.

    With `--scenario`, `run_one(name, preset)` is written to the file `--out`
    and `said(name, result)` printed (the line `run_in_subprocess`'s caller
    sees); without it, `record(preset, folder)` writes `<preset>.json` and
    `summary(preset, path)` is printed. A KitError is one line on stderr, exit 2.
    `old_flag` (`--policy`, `--variant`) is the name the flag had when the
    shipped recordings were made; their provenance commands still run.
    """
    parser = argparse.ArgumentParser(prog=_prog(), description=description)
    help_one = f"one scenario in this process ({names}); --out is its JSON file"
    parser.add_argument("--scenario", old_flag, dest="scenario", help=help_one)
    parser.add_argument("--preset", default="small")
    every = "folder for <preset>.json (every scenario), or with --scenario a file"
    parser.add_argument("--out", required=True, help=every)
    keep = "keep each scenario's run in this folder and reuse those already there (resume a cut-off recording)"
    parser.add_argument("--runs", type=Path, help=keep)
    args = parser.parse_args(argv)
    name = args.scenario
    token = RUNS_DIR.set(args.runs)
    try:
        if name:
            result = run_one(name, args.preset)
            write_run(result, args.out)
            print(said(name, result))
        else:
            path = record(args.preset, Path(args.out))
            print(f"wrote {path}")
            print("\n".join(summary(args.preset, path)))
    except KitError as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2
    finally:
        RUNS_DIR.reset(token)
    return 0
