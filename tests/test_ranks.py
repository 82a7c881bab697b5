"""Ranks side by side: groups matched by name across processes, spreads and verdicts.

Every rank on one page is `kit.show.rank_report`'s."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys

import pytest

from kit import KitError, load_snapshot
from kit.analysis.ranks import (
    estimate_lines,
    load_manifests,
    load_ranks,
    rank_differences,
    rank_summary,
    rank_table,
    rank_verdicts,
)
from kit.analysis.tables import segment_table
from kit.recordings import RECORDINGS
from kit.units import format_bytes

from .helpers import FIXTURES, MIB, segment

REPLICA = FIXTURES / "replica"
VLLM = RECORDINGS / "vllm"  # vLLM 0.33's capture path on the GPU, unpatched and under the PR


def _rank_snapshot(graph_pool_mib: int, stream: int, rank: int | None = None) -> dict:
    raw = {
        "segments": [
            segment(0x1000_0000, [(20 * MIB, "active_allocated")], stream=0),
            segment(0x2000_0000, [(graph_pool_mib * MIB, "inactive")], stream=stream, pool=(0, 1)),
        ],
        "device_traces": [[]],
        "kit": {"streams": {"model graphs stream": stream}, "pools": {"global graph pool": [0, 1]}},
    }
    if rank is not None:
        raw["kit"]["provenance"] = {"rank": rank}
    return raw


def test_groups_match_by_name_although_each_rank_has_its_own_stream_ids():
    table = rank_table([load_snapshot(_rank_snapshot(64, 7)), load_snapshot(_rank_snapshot(64, 93))])
    pool = table[table["pool_label"] == "global graph pool"]
    assert len(pool) == 1 and pool.iloc[0]["stream_label"] == "model graphs stream"
    assert list(pool.iloc[0][["rank 0", "rank 1", "spread"]]) == [64 * MIB, 64 * MIB, 0]
    assert rank_verdicts(table) == []


def test_a_rank_that_reserves_more_is_named_with_the_bytes():
    table = rank_table({0: load_snapshot(_rank_snapshot(64, 7)), 3: load_snapshot(_rank_snapshot(96, 9))})
    row = table[table["pool_label"] == "global graph pool"].iloc[0]
    assert (row["largest_rank"], row["spread"], row["min"]) == (3, 32 * MIB, 64 * MIB)
    (verdict,) = rank_verdicts(table)
    assert verdict.startswith("global graph pool / model graphs stream: rank 3 has 96.00 MiB reserved")
    assert "32.00 MiB more" in verdict
    assert rank_verdicts(table, min_bytes=64 * MIB) == []  # under the threshold: no verdict


def test_the_unpatched_rank_shows_the_replay_group_the_patched_rank_lacks(tmp_path):
    shutil.copy(REPLICA / "small_unpatched.pickle", tmp_path / "rank0.pickle")
    shutil.copy(REPLICA / "small_patched.pickle", tmp_path / "rank1.pickle")
    ranks = load_ranks(tmp_path)
    assert list(ranks) == [0, 1]
    table = rank_table(ranks)
    replay = table[(table["pool_label"] == "global graph pool") & (table["stream_label"] == "replay graphs stream")]
    expected = segment_table(ranks[0])
    expected = expected[(expected["pool_label"] == "global graph pool")]
    expected = int(expected[expected["stream_label"] == "replay graphs stream"]["reserved"].sum())
    assert expected > 0
    assert replay.iloc[0]["rank 0"] == expected and replay.iloc[0]["missing_on"] == [1]
    assert any(v.startswith("rank 1 has no global graph pool / replay graphs stream") for v in rank_verdicts(table))


def test_the_rank_comes_from_the_provenance_before_the_file_name(tmp_path):
    (tmp_path / "a.pickle").write_bytes(pickle.dumps(_rank_snapshot(64, 7, rank=1)))
    (tmp_path / "rank0.pickle").write_bytes(pickle.dumps(_rank_snapshot(64, 8)))
    assert list(load_ranks(tmp_path)) == [0, 1]


@pytest.mark.parametrize(
    "files, message",
    [
        ({}, "no snapshot files"),
        ({"capture.pickle": _rank_snapshot(64, 7)}, "no rank in its provenance or its name"),
        (
            {"rank0.pickle": _rank_snapshot(64, 7), "x.pickle": _rank_snapshot(64, 7, rank=0)},
            "a second snapshot of rank 0",
        ),
    ],
)
def test_a_folder_that_does_not_name_each_rank_once_is_a_one_line_error(tmp_path, files, message):
    for name, raw in files.items():
        (tmp_path / name).write_bytes(pickle.dumps(raw))
    with pytest.raises(KitError, match=message):
        load_ranks(tmp_path)


def test_the_command_line_prints_the_table_and_the_verdicts(tmp_path):
    for rank, mib in ((0, 64), (1, 96)):
        (tmp_path / f"rank{rank}.pickle").write_bytes(pickle.dumps(_rank_snapshot(mib, 7 + rank)))
    done = subprocess.run([sys.executable, "-m", "kit", "ranks", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "rank 1 has 96.00 MiB reserved, 32.00 MiB more" in done.stdout
    answer = json.loads(
        subprocess.run(
            [sys.executable, "-m", "kit", "ranks", str(tmp_path), "--json"], capture_output=True, text=True
        ).stdout
    )
    pool = next(r for r in answer["groups"] if r["pool_label"] == "global graph pool")
    assert [(r["rank"], r["graph_pool"]) for r in answer["ranks"]] == [(0, 64 * MIB), (1, 96 * MIB)]
    assert answer["differences"] == ["the ranks differ in graph pool: rank 0 64.00 MiB, rank 1 96.00 MiB"]
    assert (pool["rank 0"], pool["rank 1"], pool["largest_rank"]) == (64 * MIB, 96 * MIB, 1)
    bad = subprocess.run([sys.executable, "-m", "kit", "ranks", str(tmp_path / "none")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a folder" in bad.stderr


# --- the vLLM plugin's folders: a manifest beside each rank's snapshot --------------------------

BLOCK = 2 * MIB  # a KV-cache block's bytes, as a manifest states it


def _manifest(rank: int, estimate: int | None) -> dict:
    return {"kit_manifest": 1, "rank": rank, "estimate": estimate, "estimate_applied": True,
            "graph_pools": [[0, 1]], "kv_cache": {"num_blocks": 1000, "bytes_per_block": BLOCK},
            "patch": {"asked": "pr", "applied": rank > 0, "refused": None}, "vllm": "0.33.0"}  # fmt: skip


def _plugin_folder(tmp_path, names: list[str], estimate: int | None = 30 * MIB):
    for rank, name in enumerate(names):
        shutil.copy(VLLM / f"{name}.pickle", tmp_path / f"rank{rank}.pickle")
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(_manifest(rank, estimate)))
    return load_ranks(tmp_path), load_manifests(tmp_path)


def _graph_pool(name: str, stream: str | None = None) -> int:
    table = segment_table(load_snapshot(VLLM / f"{name}.pickle"))
    table = table[table["pool_label"] == "global graph pool"]
    return int(table[table["stream_label"] == stream]["reserved"].sum() if stream else table["reserved"].sum())


def test_each_ranks_graph_pool_by_stream_stranded_and_the_estimate_against_it(tmp_path):
    snapshots, manifests = _plugin_folder(tmp_path, ["unpatched", "patched"])
    assert sorted(snapshots) == sorted(manifests) == [0, 1]  # the manifests are not snapshots
    summary = rank_summary(snapshots, manifests).set_index("rank")
    replay = _graph_pool("unpatched", "decoder replay graphs stream")
    assert replay > 0
    assert summary.loc[0, "graph_pool"] == _graph_pool("unpatched") == sum(summary.loc[0, "by_stream"].values())
    assert summary.loc[0, "replay_stream"] == replay and summary.loc[1, "replay_stream"] == 0
    assert summary.loc[1, "graph_pool"] == _graph_pool("patched")
    assert summary.loc[0, "stranded"] > 0 and summary.loc[1, "stranded"] == 0
    for rank, name in enumerate(["unpatched", "patched"]):
        beyond = _graph_pool(name) - 30 * MIB
        assert summary.loc[rank, "beyond_estimate"] == beyond
        assert summary.loc[rank, "kv_blocks"] == beyond / BLOCK
    line = estimate_lines(summary.reset_index())[0]
    words = f"{format_bytes(_graph_pool('unpatched') - 30 * MIB)} ("
    assert line.startswith("rank 0: vLLM estimated 30.00 MiB") and words in line
    assert f"({(_graph_pool('unpatched') - 30 * MIB) / BLOCK:,.1f} KV-cache blocks)" in line
    assert "memory the KV cache was sized for" in line


def test_the_rank_that_differs_is_named_against_the_others(tmp_path):
    snapshots, manifests = _plugin_folder(tmp_path, ["patched", "unpatched", "patched"])
    lines = rank_differences(rank_summary(snapshots, manifests))
    assert lines[0] == (
        f"rank 1 differs: graph pool {format_bytes(_graph_pool('unpatched'))}, "
        f"{format_bytes(_graph_pool('patched'))} on the other 2 rank(s)"
    )
    assert all(line.startswith("rank 1 differs") for line in lines) and len(lines) == 3


def test_without_manifests_the_estimate_is_unknown_not_zero(tmp_path):
    shutil.copy(VLLM / "patched.pickle", tmp_path / "rank0.pickle")
    summary = rank_summary(load_ranks(tmp_path), load_manifests(tmp_path))
    assert summary.loc[0, "estimate"] is None and summary.loc[0, "kv_blocks"] is None
    assert estimate_lines(summary) == []


def test_a_manifest_that_is_not_the_kits_is_a_one_line_error(tmp_path):
    _plugin_folder(tmp_path, ["patched"])
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0}))
    with pytest.raises(KitError, match="not a kit manifest of version 1 with a rank"):
        load_manifests(tmp_path)
    done = subprocess.run([sys.executable, "-m", "kit", "ranks", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_kit_report_on_a_folder_puts_every_rank_on_one_page(tmp_path):
    (tmp_path / "caps").mkdir()
    _plugin_folder(tmp_path / "caps", ["unpatched", "patched"])
    out = tmp_path / "ranks.html"
    done = subprocess.run(
        [sys.executable, "-m", "kit", "report", str(tmp_path / "caps"), "-o", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert page.count("<h1>Rank ") == 2 and "The ranks compared" in page
    assert "more than the estimate" in page and "decoder replay graphs stream" in page
