"""Ranks side by side: groups matched by name across processes, spreads and verdicts."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys

import pytest

from kit import KitError, load_snapshot
from kit.analysis.ranks import load_ranks, rank_table, rank_verdicts
from kit.analysis.tables import segment_table

from .helpers import FIXTURES, MIB, segment

REPLICA = FIXTURES / "replica"


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
    rows = json.loads(
        subprocess.run(
            [sys.executable, "-m", "kit", "ranks", str(tmp_path), "--json"], capture_output=True, text=True
        ).stdout
    )
    pool = next(r for r in rows if r["pool_label"] == "global graph pool")
    assert (pool["rank 0"], pool["rank 1"], pool["largest_rank"]) == (64 * MIB, 96 * MIB, 1)
    bad = subprocess.run([sys.executable, "-m", "kit", "ranks", str(tmp_path / "none")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a folder" in bad.stderr
