"""vLLM 0.33's own capture path recorded on the H200 (kit/recordings/vllm): what it shows, where it came from.

`scripts/vllm_on_device.sh` ran `kit.experiments.vllm.capture` on the H200
from the bundle of vLLM's sources: `GPUModelRunner.capture_model`, its graph
managers, `graph_capture()`, the breakable wrapper and the decoder replay
graphs, all vLLM's, around a stand-in DeepSeek-V4.1, with real CUDA graphs
in vLLM's global graph pool, unpatched and under `kit.patch.vllm`. These
tests read the figures back from the snapshots: the acceptance of issue 20,
and of issue 28 (the read/write obligation and the pairings on vLLM's own
path: under the PR it holds and every dispatchable pairing is bit-exact; with
early aux forced to share it holds too when the aux is returned as V4.1 does,
and when it is handed out weak (the hypothetical flat return) it is violated,
and the graphs differ from eager on exactly the violated pairings). Each
recording is read as the scenario it ran (`vr.recorded_as`): the
shipped ones predate the return shapes' names.

`KIT_VLLM_RECORDINGS=DIR` checks a fresh recording in DIR (what
`bash scripts/vllm_on_device.sh DIR` wrote) before it is shipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from kit.experiments.early_aux import CHANGES
from kit.experiments.summary import summarize, vllm_scenario_of
from kit.experiments.vllm import recordings as vr
from kit.experiments.vllm.capture import BYPASSED, CONSTRUCTED, NOT_MODELLED, PATHS, STOOD_IN
from kit.experiments.vllm.recordings import VLLM_SCENARIOS
from kit.recordings import RECORDINGS
from tests.helpers import OWED_ON_THE_H200, owed

FOLDER = Path(os.environ.get("KIT_VLLM_RECORDINGS") or RECORDINGS / "vllm")
MODEL_STREAM, REPLAY_STREAM = "model graphs stream", "decoder replay graphs stream"
REPLAY_SIZES = [96, 192, 288, 384, 480, 512]  # vLLM's default sizing, window 96, up to the largest model graph
DISPATCHABLE = {
    (128, 96), (128, 192), (256, 96), (256, 192), (256, 288),
    (512, 96), (512, 192), (512, 288), (512, 384), (512, 480), (512, 512),
}  # fmt: skip
SAFE = ("unpatched", "patched", "early_aux_pr", "early_aux_pr_flat", "early_aux_shared")
UNSAFE = "early_aux_shared_flat"  # hypothetical: early aux forced to share, handed out weak
PLANTED = "planted_cross_break_read"  # a bug on purpose: the invariant and graphs-vs-eager must fail
COMPRESSED = sorted(p.name.removesuffix(".pickle.gz") for p in FOLDER.glob("*.pickle.gz"))  # shipped as .gz
STEMS = sorted([*(p.stem for p in FOLDER.glob("*.pickle")), *COMPRESSED])  # the files, as named when recorded


@pytest.fixture(autouse=True)
def recordings_in_folder(monkeypatch):
    """`demo --vllm` reads the recordings under test (the shipped ones unless KIT_VLLM_RECORDINGS says)."""
    monkeypatch.setattr(vr, "recording_path", lambda name: FOLDER / f"{name}.pickle")


@pytest.fixture(scope="module")
def manifest() -> dict:
    path = FOLDER / "PROVENANCE.json"
    assert path.is_file(), f"no {path}: record with `bash scripts/vllm_on_device.sh OUT`"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def every_recording(manifest) -> dict:
    return vr.load_recordings(FOLDER)


@pytest.fixture(scope="module")
def snapshots(every_recording) -> dict:
    """The scenarios at the stand-in's own sizes (vLLM's default presets are checked on their own, below)."""
    return {name: snap for name, snap in every_recording.items() if not VLLM_SCENARIOS[name].preset}


@pytest.fixture(scope="module")
def recorded(snapshots) -> dict:
    return {name: summarize(snap) for name, snap in snapshots.items()}


@pytest.fixture(scope="module")
def safe(recorded) -> list[str]:
    """The scenarios shown safe that are recorded here (`early_aux_pr` with V4.1's return shape is owed)."""
    return [name for name in SAFE if name in recorded]


def test_every_scenario_is_recorded_and_nothing_else(manifest, every_recording):
    snapshots = every_recording
    files = sorted(p.name for p in FOLDER.iterdir() if p.is_file() and p.name not in ("probe.json", "run.txt"))
    shipped = sorted(f"{stem}.pickle{'.gz' if stem in COMPRESSED else ''}" for stem in STEMS)
    assert files == sorted(["PROVENANCE.json", *shipped])  # what the script wrote, the largest compressed
    assert sorted(manifest) == sorted(f"{stem}.pickle" for stem in STEMS)
    assert set(STEMS) <= set(VLLM_SCENARIOS) | set(vr.OLD_NAMES) and len(snapshots) == len(STEMS)  # one scenario each
    # Every scenario is recorded but those tests/helpers.py still lists as owed (vLLM's default presets); in the
    # shipped folder, a listed one that has been recorded fails `owed`.
    listed = {name for name in VLLM_SCENARIOS if f"vllm/{name}.pickle" in OWED_ON_THE_H200}
    assert set(VLLM_SCENARIOS) - set(snapshots) <= listed
    if FOLDER == RECORDINGS / "vllm":
        assert set(VLLM_SCENARIOS) - set(snapshots) == {name for name in listed if owed(f"vllm/{name}.pickle")}


@pytest.mark.parametrize("name", STEMS)
def test_provenance_names_the_gpu_torch_vllm_and_every_stand_in(manifest, name):
    from kit.recordings import shipped_bytes

    entry = manifest[f"{name}.pickle"]
    data = shipped_bytes(FOLDER / f"{name}.pickle")  # the file as recorded (a .gz decompressed)
    assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["bytes"] == len(data)
    assert entry["gpu"].startswith(("NVIDIA H200", "NVIDIA H100")) and entry["torch"].startswith("2.11")
    assert entry["vllm"]["version"] == "0.33.0"
    assert entry["vllm"]["bundle"]["checked"] > 3000  # every source file checked against the wheel's RECORD
    assert entry["stood_in"] == STOOD_IN
    # Every constructor bypassed (object.__new__), what was made by its own, and what is not modelled.
    assert entry["bypassed"] == BYPASSED and entry["constructed"] == list(CONSTRUCTED)
    assert entry["not_modelled"] == NOT_MODELLED
    assert entry["weak_ref_tensor"] == "kit (vllm._C missing)"
    for stub in entry["stubs"]:  # a stubbed package says what it is and why; a compiled extension, that it is one
        compiled = stub["module"].startswith("vllm.")
        why = "a compiled extension of the vLLM wheel" if compiled else f"Stub of {stub['module']}"
        assert stub["why"].startswith(why)
    assert {s["module"] for s in entry["stubs"]} >= {"vllm._C_stable_libtorch", "fastapi", "xgrammar"}
    assert vllm_scenario_of(entry)["name"] == name and vllm_scenario_of(entry)["path"] in PATHS
    # The full path (GPUModelRunner.capture_model) ran, or what stopped it is kept.
    assert vllm_scenario_of(entry)["path"] == "runner" or entry["earlier_path_failed"]


def test_the_replay_sizes_are_vllms_default_and_every_model_graph_breaks_out(snapshots):
    for name, snap in snapshots.items():
        scenario = vllm_scenario_of(snap.kit)
        assert scenario["replay_sizes"] == REPLAY_SIZES and scenario["trim_threshold"] == 128, name
        assert list(scenario["config"]["decoder_replay_cudagraph_capture_sizes"]) == [], name  # left to vLLM
        assert scenario["config"]["window"] == 96, name


def test_each_model_graph_is_two_segments_around_the_break_and_each_replay_graph_one(snapshots):
    from kit.analysis.attribution import capture_table

    for name, snap in snapshots.items():
        table = capture_table(snap)
        model, replay = table[table["manager"] == "model graphs"], table[table["manager"] == "decoder replay graphs"]
        assert sorted(model["size"]) == [128, 256, 512] and set(model["graphs"]) == {2}, name
        assert sorted(replay["size"]) == REPLAY_SIZES and set(replay["graphs"]) == {1}, name


def test_unpatched_replay_graphs_add_pool_segments_on_a_stream_graph_capture_made_for_them(recorded, snapshots):
    s = recorded["unpatched"]
    assert s["replay_stream_names"] == [REPLAY_STREAM] and not s["replay_on_model_stream"]
    assert s["replay_streams_from_graph_capture"]
    assert len(set(vllm_scenario_of(snapshots["unpatched"].kit)["graph_capture_streams"])) == 2
    assert s["replay_added_bytes"] > 0
    assert set(s["replay_added_by_stream"]) == {REPLAY_STREAM}  # by the stream's name, as the replica's


def test_replay_graphs_split_over_two_streams_are_not_on_the_model_graphs_stream(snapshots):
    """One replay capture moved off the model graphs' stream: they are on it only where every one of them is."""
    import copy

    from kit.load.snapshot import Snapshot

    raw = copy.deepcopy(snapshots["patched"].raw)
    first = next(c for c in raw["kit"]["captures"] if "replay" in c["manager"])
    first["stream"] = 12345
    figures = summarize(Snapshot(raw, origin="patched, one replay capture on another stream"))
    assert figures["model_stream"] in figures["replay_streams"] and not figures["replay_on_model_stream"]


def test_patched_replay_graphs_capture_on_the_model_graphs_stream_and_add_a_fraction(recorded, snapshots):
    s = recorded["patched"]
    assert s["replay_stream_names"] == [MODEL_STREAM] and s["replay_on_model_stream"]
    assert s["replay_streams_from_graph_capture"]
    assert len(set(vllm_scenario_of(snapshots["patched"].kit)["graph_capture_streams"])) == 1
    # What they add is what the model graphs' free blocks could not hold (no stranding: `kit check` passes).
    assert set(s["replay_added_by_stream"]) <= {MODEL_STREAM}
    assert s["replay_added_bytes"] * 4 < recorded["unpatched"]["replay_added_bytes"]
    assert s["graph_pool_bytes"] < recorded["unpatched"]["graph_pool_bytes"]


def test_early_aux_keeps_its_own_stream_under_the_pr(recorded, snapshots):
    pr = [name for name in ("early_aux_pr", "early_aux_pr_flat") if name in recorded]
    assert pr
    for name in pr:
        s = recorded[name]
        assert s["has_early_aux"] is True
        assert s["replay_stream_names"] == [REPLAY_STREAM] and not s["replay_on_model_stream"]
        decisions = vllm_scenario_of(snapshots[name].kit)["decisions"]
        assert [d["shared"] for d in decisions] == [False] and decisions[0]["early_aux"] is True
    for name in ("early_aux_shared", "early_aux_shared_flat"):
        assert recorded[name]["replay_on_model_stream"] and recorded[name]["has_early_aux"], name
    # Each early-aux scenario's aux left as its name says: flat for the hypothetical ones, else as V4.1 returns it.
    for name, s in recorded.items():
        if s["has_early_aux"]:
            assert s["aux_return"] == ("flat" if name.endswith("_flat") else "nested"), name


def test_graphs_equal_eager_where_the_pr_says(recorded, snapshots, safe):
    for name in safe:
        assert recorded[name]["bit_exact"] is True and recorded[name]["max_abs_diff"] == 0, name
    # Forced to share with an aux state made before the break and handed out weak: that state, and only it, differs.
    rows = snapshots[UNSAFE].kit["equivalence"]
    assert {r["output"] for r in rows if not r["bit_exact"]} == {"aux_hidden_state[1]"}


def test_the_obligation_holds_on_vllms_path_where_the_pr_says_and_fails_where_it_does_not(recorded, safe):
    for name, s in recorded.items():
        rows = s["readwrite"]
        assert {(r["model_size"], r["replay_size"]) for r in rows if r["can_run"]} == DISPATCHABLE, name
        assert len(s["readwrite_verdicts"]) == len(DISPATCHABLE), name
    for name in safe:
        assert recorded[name]["readwrite_holds"] is True, name
        assert recorded[name]["readwrite_verdict"].endswith(f"Holds for all {len(DISPATCHABLE)} pairings that can run.")
    shared = recorded[UNSAFE]
    assert shared["readwrite_holds"] is False and " Violated in " in shared["readwrite_verdict"]
    violated = [r for r in shared["readwrite"] if r["can_run"] and not r["holds"]]
    assert violated and all(r["reading_ops"] == ["the forward's caller"] for r in violated)  # the early aux, read
    assert all(r["overlap_bytes"] <= r["model_size"] * 1024 * 2 for r in violated)  # within it (N x hidden bf16)


def test_the_stored_obligation_is_what_the_recorded_accesses_give(snapshots):
    from kit.analysis.readwrite import ReadWriteRecording, readwrite_table
    from kit.experiments import dispatch

    for name, snap in snapshots.items():
        stored = snap.kit["readwrite"]
        assert stored["phases"]["replay_graphs"] == REPLAY_SIZES, name
        for parts in stored["phases"]["model_graphs"].values():
            assert parts == ["segment 0", "break 0", "runs_replay 0", "after_replay 0", "segment 1", "output 0"]
        table = readwrite_table(
            ReadWriteRecording.from_records(stored["accesses"]),
            can_run=lambda n, r: r in dispatch.dispatchable_replay_sizes(n, REPLAY_SIZES, 128),
        )
        again = {(r["model_size"], r["replay_size"]): (r["holds"], r["overlap_bytes"]) for _, r in table.iterrows()}
        rows = {(r["model_size"], r["replay_size"]): (r["holds"], r["overlap_bytes"]) for r in stored["rows"]}
        assert rows == again, name


def test_the_pairings_differ_from_eager_exactly_where_the_obligation_fails(recorded, safe):
    for name, s in recorded.items():
        pairs = s["pairings"]
        assert {(p["model_size"], p["replay_size"]) for p in pairs} == DISPATCHABLE, name
        for p in pairs:  # vLLM's dispatch padded the rows to R, and R replayed once in N's break
            assert p["dispatched"] == p["replay_size"] and p["replayed"] == [p["replay_size"]], (name, p)
            assert "error" not in p, (name, p)
        differ = {(p["model_size"], p["replay_size"]) for p in pairs if not p["bit_exact"]}
        violated = {(r["model_size"], r["replay_size"]) for r in s["readwrite"] if r["can_run"] and not r["holds"]}
        assert differ == violated, name
    for name in safe:
        assert all(p["bit_exact"] for p in recorded[name]["pairings"]), name
        assert recorded[name]["pairings_verdict"].startswith("graphs equal eager bit for bit on all 11"), name
    shared = recorded[UNSAFE]["pairings"]
    assert any(not p["bit_exact"] for p in shared)
    assert {o for p in shared for o in p["differing_outputs"]} == {"aux_hidden_state[1]"}


def test_each_pairing_has_its_power_where_the_recording_has_the_control(recorded):
    """With the positive control (kit.experiments.power): every pairing has its power and a reason, and where an
    early aux is read after R (forced to share, pinned or not) every pairing has power; the verdict counts them. A
    recording made before the control has no power on any pairing (its verdict, stored then, claims none)."""
    for name, s in recorded.items():
        pairs = s["pairings"]
        if not any("power" in p for p in pairs):
            assert "shown (with power)" not in s["pairings_verdict"], name
            continue
        assert all(isinstance(p["power"], bool) and p["power_reason"] for p in pairs), name
        shown = sum(p["power"] for p in pairs)
        assert f"; {shown} of {len(pairs)} pairings shown (with power)" in s["pairings_verdict"], name
        if name.startswith("early_aux_shared"):
            assert shown == len(pairs), name


def test_what_if_on_the_unpatched_recording_predicts_the_patched_graph_pool(snapshots, recorded):
    from kit import what_if

    unpatched = snapshots["unpatched"]
    result = what_if(unpatched, {REPLAY_STREAM: MODEL_STREAM})
    pool = tuple(unpatched.kit["pools"]["global graph pool"])
    predicted = int(result.predicted[result.predicted["pool"] == pool]["reserved"].sum())
    assert predicted == recorded["patched"]["graph_pool_bytes"]


@pytest.mark.parametrize(("name", "code"), [("unpatched", 1), ("patched", 0)])
def test_kit_check_fails_unpatched_and_passes_patched(name, code, capsys):
    from kit.cli import main

    assert main(["check", str(FOLDER / f"{name}.pickle")]) == code
    shown = capsys.readouterr()
    assert ("failed:" in shown.err) is (code == 1) and "recorded on NVIDIA H" in shown.out + shown.err


def test_the_lifetime_analysis_with_the_breaks_reads_agrees(snapshots, safe):
    """With what each break read attached (`kit["break_reads"]`), V4.1's residual, post_mix and res_mix are break
    inputs: safe under the PR; with early aux forced to share, the early aux block is the conflict."""
    from kit.analysis.liveness import liveness_table, liveness_verdicts

    for name in safe:
        assert all(line.split(": ")[1] == "safe" for line in liveness_verdicts(liveness_table(snapshots[name]))), name
    verdicts = liveness_verdicts(liveness_table(snapshots[UNSAFE]))
    assert len(verdicts) == 3 and all(line.split(": ")[1] == "CONFLICT" for line in verdicts)


def test_demo_vllm_json_has_each_scenarios_figures_and_provenance(recorded, capsys):
    from kit.cli import main

    assert main(["demo", "--vllm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [name for name in data if not VLLM_SCENARIOS[name].preset] == list(recorded)
    assert [name for name in data if VLLM_SCENARIOS[name].preset] == ["h200_default", "gb200_default"]
    for name, figures in ((name, data[name]) for name in recorded):
        assert figures["replay_added_bytes"] == recorded[name]["replay_added_bytes"]
        assert figures["graph_pool_bytes"] == recorded[name]["graph_pool_bytes"]
        assert figures["provenance"]["vllm"]["version"] == "0.33.0"
        assert figures["pairings"] == recorded[name]["pairings"] and figures["readwrite"] == recorded[name]["readwrite"]
        assert figures["readwrite_holds"] is (name not in (UNSAFE, PLANTED))
        assert (figures["early_aux_verdict"] is None) is (not recorded[name]["has_early_aux"]), name
    assert data["patched"]["replay_added_bytes"] < data["unpatched"]["replay_added_bytes"]
    assert data[UNSAFE]["pairings_verdict"].startswith("graphs DIFFER from eager on ")
    # What the recordings show: on vLLM 0.33 (V4.1's nested aux) the PR's exception is defensive; flat needs it.
    early = data["early_aux_shared"]["early_aux_verdict"]
    assert early["on_vllm_0_33"] == "defensive" and early["necessary_under"] == list(CHANGES)
    assert early["shapes"]["nested"]["shared"] == "early_aux_shared" and early["shapes"]["flat"]["shared"] == UNSAFE
    cost = early["shapes"]["nested"]["graph_pool_pr"] - recorded["early_aux_shared"]["graph_pool_bytes"]
    assert early["exception_costs"] == cost > 0


def test_demo_vllm_prints_the_figures(recorded, safe, capsys):
    from kit.cli import main
    from kit.experiments.recorded import repo_path

    assert main(["demo", "--vllm"]) == 0
    out = capsys.readouterr().out
    assert "replay graphs captured on a stream of their own (made by graph_capture())" in out
    assert "replay graphs captured on the model graphs' stream" in out
    saved = recorded["unpatched"]["graph_pool_bytes"] - recorded["patched"]["graph_pool_bytes"]
    assert "graph pool saved by the patch on vLLM's own code: " in out and f"({saved} bytes)" in out
    assert out.count("  read/write obligation: holds on all 11 dispatchable pairings") == len(safe)
    assert "  read/write obligation: VIOLATED on " in out
    for stem in STEMS:  # each source line names the recording as the repository does, on any machine
        assert (
            f"({repo_path(FOLDER / f'{stem}.pickle')})" in out or f"({repo_path(FOLDER / f'{stem}.pickle.gz')})" in out
        )
    assert "  on vLLM 0.33 the exception is DEFENSIVE, not needed: " in out
    assert "  it becomes NECESSARY under a change that hands the early aux out weak (early_aux_shared_flat " in out


# --- vLLM's default presets on vLLM's path ------------------------------------------------------------------------


def test_vllms_h200_defaults_on_vllms_path_break_out_nowhere(every_recording):
    """At vLLM's H200 defaults (model graphs up to 512, threshold 768) vLLM's own replay layers run inside every
    model graph: each is one segment, no pairing can run, and nothing is claimed of the obligation."""
    from kit.experiments.vllm.safety import invariant_of_snapshot

    snap = every_recording["h200_default"]
    scenario = vllm_scenario_of(snap.kit)
    assert scenario["replay_sizes"] == [128, 256, 384, 512] and scenario["trim_threshold"] == 768
    figures = summarize(snap)
    assert figures["bit_exact"] and figures["readwrite_holds"] is None
    assert snap.kit["pairings"]["pairs"] == [] and snap.kit["pcp_pairings"]["pairs"] == []
    assert invariant_of_snapshot(snap.raw)["holds"] is None
    phases = snap.kit["readwrite"]["phases"]["model_graphs"]
    assert len(phases) == 51 and all(list(seen) == ["segment 0", "output 0"] for seen in phases.values())


def test_vllms_gb200_defaults_on_vllms_path_run_r_over_n_and_hold(every_recording):
    """At vLLM's GB200 defaults the 17 model graphs 768..1024 break out; vLLM's dispatch runs 126 (N, R), 14 of
    them R > N, and 10 more under PCP: all bit-exact against eager, the obligation and the invariant hold."""
    from kit.experiments.vllm.safety import invariant_of_snapshot

    snap = every_recording["gb200_default"]
    assert vllm_scenario_of(snap.kit)["replay_sizes"] == list(range(128, 1025, 128))
    pairs = snap.kit["pairings"]["pairs"]
    assert len(pairs) == 126 and sum(p["replay_size"] > p["model_size"] for p in pairs) == 14
    assert {p["model_size"] for p in pairs} == set(range(768, 1025, 16))
    assert all(p["bit_exact"] and p["replayed"] == [p["replay_size"]] for p in pairs)
    pcp = snap.kit["pcp_pairings"]["pairs"]
    assert len(pcp) == 10 and all(p["bit_exact"] and p["rows"] > p["model_size"] for p in pcp)
    assert summarize(snap)["readwrite_holds"] is True and invariant_of_snapshot(snap.raw)["holds"] is True
