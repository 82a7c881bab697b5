"""The liveness analysis on live captures: it predicts which capture sizes differ from eager."""

from __future__ import annotations

import pandas as pd
import pytest

from kit import Equivalence, liveness_table
from kit.analysis.liveness import break_allocations

pytestmark = pytest.mark.gpu


def test_live_captures_the_trace_predicts_which_sizes_differ_from_eager(tmp_path):
    from kit import Snapshot, load_snapshot
    from kit.experiments.dispatch import dispatch_replay_size
    from kit.experiments.scenarios import run_all
    from kit.replica.model import PRESETS, replay_rows

    sizes = PRESETS["small"].decoder_replay_cudagraph_capture_sizes

    names = ("patched", "early_aux_shared", "early_aux_shared_flat")
    run_all("small", tmp_path, names=names)
    for name in names:
        snap = Snapshot(load_snapshot(tmp_path / f"small_{name}.pickle").raw, origin=name, live=True)
        table = liveness_table(snap, replay_size_for=lambda n: dispatch_replay_size(replay_rows(n), sizes)).rows
        equivalence = Equivalence(pd.DataFrame(snap.kit["equivalence"]))
        differs = set(equivalence.rows[~equivalence.rows["bit_exact"]]["size"])
        assert set(table[table["conflict"]]["capture_size"]) == differs
        assert bool(differs) == (name == "early_aux_shared_flat")  # V4.1's nested aux keeps its block
        assert break_allocations(snap)["outside_pool"].all()
