"""The proof obligation on live captures: reads and writes against lifetimes, each policy in a fresh process."""

from __future__ import annotations

import pytest

from kit.experiments.dispatch import dispatch_replay_size
from kit.experiments.readwrite_run.result import OUTPUTS_READ
from kit.replica.model import ReplicaConfig

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    from kit.experiments.readwrite_run.result import load_recording
    from kit.experiments.readwrite_run.run import record

    return load_recording("small", record("small", tmp_path_factory.mktemp("readwrite")))


def _pairs(data: dict, policy: str) -> list[dict]:
    return [p for p in data["pairs"] if p["scenario"] == policy]


def _paired(data: dict, policy: str) -> set[int]:
    """The model graph sizes whose graphs differed from eager with their own replay graph (N/2)."""
    return {r["size"] for r in data["scenarios"][policy]["equivalence"] if not r["bit_exact"]}


def test_under_the_pr_the_obligation_holds_on_every_dispatchable_pairing(small):
    pairs = _pairs(small, "pr")
    assert any(p["dispatchable"] for p in pairs) and any(not p["dispatchable"] for p in pairs)
    assert all(p["readwrite_holds"] for p in pairs if p["dispatchable"])
    assert all(p["agree"] and p["explanation"] is None for p in pairs)  # with the breaks' reads known
    assert _paired(small, "pr") == set()
    # several break inputs: the blocks each break read and the forward keeps bound are break inputs,
    # which the trace alone cannot tell from blocks read after the break
    policy = small["scenarios"]["pr"]
    with_reads = [b["classes"] for b in policy["break_inputs"] if b["analysis"] == "with_break_reads"]
    assert with_reads and all(c.get("break input", {}).get("blocks", 0) >= 3 for c in with_reads)
    assert all("held after the break" not in c for c in with_reads)
    for p in pairs:
        assert p["agree_trace_only"] == (p["explanation_trace_only"] is None)


def test_with_early_aux_shared_the_obligation_fails_where_the_lifetime_analysis_flags(small):
    pairs = _pairs(small, "early_aux_shared")
    flagged = {(p["model_size"], p["replay_size"]) for p in pairs if p["lifetime_conflict"]}
    violated = {(p["model_size"], p["replay_size"]) for p in pairs if not p["readwrite_holds"]}
    assert flagged and violated == flagged
    assert any(p["dispatchable"] for p in pairs if not p["readwrite_holds"])
    assert all(p["reading_ops"] == [OUTPUTS_READ] for p in pairs if not p["readwrite_holds"])  # the early aux
    # the replica's own pairing (N, the replay graph N/2 rows pad to) differs from eager exactly where it fails
    config = small["scenarios"]["early_aux_shared"]["config"]
    replay_sizes = ReplicaConfig(
        **{
            **config,
            "cudagraph_capture_sizes": tuple(config["cudagraph_capture_sizes"]),
            "aux_hidden_state_layers": tuple(config["aux_hidden_state_layers"]),
        }
    )
    own = {n: dispatch_replay_size(n // 2, replay_sizes.decoder_replay_cudagraph_capture_sizes) for n, _ in violated}
    assert _paired(small, "early_aux_shared") == {n for n, r in violated if r == own[n]}


def test_unpatched_replay_graphs_write_nothing_a_model_graph_carries(small):
    pairs = _pairs(small, "unpatched")
    assert all(p["readwrite_holds"] and not p["lifetime_conflict"] and not p["trace_only_conflict"] for p in pairs)
    assert all(p["overlap_bytes"] == 0 for p in pairs)
