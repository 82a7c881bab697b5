"""The kit as a vLLM general plugin (kit/vllm_plugin.py), loaded by vLLM 0.33's own `load_general_plugins()`.

Each test that loads vLLM does so in a fresh process, as vLLM loads plugins
once per process: tests/vllm_plugin_worker.py is a worker on the CPU (CUDA
stood in) that loads the plugins and runs vLLM's `profile_cudagraph_memory`
and `capture_model` around the stand-in runner, with no kit call of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from kit.analysis.ranks import load_manifests, load_ranks
from kit.record.provenance import sha256
from tests.vllm_plugin_worker import ESTIMATE

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300


def _env(**values: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("KIT_CAPTURE_DIR", "KIT_VLLM_PATCH")}
    return {**env, **values, "PYTHONPATH": str(ROOT)}


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code]
    return subprocess.run(command, cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=TIMEOUT)


def test_the_installed_kit_is_a_vllm_general_plugin():
    (found,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kit"]
    assert found.value == "kit.vllm_plugin:register"


def test_register_imports_nothing_heavy_and_without_the_variables_does_nothing():
    code = """
import sys
import kit.vllm_plugin as plugin
finders = list(sys.meta_path)
plugin.register()
assert sys.meta_path == finders, "hooked with no variable set"
import os
os.environ["KIT_VLLM_PATCH"] = "pr"
plugin.register()
plugin.register()
hooks = [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]
assert len(hooks) == len(plugin.RUNNER_MODULES), hooks
heavy = [m for m in ("torch", "vllm", "pandas", "numpy") if m in sys.modules]
assert not heavy, heavy
print("ok")
"""
    done = _python(code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.slow
def test_vllm_untouched_when_not_asked_and_an_unknown_vllm_refused_with_one_line():
    code = """
import os
import vllm
import vllm.plugins as plugins
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm.v1.worker.gpu.model_runner as runner
from vllm.distributed import parallel_state
from kit.patch import vllm as patch
installed = (runner.GPUModelRunner.capture_model, runner.GPUModelRunner.profile_cudagraph_memory,
             parallel_state.graph_capture)
assert not patch.is_applied()
os.environ["KIT_VLLM_PATCH"] = "pr"
vllm.__version__ = "0.34.0"
plugins.plugins_loaded = False  # a second process's load, as far as the plugin can tell
load_general_plugins()
now = (runner.GPUModelRunner.capture_model, runner.GPUModelRunner.profile_cudagraph_memory,
       parallel_state.graph_capture)
assert not patch.is_applied() and now == installed
print("untouched")
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("untouched")
    refusals = [line for line in (done.stdout + done.stderr).splitlines() if "PR 63155 not applied" in line]
    assert len(refusals) == 1
    assert "vLLM 0.34.0 is not the release the kit knows (0.33.0); vLLM runs unpatched" in refusals[0]


def test_an_unknown_policy_is_one_line_and_nothing_is_hooked():
    code = """
import sys
import kit.vllm_plugin as plugin
plugin.register()
assert not [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]
"""
    done = _python(code, KIT_VLLM_PATCH="sometimes")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "KIT_VLLM_PATCH" in line]
    assert "KIT_VLLM_PATCH=sometimes is not one of pr, share, separate; vLLM runs unpatched" in line


@pytest.mark.slow
def test_two_worker_processes_record_their_rank_through_the_plugin_alone(tmp_path):
    """Rank 0 asks for the PR, rank 1 does not: two files each, rank-tagged, and `kit ranks` sets them side by side."""
    folder = tmp_path / "caps"
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.vllm_plugin_worker", str(rank)],
            cwd=ROOT,
            env=_env(KIT_CAPTURE_DIR=str(folder), **({"KIT_VLLM_PATCH": "pr"} if rank == 0 else {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [w.communicate(timeout=TIMEOUT) for w in workers]
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-3000:]
    seen = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [s["rank"] for s in seen] == [0, 1]
    assert [s["streams"] for s in seen] == [2, 3]  # the PR on rank 0 only: the replay graphs share the model's
    assert all(s["wrapped_by"].endswith("kit/vllm_plugin.py") for s in seen)  # the plugin wrapped vLLM's
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.json", "rank0.pickle", "rank1.json", "rank1.pickle"]
    assert "kit: rank 0 captured with PR 63155 applied (policy pr)" in outputs[0][0] + outputs[0][1]

    manifests = load_manifests(folder)
    assert sorted(manifests) == [0, 1]
    for rank, manifest in manifests.items():
        assert manifest["rank"] == rank and manifest["snapshot"] == f"rank{rank}.pickle"
        assert manifest["sha256"] == sha256((folder / f"rank{rank}.pickle").read_bytes())
        assert manifest["estimate"] == ESTIMATE and manifest["vllm"] == "0.33.0"
        assert manifest["sizes"] == {"tp": 1, "pp": 1, "pcp": 1, "dp": 1}
    assert manifests[0]["patch"] == {"asked": "pr", "applied": True, "refused": None}
    assert manifests[1]["patch"] == {"asked": None, "applied": False, "refused": None}
    snapshots = load_ranks(folder)  # the manifests are not read as snapshots
    assert sorted(snapshots) == [0, 1]
    assert snapshots[1].kit["vllm_worker"]["rank"] == 1

    done = subprocess.run(
        [sys.executable, "-m", "kit", "ranks", str(folder), "--json"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    ranks = [(r["rank"], r["estimate"], r["patch"]) for r in answer["ranks"]]
    assert ranks == [(0, ESTIMATE, "pr"), (1, ESTIMATE, None)]


def test_streams_and_pools_are_named_after_the_real_capture_not_the_estimates():
    """As recorded on the H100: the estimate captures first, on streams and into a pool of its own."""
    from kit.record.recorder import CaptureRecord
    from kit.vllm_plugin import name_phases

    def record(manager: str, stream: int, pool: tuple, *, is_global: bool = True) -> CaptureRecord:
        return CaptureRecord(manager, 8, stream, 0, 0, pool=pool, trace_end=1, global_pool=is_global)

    estimate = [record("model graphs", 11, (0, 2)), record("decoder replay graphs", 12, (0, 2))]
    for replay_stream, want in ((22, {"decoder replay graphs stream": 22}), (21, {})):  # unpatched, then the PR
        kit: dict = {}
        real = [record("model graphs", 21, (0, 1)), record("decoder replay graphs", replay_stream, (0, 1))]
        name_phases(kit, estimate + real, len(estimate))
        assert kit["streams"] == {
            "model graphs stream": 21,
            **want,
            "estimate's model graphs stream": 11,
            "estimate's decoder replay graphs stream": 12,
        }
        assert kit["pools"] == {"global graph pool": [0, 1], "estimate's global graph pool": [0, 2]}


def test_data_parallel_replicas_never_share_a_file_name():
    """Where each replica's world holds only its own ranks (external launcher, elastic EP), the rank is offset
    by the DP rank as vLLM offsets it; where the world spans DP (vLLM's default), its rank is already unique."""
    from kit.vllm_plugin import global_rank

    sizes = {"tp": 2, "pp": 1, "pcp": 1, "dp": 2}
    per_replica = {global_rank(rank, 2, sizes, dp) for dp in (0, 1) for rank in (0, 1)}
    assert per_replica == {0, 1, 2, 3}
    assert [global_rank(rank, 4, sizes, rank // 2) for rank in range(4)] == [0, 1, 2, 3]
    assert global_rank(1, None, {"tp": 2, "pp": 1, "pcp": 1, "dp": 1}, 0) == 1
