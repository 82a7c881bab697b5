"""PR 63155's alternatives live on a GPU: the replica with its speculator, each variant in a fresh process.

What is asserted is what the measurement must show whatever the figures: the PR saves
graph pool, putting the speculator on the same stream saves no less, the drafter's graphs
equal eager under vLLM 0.33 and under the PR, the streams are the ones each variant asks for,
and a lower cap on the replay sizes never reserves more. Alternative (a)'s safety verdict is
recorded, whichever it is.
"""

from __future__ import annotations

import pytest

from kit.experiments.alternatives.result import load_graphs_vs_eager
from kit.experiments.alternatives.run import record
from kit.experiments.alternatives.scenarios import (
    DRAFTER,
    MAIN_SCENARIOS,
    alternatives_config,
    cap_sweep,
    eager_replay_sizes,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return load_graphs_vs_eager("small", record("small", tmp_path_factory.mktemp("alternatives")))


def test_the_pr_saves_and_one_stream_for_all_saves_no_less(small):
    assert small["unpatched"]["saved_bytes"] == 0
    assert small["pr"]["saved_bytes"] > 0
    assert small["share_all"]["saved_bytes"] >= small["pr"]["saved_bytes"]


def test_drafter_graphs_equal_eager_under_vllm_and_the_pr(small):
    for scenario in ("unpatched", "pr"):
        entry = small[scenario]
        assert entry["safe"], entry["evidence"]
        replayed = {c["draft_graph_size"] for c in entry["checks"]} - {None}
        assert replayed == set(small["speculator"]["capture_sizes"])
        assert all(c["draft_bit_exact"] for c in entry["checks"])


def test_alternative_a_is_checked_whatever_the_verdict(small):
    entry = small["share_all"]
    assert isinstance(entry["safe"], bool) and entry["evidence"] and len(entry["checks"]) == 9
    assert entry["safe"] == all(c["bit_exact"] for c in entry["checks"])


def test_each_scenario_captures_on_the_streams_it_asks_for(small):
    streams = {v: small[v]["capture_streams"] for v in MAIN_SCENARIOS}
    unpatched = streams["unpatched"]
    assert len({unpatched["model graphs"], unpatched["replay graphs"], unpatched[DRAFTER]}) == 3
    assert streams["pr"]["replay graphs"] == streams["pr"]["model graphs"] != streams["pr"][DRAFTER]
    share_all = streams["share_all"]
    assert share_all["replay graphs"] == share_all["model graphs"] == share_all[DRAFTER]


def test_a_lower_cap_never_reserves_more_and_no_cap_is_vllm(small):
    caps = small["cap_replay_sizes"]
    config = alternatives_config("small")
    assert [row["max_replay_size"] for row in caps] == cap_sweep(config)
    pools = [row["graph_pool_bytes"] for row in caps]
    assert pools == sorted(pools) and pools[-1] == small["unpatched"]["graph_pool_bytes"]
    assert caps[0]["eager_replay_sizes"] == eager_replay_sizes(config, caps[0]["max_replay_size"])


def test_the_estimate_falls_with_the_patch_and_frees_kv_blocks(small):
    estimates = small["kv_cache"]["replica"]["profile_estimate_bytes"]
    assert estimates["unpatched"] > estimates["pr"] > 0
    assert small["kv_cache"]["replica"]["freed"]["pr"]["blocks"] > 0
