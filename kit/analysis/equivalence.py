"""Graphs against eager: the safety argument asked of the outputs, on a GPU.

If a replay graph overwrote a block its model graph still needed, the graph
outputs would differ from an eager run of the same model on the same input.
`compare_sizes` runs fresh inputs through a runner's captured graphs and
through the same model eagerly, for every capture size, and reports
bit-exact equality or the largest difference per output: the replica's
runner through `check_equivalence`, vLLM's own path through
`kit.experiments.vllm.capture.check_vllm_equivalence`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kit.load.snapshot import Snapshot

COLUMNS = ["size", "output", "bit_exact", "max_abs_diff", "mismatched_elements"]


@dataclass
class Equivalence:
    rows: pd.DataFrame  # one row per (capture size, output)

    @classmethod
    def recorded_in(cls, snapshot: Snapshot) -> Equivalence:
        """The check a replica scenario made right after its capture and kept in its snapshot (`kit["equivalence"]`)."""
        return cls(pd.DataFrame(snapshot.kit["equivalence"], columns=COLUMNS))

    @property
    def bit_exact(self) -> bool:
        return bool(self.rows["bit_exact"].all())

    @property
    def max_abs_diff(self) -> float:
        return float(self.rows["max_abs_diff"].max()) if len(self.rows) else 0.0

    def summary(self) -> str:
        if self.bit_exact:
            return f"graphs equal eager bit for bit ({len(self.rows)} outputs over {self.rows['size'].nunique()} sizes)"
        bad = self.rows[~self.rows["bit_exact"]]
        worst = bad.loc[bad["max_abs_diff"].idxmax()]
        return (
            f"graphs differ from eager in {len(bad)} of {len(self.rows)} outputs: largest difference "
            f"{self.max_abs_diff:.4g} ({worst['output']} at size {int(worst['size'])})"
        )

    def to_records(self) -> list[dict]:
        records = self.rows.to_dict("records")
        return [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in records]


def compare(size: int, name: str, graph, eager) -> dict:
    import torch

    diff = (graph.float() - eager.float()).abs()
    return {
        "size": size,
        "output": name,
        "bit_exact": bool(torch.equal(graph, eager)),
        "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
        "mismatched_elements": int((graph != eager).sum()),
    }


def compare_forward(names: list[str], graph: tuple, eager: tuple) -> dict:
    """A forward's outputs, `(hidden_states, aux_hidden_states)`, graphs against eager, bit for bit: one row.

    `names` names the hidden states and each aux state in order. A NaN difference (garbage
    read as a float) counts as the largest there is.
    """
    (graph_out, graph_aux), (eager_out, eager_aux) = graph, eager
    checks = [
        compare(0, name, g, e)
        for name, g, e in zip(names, (graph_out, *graph_aux), (eager_out, *eager_aux), strict=True)
    ]
    return {
        "bit_exact": all(c["bit_exact"] for c in checks),
        "max_abs_diff": max(math.inf if math.isnan(c["max_abs_diff"]) else c["max_abs_diff"] for c in checks),
        "outputs": len(checks),
        "differing_outputs": [c["output"] for c in checks if not c["bit_exact"]],
        "mismatched_elements": sum(c["mismatched_elements"] for c in checks),
    }


def check_equivalence(runner, seed: int = 1234) -> Equivalence:
    """The replica's runner: fresh random token ids per capture size; graph outputs against eager ones."""
    config = runner.config
    rows = compare_sizes(
        config.cudagraph_capture_sizes,
        sorted(set(config.aux_hidden_state_layers)),
        lambda size, generator: torch_randint(config.vocab_size, size, generator).to(runner.device),
        lambda ids: runner.run(ids, use_cudagraph=True),
        lambda ids: runner.run(ids, use_cudagraph=False),
        seed,
    )
    return Equivalence(pd.DataFrame(rows, columns=COLUMNS))


def compare_sizes(sizes, aux_layers, draw_ids, run_graphs, run_eager, seed: int = 1234) -> list[dict]:
    """Graphs against eager at every capture size, the one check of the replica and of vLLM's path: rows.

    Per size (ascending), `draw_ids(size, generator)` makes fresh token ids
    from a CPU generator seeded with `seed`; `run_graphs(ids)` and
    `run_eager(ids)` each return `(hidden_states, aux_hidden_states)`, the aux
    states in the order of `aux_layers`. One `compare` row per output.
    """
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for size in sorted(sizes):
        ids = draw_ids(size, generator)
        graph_out, graph_aux = run_graphs(ids)
        eager_out, eager_aux = run_eager(ids)
        rows.append(compare(size, "hidden_states", graph_out, eager_out))
        for layer, g, e in zip(aux_layers, graph_aux, eager_aux, strict=True):
            rows.append(compare(size, f"aux_hidden_state[{layer}]", g, e))
    return rows


def torch_randint(high: int, size: int, generator, dtype=None):
    """`size` token ids below `high` from `generator` (int64 unless `dtype`)."""
    import torch

    kwargs = {"dtype": dtype} if dtype is not None else {}
    return torch.randint(high, (size,), generator=generator, **kwargs)
