"""The notebooks' live path on a GPU: the model-and-replay experiment, then the trace analyses on it."""

from __future__ import annotations

import pytest

from kit import reuse_table, segment_table, what_if
from kit.experiments.model_and_replay import model_and_replay

pytestmark = pytest.mark.gpu


def test_live_model_and_replay_captures_strand_the_replay_stream_and_what_if_predicts_sharing():
    new = model_and_replay(shared_stream=False, source="live GPU")
    shared = model_and_replay(shared_stream=True, source="live GPU")
    assert new.data_source == "live GPU"
    pool = tuple(new.kit["pools"]["global graph pool"])
    reuse = reuse_table(new)
    assert reuse.attrs["mismatches"] == []
    replay = reuse[(reuse["pool"] == pool) & (reuse["stream_label"] == "replay graphs stream")].iloc[0]
    assert replay["stranded_bytes"] == replay["new_segment_bytes"] > 0
    result = what_if(new, {"replay graphs stream": "model graphs stream"})
    predicted = result.predicted[result.predicted["pool"] == pool]["reserved"].sum()
    table = segment_table(shared)
    assert predicted == table[table["pool"] == tuple(shared.kit["pools"]["global graph pool"])]["reserved"].sum()
