"""vLLM 0.33's own capture path recorded on the H200 (kit/recordings/vllm): what it shows, where it came from.

`scripts/vllm_on_device.sh` ran `kit.experiments.vllm_capture` on the H200
from the bundle of vLLM's sources: `GPUModelRunner.capture_model`, its graph
managers, `graph_capture()`, the breakable wrapper and the decoder replay
graphs, all vLLM's, around a stand-in DeepSeek-V4.1, with real CUDA graphs
in vLLM's global graph pool, unpatched and under `kit.patch.vllm`. These
tests read the figures back from the snapshots; the acceptance of issue 20.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from kit.experiments.vllm_capture import PATHS, STOOD_IN, VARIANTS, summarize
from kit.recordings import RECORDINGS

FOLDER = RECORDINGS / "vllm"
MODEL_STREAM, REPLAY_STREAM = "model graphs stream", "decoder replay graphs stream"


@pytest.fixture(scope="module")
def manifest() -> dict:
    path = FOLDER / "PROVENANCE.json"
    assert path.is_file(), "no kit/recordings/vllm/PROVENANCE.json: record with `bash scripts/vllm_on_device.sh OUT`"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def recorded(manifest) -> dict:
    from kit.load.snapshot import load_snapshot

    return {name: summarize(load_snapshot(FOLDER / f"{name}.pickle")) for name in VARIANTS}


@pytest.fixture(scope="module")
def snapshots(manifest) -> dict:
    from kit.load.snapshot import load_snapshot

    return {name: load_snapshot(FOLDER / f"{name}.pickle") for name in VARIANTS}


def test_every_variant_is_recorded_and_nothing_else(manifest):
    files = sorted(p.name for p in FOLDER.iterdir() if p.is_file())
    assert files == sorted(["PROVENANCE.json", *(f"{name}.pickle" for name in VARIANTS)])
    assert sorted(manifest) == sorted(f"{name}.pickle" for name in VARIANTS)


@pytest.mark.parametrize("name", VARIANTS)
def test_provenance_names_the_gpu_torch_vllm_and_every_stand_in(manifest, name):
    entry = manifest[f"{name}.pickle"]
    data = (FOLDER / f"{name}.pickle").read_bytes()
    assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["bytes"] == len(data)
    assert entry["gpu"].startswith("NVIDIA H200") and entry["torch"].startswith("2.11")
    assert entry["vllm"]["version"] == "0.33.0"
    assert entry["vllm"]["bundle"]["checked"] > 3000  # every source file checked against the wheel's RECORD
    assert entry["stood_in"] == STOOD_IN
    assert entry["weak_ref_tensor"] == "kit (vllm._C missing)"
    for stub in entry["stubs"]:  # a stubbed package says what it is and why; a compiled extension, that it is one
        compiled = stub["module"].startswith("vllm.")
        why = "a compiled extension of the vLLM wheel" if compiled else f"Stub of {stub['module']}"
        assert stub["why"].startswith(why)
    assert {s["module"] for s in entry["stubs"]} >= {"vllm._C_stable_libtorch", "fastapi", "xgrammar"}
    assert entry["variant"]["name"] == name and entry["variant"]["path"] in PATHS
    # The full path (GPUModelRunner.capture_model) ran, or what stopped it is kept.
    assert entry["variant"]["path"] == "runner" or entry["earlier_path_failed"]


def test_each_model_graph_is_two_segments_around_the_break_and_each_replay_graph_one(snapshots):
    from kit.analysis.attribution import capture_table

    for name, snap in snapshots.items():
        table = capture_table(snap)
        model, replay = table[table["manager"] == "model graphs"], table[table["manager"] == "decoder replay graphs"]
        assert sorted(model["size"]) == [128, 256, 512] and set(model["graphs"]) == {2}, name
        assert sorted(replay["size"]) == [64, 128, 256] and set(replay["graphs"]) == {1}, name


def test_unpatched_replay_graphs_add_pool_segments_on_a_stream_graph_capture_made_for_them(recorded, snapshots):
    s = recorded["unpatched"]
    assert s["replay_stream_names"] == [REPLAY_STREAM] and not s["replay_on_model_stream"]
    assert s["replay_streams_from_graph_capture"]
    assert len(set(snapshots["unpatched"].kit["variant"]["graph_capture_streams"])) == 2
    assert s["replay_added_bytes"] > 0
    assert set(s["replay_added_by_stream"]) == {str(s["replay_streams"][0])}


def test_patched_replay_graphs_add_nothing_and_capture_on_the_model_graphs_stream(recorded, snapshots):
    s = recorded["patched"]
    assert s["replay_stream_names"] == [MODEL_STREAM] and s["replay_on_model_stream"]
    assert s["replay_streams_from_graph_capture"]
    assert len(set(snapshots["patched"].kit["variant"]["graph_capture_streams"])) == 1
    assert s["replay_added_bytes"] == 0
    assert s["graph_pool_bytes"] < recorded["unpatched"]["graph_pool_bytes"]


def test_early_aux_keeps_its_own_stream_under_the_pr(recorded, snapshots):
    s = recorded["early_aux_pr"]
    assert s["has_early_aux"] is True
    assert s["replay_stream_names"] == [REPLAY_STREAM] and not s["replay_on_model_stream"]
    decisions = snapshots["early_aux_pr"].kit["variant"]["decisions"]
    assert [d["shared"] for d in decisions] == [False] and decisions[0]["early_aux"] is True
    assert recorded["early_aux_shared"]["replay_on_model_stream"]


def test_graphs_equal_eager_where_the_pr_says(recorded, snapshots):
    for name in ("unpatched", "patched", "early_aux_pr"):
        assert recorded[name]["bit_exact"] is True and recorded[name]["max_abs_diff"] == 0, name
    # Forced to share with an aux state made before the break: only that state may differ.
    rows = snapshots["early_aux_shared"].kit["equivalence"]
    assert {r["output"] for r in rows if not r["bit_exact"]} <= {"aux_hidden_state[1]"}


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
    assert ("failed:" in shown.err) is (code == 1) and "recorded on NVIDIA H200" in shown.out + shown.err


def test_demo_vllm_json_has_each_variants_figures_and_provenance(recorded, capsys):
    from kit.cli import main

    assert main(["demo", "--vllm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == list(VARIANTS)
    for name, figures in data.items():
        assert figures["replay_added_bytes"] == recorded[name]["replay_added_bytes"]
        assert figures["graph_pool_bytes"] == recorded[name]["graph_pool_bytes"]
        assert figures["provenance"]["vllm"]["version"] == "0.33.0"
    assert data["patched"]["replay_added_bytes"] == 0 < data["unpatched"]["replay_added_bytes"]


def test_demo_vllm_prints_the_figures(recorded, capsys):
    from kit.cli import main

    assert main(["demo", "--vllm"]) == 0
    out = capsys.readouterr().out
    assert "replay graphs captured on a stream of their own (made by graph_capture())" in out
    assert "replay graphs captured on the model graphs' stream" in out
    saved = recorded["unpatched"]["graph_pool_bytes"] - recorded["patched"]["graph_pool_bytes"]
    assert "graph pool saved by the patch on vLLM's own code: " in out and f"({saved} bytes)" in out
    for name in VARIANTS:  # each source line names the recording as the repository does, on any machine
        assert f"(kit/recordings/vllm/{name}.pickle)" in out
