"""The plugin on the GPU: vLLM 0.33's estimate and capture with KIT_CAPTURE_DIR / KIT_VLLM_PATCH alone.

`KIT_VLLM_RUN=plugin bash scripts/vllm_on_device.sh OUT` installed the kit on
the GPU machine and ran `scripts/vllm_plugin_capture.py` twice (unpatched,
patched); kit/recordings/vllm_plugin holds what the plugin wrote, one folder
per arm (`rank0.pickle`, `rank0.json`) and each arm's run file. These tests
read it back: the plugin's figures against the kit's own recordings of the
same capture path (kit/recordings/vllm), and `kit ranks` on each folder.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kit.analysis.ranks import compare_ranks
from kit.analysis.tables import segment_table
from kit.load.snapshot import load_snapshot
from kit.recordings import RECORDINGS

FOLDER = RECORDINGS / "vllm_plugin"
ARMS = ("unpatched", "patched")


def _graph_pool(snapshot, stream: str | None = None) -> int:
    table = segment_table(snapshot)
    table = table[table["pool_label"] == "global graph pool"]
    return int((table[table["stream_label"] == stream] if stream else table)["reserved"].sum())


@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_was_written_by_the_plugin_on_a_gpu_with_its_provenance(arm):
    manifest = json.loads((FOLDER / arm / "rank0.json").read_text())
    assert manifest["gpu"].startswith("NVIDIA") and manifest["torch"].startswith("2.11")
    assert manifest["vllm"] == "0.33.0" and "vllm_plugin_capture.py" in manifest["command"]
    assert manifest["date"] and manifest["asked_by"]["KIT_CAPTURE_DIR"]
    assert manifest["patch"]["applied"] is (arm == "patched")
    run = json.loads((FOLDER / f"{arm}.run.json").read_text())
    assert run["failed"] is None and run["estimate"] == manifest["estimate"] > 0


def test_the_plugins_graph_pool_is_the_kits_own_recording_of_the_same_path():
    ranks = {arm: compare_ranks(FOLDER / arm).summary.iloc[0] for arm in ARMS}
    for arm in ARMS:
        direct = load_snapshot(RECORDINGS / "vllm" / f"{arm}.pickle")
        assert ranks[arm]["graph_pool"] == _graph_pool(direct)
        assert ranks[arm]["replay_stream"] == _graph_pool(direct, "decoder replay graphs stream")
    assert ranks["unpatched"]["replay_stream"] > 0 and ranks["patched"]["replay_stream"] == 0


@pytest.mark.parametrize("arm", ARMS)
def test_kit_ranks_reads_each_arm(arm):
    done = subprocess.run(
        [sys.executable, "-m", "kit", "ranks", str(FOLDER / arm), "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    (rank,) = json.loads(done.stdout)["ranks"]
    assert rank["estimate"] > 0 and rank["beyond_estimate"] == rank["graph_pool"] - rank["estimate"]
