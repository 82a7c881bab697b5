"""vLLM 0.33's own capture path with real CUDA graphs: a stand-in DeepSeek-V4.1, unpatched and under PR 63155.

The replica (`kit.replica`) copies vLLM's capture path; this runs vLLM's.
Everything that decides streams, pools and capture order is vLLM 0.33.0's
own code, imported from its sources (on the kit's GPU machine, from the
bundle `scripts/vllm_bundle.py` builds): `GPUModelRunner.capture_model`,
`ModelCudaGraphManager.capture` and the base `CudaGraphManager.capture`,
`parallel_state.graph_capture` and `GroupCoordinator.graph_capture`, the
breakable PIECEWISE wrapper (`BreakableCUDAGraphWrapper`) and its eager
breaks (`eager_break_during_capture`), `DecoderReplayLayers`,
`DeepseekV41ModelState.capture_inner_cudagraphs`,
`DecoderReplayCudaGraphManager` and the global graph pool of vLLM's CUDA
platform. `kit.patch.vllm` patches those functions in the scenarios that ask
for it, and `kit.CaptureRecorder` records every graph.

What is stood in, and why (each is also in every recording's provenance:
`stood_in`, `bypassed`, `constructed`, `not_modelled`):

- the model: `StandInDeepseekV41` is shaped like DeepSeek-V4.1 where the
  capture path looks: a backbone (`.model`) with `layers`,
  `decoder_replay_start`, `aux_hidden_state_layers` (aux id `i` is layer
  `i`'s input, made while layer `i` runs) and vLLM's own
  `DecoderReplayLayers`, which it calls with V4.1's seven break inputs
  (`hidden_states, positions, input_ids, pre_mix, post_mix, res_mix,
  residual`, at V4.1's shapes and dtypes) and which return
  `hidden_states, pre_mix, *late_aux`; its layers are MLPs, not attention.
  It returns its aux states as V4.1 does, `(hidden_states, aux_list)`, which
  vLLM's wrapper keeps allocated; in the hypothetical `*_flat` scenarios its
  early aux states leave a captured forward as weak references, as vLLM's
  wrapper hands out top-level outputs (`_define_model` says why);
- what needs a checkpoint or kernels: the model config
  (`model_config.hf_config`'s `hidden_size`, `hc_mult`, and the dtype: a
  namespace), the model state's attention metadata (`prepare_attn`) and its
  replay batch (`replay_batch`: a step's last r rows, half by default, padded
  by vLLM's own `dispatch` to the replay graph that fits; vLLM gathers them
  with Triton kernels), the KV writes (`write_batch_kv`: there is no KV
  cache) and the block tables;
- constructors bypassed (`BYPASSED`): `GPUModelRunner`,
  `DeepseekV41ModelState` and the `GroupCoordinator`s (tp, pp, dp, ep, world:
  one rank, no device communicator; their `graph_capture` runs as installed)
  are made with `object.__new__` and given the attributes the capture path
  reads; the model config is set past pydantic's validation. The graph
  managers, the replay layers, the wrappers and the config are made by their
  own constructors (`CONSTRUCTED`);
- `vllm._C`'s `weak_ref_tensor` op: the compiled extension is not carried;
  `install_weak_ref_op` registers the same op (a tensor viewing the same
  memory that does not keep it alive) where it is missing;
- on the GPU machine, the stub modules of `kit/experiments/vllm/stubs/` for
  packages it lacks that the imports touch but the path never calls.

Not modelled (`NOT_MODELLED`): the speculator (DSpark drafter), FULL and
microbatch (ubatch) graphs, attention (so V4.1's per-layer attention breaks),
the KV cache writes, parallelism of any kind.

The replay capture sizes are vLLM's default (`DecoderReplayCudaGraphManager.__init__`
makes them from the window, 96 here: 96, 192, ..., 480, 512), read back from
the manager. Scenarios, each in a fresh process (the graph pool and the patch
are per process): `unpatched` (vLLM 0.33), `patched` (PR 63155),
`early_aux_pr` (an aux id before the replay layers, returned as V4.1 does,
under the PR: the replay graphs keep their own stream), `early_aux_shared`
(the same forced to share), and the hypothetical `early_aux_pr_flat` and
`early_aux_shared_flat` (the same with the early aux handed out weak, as a
model returning its aux flattened would), `planted_cross_break_read` (a bug on
purpose, for the invariant to catch), and `h200_default` and `gb200_default`
(PR 63155 at vLLM's default capture sizes on those GPUs, `preset_config`: on
the H200 no model graph breaks out; on the GB200 most break out to a replay
graph larger than themselves). Recordings made before the return
shapes were named keep their file names (`early_aux_pr`, `early_aux_shared`:
flat; `early_aux_shared_pinned`: nested) and are read as the scenario they
ran (`kit.experiments.vllm.recordings.recorded_as`). Each writes a snapshot
(`<scenario>.pickle`) whose `kit` key holds the scenario, the path that ran, the streams `graph_capture` made, the
graphs-versus-eager check, the read/write obligation over the dispatchable
pairings (`readwrite`, recorded during the capture by vLLM's phases), the
pairings against eager (`pairings`), what each break read (`break_reads`) and
the provenance (`kit.experiments.vllm.safety`); `record` writes them with
`PROVENANCE.json`.

This module runs the scenarios (`kit.experiments.vllm.recordings` reads them
back, without torch or vLLM); it is the entry point, and re-exports what the tests and notebooks use of the two it
is built on: `kit.experiments.vllm.importing` (importing vLLM's capture path and
standing in its compiled parts, with the stubs of `kit/experiments/vllm/stubs/`)
and `kit.experiments.vllm.standin` (the stand-in model and the runner built
around it). The figures are `kit.experiments.summary`'s, as the replica's.

    python -m kit.experiments.vllm.capture --out DIR          # every scenario (needs CUDA)
    python -m kit.experiments.vllm.capture --probe            # which capture modules import here
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pickle
import subprocess
import sys
import traceback
from pathlib import Path

from kit.errors import KitError, check_one_of
from kit.experiments.recorded import child_error, run_fresh
from kit.experiments.summary import summarize
from kit.experiments.vllm.importing import (  # noqa: F401 - re-exported: the entry point's names
    CAPTURE_MODULES,
    MODULE,
    PROBE_MARK,
    STAND_IN_STEP,
    STUBS,
    import_vllm,
    install_weak_ref_op,
    probe,
    probe_all,
    set_vllm_env,
    stub_support,
    stubs_in_use,
    vllm_source,
)
from kit.experiments.vllm.recordings import OLD_NAMES, VLLM_SCENARIOS
from kit.experiments.vllm.standin import (  # noqa: F401 - re-exported: the entry point's names
    BYPASSED,
    CAPTURE_NEEDS_CUDA,
    CONSTRUCTED,
    NOT_MODELLED,
    STOOD_IN,
    StandInConfig,
    build_model,
    build_runner,
    handed_out,
    preset_config,
    vllm_config,
)
from kit.fileio import atomic_write
from kit.patch.install import Patch
from kit.record.provenance import add_entry, provenance, require_cuda

PATHS = ("runner", "managers")  # GPUModelRunner.capture_model, else the two managers' captures called by hand


SCENARIO_TIMEOUT_S = 240.0  # capture with both recorders, the check, 11 pairings


PRESET_TIMEOUT_S = 540.0  # a preset captures up to 83 model graphs and runs every dispatchable pairing


STAGE_MARK = "KIT_STAGE "


@contextlib.contextmanager
def graph_capture_streams():
    """The stream of every `GroupCoordinator.graph_capture()` entered (tp's), in order; the real one runs."""
    from vllm.distributed.parallel_state import GroupCoordinator

    seen: list[int] = []
    original = GroupCoordinator.graph_capture

    @contextlib.contextmanager
    def graph_capture(self, graph_capture_context=None):
        with original(self, graph_capture_context) as context:
            if self.unique_name == "tp":
                seen.append(int(context.stream.cuda_stream))
            yield context

    with Patch("graph_capture() streams", [(GroupCoordinator, "graph_capture", graph_capture)]):
        yield seen


def capture_graphs(runner, path: str) -> None:
    """Every graph: through `GPUModelRunner.capture_model` (`runner`), or the two managers' captures (`managers`)."""
    import torch

    if path == "runner":
        runner.capture_model()
        return
    manager, state = runner.cudagraph_manager, runner.model_state
    with torch.inference_mode():
        manager.capture(
            runner.model, state, runner.input_buffers, None, runner.block_tables, runner.attn_groups,
            runner.kv_cache_config, use_aux_hidden_state_outputs=True,
        )  # fmt: skip
        stream = getattr(manager, "capture_stream", None)  # set by the patch only
        args = (runner.input_buffers, runner.block_tables, runner.attn_groups, runner.kv_cache_config)
        state.capture_inner_cudagraphs(*args, **({"stream": stream} if stream is not None else {}))


def run_forward(runner, input_ids, use_cudagraph: bool, rows: int | None = None, pad: bool = False):
    """One forward of `input_ids` as the runner runs a step: graphs (PIECEWISE) or eager; copies of the outputs.

    The step's replay batch holds its last `rows` rows (half of them by
    default); with graphs vLLM's dispatch runs them in the replay graph that
    fits, eagerly they run as they are, or with `pad` padded with zeros to that
    graph's size (`DeepseekV41ModelState.replay_batch` of the stand-in).
    """
    import torch
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, set_forward_context

    n = input_ids.shape[0]
    buffers = runner.input_buffers
    buffers.input_ids[:n].copy_(input_ids)
    torch.arange(n, out=buffers.positions[:n])
    inputs = {"input_ids": buffers.input_ids[:n], "positions": buffers.positions[:n], "intermediate_tensors": None}
    runner.model.decoder_replay_layers.replay_batch = runner.model_state.replay_batch(
        n, run_graph=use_cudagraph, rows=rows, pad=pad
    )
    mode = CUDAGraphMode.PIECEWISE if use_cudagraph else CUDAGraphMode.NONE
    with (
        torch.inference_mode(),
        set_forward_context(
            None,
            runner.vllm_config,
            num_tokens=n,
            cudagraph_runtime_mode=mode,
            batch_descriptor=BatchDescriptor(num_tokens=n),
        ),
    ):
        if use_cudagraph:
            hidden, aux = runner.cudagraph_manager.run_pw_graph(runner.model, inputs)
        else:
            hidden, aux = runner.model(**inputs)
    torch.cuda.synchronize()
    return hidden.clone(), [a.clone() for a in aux]


def check_vllm_equivalence(runner, seed: int = 1234) -> list[dict]:
    """Fresh token ids per capture size, graphs against eager: the replica's check (`compare_sizes`) on vLLM's path.

    Each step's replay batch is its last half of rows, which vLLM's dispatch
    pads to the replay graph that fits; the eager run pads them the same way
    (`pad`), so both run the replay layers on the same shapes and any
    difference is one of memory, not of a GEMM picked for another row count.
    """
    import torch

    from kit.analysis.equivalence import compare_sizes, torch_randint

    cfg = runner.stand_in
    return compare_sizes(
        cfg.cudagraph_capture_sizes,
        runner.model.model.aux_hidden_state_layers,
        lambda size, generator: torch_randint(cfg.vocab_size, size, generator, torch.int32).to(runner.device),
        lambda ids: run_forward(runner, ids, use_cudagraph=True),
        lambda ids: run_forward(runner, ids, use_cudagraph=False, pad=True),
        seed,
    )


def run_scenario(name: str, path: str = "runner") -> dict:
    """Build, capture under the scenario's patch with both recorders on, check against eager, run the pairings;
    the raw snapshot, with the obligation and the pairings in its `kit` key."""
    check_one_of(name, VLLM_SCENARIOS, "scenario")
    check_one_of(path, PATHS, "path")
    require_cuda(CAPTURE_NEEDS_CUDA)
    stage("import vLLM's capture path")
    stood_in = import_vllm()
    import torch

    import kit.patch.vllm as vllm_patch
    from kit.analysis.readwrite import attach_break_reads
    from kit.experiments.recorded import trim_frames
    from kit.experiments.vllm import safety as vllm_safety
    from kit.patch.policy import has_early_aux
    from kit.record.recorder import CaptureRecorder

    scenario = VLLM_SCENARIOS[name]
    policy = scenario.policy
    cfg = preset_config(scenario.preset) if scenario.preset else StandInConfig()
    cfg = cfg.with_early_aux(aux_return=scenario.aux_return) if scenario.early_aux else cfg
    cfg = dataclasses.replace(cfg, planted_cross_break_read=True) if scenario.planted else cfg
    weak_ref = install_weak_ref_op()
    stage(f"apply the patch ({policy})" if policy else "no patch")
    patch = vllm_patch.patched(policy=policy) if policy else contextlib.nullcontext()
    with patch as handle, graph_capture_streams() as streams, CaptureRecorder() as recorder:
        stage("build the runner around the stand-in")
        runner = build_runner(cfg)
        torch.cuda.synchronize()
        stage(f"capture ({path}: {PATH_CALLS[path]}), recording reads and writes by phase")
        recording = capture_recorded(runner, path)
        torch.cuda.synchronize()
    stage("check the graphs against eager")
    try:
        equivalence = check_vllm_equivalence(runner)
    except Exception as e:  # noqa: BLE001 - the captures are recorded either way; the check's error is kept
        equivalence = [{"error": f"{type(e).__name__}: {e}"[:500], "where": traceback.format_exc().splitlines()[-6:]}]
    stage("the read/write obligation over the dispatchable pairings")
    readwrite = vllm_safety.guarded(vllm_safety.readwrite_result, recording, runner)
    stage("the pairings: every dispatchable replay graph in every model graph's break, against eager")
    pairings = vllm_safety.guarded(vllm_safety.run_pairings, runner, run_forward)
    stage("the pairings vLLM dispatches only under prefill context parallelism (rows over the global batch)")
    pcp_pairings = vllm_safety.guarded(vllm_safety.run_pcp_pairings, runner, run_forward)
    stage("write the snapshot")
    raw = recorder.snapshot.raw
    trim_frames(raw)
    raw["kit"]["vllm_scenario"] = {
        "name": name,
        "policy": policy or "unpatched",
        "description": scenario.description,
        "path": path,
        "config": dataclasses.asdict(cfg),
        "early_aux_pinned": scenario.aux_return == "nested" if scenario.early_aux else None,  # as before aux_return
        "aux_return": scenario.aux_return if scenario.early_aux else None,
        "replay_sizes": vllm_safety.replay_sizes(runner),
        "trim_threshold": vllm_safety.trim_threshold(runner),
        "has_early_aux": has_early_aux(runner.model_state),
        "decisions": [dataclasses.asdict(d) for d in handle.decisions] if policy else [],
        "graph_capture_streams": streams,
    }
    raw["kit"]["equivalence"] = equivalence
    raw["kit"]["readwrite"] = readwrite
    if isinstance(readwrite, dict) and "error" not in readwrite:  # the invariant, over the same capture's segments
        readwrite["invariant"] = vllm_safety.guarded(vllm_safety.vllm_invariant, recording, raw, runner)
    raw["kit"]["pairings"] = pairings
    raw["kit"]["pcp_pairings"] = pcp_pairings
    attached = vllm_safety.guarded(attach_break_reads, raw, recording)  # kit["break_reads"], for the lifetimes
    if attached is not raw:
        raw["kit"]["break_reads_error"] = attached
    raw["kit"]["provenance"].update(
        provenance(f"python -m kit.experiments.vllm.capture --scenario {name} --path {path}", python=True),
        vllm=vllm_source(), stubs=stubs_in_use(), stood_in=STOOD_IN, bypassed=BYPASSED,
        constructed=list(CONSTRUCTED), not_modelled=NOT_MODELLED, weak_ref_tensor=weak_ref,
        compiled_stand_ins=stood_in,
    )  # fmt: skip
    return raw


def capture_recorded(runner, path: str):
    """`capture_graphs(runner, path)` under a `ReadWriteRecorder`, by vLLM's phases (`vllm_safety.vllm_phases`); the
    recording of what every op read and wrote."""
    from kit.experiments.vllm import safety as vllm_safety
    from kit.record.readwrite import ReadWriteRecorder

    with ReadWriteRecorder() as rw, vllm_safety.vllm_phases(runner, rw):
        capture_graphs(runner, path)
    return rw.recording()


PATH_CALLS = {
    "runner": "GPUModelRunner.capture_model",
    "managers": "ModelCudaGraphManager.capture, then DeepseekV41ModelState.capture_inner_cudagraphs",
}


def stage(name: str) -> None:
    """Say on stderr which step a scenario's process is in (`record` keeps the last one a failed process reached)."""
    print(f"{STAGE_MARK}{name}", file=sys.stderr, flush=True)


def record(out_dir: str | Path, names: tuple[str, ...] = tuple(VLLM_SCENARIOS)) -> dict:
    """Every scenario in a fresh process into `out_dir`: `<scenario>.pickle`, `PROVENANCE.json`; what each gave.

    A scenario whose `GPUModelRunner.capture_model` path fails is run again on
    the `managers` path (the two managers' captures called as the runner
    calls them); what stopped the first is kept in its entry, and a scenario
    that fails both ways is listed with both errors. Nothing raises for a
    failed scenario: the lead gets every figure that could be had.
    """
    for name in names:
        check_one_of(name, VLLM_SCENARIOS, "scenario")
    require_cuda(CAPTURE_NEEDS_CUDA)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in names:
        errors = []
        for path in PATHS:
            argv = [sys.executable, "-m", MODULE, "--scenario", name, "--path", path, "--out", str(out)]
            done = run_fresh(argv, PRESET_TIMEOUT_S if VLLM_SCENARIOS[name].preset else SCENARIO_TIMEOUT_S)
            if done.returncode == 0:
                break
            errors.append(failure(path, done))
        if done.returncode != 0:
            results[name] = {"failed": errors}
            add_entry(out, f"{name}.pickle", {"failed": errors})  # after each scenario: a run cut short keeps it
            continue
        # The summary is the last JSON line (vLLM logs to stdout too).
        summary = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
        pickle_path = out / f"{name}.pickle"
        data = pickle_path.read_bytes()
        raw = pickle.loads(data)
        entry = {
            **raw["kit"]["provenance"],
            "command": f"python -m kit.experiments.vllm.capture --out {out.name}",
            "vllm_scenario": raw["kit"]["vllm_scenario"],
            "figures": summary,
            "earlier_path_failed": errors,
        }
        add_entry(out, pickle_path.name, entry, data, size=True)
        results[name] = summary
    return results


def failure(path: str, done: subprocess.CompletedProcess) -> dict:
    """What stopped a scenario's process: the step it had reached, the error's line, and the output's last lines."""
    output = done.stderr or done.stdout or ""
    lines = output.strip().splitlines()
    stages = [line[len(STAGE_MARK) :] for line in lines if line.startswith(STAGE_MARK)]
    said = "\n".join(line for line in lines if not line.startswith(STAGE_MARK))
    return {
        "path": path,
        "stage": stages[-1] if stages else "starting the process",
        "error": child_error(said) if said.strip() else f"exit status {done.returncode}",
        "returncode": done.returncode,
        "stderr": [line for line in lines if not line.startswith(STAGE_MARK)][-40:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="vLLM 0.33's own capture path on this GPU, unpatched and under PR 63155."
    )
    parser.add_argument("--out", help="folder for the snapshots and PROVENANCE.json")
    parser.add_argument(
        "--scenario", "--variant", choices=sorted([*VLLM_SCENARIOS, *OLD_NAMES]), help="run only this one, here"
    )  # --variant: the name the recordings' provenance commands use; OLD_NAMES: the names older recordings name
    parser.add_argument("--path", choices=PATHS, default="runner")
    parser.add_argument("--scenarios", help="comma-separated: record only these, each in a fresh process")
    parser.add_argument("--probe", action="store_true", help="import each capture module and say what stopped it")
    parser.add_argument("--probe-modules", help=argparse.SUPPRESS)  # one process of --probe: these, in order
    args = parser.parse_args(argv)
    try:
        set_vllm_env()
        if args.probe_modules:
            results = probe(tuple(args.probe_modules.split(",")))
            if results:  # what this process had stood in, once it stopped
                results[-1]["stubs_in_this_process"] = [stub["module"] for stub in stubs_in_use()]
            print(PROBE_MARK + json.dumps(results, default=str))
            return 0 if all(r["ok"] for r in results) else 1
        if args.probe:
            results = probe_all()
            for r in results:
                print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['module']}" + ("" if r["ok"] else f": {r['error']}"))
                if r.get("stood_in"):
                    print(f"     {json.dumps(r['stood_in'], default=str)}")
            ok = all(r["ok"] for r in results)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                payload = {"modules": results, **provenance("--probe", python=True)}
                with atomic_write(Path(args.out) / "probe.json") as f:
                    f.write(json.dumps(payload, indent=1, default=str) + "\n")
            return 0 if ok else 1
        if not args.out:
            raise KitError("--out DIR is required")
        if args.scenario:
            name = OLD_NAMES.get(args.scenario, args.scenario)
            raw = run_scenario(name, args.path)
            with atomic_write(Path(args.out) / f"{name}.pickle", "wb") as f:
                pickle.dump(raw, f)
            print(json.dumps(summarize(raw)))
            return 0
        results = record(args.out, tuple(args.scenarios.split(",")) if args.scenarios else tuple(VLLM_SCENARIOS))
        print(json.dumps(results, indent=1, default=str))
        return 0 if all("failed" not in r for r in results.values()) else 1
    except KitError as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
