"""`--runs DIR`: a recording cut off by the device's time limit resumes from the runs it kept."""

from __future__ import annotations

import json

import pytest

from kit.errors import KitError
from kit.experiments import recorded


def test_kept_runs_are_reused_and_the_rest_run(tmp_path):
    ran = []

    def run_one(name, preset, out):
        ran.append(name)
        result = {"name": name, "preset": preset}
        recorded.write_run(result, out)
        return result

    token = recorded.RUNS_DIR.set(tmp_path)
    try:
        recorded.write_run({"name": "pr", "kept": True}, tmp_path / "large-pr.json")
        runs = recorded.run_each(["pr", "unpatched"], run_one, "large", "kit-x-")
        assert ran == ["unpatched"]
        assert runs["pr"] == {"name": "pr", "kept": True}
        assert json.loads((tmp_path / "large-unpatched.json").read_text())["preset"] == "large"
        # Another preset's runs are not this preset's.
        recorded.run_each(["pr"], run_one, "small", "kit-x-")
        assert ran == ["unpatched", "pr"]
    finally:
        recorded.RUNS_DIR.reset(token)


def test_without_runs_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(recorded.tempfile, "tempdir", str(tmp_path))
    recorded.run_each(["pr"], lambda name, preset, out: recorded.write_run({}, out) or {}, "small", "kit-x-")
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_kept_run_is_one_line(tmp_path):
    (tmp_path / "small-pr.json").write_text("{not json")
    token = recorded.RUNS_DIR.set(tmp_path)
    try:
        with pytest.raises(KitError, match="small-pr.json: a kept run that cannot be read.*delete it"):
            recorded.run_each(["pr"], lambda *a: {}, "small", "kit-x-")
    finally:
        recorded.RUNS_DIR.reset(token)


def test_the_command_line_takes_runs_and_leaves_no_folder_set(tmp_path):
    seen = []

    def record(preset, out):
        seen.append(recorded.RUNS_DIR.get())
        return out / f"{preset}.json"

    argv = ["--preset", "large", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")]
    code = recorded.recording_main(
        argv,
        description="",
        old_flag="--variant",
        names="",
        run_one=None,
        said=None,
        record=record,
        summary=lambda preset, path: [],
    )
    assert code == 0 and seen == [tmp_path / "runs"]
    assert recorded.RUNS_DIR.get() is None


def test_record_each_makes_the_folder_and_stamps_the_whole_command(tmp_path):
    def run_one(name, preset, out):
        return {"name": name, "pairs": [{"of": name}], "provenance": {"gpu": f"gpu of {name}", "command": "one run"}}

    out_dir, runs, provenance = recorded.record_each(
        "kit.experiments.safety_run", ["pr", "unpatched"], run_one, "small", tmp_path / "made"
    )
    assert out_dir == (tmp_path / "made").resolve() and out_dir.is_dir()
    assert list(runs) == ["pr", "unpatched"]
    assert provenance == {
        "gpu": "gpu of pr",
        "command": f"python -m kit.experiments.safety_run --preset small --out {recorded.repo_path(out_dir)}",
    }
    pairs, rest = recorded.split_pairs(runs)
    assert pairs == [{"of": "pr"}, {"of": "unpatched"}]
    assert rest["unpatched"] == {"name": "unpatched", "provenance": runs["unpatched"]["provenance"]}


MODULES = ("safety_run", "readwrite_run", "drafter_run", "alternatives")


@pytest.mark.parametrize("name", MODULES)
def test_every_recording_module_records_through_record_each(name, tmp_path, monkeypatch):
    import importlib

    package = importlib.import_module(f"kit.experiments.{name}")
    # A split experiment records from its GPU-run module; the command it names is the package's.
    module = importlib.import_module(f"{package.__name__}.run") if hasattr(package, "__path__") else package
    seen = []

    def record_each(module_name, names, run_one, preset, out_dir):
        seen.append((module_name, list(names), run_one, preset))
        raise KitError("stop here")

    monkeypatch.setattr(module, "require_cuda", lambda message: None)
    monkeypatch.setattr(recorded, "record_each", record_each)
    with pytest.raises(KitError, match="stop here"):
        module.record("small", tmp_path)
    [(module_name, names, run_one, preset)] = seen
    assert module_name == package.__name__ and preset == "small" and names
    assert run_one is module.run_scenario_in_subprocess
