"""The H200 recordings shipped with the kit, and the choice between running live and reading them.

Each file here was recorded on an NVIDIA H200 with torch 2.11; `PROVENANCE.json`
beside it names the GPU, the torch and CUDA versions, the date, the command
that made it and its sha256. They let every notebook, command and test run
on a machine without a GPU, and they are what the simulator was checked
against:

- `two_streams.pickle`, `shared_stream.pickle`: the two-capture experiment
  (`kit.experiments.two_captures`), replay capture on a new stream and on the
  model capture's stream;
- `replica/{small,large}_{scenario}.pickle`: the replica's experiments
  (`kit.experiments.scenarios`);
- `corpus/`: 70 workloads (seeded random ones, the PR's story, six boundary workloads) run on the
  real allocator, each beside its workload JSON: the simulator's fidelity
  corpus;
- `plain/`: plain `torch.cuda.memory._dump_snapshot()` files of programs the
  kit did not write (`scripts/plain_programs/`: two captures into one pool on
  two streams or one, torch.compile's reduce-overhead mode, record_stream),
  with no `kit` key and traces that start mid-process, as a user brings them;
  `replay_graphs_{separate,shared}` is vLLM's capture order with matmuls;
- `merged/`: 13 workloads run as written and with one stream merged into
  another (`scripts/record_merged.py`): what-if's ground truth.

- `safety/`, `readwrite/`, `alternatives/`: the replica's safety and
  alternatives experiments (`kit.experiments.pairings`, `readwrite_run`,
  `alternatives`), one JSON per preset.

`make recordings` records them all again on a CUDA machine (`make
plain-recordings` the plain ones).
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import KitError

RECORDINGS = Path(__file__).resolve().parent
LIVE, RECORDED = "live GPU", "recorded"


def recording(name: str) -> Path:
    """The path of a shipped recording, e.g. `recording("replica/small_patched.pickle")`."""
    path = RECORDINGS / name
    if not path.is_file():
        raise KitError(f"no shipped recording {name!r} (they are in {RECORDINGS})")
    return path


def default_source() -> str:
    """`live GPU` where this process has CUDA, else `recorded` (the shipped H200 recordings)."""
    import torch

    return LIVE if torch.cuda.is_available() else RECORDED


def check_source(source: str) -> str:
    if source not in (LIVE, RECORDED):
        raise KitError(f"unknown data source {source!r}: use {LIVE!r} or {RECORDED!r}")
    return source
