"""Plant single bugs in a copy of the kit, one at a time, and check that the tests meant to catch each one fail.

    python scripts/mutations.py            # every mutation; a table, then the count caught
    python scripts/mutations.py --json     # the same, then {"mutations": [{"name", "caught"}, ...]} as the last line
    python scripts/mutations.py --only empty_cache_releases_in_reverse_order --keep

A test suite that passes says little until each bug it exists for is shown to
fail it. Each entry of `MUTATIONS` is one small, plausible bug: a replacement
of an exact piece of one source file (which must occur there exactly once, so
a mutation whose source moved fails loudly instead of testing nothing), and
the tests that should catch it. The script copies the repository's files (git's
tracked and untracked, not the ignored ones) to a temporary folder, runs every
mutation's tests there unchanged first (they must pass, or a failure would
prove nothing), then plants each mutation alone and runs its tests with
`PYTHONPATH` on the copy, so that subprocesses, notebook kernels and JupyterLab
import the mutated kit. A mutation is caught when its tests fail.

Not part of `make test` or CI: it takes a few minutes (the notebook mutation runs
notebook 04 headless and in the browser). docs/testing.md has its last result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.fileio import atomic_write  # noqa: E402

NODE_MODULES = Path("tests/browser/node_modules")  # ignored by git; the browser test needs it


@dataclass(frozen=True)
class Mutation:
    """One planted bug: `old` replaced by `new` in `file` (exactly once), caught by failing `tests`."""

    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


SIM_FIDELITY = "tests/test_simulator.py::test_simulator_matches_the_real_allocator"
SIM_RULES = "tests/test_simulator.py"
BOUNDARIES = "tests/test_boundaries.py"
REPLAY_STREAM_HUNK = (
    'Hunk("self.replay_cudagraphs.capture_replay_graphs(prepare)", '
    '"self.replay_cudagraphs.capture_replay_graphs(prepare, stream=stream)")'
)
VLLM_PATCH = "tests/test_vllm_patch.py::"
WHATIF_MERGED = "tests/test_whatif_merged.py::"
UNPICKLER = (
    "tests/test_bad_input.py::test_a_named_global_of_any_module_is_refused_without_being_looked_up",
    "tests/test_bad_input.py::test_a_persistent_id_is_refused",
    "tests/test_bad_input.py::test_hostile_pickle_never_runs_its_command",
)
REFUSAL = "        raise KitError(f\"refused to load global '{module}.{name}': a snapshot holds plain data only\")"
CACHE = "tests/test_cache.py::"
KV_NEGATIVE = "tests/test_alternatives.py::test_a_negative_saving_costs_what_the_same_positive_saving_buys"

MUTATIONS = (
    # -- the six bugs issue 22 found surviving the suite
    Mutation(
        "simulator_splits_a_large_block_with_exactly_1_MiB_left",
        "kit/allocator/simulator.py",
        "        split = should_split(remaining, small, self.expandable)",
        "        split = should_split(remaining, small, self.expandable) or (not small and remaining == 1 << 20)",
        (BOUNDARIES, SIM_FIDELITY),
        "PyTorch splits a large-pool block only when more than 1 MiB is left",
    ),
    Mutation(
        "simulator_splits_a_small_block_only_above_512_B",
        "kit/allocator/simulator.py",
        "        split = should_split(remaining, small, self.expandable)",
        "        split = should_split(remaining, small, self.expandable) and not (small and remaining == 512)",
        (BOUNDARIES, SIM_FIDELITY),
        "PyTorch splits a small-pool block when 512 bytes or more are left",
    ),
    Mutation(
        "empty_cache_releases_in_reverse_order",
        "kit/allocator/simulator.py",
        "        for address in released:",
        "        for address in reversed(released):",
        (SIM_FIDELITY,),
        "the final state is the same; the trace's order of segment_free is not",
    ),
    Mutation(
        "unpickler_admits_torch_globals",
        "kit/load/unpickle.py",
        REFUSAL,
        '        if module.partition(".")[0] == "torch":\n'
        "            return super().find_class(module, name)\n" + REFUSAL,
        UNPICKLER,
        "a torch.* global in a pickle is looked up (and may be called) instead of refused",
    ),
    Mutation(
        "liveness_counts_a_break_input_as_a_conflict",
        "kit/analysis/liveness.py",
        '"conflict": classes[id(life)] == HELD and bool(in_break),',
        '"conflict": classes[id(life)] in (HELD, BREAK_INPUT) and bool(in_break),',
        ("tests/test_safety_cases.py",),
        "a replay graph over a block the break read, and nothing reads after it, is safe",
    ),
    Mutation(
        "notebook_04_shows_the_safe_capture_for_early_aux_forced_to_share",
        "kit/show/safety.py",
        "    if has_early_aux and shares:\n",
        "    if has_early_aux and not shares:\n",
        ("tests/test_browser.py::test_notebook_renders_and_reacts_in_jupyterlab[04_safety]",),
        "the policy explorer's branches swapped: forced sharing shows the PR's safe capture",
    ),
    Mutation(
        "policy_explorer_ignores_the_aux_return",
        "kit/show/safety.py",
        'return ("early_aux_shared_flat" if aux_return == "flat" else "early_aux_shared"), shares',
        'return "early_aux_shared", shares',
        (
            "tests/test_show.py::test_scenario_for_follows_the_prs_rule",
            "tests/test_show.py::test_safety_view_shows_the_capture_the_rule_picks_and_redraws_in_place",
        ),
        "the explorer's aux-return choice picks the capture: flat is the hypothetical that conflicts",
    ),
    # -- the simulator's other rules
    Mutation(
        "simulator_reuses_a_block_of_another_stream",
        "kit/allocator/simulator.py",
        "        lst = self.free.get((pool, small, stream))",
        "        lst = next((f for (p, s, _), f in self.free.items() if (p, s) == (pool, small) and f and"
        " f[-1][0] >= size), None)",
        (SIM_RULES,),
        "the stream check: a free block serves only requests of its own stream",
    ),
    Mutation(
        "simulator_merges_a_freed_block_only_with_the_one_before",
        "kit/allocator/simulator.py",
        "        for neighbour in (block.prev, block.next):",
        "        for neighbour in (block.prev,):",
        (SIM_RULES,),
        "a freed block merges with its free neighbours on both sides",
    ),
    Mutation(
        "empty_cache_releases_graph_pool_segments",
        "kit/allocator/simulator.py",
        "        if block.prev is None and block.next is None and block.pool == DEFAULT_POOL:",
        "        if block.prev is None and block.next is None:",
        (SIM_RULES,),
        "empty_cache releases whole free segments of the default pool only; live graphs keep theirs",
    ),
    Mutation(
        "rounding_rounds_a_multiple_of_512_up",
        "kit/allocator/rules.py",
        "    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)",
        "    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE) // K_MIN_BLOCK_SIZE)",
        (BOUNDARIES, SIM_RULES),
        "requests round up to a multiple of 512 bytes; one that is one stays as it is",
    ),
    # -- the two trace walks: their split rule and the stranded condition
    Mutation(
        "row_walk_splits_a_large_block_with_exactly_1_MiB_left",
        "kit/analysis/trace/rows.py",
        "    split = should_split(gap - rounded, seg.small, expandable)",
        "    split = should_split(gap - rounded, seg.small, expandable) or gap - rounded == 1 << 20",
        (BOUNDARIES,),
        "the row walk must place blocks as the allocator split them, or it ends elsewhere than the snapshot",
    ),
    Mutation(
        "columnar_walk_splits_a_small_block_only_above_512_B",
        "kit/analysis/trace/forward.py",
        "size = need[t] if room - need[t] > limit[i] else max(room, need[t])",
        "size = need[t] if room - need[t] > max(limit[i], 512) else max(room, need[t])",
        (BOUNDARIES,),
        "the columnar walk must place blocks as the allocator split them",
    ),
    Mutation(
        "columnar_walk_breaks_ties_by_the_latest_segment",
        "kit/analysis/trace/forward.py",
        "(gap[a] == gap[b] and seq[a] < seq[b])",
        "(gap[a] == gap[b] and seq[a] > seq[b])",
        ("tests/test_scale.py::test_walk_equals_the_per_row_walk",),
        "of equal free blocks on other streams the walk by entry names the first segment in its order",
    ),
    Mutation(
        "columnar_walk_gives_a_replacing_segment_a_new_place",
        "kit/analysis/trace/forward.py",
        "                seq[i] = seq[gone]",
        "                seq[i] = seq[gone] * 0 + next_seq",
        ("tests/test_scale.py::test_inconsistent_traces_take_the_search_and_agree",),
        "a segment_alloc over a live segment's address takes its place in the walk's dict order",
    ),
    Mutation(
        "whatif_simulation_drops_the_trace_it_was_asked_to_keep",
        "kit/analysis/whatif.py",
        "        if not keep_trace and not expandable:",
        "        if not expandable:",
        ("tests/test_plain_snapshots.py::test_a_simulation_keeps_its_trace_when_asked_and_only_then",),
        "only a run nobody reads the trace of may keep none",
    ),
    Mutation(
        "safety_json_rewrites_a_recorded_figure",
        "kit/experiments/safety_run/result.py",
        '    return [p if "power" in p else {**p, "power": None, "power_reason": NOT_RECORDED} for p in pairs]',
        '    return [{**p, "max_abs_diff": 0.0} if "power" in p else {**p, "power": None, "power_reason": NOT_RECORDED}'
        " for p in pairs]",
        ("tests/test_cli_golden.py::test_safety_json_carries_every_recorded_pairing_unchanged",),
        "`kit safety --json` carries every recorded pairing's figures as recorded",
    ),
    Mutation(
        "forked_spread_tries_all_run_one_placement",
        "kit/analysis/whatif.py",
        "    return simulated_reserved(snap, moves, walk, placement)",
        "    return simulated_reserved(snap, moves, walk, PLACEMENTS[0])",
        ("tests/test_whatif_merged.py::test_the_spreads_tries_in_forked_processes_are_its_tries_run_in_order",),
        "each forked try of the spread runs its own placement, as the tries run in order do",
    ),
    Mutation(
        "row_walk_strands_only_beside_a_larger_block",
        "kit/analysis/trace/rows.py",
        "        if size >= rounded and (best is None or size > best[1]):",
        "        if size > rounded and (best is None or size > best[1]):",
        (BOUNDARIES,),
        "a free block of exactly the rounded size on another stream would have served the request: stranded",
    ),
    Mutation(
        "columnar_walk_strands_only_beside_a_larger_block",
        "kit/analysis/trace/forward.py",
        "if best >= 0 and gap[best] >= need[t]:",
        "if best >= 0 and gap[best] > need[t]:",
        (BOUNDARIES,),
        "as in the row walk: an exact fit on another stream is stranding",
    ),
    # -- the patch's stream decision, in vLLM and in the replica
    Mutation(
        "vllm_patch_shares_the_stream_despite_early_aux",
        "kit/patch/vllm.py",
        "    (_INNER_STREAM, REPLAY_GRAPHS_GET_THE_STREAM),",
        f"    (_INNER_STREAM, {REPLAY_STREAM_HUNK}),",
        (
            f"{VLLM_PATCH}test_with_early_aux_the_replay_graphs_keep_their_own_stream",
            f"{VLLM_PATCH}test_each_patched_function_is_the_installed_one_with_the_prs_edits",
        ),
        "vLLM's DeepseekV41ModelState hands the model graphs' stream on regardless of early aux",
    ),
    Mutation(
        "replica_patch_shares_the_stream_despite_early_aux",
        "kit/patch/replica.py",
        "            vllm.REPLAY_GRAPHS_GET_THE_STREAM,",
        f"            {REPLAY_STREAM_HUNK},",
        (
            "tests/test_replica.py::test_patched_capture_inner_cudagraphs_hands_the_stream_on_by_policy",
            "tests/test_replica.py::test_capture_model_puts_the_replay_graphs_on_the_stream_the_policy_picks",
        ),
        "the replica's model state hands the model graphs' stream on regardless of early aux",
    ),
    Mutation(
        "early_aux_includes_the_replay_start_layer",
        "kit/patch/policy.py",
        "            return any(layer_id < start for layer_id in aux)",
        "            return any(layer_id <= start for layer_id in aux)",
        (f"{VLLM_PATCH}test_an_aux_layer_at_the_replay_start_is_made_inside_the_replay_layers",),
        "aux id decoder_replay_start is made inside the break: not early",
    ),
    Mutation(
        "an_unreadable_model_shares_the_stream",
        "kit/patch/policy.py",
        '    if policy == "share" or (policy == "pr" and has_early_aux is False):',
        '    if policy == "share" or (policy == "pr" and not has_early_aux):',
        (f"{VLLM_PATCH}test_a_model_whose_aux_layers_cannot_be_read_keeps_the_replay_stream_apart",),
        "when early aux cannot be told, the PR's rule keeps a stream of their own",
    ),
    # -- the unpickler's refusal
    Mutation(
        "unpickler_admits_every_global",
        "kit/load/unpickle.py",
        REFUSAL,
        "        return super().find_class(module, name)",
        UNPICKLER,
        "any global a pickle names is looked up: a hostile pickle runs code",
    ),
    Mutation(
        "unpickler_admits_persistent_ids",
        "kit/load/unpickle.py",
        '        raise KitError("refused a persistent id: a snapshot holds plain data only")',
        "        return pid",
        UNPICKLER,
        "a persistent id is resolved to a value instead of refused",
    ),
    # -- the liveness classes
    Mutation(
        "liveness_never_releases_a_block",
        "kit/analysis/liveness.py",
        "        if life.free is not None and life.free < next_first:",
        "        if life.free is not None and life.free < begin:",
        ("tests/test_safety_cases.py",),
        "a block freed as the break returns is released: a replay graph over it is safe",
    ),
    Mutation(
        "liveness_releases_the_early_aux",
        "kit/analysis/liveness.py",
        "            classes[id(life)] = HELD",
        "            classes[id(life)] = RELEASED",
        ("tests/test_safety_cases.py",),
        "an early aux state is held after the break: a replay graph over it is a conflict",
    ),
    # -- the what-if on real traces (issue 27): pools that never vanish, workspaces, maps
    Mutation(
        "whatif_frees_pools_by_simulated_address",
        "kit/analysis/whatif.py",
        "                freed_pools |= _graph_pools_freed(acts, addrs, i, recorded_pool)",
        "                freed_pools |= _graph_pools_freed(\n"
        "                    acts, addrs, i, {a: b.pool for a, b in sim.segments.items()}\n"
        "                )",
        (WHATIF_MERGED + "test_what_if_predicts_every_pool_the_merged_run_reserved_on_the_gpu",),
        "which graph pools a segment-free run releases is read off the recording, not the mapped simulation",
    ),
    Mutation(
        "whatif_keeps_a_moved_streams_workspace",
        "kit/analysis/whatif.py",
        "                key = (kind, moves.get(stream, stream))",
        "                key = (kind, stream)",
        (WHATIF_MERGED + "test_what_if_on_the_vllm_shaped_separate_run_predicts_the_shared_runs_graph_pool_exactly",),
        "a moved stream's cuBLAS workspace is never made on a target that has its own",
    ),
    Mutation(
        "workspace_kind_ignores_cublaslt",
        "kit/analysis/workspaces.py",
        '        if _LT.search(name):\n            return "cuBLASLt"',
        '        if _LT.search(name) and False:\n            return "cuBLASLt"',
        (WHATIF_MERGED + "test_workspaces_are_found_by_their_cpp_frames",),
        "each stream has a cuBLAS and a cuBLASLt workspace: two kinds, not one",
    ),
    Mutation(
        "whatif_accepts_chained_maps",
        "kit/analysis/whatif.py",
        "        if b in out:",
        "        if b in out and b == a:",
        (WHATIF_MERGED + "test_chained_maps_are_refused",),
        "a map that moves a stream another is mapped onto is refused",
    ),
    Mutation(
        "whatif_spread_tries_no_other_placement",
        "kit/analysis/whatif.py",
        "PLACEMENTS = (ASCENDING, DESCENDING, SHUFFLED)",
        "PLACEMENTS = (RECORDED,)",
        (WHATIF_MERGED + "test_what_if_predicts_every_pool_the_merged_run_reserved_on_the_gpu",),
        "a default-pool miss must come with a range that holds the measured figure",
    ),
    Mutation(
        "whatif_shuffled_placement_ignores_recorded_addresses",
        "kit/analysis/whatif.py",
        "iter(recorded if placement in (RECORDED, SHUFFLED) else ())",
        "iter(recorded if placement == RECORDED else ())",
        (WHATIF_MERGED + "test_each_placement_lays_new_segments_where_its_docstring_says",),
        "the shuffled try lays new segments at the recording's addresses in another order",
    ),
    Mutation(
        "whatif_spread_share_loosened",
        "kit/analysis/whatif.py",
        "SPREAD_SEEN_OUTSIDE = 0.03",
        "SPREAD_SEEN_OUTSIDE = 0.1",
        (WHATIF_MERGED + "test_the_share_the_correction_line_states_is_what_the_spread_set_measured",),
        "the share the correction line states is the one the spread set measured, not a looser one",
    ),
    Mutation(
        "whatif_spread_margin_dropped",
        "kit/analysis/whatif.py",
        "    return low - SPREAD_SEEN_OUTSIDE * measured <= measured <= high + SPREAD_SEEN_OUTSIDE * measured",
        "    return low <= measured <= high",
        (
            WHATIF_MERGED
            + "test_on_the_spread_set_every_graph_pool_is_exact_and_the_default_pool_near_its_stated_range",
        ),
        "a default pool outside the placements' range is held to the share the correction line states",
    ),
    Mutation(
        "plugin_names_streams_after_the_estimate",
        "kit/vllm_plugin.py",
        "    estimate, real = records[:real_from], records[real_from:]",
        "    estimate, real = records[:real_from], records",
        ("tests/test_vllm_plugin.py::test_streams_and_pools_are_named_after_the_real_capture_not_the_estimates",),
        "the real capture's streams and pools carry the plain names, the estimate's the prefix",
    ),
    Mutation(
        "walk_ignores_capture_windows_for_freed_segments",
        "kit/analysis/trace/columnar.py",
        "            pool, small = captured.at(i, stream) or DEFAULT_POOL, is_small_segment(size)",
        "            pool, small = DEFAULT_POOL, is_small_segment(size)",
        ("tests/test_plain_snapshots.py::test_a_graph_pool_freed_within_the_trace_is_told_by_the_capture_windows",),
        "a segment made in a recorded capture and freed within the trace is that capture's pool's",
    ),
    # --- issue 38's planted bugs, each once passed by the whole suite ---
    Mutation(
        "simulator_capture_routes_every_stream_into_the_pool",
        "kit/allocator/simulator.py",
        "        if self.capture and self.capture[0] == stream:",
        "        if self.capture:",
        ("tests/test_simulator.py::test_during_a_capture_only_the_capturing_streams_allocations_go_to_its_pool",),
        "during a capture only the capturing stream's allocations go to the capture's pool",
    ),
    Mutation(
        "whatif_spread_forgets_the_recorded_placement",
        "kit/analysis/whatif.py",
        "    runs = [predicted] + (tries() if tries else",
        "    runs = (tries() if tries else",
        (WHATIF_MERGED + "test_the_share_the_correction_line_states_is_what_the_spread_set_measured",),
        "the stated range includes the prediction made with the recording's addresses",
    ),
    Mutation(
        "whatif_forgets_the_moved_streams_workspaces",
        "kit/analysis/whatif.py",
        "    made = {(kind, moves.get(stream, stream)) for kind, stream in workspaces.seeded.values()}",
        "    made = set()",
        (WHATIF_MERGED + "test_a_workspace_made_before_the_trace_counts_for_the_stream_moved_onto_it",),
        "a workspace made before the trace on a stream counts as made for the stream it moves onto",
    ),
    Mutation(
        "whatif_baseline_says_more_for_less",
        "kit/analysis/whatif.py",
        "{'more' if off > 0 else 'less'} than the recording ",
        "{'less' if off > 0 else 'more'} than the recording ",
        (WHATIF_MERGED + "test_the_baseline_line_says_which_way_the_replay_is_off",),
        "the baseline's line says which way it differs from the recording",
    ),
    Mutation(
        "workspaces_by_size_take_one_freed_and_made_again",
        "kit/analysis/workspaces.py",
        "        if last_alloc[e.addr] != i or e.addr not in live_at_end:",
        "        if e.addr not in live_at_end:",
        (WHATIF_MERGED + "test_told_apart_by_size_a_workspace_is_the_allocation_still_live_at_its_address",),
        "a workspace told by size is the last allocation at its address, still live at the end",
    ),
    Mutation(
        "workspace_kinds_swapped",
        "kit/analysis/workspaces.py",
        '''        if _LT.search(name):
            return "cuBLASLt"
        if _CUBLAS.search(name):
            return "cuBLAS"''',
        '''        if _LT.search(name):
            return "cuBLAS"
        if _CUBLAS.search(name):
            return "cuBLASLt"''',
        (WHATIF_MERGED + "test_workspaces_are_found_by_their_cpp_frames",),
        "cuBLAS's and cuBLASLt's workspaces are told apart by their getters' names",
    ),
    Mutation(
        "attribution_counts_one_eager_break_too_many",
        "kit/analysis/attribution.py",
        '                "eager_breaks": len(mine) - 1,',
        '                "eager_breaks": len(mine),',
        ("tests/test_attribution.py::test_vllms_model_graphs_break_once_and_its_replay_graphs_never",),
        "a capture of G graphs has G - 1 eager breaks",
    ),
    Mutation(
        "patched_block_keeps_the_inner_policy",
        "kit/patch/pr.py",
        "                    handle.policy = previous",
        "                    pass",
        ("tests/test_replica.py::test_nested_patched_blocks_put_back_the_outer_policy",),
        "a patched() block's end puts back the policy of the block around it",
    ),
    Mutation(
        "apply_again_patches_on_top",
        "kit/patch/pr.py",
        """            if self._applied is not None:
                self._applied.policy = policy
                return self._applied""",
        """            if False:
                self._applied.policy = policy
                return self._applied""",
        (VLLM_PATCH + "test_revert_restores_every_original_and_applying_twice_wraps_once",),
        "applying the PR again returns the patch already on, with the new policy",
    ),
    Mutation(
        "vllm_patch_checks_only_direct_subclasses",
        "kit/patch/vllm.py",
        "        pending.extend(cls.__subclasses__())",
        "        pass",
        (VLLM_PATCH + "test_a_loaded_model_state_that_takes_no_stream_is_refused[grandchild]",),
        "every model state below ModelState, not only its children, is checked for a stream parameter",
    ),
    Mutation(
        "html_text_leaves_ampersands",
        "kit/markup.py",
        '_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;"',
        '_ESCAPES = str.maketrans({"<": "&lt;"',
        ("tests/test_report.py::test_html_text_shows_an_entity_reference_as_written",),
        "`&` is escaped too, or `&lt;` in a label would show as `<`",
    ),
    Mutation(
        "replay_on_model_stream_when_one_of_several",
        "kit/experiments/summary.py",
        '        "replay_on_model_stream": replay_streams == [model_stream],',
        '        "replay_on_model_stream": model_stream in replay_streams,',
        ("tests/test_vllm_recording.py::test_replay_graphs_split_over_two_streams_are_not_on_the_model_graphs_stream",),
        "the replay graphs are on the model graphs' stream only when every one of them is",
    ),
    Mutation(
        "a_hand_made_patch_outside_kit_patch",
        "kit/experiments/vllm/capture.py",
        """    with Patch("graph_capture() streams", [(GroupCoordinator, "graph_capture", graph_capture)]):
        yield seen""",
        """    GroupCoordinator.graph_capture = graph_capture  # never put back
    yield seen""",
        ("tests/test_layout.py::test_no_module_outside_kit_patch_patches_another_objects_attributes",),
        "patching goes through kit.patch.install.Patch, which puts back what was there",
    ),
    Mutation(
        "fresh_process_without_a_time_limit",
        "kit/experiments/recorded.py",
        "        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)",
        "        return subprocess.run(argv, capture_output=True, text=True)",
        ("tests/test_readwrite.py::test_a_scenario_run_past_its_time_limit_fails_in_one_line",),
        "every experiment's fresh process is killed past its time limit",
    ),
    Mutation(
        "readwrite_summary_counts_holding_pairings_as_violated",
        "kit/experiments/readwrite_run/result.py",
        'f"{len(running) - len(violated) if violated.empty else len(violated)} of {len(running)} dispatchable "',
        'f"{len(running) - len(violated)} of {len(running)} dispatchable "',
        ("tests/test_readwrite_recording.py::test_the_summary_counts_only_the_dispatchable_pairings",),
        '"VIOLATED on N of M" counts the pairings that violate the obligation',
    ),
    Mutation(
        "drafter_summary_counts_holding_pairings_as_violated",
        "kit/experiments/drafter_run.py",
        'f"{len(violated) if violated else len(running)} of {len(running)} dispatchable pairings (the drafter "',
        'f"{len(running) - len(violated)} of {len(running)} dispatchable pairings (the drafter "',
        ("tests/test_drafter.py::test_the_drafter_summary_counts_the_pairings_that_violate_the_obligation",),
        '"VIOLATED on N of M" counts the pairings that violate the drafter obligation',
    ),
    # -- the planted-bug audit's survivors, each caught beside its module's tests
    Mutation(
        "cache_accepts_a_damaged_header",
        "kit/load/cache.py",
        '    if zlib.crc32(text) != crc:\n        raise Rejected("damaged (its header\'s checksum does not match)")\n',
        "",
        ("tests/test_cache.py::test_a_damaged_header_is_made_again",),
        "a header changed in a way JSON still reads is refused by its CRC-32, not read as if whole",
    ),
    Mutation(
        "cache_stamp_leaves_the_tail_unhashed",
        "kit/load/cache.py",
        "    digest.update(os.pread(fd, HASHED_BYTES, max(0, st.st_size - HASHED_BYTES)))\n",
        "",
        (f"{CACHE}test_a_snapshot_rewritten_in_its_last_mib_with_its_size_and_time_is_read_again",),
        "a snapshot rewritten in its last MiB with its size and time kept is told apart by the hash of its tail",
    ),
    Mutation(
        "cache_stamp_hashes_the_first_mib_twice",
        "kit/load/cache.py",
        "max(0, st.st_size - HASHED_BYTES)",
        "0",
        (f"{CACHE}test_a_snapshot_rewritten_in_its_last_mib_with_its_size_and_time_is_read_again",),
        "the stamp hashes the file's first MiB and its last, not the first twice",
    ),
    Mutation(
        "cache_goes_beside_a_readable_folder",
        "kit/load/cache.py",
        "os.access(path.parent, os.W_OK)",
        "os.access(path.parent, os.R_OK)",
        (f"{CACHE}test_a_folder_readable_but_not_writable_puts_the_cache_in_the_user_cache_folder",),
        "a folder the kit can read but not write gets no cache beside the snapshot: the user's cache folder does",
    ),
    Mutation(
        "stream_streams_a_trace_listed_before_the_segments",
        "kit/load/incremental.py",
        '    if "segments" in keys and keys.index("segments") > keys.index("device_traces"):\n'
        "        return None  # segments after the trace could list an entry the sink emptied\n",
        "",
        (f"{CACHE}test_device_traces_before_segments_loads_as_the_usual_order",),
        "segments read after the trace may hold an entry the sink emptied: such a file is read the plain way",
    ),
    Mutation(
        "unpickler_admits_the_trace_sink_by_name_from_any_module",
        "kit/load/unpickle.py",
        "(module, name) == self._sink[:2]",
        "name == self._sink[1]",
        (
            "tests/test_bad_input.py::test_the_trace_sinks_name_under_any_module_but_the_loads_token_is_refused_without_lookup",
        ),
        "only the load's own token names the trace sink; its class name under any other module is refused",
    ),
    Mutation(
        "inferred_capture_gap_check_skips_the_entry_right_after_a_window",
        "kit/analysis/attribution.py",
        "lo, hi = np.searchsorted(self.index, low), np.searchsorted(self.index, high)",
        'lo, hi = np.searchsorted(self.index, low, side="right"), np.searchsorted(self.index, high)',
        (
            "tests/test_attribution.py::test_another_streams_graph_pool_allocation_right_after_a_window_starts_another_capture",
        ),
        "another stream's graph-pool allocation right after a window parts it from the next: two captures",
    ),
    Mutation(
        "inferred_capture_window_ends_one_entry_early",
        "kit/analysis/attribution.py",
        "return [(first, last + 1, s, pools[c])",
        "return [(first, last, s, pools[c])",
        (
            "tests/test_attribution.py::test_a_window_ends_just_after_its_last_allocation_and_holds_every_one_of_its_run",
        ),
        "an inferred window ends just after its last allocation, which it holds",
    ),
    Mutation(
        "liveness_holds_only_blocks_freed_after_the_breaks_first_entry",
        "kit/analysis/liveness.py",
        "(life.free is None or life.free >= begin)",
        "(life.free is None or life.free > begin)",
        ("tests/test_liveness.py::test_a_block_freed_by_the_breaks_first_entry_is_held_across_it_and_released_by_it",),
        "a block freed by the break's very first entry is held across the break, and released by it",
    ),
    Mutation(
        "liveness_frees_a_block_when_its_free_completes",
        "kit/analysis/liveness.py",
        'elif e.action in ("free_requested", "free_completed") and e.addr in live:',
        'elif e.action == "free_completed" and e.addr in live:',
        ("tests/test_liveness.py::test_a_block_is_freed_when_its_free_is_requested_not_when_it_completes",),
        "a block is freed when its free is requested; completion may come after the next graph's first allocation",
    ),
    Mutation(
        "readwrite_phase_order_puts_the_next_segment_beside_the_break",
        "kit/analysis/readwrite.py",
        "else 2 * self.index + _PART_ORDER[self.part]",
        "else self.index + _PART_ORDER[self.part]",
        (
            "tests/test_readwrite.py::test_phases_are_ordered_segment_break_next_segment_and_the_outputs_last",
            "tests/test_readwrite.py::test_the_shipped_recording_carries_what_is_read_after_the_replay_layers_start",
        ),
        "segment J + 1 comes after break J: its reads are carried across it (small.json's 18,432 bytes, not 0)",
    ),
    Mutation(
        "readwrite_summary_counts_pairings_that_cannot_run",
        "kit/experiments/readwrite_run/result.py",
        '        running = rows[rows["dispatchable"]]\n',
        "        running = rows\n",
        ("tests/test_readwrite_recording.py::test_the_summary_counts_only_the_dispatchable_pairings",),
        "the summary's obligation counts only the pairings vLLM's dispatch can make",
    ),
    Mutation(
        "kv_cache_turns_a_negative_saving_into_blocks_gained",
        "kit/analysis/kv_cache.py",
        "    sign = -1 if saved_bytes < 0 else 1\n",
        "    sign = 1\n",
        (KV_NEGATIVE, "tests/test_alternatives.py::test_the_replicas_kv_layout_and_what_24_mib_buys"),
        "budget lost costs blocks and tokens; it never buys them",
    ),
    Mutation(
        "kv_cache_floors_a_negative_saving",
        "kit/analysis/kv_cache.py",
        "blocks = sign * (abs(int(saved_bytes)) // layout.bytes_per_block)",
        "blocks = int(saved_bytes) // layout.bytes_per_block",
        (KV_NEGATIVE,),
        "bytes lost cost the whole blocks the same bytes saved would buy (rounded toward zero), not one more",
    ),
    Mutation(
        "swa_requests_counts_a_negative_saving",
        "kit/analysis/kv_cache.py",
        "return max(int(saved_bytes), 0) // bytes_per_request",
        "return abs(int(saved_bytes)) // bytes_per_request",
        (KV_NEGATIVE,),
        "budget lost holds no more requests' sliding windows",
    ),
    Mutation(
        "progress_drops_the_last_update",
        "kit/progress.py",
        "                n = 0\n        shown_bar.update(n)\n",
        "                n = 0\n",
        ("tests/test_progress.py::test_a_tracked_bar_ends_at_its_total",),
        "a tracked bar counts the last items, fewer than `every`, and ends at its total",
    ),
    # -- the CI guard fails closed and walks every device (issue 27)
    Mutation(
        "check_ignores_a_trace_whose_walk_misses",
        "kit/analysis/check.py",
        "        if walk.mismatches:\n",
        "        if walk.mismatches and False:\n",
        (
            "tests/test_check.py::test_a_trace_whose_walk_misses_the_snapshot_exits_2_in_one_line",
            "tests/test_check.py::test_check_snapshot_and_assert_no_stranding_raise_kit_error_for_a_trace_whose_walk_misses",
        ),
        "a trace that does not walk to the snapshot gives no verdict: check exits 2, never 0",
    ),
    Mutation(
        "check_walks_device_0_only",
        "kit/analysis/check.py",
        "    for device in devices:\n",
        "    for device in devices[:1]:\n",
        ("tests/test_check.py::test_every_device_with_a_trace_is_checked",),
        "check walks every device that has a trace, not the first only",
    ),
    # -- diff pairs graph pools by id and content, never by their number (the leftover-pool and moved-work issues)
    Mutation(
        "diff_pairs_graph_pools_by_their_number",
        "kit/analysis/pairing.py",
        "            score = likeness(b, a)\n",
        "            score = (3, True) if b.label == a.label else likeness(b, a)\n",
        ("tests/test_diff_pairing.py::test_a_leftover_pool_numbered_first_is_not_paired_with_the_real_one",),
        "a leftover pool made first takes number 1: pairing by the number pairs it with the real pool",
    ),
    Mutation(
        "diff_guesses_among_equally_matching_pools",
        "kit/analysis/pairing.py",
        "if tops_b[kb] == [ka] and tops_a[ka] == [kb]]",
        "if tops_b[kb][0] == ka and tops_a[ka][0] == kb]",
        (
            "tests/test_diff_pairing.py::test_content_that_matches_two_pools_equally_leaves_the_pool_unpaired_not_refused",
        ),
        "two pools that match one equally cannot be told apart: the pool stays unpaired rather than take the first",
    ),
    Mutation(
        "diff_pairs_one_id_whatever_its_captures",
        "kit/analysis/pairing.py",
        "        return bool(b.frames & a.frames)\n",
        "        return True\n",
        ("tests/test_diff_pairing.py::test_a_leftover_pool_numbered_first_is_not_paired_with_the_real_one",),
        "an id whose captures differ on the two sides is two pools (a leftover took it): content pairs them",
    ),
    Mutation(
        "diff_never_pairs_by_id",
        "kit/analysis/pairing.py",
        '        if a is None or a.role == "default" or not ids_agree(b, a):\n',
        "        if True:\n",
        (
            "tests/test_diff_pairing.py::test_recorded_runs_where_work_moved_pair_every_pool_as_its_graphs_say",
            "tests/test_diff_pairing.py::test_a_leftover_holding_the_same_captures_is_paired_by_id_with_a_warning",
        ),
        "where work moved between streams only the id tells pools apart: content alone leaves them unpaired",
    ),
    Mutation(
        "diff_labels_a_pool_pair_by_each_sides_own_number",
        "kit/analysis/tables.py",
        '    out["pool_label"] = merged["_pool_key"].map(shown)\n',
        '    out["pool_label"] = merged["pool_label_after"].fillna(merged["pool_label_before"])\n',
        ("tests/test_diff_pairing.py::test_recorded_runs_where_work_moved_pair_every_pool_as_its_graphs_say",),
        "one pool numbered differently in two runs is one pool: its summary is one line, not a saving and a cost",
    ),
    # -- labels from a snapshot are text wherever they are rendered as HTML ("stream of  (file.py:46)")
    Mutation(
        "style_table_escapes_only_until_a_callers_format",
        "kit/analysis/tables.py",
        "styler = _text_styler()(table).format_index",
        'styler = table.style.format(escape="html").format_index',
        (
            "tests/test_tables.py::test_styler_shows_the_snapshots_markup_as_text_also_after_a_callers_format",
            "tests/test_show.py::test_explorer_shows_the_snapshots_markup_as_text",
        ),
        "a caller's format({column: f}) resets every other column: they stay escaped, or <module> is eaten as a tag",
    ),
    Mutation(
        "segment_map_legend_renders_labels_as_markup",
        "kit/show/pictures.py",
        'name=html_text(f"{labels.get(sid, sid)}: {name}"),',
        'name=f"{labels.get(sid, sid)}: {name}",',
        (
            "tests/test_report.py::test_figures_show_the_snapshots_markup_as_text",
            "tests/test_browser.py::test_a_hostile_snapshot_runs_nothing_in_the_report_or_the_explorer",
        ),
        "plotly draws a trace's name as HTML: a stream label from the snapshot is escaped first",
    ),
    Mutation(
        "obligation_ignores_reads_after_the_replay_layers_in_the_break",
        "kit/analysis/readwrite.py",
        "        if order > boundary:",
        "        if order > boundary and accesses[0].phase.part != AFTER_REPLAY:",
        ("tests/test_readwrite.py",),
        "a read of a break input after R starts, in the rest of the break, is carried across R",
    ),
    Mutation(
        "dispatch_allows_only_replay_graphs_smaller_than_the_model_graph",
        "kit/experiments/dispatch.py",
        "    return {s for s in replay_sizes if s >= smallest and (largest is None or s <= largest)}",
        "    return {s for s in replay_sizes if s >= smallest and s < model_size}",
        ("tests/test_dispatch.py", "tests/test_safety_recording.py"),
        "vLLM's dispatch pads N rows to the smallest replay size that fits: R = N and R > N can run",
    ),
    Mutation(
        "eager_replay_rows_not_padded_to_the_graphs_size",
        "kit/replica/model_state.py",
        "            padded = size if size is not None else (num_rows if num_rows > local_rows else None)",
        "            padded = None",
        ("tests/test_dispatch.py",),
        "an eager forward multiplies the graph's shapes only when its rows are padded to the replay size",
    ),
    Mutation(
        "child_error_keeps_the_last_line",
        "kit/experiments/recorded.py",
        '    error = raised[-1].removeprefix("kit: error: ") if raised else (lines[-1] if lines else "no output")',
        '    error = lines[-1] if lines else "no output"',
        ("tests/test_child_error.py",),
        "a failed child's error is the raised line, not torch's closing advice",
    ),
    Mutation(
        "record_each_stamps_the_last_runs_provenance",
        "kit/experiments/recorded.py",
        "    first = next(iter(runs.values()))",
        "    first = list(runs.values())[-1]",
        ("tests/test_recorded_resume.py",),
        "a recording's provenance is its first run's, with the command that records every scenario",
    ),
    # -- issue 39: the segment map's endless loop and the capture inference's missed empty_cache, re-planted, and
    # -- every boundary its tests take at the limit, one below and one above
    Mutation(
        "segment_map_loops_forever_on_one_segment_over_max_bars",
        "kit/show/pictures.py",
        "    while len(order) > 1 and sum(len(bars_of(c, i)[0]) for i in order) > max_bars:\n"
        "        keep = min(len(order) - 1, max(1, len(order) * 3 // 4))\n",
        "    while order and sum(len(bars_of(c, i)[0]) for i in order) > max_bars:\n"
        "        keep = max(1, len(order) * 3 // 4)\n",
        ("tests/test_segment_map.py::test_one_segment_with_more_runs_than_bars_is_drawn_in_groups_and_says_so",),
        "issue 39: one segment with more runs than max_bars keeps `keep` at 1 and the loop never ends",
    ),
    Mutation(
        "inferred_capture_misses_a_segment_free_right_after_a_window",
        "kit/analysis/attribution.py",
        "if np.searchsorted(self.frees, low) < np.searchsorted(self.frees, high):",
        'if np.searchsorted(self.frees, low, side="right") < np.searchsorted(self.frees, high):',
        ("tests/test_attribution.py::test_an_empty_cache_right_after_a_capture_parts_it_from_the_next",),
        "issue 39: an empty_cache's segment_free right after a window parts it from the next window: two captures",
    ),
    Mutation(
        "segment_map_merges_blocks_at_exactly_max_bars",
        "kit/show/pictures.py",
        "    merged = sum(int(c.n_blocks[i]) for i in order) > max_bars\n",
        "    merged = sum(int(c.n_blocks[i]) for i in order) >= max_bars\n",
        ("tests/test_segment_map.py::test_one_segments_blocks_runs_and_groups_at_each_limit",),
        "as many blocks as max_bars are drawn each as its own bar",
    ),
    Mutation(
        "segment_map_leaves_a_segment_out_at_exactly_max_bars",
        "kit/show/pictures.py",
        "sum(len(bars_of(c, i)[0]) for i in order) > max_bars:",
        "sum(len(bars_of(c, i)[0]) for i in order) >= max_bars:",
        ("tests/test_segment_map.py::test_two_segments_at_each_limit_merge_then_leave_the_smaller_out_then_group",),
        "segments whose runs add up to exactly max_bars are all drawn",
    ),
    Mutation(
        "segment_map_groups_a_segment_with_exactly_max_bars_runs",
        "kit/show/pictures.py",
        "(order[0], runs) if runs > max_bars else None",
        "(order[0], runs) if runs >= max_bars else None",
        ("tests/test_segment_map.py::test_one_segments_blocks_runs_and_groups_at_each_limit",),
        "a segment of exactly max_bars runs is drawn run by run, and the title says no grouping",
    ),
    Mutation(
        "segment_map_groups_into_one_bar_too_many",
        "kit/show/pictures.py",
        "        return lambda c, i: _groups(c, i, max_bars)\n",
        "        return lambda c, i: _groups(c, i, max_bars + 1)\n",
        ("tests/test_segment_map.py::test_any_segments_and_limits_finish_within_the_limits_and_tile_what_is_drawn",),
        "the property: whatever the segments and limits, never more bars than max_bars",
    ),
    Mutation(
        "segment_map_accepts_zero_bars",
        "kit/show/pictures.py",
        "not isinstance(max_bars, int) or max_bars < 1:",
        "not isinstance(max_bars, int) or max_bars < 0:",
        ("tests/test_segment_map.py::test_fewer_than_one_bar_is_refused_in_one_line",),
        "max_bars of 0 is refused in one line: no segment with a block could be drawn",
    ),
    Mutation(
        "inferred_capture_gap_check_stops_one_entry_before_the_next_window",
        "kit/analysis/attribution.py",
        "if np.searchsorted(self.frees, low) < np.searchsorted(self.frees, high):",
        "if np.searchsorted(self.frees, low) < np.searchsorted(self.frees, high - 1):",
        ("tests/test_attribution.py::test_only_an_entry_between_two_windows_parts_them_into_two_captures",),
        "a segment_free right before the next window's first entry parts the two windows",
    ),
    Mutation(
        "inferred_capture_gap_check_starts_at_the_first_windows_begin",
        "kit/analysis/attribution.py",
        'between.one_capture(before["trace_end"], begin, stream)',
        'between.one_capture(before["trace_begin"], begin, stream)',
        ("tests/test_attribution.py::test_only_an_entry_between_two_windows_parts_them_into_two_captures",),
        "what happens inside the first window (before its last allocation) does not part it from the next",
    ),
    Mutation(
        "inferred_capture_gap_check_runs_past_the_next_windows_begin",
        "kit/analysis/attribution.py",
        "lo, hi = np.searchsorted(self.index, low), np.searchsorted(self.index, high)",
        "lo, hi = np.searchsorted(self.index, low), len(self.index)",
        ("tests/test_attribution.py::test_only_an_entry_between_two_windows_parts_them_into_two_captures",),
        "another stream's graph-pool allocation after the next window began does not part the two",
    ),
    Mutation(
        "recorded_window_refused_for_ending_at_the_traces_end",
        "kit/analysis/attribution.py",
        'if length is not None and window["trace_end"] > length:',
        'if length is not None and window["trace_end"] >= length:',
        ("tests/test_boundaries.py::test_a_recorded_window_may_end_at_the_traces_end_and_begin_at_its_end",),
        "a window may end exactly at the trace's end (its end is exclusive)",
    ),
    Mutation(
        "recorded_window_refused_when_empty",
        "kit/load/rows.py",
        "    if end < begin:\n",
        "    if end <= begin:\n",
        ("tests/test_boundaries.py::test_a_recorded_window_may_end_at_the_traces_end_and_begin_at_its_end",),
        "a window that begins where it ends is empty, not malformed",
    ),
    Mutation(
        "recorded_window_accepts_a_negative_begin",
        "kit/load/rows.py",
        '    begin = _int(c, "trace_begin", where, maximum=INT64_MAX)\n',
        '    begin = _int(c, "trace_begin", where, minimum=-1, maximum=INT64_MAX)\n',
        ("tests/test_boundaries.py::test_a_recorded_window_may_end_at_the_traces_end_and_begin_at_its_end",),
        "a window beginning at trace index -1 is refused",
    ),
    Mutation(
        "capture_attribution_counts_the_segment_made_at_its_end",
        "kit/analysis/attribution.py",
        'hi = bisect_left(self.index, window["trace_end"])',
        'hi = bisect_left(self.index, window["trace_end"] + 1)',
        (
            "tests/test_boundaries.py::test_a_capture_window_holds_the_segments_made_from_its_begin_to_just_before_its_end",
        ),
        "a window's end is exclusive: the segment made at it is the next one's",
    ),
    Mutation(
        "capture_attribution_skips_the_segment_made_at_its_begin",
        "kit/analysis/attribution.py",
        'lo = bisect_left(self.index, window["trace_begin"])',
        'lo = bisect_left(self.index, window["trace_begin"] + 1)',
        (
            "tests/test_boundaries.py::test_a_capture_window_holds_the_segments_made_from_its_begin_to_just_before_its_end",
        ),
        "a window's begin is inclusive: the segment made at it is the window's",
    ),
    Mutation(
        "row_parser_refuses_a_value_at_its_limit",
        "kit/load/rows.py",
        "    if value > maximum:\n        if maximum == MAX_DEVICE_BYTES:\n",
        "    if value >= maximum:\n        if maximum == MAX_DEVICE_BYTES:\n",
        ("tests/test_boundaries.py::test_each_segment_limit_of_the_loaders_takes_the_limit_and_refuses_one_more",),
        "a size of exactly 4 TiB, device 1024 and stream id 2**63 - 1 are each a snapshot's",
    ),
    Mutation(
        "bulk_columns_refuse_a_value_at_its_limit",
        "kit/load/columns.py",
        "(maximum is not None and out.max() > maximum)",
        "(maximum is not None and out.max() >= maximum)",
        ("tests/test_boundaries.py::test_each_segment_limit_of_the_loaders_takes_the_limit_and_refuses_one_more",),
        "the bulk checks take what the row parser takes: a value at its limit",
    ),
    Mutation(
        "row_parser_takes_one_device_more",
        "kit/load/rows.py",
        'device=_int(s, "device", where, default=0, maximum=MAX_DEVICE),',
        'device=_int(s, "device", where, default=0, maximum=MAX_DEVICE + 1),',
        ("tests/test_boundaries.py::test_each_segment_limit_of_the_loaders_takes_the_limit_and_refuses_one_more",),
        "device 1025 is refused by the row parser, not only by the bulk checks",
    ),
    Mutation(
        "segment_may_not_end_at_the_address_spaces_end",
        "kit/load/rows.py",
        "    if address + total > MAX_ADDRESS + 1:\n",
        "    if address + total > MAX_ADDRESS:\n",
        ("tests/test_boundaries.py::test_each_segment_limit_of_the_loaders_takes_the_limit_and_refuses_one_more",),
        "a segment may end exactly at 2**64; one byte further runs past the address space",
    ),
    Mutation(
        "row_parser_refuses_exactly_1_PiB_in_all",
        "kit/load/rows.py",
        "    if total > MAX_BYTES:\n",
        "    if total >= MAX_BYTES:\n",
        ("tests/test_boundaries.py::test_each_segment_limit_of_the_loaders_takes_the_limit_and_refuses_one_more",),
        "segments reserving exactly 1 PiB in all are a snapshot's; one byte more is corruption",
    ),
    Mutation(
        "bulk_columns_refuse_exactly_1_PiB_in_all",
        "kit/load/columns.py",
        "sum(total.tolist()) > MAX_BYTES",
        "sum(total.tolist()) >= MAX_BYTES",
        ("tests/test_boundaries.py::test_each_segment_limit_of_the_loaders_takes_the_limit_and_refuses_one_more",),
        "the bulk checks take exactly 1 PiB in all, as the row parser does",
    ),
    Mutation(
        "trace_entry_address_takes_one_past_the_last",
        "kit/load/rows.py",
        'addr=_int(e, "addr", where, default=0, maximum=MAX_ADDRESS),',
        'addr=_int(e, "addr", where, default=0, maximum=MAX_ADDRESS + 1),',
        ("tests/test_boundaries.py::test_each_trace_entry_limit_takes_the_limit_and_refuses_one_more",),
        "a trace entry's address past 2**64 - 1 is refused",
    ),
    Mutation(
        "device_traces_refused_at_one_per_possible_device",
        "kit/load/snapshot.py",
        "and len(traces) <= MAX_DEVICE",
        "and len(traces) < MAX_DEVICE",
        ("tests/test_boundaries.py::test_device_traces_take_one_list_per_possible_device_and_refuse_one_more",),
        "1024 device traces are a snapshot's, 1025 are not",
    ),
    Mutation(
        "cache_refuses_an_array_ending_at_the_datas_end",
        "kit/load/cache.py",
        'spec["offset"] + n * dtype.itemsize <= len(data):',
        'spec["offset"] + n * dtype.itemsize < len(data):',
        ("tests/test_boundaries.py::test_a_cached_array_may_end_exactly_at_the_datas_end_and_not_a_byte_past",),
        "the last array of a cache ends exactly at its data's end",
    ),
    Mutation(
        "cache_takes_an_array_before_the_data",
        "kit/load/cache.py",
        'not 0 <= spec["offset"] <=',
        'not -1 <= spec["offset"] <=',
        ("tests/test_boundaries.py::test_a_cached_array_may_end_exactly_at_the_datas_end_and_not_a_byte_past",),
        "an array at offset -1 is a damaged cache",
    ),
    Mutation(
        "cache_takes_a_stack_one_past_the_last",
        "kit/load/cache.py",
        '<= fields["stack"].max() < len(starts) - 1:',
        '<= fields["stack"].max() <= len(starts) - 1:',
        ("tests/test_boundaries.py::test_a_cached_entrys_stack_is_one_the_cache_holds",),
        "an entry's stack number is below the number of stacks the cache holds",
    ),
    Mutation(
        "cache_takes_stacks_ending_short_of_their_frames",
        "kit/load/cache.py",
        "or starts[-1] != len(flat):",
        "or starts[-1] > len(flat):",
        ("tests/test_boundaries.py::test_a_cached_entrys_stack_is_one_the_cache_holds",),
        "the stacks end exactly at the end of the frames the cache holds, not short of it",
    ),
    Mutation(
        "cached_stack_names_one_frame_past_the_last",
        "kit/load/columns.py",
        "if any(not 0 <= i < len(frames) for i in set(numbers)):",
        "if any(not 0 <= i <= len(frames) for i in set(numbers)):",
        ("tests/test_boundaries.py::test_a_cached_stack_names_only_frames_the_cache_holds",),
        "a stack's frame number is below the number of frames the cache holds",
    ),
    Mutation(
        "cache_header_may_not_end_at_the_files_end",
        "kit/load/cache.py",
        "    if PREFIX.size + length > size:\n",
        "    if PREFIX.size + length >= size:\n",
        ("tests/test_boundaries.py::test_a_caches_header_may_end_exactly_at_the_files_end",),
        "a header may end exactly at the file's end (a cache of no arrays)",
    ),
    Mutation(
        "cache_takes_data_shorter_than_its_file",
        "kit/load/cache.py",
        'if start + header.get("data_bytes", -1) != size:',
        'if start + header.get("data_bytes", -1) > size:',
        ("tests/test_boundaries.py::test_a_caches_data_ends_exactly_where_its_header_says",),
        "a cache one byte longer than its header says is refused",
    ),
    Mutation(
        "format_bytes_keeps_1024_in_the_unit_below",
        "kit/units.py",
        '        if n < 1024 or name == "GiB":\n',
        '        if n <= 1024 or name == "GiB":\n',
        ("tests/test_boundaries.py::test_format_bytes_changes_unit_at_exactly_1024_of_the_one_below",),
        "1024 bytes are 1.00 KiB, not 1024 B",
    ),
    Mutation(
        "format_bytes_stops_at_MiB",
        "kit/units.py",
        '        if n < 1024 or name == "GiB":\n',
        '        if n < 1024 or name == "MiB":\n',
        ("tests/test_boundaries.py::test_format_bytes_changes_unit_at_exactly_1024_of_the_one_below",),
        "a GiB is 1.00 GiB; GiB is the largest unit",
    ),
    Mutation(
        "format_bytes_signs_twice",
        "kit/units.py",
        "    n = abs(float(n))\n",
        "    n = float(n)\n",
        ("tests/test_boundaries.py::test_format_bytes_changes_unit_at_exactly_1024_of_the_one_below",),
        "a negative size has one minus sign, and its unit by its magnitude",
    ),
    Mutation(
        "segment_of_exactly_2_MiB_taken_as_large",
        "kit/allocator/rules.py",
        "    return total_size <= K_SMALL_BUFFER\n",
        "    return total_size < K_SMALL_BUFFER\n",
        ("tests/test_boundaries.py::test_a_segment_without_a_known_type_is_small_up_to_2_MiB",),
        "a 2 MiB segment is a small-pool segment",
    ),
    Mutation(
        "bulk_columns_take_an_unknown_segment_type_as_large",
        "kit/load/columns.py",
        't == "small" if t in _SEGMENT_TYPES else is_small_segment(size)',
        't == "small"',
        ("tests/test_boundaries.py::test_a_segment_without_a_known_type_is_small_up_to_2_MiB",),
        "a segment without a known segment_type is classed by its size, in the bulk columns too",
    ),
    Mutation(
        "row_parser_keeps_an_unknown_segment_type",
        "kit/load/rows.py",
        '    if segment_type not in ("small", "large"):\n',
        "    if segment_type is None:\n",
        ("tests/test_boundaries.py::test_a_segment_without_a_known_type_is_small_up_to_2_MiB",),
        "a segment_type the kit does not know is replaced by the size's class",
    ),
    Mutation(
        "request_of_exactly_1_MiB_taken_as_large",
        "kit/allocator/rules.py",
        "    return rounded <= K_SMALL_SIZE\n",
        "    return rounded < K_SMALL_SIZE\n",
        ("tests/test_boundaries.py::test_a_new_segment_is_sized_and_typed_by_its_request_at_each_boundary",),
        "a 1 MiB request is the largest the small pool serves",
    ),
    Mutation(
        "small_request_of_exactly_1_MiB_gets_a_20_MiB_segment",
        "kit/allocator/rules.py",
        "    if size <= K_SMALL_SIZE:\n        return K_SMALL_BUFFER\n",
        "    if size < K_SMALL_SIZE:\n        return K_SMALL_BUFFER\n",
        ("tests/test_boundaries.py::test_a_new_segment_is_sized_and_typed_by_its_request_at_each_boundary",),
        "a 1 MiB request's new segment is 2 MiB",
    ),
    Mutation(
        "request_of_exactly_10_MiB_shares_a_20_MiB_segment",
        "kit/allocator/rules.py",
        "    if size < K_MIN_LARGE_ALLOC:\n",
        "    if size <= K_MIN_LARGE_ALLOC:\n",
        ("tests/test_boundaries.py::test_a_new_segment_is_sized_and_typed_by_its_request_at_each_boundary",),
        "from 10 MiB a request gets a segment of its own, rounded up to 2 MiB",
    ),
    Mutation(
        "hunk_never_matches_the_last_line",
        "kit/patch/source.py",
        "for i in range(len(lines) - len(old) + 1)",
        "for i in range(len(lines) - len(old))",
        ("tests/test_boundaries.py::test_a_hunk_applies_where_its_old_lines_occur_once_up_to_the_last_line",),
        "a hunk whose old lines are the function's last is applied, not refused",
    ),
    Mutation(
        "hunk_matches_without_its_last_line",
        "kit/patch/source.py",
        "all(lines[i + k].strip() == old[k] for k in range(len(old)))",
        "all(lines[i + k].strip() == old[k] for k in range(len(old) - 1))",
        ("tests/test_boundaries.py::test_a_hunk_applies_where_its_old_lines_occur_once_up_to_the_last_line",),
        "every old line of a hunk must match, its last too",
    ),
    Mutation(
        "hunk_applies_at_the_first_of_two_places",
        "kit/patch/source.py",
        "    if len(starts) != 1:\n",
        "    if not starts:\n",
        ("tests/test_boundaries.py::test_a_hunk_is_refused_unless_its_old_lines_occur_exactly_once",),
        "old lines found twice are refused: which place the PR meant cannot be told",
    ),
    Mutation(
        "added_segment_why_forgets_its_own_streams_smaller_blocks",
        "kit/analysis/added_segments.py",
        '    own = free[TOO_SMALL]\n    if own["count"]:',
        '    own = free[TOO_SMALL]\n    if own["fitting"]:',
        ("tests/test_added_segments.py",),
        "why a request made a segment names its own stream's free blocks of its size class that were too small",
    ),
    Mutation(
        "added_segments_blame_no_segment_on_the_stream",
        "kit/analysis/added_segments.py",
        '        stranded = r["served"] == "stranded" or bool(',
        "        stranded = False and bool(",
        ("tests/test_added_segments.py",),
        "a segment made while a fitting free block sat on another stream counts for the stream, not for want of one",
    ),
    Mutation(
        "safety_provenance_names_the_module_before_its_rename",
        "kit/recordings/safety/PROVENANCE.json",
        '"command": "python -m kit.experiments.safety_run --preset small --out kit/recordings/safety"',
        # The old name, split so that the layout test does not take it for a module the project names.
        '"command": "python -m kit.experiments.' + 'pairings --preset small --out kit/recordings/safety"',
        ("tests/test_commands_exist.py",),
        "every command a recording's provenance names runs (its --help exits 0)",
    ),
    Mutation(
        "readme_names_a_make_target_that_does_not_exist",
        "README.md",
        "make lab    # creates .venv if missing",
        "make notebooks    # creates .venv if missing",
        ("tests/test_commands_exist.py",),
        "every make target, module, script and kit subcommand the README and docs show exists",
    ),
    Mutation(
        "readwrite_strided_write_covers_its_hull",
        "kit/record/readwrite.py",
        "        exact = element_spans(t)",
        "        exact = [byte_span(t)]",
        (
            "tests/test_readwrite.py::test_a_strided_copy_into_one_column_rewrites_that_column_and_not_the_gaps_between_its_elements",
        ),
        "a copy_ into one column writes that column's elements, not the gaps between them (which hold carried values)",
    ),
    Mutation(
        "readwrite_strided_read_covers_its_hull",
        "kit/record/readwrite.py",
        "    spans = element_spans(t)\n    if spans is None:",
        "    spans = None\n    if spans is None:",
        ("tests/test_readwrite.py::test_views_resolve_to_the_bytes_of_their_elements_in_their_storage",),
        "a strided view is read element by element, not as its hull",
    ),
    Mutation(
        "readwrite_element_spans_do_not_coalesce",
        "kit/record/readwrite.py",
        "    while dims and dims[-1][0] == run:",
        "    while False:",
        ("tests/test_readwrite.py::test_element_spans_coalesce_contiguous_dimensions_and_stop_at_the_cap",),
        "contiguous inner dimensions make one run, so a tensor counts against MAX_SPANS by its runs",
    ),
    Mutation(
        "readwrite_empty_outputs_not_marked_fresh",
        "kit/record/readwrite.py",
        "        spans[FRESH] = tensor_reads(returned)",
        "        spans[FRESH] = []",
        ("tests/test_readwrite.py",),
        "an empty's bytes are marked fresh, so a read no recorded op wrote is seen as written outside the dispatcher",
    ),
    Mutation(
        "readwrite_unseen_writer_counted_as_carried",
        "kit/analysis/readwrite.py",
        "                    for start, end in _outside(fresh.ranges.spans, access.start, access.end)",
        "                    for start, end in [(access.start, access.end)]",
        ("tests/test_readwrite.py",),
        "a read of bytes written outside the dispatcher is reported as such, never counted as carried across R",
    ),
    Mutation(
        "readwrite_may_write_rewrites_carried_values",
        "kit/analysis/readwrite.py",
        "for a in accesses if a.kind in (WRITE, FRESH))",
        "for a in accesses if a.kind in (WRITE, FRESH, MAY_WRITE))",
        ("tests/test_readwrite.py::test_a_write_too_large_to_list_rewrites_nothing_and_counts_as_the_replay_graphs",),
        "the hull of a write too large to list may cover bytes it did not write: it hides no carried read",
    ),
    Mutation(
        "readwrite_replay_may_write_not_counted",
        "kit/analysis/readwrite.py",
        "recording.of(REPLAY, size) if a.kind in (WRITE, MAY_WRITE)",
        "recording.of(REPLAY, size) if a.kind == WRITE",
        ("tests/test_readwrite.py::test_a_write_too_large_to_list_rewrites_nothing_and_counts_as_the_replay_graphs",),
        "a replay graph's write too large to list counts as a write of its whole hull",
    ),
    Mutation(
        "readwrite_verdict_hides_the_unseen_writer",
        "kit/analysis/readwrite.py",
        '    if not unseen and not blind:\n        return ""',
        '    if True:\n        return ""',
        ("tests/test_readwrite.py",),
        "a pairing's verdict and the summary say what was written outside the dispatcher",
    ),
    Mutation(
        "readwrite_pairs_drop_the_unseen_writer",
        "kit/experiments/readwrite_run/result.py",
        '"unseen_writer_bytes": int(row["unseen_writer_bytes"]),',
        '"unseen_writer_bytes": 0,',
        ("tests/test_readwrite.py::test_the_side_by_side_comparison_carries_the_unseen_writer_of_each_pairing",),
        "the side-by-side comparison's pairs carry the bytes written outside the dispatcher",
    ),
    Mutation(
        "dispatch_ignores_pcp_global_rows",
        "kit/experiments/dispatch.py",
        "    return fewest, pcp_size * model_size",
        "    return fewest, model_size",
        ("tests/test_dispatch.py", "tests/test_safety_run.py::test_safety_json_is_the_contract"),
        "under PCP vLLM counts the replay rows over the global batch: R reaches dispatch(pcp_size x N)",
    ),
    Mutation(
        "dispatch_rows_without_lower_bound",
        "kit/experiments/dispatch.py",
        "    fewest = smallest_step if window is None else min(smallest_step, window)",
        "    fewest = 1",
        ("tests/test_dispatch.py",),
        "every request keeps min(T, window) rows and a step padded to N holds more than P tokens",
    ),
    Mutation(
        "dp_dummy_runs_its_own_rows_graph",
        "kit/experiments/dispatch.py",
        "    return dispatch_replay_size(max(rows), replay_sizes)",
        "    return dispatch_replay_size(rows[0], replay_sizes)",
        ("tests/test_dispatch.py",),
        "a DP dummy batch keeps one row but runs the replay graph of the largest rank's rows",
    ),
    Mutation(
        "replica_dispatches_the_local_rows_under_pcp",
        "kit/replica/model_state.py",
        "        size = graphs.dispatch(num_rows) if graphs is not None else None",
        "        size = graphs.dispatch(local_rows) if graphs is not None else None",
        ("tests/test_dispatch.py",),
        "a PCP step's replay graph is the one its global row count dispatches to, not its own rows'",
    ),
    Mutation(
        "vllm_presets_json_restated_wrong",
        "kit/replica/vllm_presets.json",
        '"max_cudagraph_capture_size": 1024,',
        '"max_cudagraph_capture_size": 512,',
        ("tests/test_vllm_presets.py",),
        "the checked-in presets are what vLLM 0.33's config code computes (1024 on the Blackwell family)",
    ),
    Mutation(
        "replica_preset_window_not_vllms",
        "kit/replica/model.py",
        '        window=numbers["window"],',
        "        window=96,",
        ("tests/test_vllm_presets.py",),
        "the replica's default presets take vLLM's window, so its replay sizes are vLLM's",
    ),
    Mutation(
        "vllm_standin_dispatches_the_local_rows_under_pcp",
        "kit/experiments/vllm/standin.py",
        "        desc = cudagraphs.dispatch(count, count, None, 0)",
        "        desc = cudagraphs.dispatch(local, local, None, 0)",
        ("tests/test_vllm_safety.py",),
        "on vLLM's path a PCP step's replay graph is the one its global row count dispatches to",
    ),
    Mutation(
        "invariant_counts_bytes_outside_the_graph_pool",
        "kit/analysis/invariant.py",
        "        in_pool = Ranges([(piece.start, piece.end)]) & pool",
        "        in_pool = Ranges([(piece.start, piece.end)])",
        ("tests/test_invariant.py",),
        "the invariant is about graph-pool bytes: a carried read elsewhere (a weight, the row index) is not one",
    ),
    Mutation(
        "invariant_takes_early_aux_for_a_violation",
        "kit/analysis/invariant.py",
        "        for parts, is_aux in ((in_pool & early_aux, True), (in_pool - early_aux, False)):",
        "        for parts, is_aux in ((Ranges(), True), (in_pool, False)):",
        ("tests/test_invariant.py",),
        "early aux read after the break is the PR's exception, told apart from a violation",
    ),
    Mutation(
        "graph_pool_ranges_count_the_default_pool",
        "kit/analysis/invariant.py",
        '        if tuple(s.get("segment_pool_id", DEFAULT_POOL)) != DEFAULT_POOL',
        '        if s.get("segment_pool_id") is not None',
        ("tests/test_invariant.py",),
        "a segment of pool (0, 0) is not the graph pool: no replay capture can take its blocks",
    ),
    Mutation(
        "early_aux_taken_from_the_hidden_states",
        "kit/analysis/invariant.py",
        "    return Ranges(output_spans(recording, size)[1 : 1 + early_aux])",
        "    return Ranges(output_spans(recording, size)[:early_aux])",
        ("tests/test_invariant.py",),
        "the caller reads the hidden states first, then the aux states: the early ones follow the hidden states",
    ),
    Mutation(
        "invariant_holds_whatever_is_read",
        "kit/analysis/invariant.py",
        '                        "invariant_holds": not bad,',
        '                        "invariant_holds": True,',
        ("tests/test_invariant.py",),
        "a graph-pool value from before the break read after it violates the invariant",
    ),
    Mutation(
        "invariant_merged_into_the_wrong_pairings",
        "kit/experiments/readwrite_run/result.py",
        '    rows = {(r["model_size"], r["break"], r["replay_size"]): r for r in invariant["rows"]}',
        '    rows = {(r["replay_size"], r["break"], r["model_size"]): r for r in invariant["rows"]}',
        ("tests/test_invariant.py",),
        "each pairing carries the invariant of its own model graph and break",
    ),
    Mutation(
        "safety_json_without_the_invariant",
        "kit/experiments/safety_run/result.py",
        '        figures = {k: row.get(k) for k in (*INVARIANT_PAIR_KEYS, "readwrite_holds")}',
        "        figures = {}",
        ("tests/test_invariant.py",),
        "kit safety --json gives each pairing the invariant's graph-pool bytes and verdict (None: not recorded)",
    ),
    Mutation(
        "planted_block_never_read_after_the_break",
        "kit/replica/model.py",
        "        hidden_states = planted_read(hidden_states, kept)",
        "        hidden_states = hidden_states",
        ("tests/test_invariant.py",),
        "the planted variant reads its kept block after the break, so an overwrite changes the outputs",
    ),
    Mutation(
        "planted_stand_in_never_reads_its_block",
        "kit/experiments/vllm/standin.py",
        "            hidden_states = planted_read(hidden_states, kept)",
        "            hidden_states = hidden_states",
        ("tests/test_vllm_safety.py::test_the_planted_stand_in_carries_its_kept_block_across_the_break_on_vllms_path",),
        "on vLLM's path the planted stand-in reads its kept block after the replay break too",
    ),
    Mutation(
        "vllm_invariant_computed_without_early_aux",
        "kit/experiments/vllm/safety.py",
        '    early = early_aux_count(config["aux_hidden_state_layers"], config["decoder_replay_start"])',
        "    early = 0",
        (
            "tests/test_invariant.py::test_on_vllms_recordings_the_invariant_holds_and_only_early_aux_is_in_the_pool",
            "tests/test_invariant.py::test_the_invariant_recorded_on_the_gpu_is_what_the_recordings_accesses_give_again",
        ),
        "a vLLM recording's invariant computed from its accesses tells its early aux apart, from the recorded config",
    ),
    # --- power on every pairing (kit/experiments/power.py, safety_run, vllm_safety) ---
    Mutation(
        "power_is_the_control_staying_bit_exact",
        "kit/experiments/power.py",
        '    changed = not control["bit_exact"]',
        '    changed = control["bit_exact"]',
        ("tests/test_safety_run.py", "tests/test_vllm_safety.py"),
        "a pairing has power when the poisoned run's outputs change, not when they stay bit-exact",
    ),
    Mutation(
        "poison_spares_not_the_replay_graphs_outputs",
        "kit/experiments/power.py",
        "            for tensor, values in kept:\n                tensor.copy_(values)\n",
        "",
        ("tests/test_safety_run.py",),
        "R's outputs are the break's input from R, not a value carried across it: poisoning them gives any pairing "
        "power",
    ),
    Mutation(
        "poison_never_put_back",
        "kit/experiments/power.py",
        "                segment.copy_(saved)",
        "                pass",
        ("tests/test_safety_run.py", "tests/test_vllm_safety.py"),
        "the control's poison must not outlive its run: the pool is put back as it was",
    ),
    Mutation(
        "poison_before_the_replay",
        "kit/experiments/safety_run/run.py",
        "            outputs = real(rows, inputs)\n            self.replayed.append(size)\n"
        "            if self.poison is not None:\n                self.poison(outputs)",
        "            if self.poison is not None:\n                self.poison(None)\n"
        "            outputs = real(rows, inputs)\n            self.replayed.append(size)",
        ("tests/test_safety_run.py",),
        "the poison comes right after R replays, on R's outputs, or what R writes could overwrite it",
    ),
    Mutation(
        "stress_pairings_not_forced_into_r",
        "kit/experiments/safety_run/run.py",
        "            batch.forward_context = ForwardContext(self.replay_size, CUDAGraphMode.PIECEWISE)",
        "            pass",
        ("tests/test_safety_run.py",),
        "a stress pairing runs its rows in replay graph R, the one replay graph in N's break",
    ),
    Mutation(
        "pairing_without_power_counted_as_shown",
        "kit/experiments/power.py",
        '    shown = [r for r in rows if has_power(r)]\n    clause = f"{len(shown)} of',
        '    shown = [r for r in rows if has_power(r) or r.get("bit_exact")]\n    clause = f"{len(shown)} of',
        ("tests/test_safety_run.py", "tests/test_safety_recording.py"),
        "a pairing without power is never counted as shown, bit-exact or not",
    ),
    Mutation(
        "old_recording_power_counted_as_shown",
        "kit/experiments/power.py",
        "    return isinstance(value, bool | np.bool_) and bool(value)",
        "    return value is None or (isinstance(value, bool | np.bool_) and bool(value))",
        ("tests/test_safety_run.py", "tests/test_safety_recording.py", "tests/test_vllm_safety.py"),
        "a recording made before the positive control has no power: none of its pairings is shown",
    ),
    Mutation(
        "vllm_control_poisons_nothing",
        "kit/experiments/vllm/safety.py",
        "        poison(outputs)  # R's outputs keep their values",
        "        pass  # R's outputs keep their values",
        ("tests/test_vllm_safety.py",),
        "on vLLM's path the pool is poisoned right after each replay of R",
    ),
    Mutation(
        "a_failed_check_without_power",
        "kit/experiments/power.py",
        "    power = changed or failed",
        "    power = changed",
        ("tests/test_safety_run.py",),
        "a check that failed could fail: it has power even where the poison changed nothing",
    ),
    Mutation(
        "replica_weak_refs_recurse_into_nested_outputs",
        "kit/replica/breakable_cudagraph.py",
        "        return tuple(weak_ref_tensor(v) for v in x)",
        "        return tuple(weak_ref_tensors(v) for v in x)",
        ("tests/test_early_aux.py",),
        "vLLM 0.33's weak_ref_tensors weak-references top-level tensors only: V4.1's nested aux list stays owned",
    ),
    Mutation(
        "replica_returns_aux_flattened_by_default",
        "kit/replica/model.py",
        '    aux_return: str = "nested"',
        '    aux_return: str = "flat"',
        ("tests/test_early_aux.py",),
        "the replica's forward returns V4.1's (hidden_states, aux_list) unless a scenario asks for the flat one",
    ),
    Mutation(
        "vllm_stand_in_hands_out_nested_early_aux_weak",
        "kit/experiments/vllm/standin.py",
        '    if aux_return != "flat" or BreakableCUDAGraphCapture.current() is None:',
        "    if BreakableCUDAGraphCapture.current() is None:",
        ("tests/test_vllm_safety.py::test_the_early_aux_leaves_a_captured_forward_weak_only_when_returned_flat",),
        "on vLLM's path the early aux leaves a capture weak only in the hypothetical flat scenarios",
    ),
    Mutation(
        "old_vllm_recordings_read_by_their_file_name",
        "kit/experiments/vllm/recordings.py",
        '    return base + FLAT_SUFFIX if aux_return_of({"vllm_scenario": about}) == "flat" else base',
        "    return name",
        ("tests/test_early_aux.py", "tests/test_vllm_recording.py"),
        "a vLLM recording made before the return shapes were named is read as the scenario it ran, not its file name",
    ),
    Mutation(
        "old_replica_recordings_read_as_nested",
        "kit/experiments/summary.py",
        '    return "flat" if scenario else None',
        '    return "nested" if scenario else None',
        ("tests/test_early_aux.py",),
        "a replica recording without aux_return was made when its weak references recursed: its aux left flat",
    ),
    Mutation(
        "early_aux_verdict_ignores_the_obligation",
        "kit/experiments/early_aux.py",
        '        passed.append(found["obligation_holds_on"] == found["obligation_pairings"])',
        "        passed.append(True)",
        ("tests/test_early_aux.py",),
        "forced sharing is shown safe only if the read/write obligation holds on every dispatchable pairing too",
    ),
    Mutation(
        "early_aux_verdict_swaps_needed_and_defensive",
        "kit/experiments/early_aux.py",
        '        "on_vllm_0_33": None if safe_nested is None else (DEFENSIVE if safe_nested else NEEDED),',
        '        "on_vllm_0_33": None if safe_nested is None else (NEEDED if safe_nested else DEFENSIVE),',
        ("tests/test_early_aux.py", "tests/test_vllm_recording.py"),
        "the exception is defensive on vLLM 0.33 when V4.1's shape forced to share was shown safe, else needed",
    ),
    Mutation(
        "early_aux_cost_taken_from_the_flat_shape",
        "kit/experiments/early_aux.py",
        '        "exception_costs": nested.get("exception_costs"),',
        '        "exception_costs": flat.get("exception_costs"),',
        ("tests/test_early_aux.py",),
        "the exception's cost on vLLM 0.33 is the PR's graph pool against forced sharing with V4.1's return shape",
    ),
    Mutation(
        "early_aux_never_necessary",
        "kit/experiments/early_aux.py",
        '        "necessary_under": None if safe_flat is None else ([] if safe_flat else list(CHANGES)),',
        '        "necessary_under": None if safe_flat is None else [],',
        ("tests/test_early_aux.py", "tests/test_vllm_recording.py"),
        "the changes to vLLM that would need the exception are named when the flat shape was shown unsafe",
    ),
    Mutation(
        "shipped_gz_bound_off_by_the_whole_bound",
        "kit/recordings/__init__.py",
        "    if len(data) > MAX_SHIPPED_BYTES:",
        "    if len(data) > 2 * MAX_SHIPPED_BYTES:",
        ("tests/test_shipped_recordings.py",),
        "a compressed recording that expands past the bound is refused, not read",
    ),
    Mutation(
        "shipped_gz_zlib_error_escapes",
        "kit/recordings/__init__.py",
        "    except (OSError, EOFError, zlib.error) as e:",
        "    except (OSError, EOFError) as e:",
        ("tests/test_shipped_recordings.py",),
        "a corrupt compressed recording is a one-line KitError, not a zlib traceback",
    ),
    Mutation(
        "vllm_preset_keeps_the_stand_ins_window",
        "kit/experiments/vllm/standin.py",
        '        window=numbers["window"],',
        "        window=96,",
        ("tests/test_vllm_presets.py",),
        "vLLM's path at a default preset takes the preset's window, which sets vLLM's replay sizes",
    ),
    Mutation(
        "vllm_preset_ignores_max_num_seqs",
        "kit/experiments/vllm/standin.py",
        "    if cfg.max_num_seqs is not None:\n        config.scheduler_config.max_num_seqs = cfg.max_num_seqs",
        "    pass",
        ("tests/test_vllm_presets.py",),
        "vLLM's path at a default preset runs with the preset's max_num_seqs",
    ),
    Mutation(
        "pairless_readwrite_claims_the_stress_rows",
        "kit/experiments/readwrite_run/result.py",
        '    if not data["pairs"] or not any(p["dispatchable"] for p in data["pairs"]):',
        '    if not data["pairs"]:',
        ("tests/test_readwrite_recording.py",),
        "a preset where vLLM dispatches no pairing claims nothing of the obligation from its stress rows",
    ),
    # --- expandable segments (kit/allocator/simulator.py, rules.py) ---
    Mutation(
        "expandable_large_pages_of_2_MiB",
        "kit/allocator/rules.py",
        "    return K_SMALL_BUFFER if small else K_LARGE_BUFFER\n",
        "    return K_SMALL_BUFFER\n",
        ("tests/test_expandable.py",),
        "the large pool maps 20 MiB pages",
    ),
    Mutation(
        "expandable_no_growth_ranking",
        "kit/allocator/simulator.py",
        "            if self._expandable_size(lst[i + 1][1]) >= self._expandable_size(lst[i][1]):",
        "            if True:",
        ("tests/test_expandable.py",),
        "a block before unmapped pages is ranked by the size it could grow to",
    ),
    Mutation(
        "expandable_merge_across_mapped_state",
        "kit/allocator/simulator.py",
        "not neighbour.allocated and neighbour.mapped == block.mapped:",
        "not neighbour.allocated:",
        ("tests/test_expandable.py",),
        "free blocks merge only with neighbours in the same mapped state",
    ),
    # --- labels: dense pool numbers, natural order (kit/analysis/names.py) ---
    Mutation(
        "graph_pool_numbers_count_named_pools",
        "kit/analysis/names.py",
        "    for pool in pool_order(snapshot):\n        if pool in given:",
        "    for pool in pool_order(snapshot):\n        n += pool in given\n        if pool in given:",
        ("tests/test_tables.py::test_unnamed_graph_pools_are_numbered_without_gaps_and_listed_in_natural_order",),
        "graph pools the snapshot names take no number: the others are numbered without gaps",
    ),
    Mutation(
        "labels_sorted_as_text",
        "kit/analysis/tables.py",
        "if x in made_up}, key=natural_order",
        "if x in made_up}",
        ("tests/test_tables.py::test_unnamed_graph_pools_are_numbered_without_gaps_and_listed_in_natural_order",),
        "made-up labels are listed in natural order (graph pool 2 before 10)",
    ),
    Mutation(
        "expandable_verdict_says_cudamalloc",
        "kit/analysis/trace/reports.py",
        "        if expandable\n        else",
        "        if False\n        else",
        ("tests/test_expandable.py::test_table_and_reuse_say_when_segments_are_expandable_and_verdicts_say_mapped",),
        "a verdict on an expandable recording says pages were mapped, not segments cudaMalloc'ed",
    ),
    # --- what-if --rank (kit/analysis/ranking.py) ---
    Mutation(
        "rank_worst_first",
        "kit/analysis/ranking.py",
        "ascending=[False, True, False, False, True]",
        "ascending=[True, True, False, False, True]",
        ("tests/test_ranking.py",),
        "the ranking puts the biggest graph-pool saving first",
    ),
    Mutation(
        "rank_counts_the_default_pool",
        "kit/analysis/ranking.py",
        '"graph_pool_saved": sum(b for p, b in saved.items() if p != DEFAULT_POOL),',
        '"graph_pool_saved": sum(b for p, b in saved.items()),',
        ("tests/test_ranking.py",),
        "a map's graph-pool saving leaves the default pool out (reported beside it)",
    ),
    Mutation(
        "rank_without_the_all_in_one_maps",
        "kit/analysis/ranking.py",
        "            if len(streams) > 2:",
        "            if False:",
        ("tests/test_ranking.py::test_candidates_are_each_single_move_and_each_all_in_one_map_once",),
        "every capture stream of a pool onto one of them is a candidate too",
    ),
    # --- --own-stream by what the kit prints (kit/analysis/check.py) ---
    Mutation(
        "own_stream_ignores_stream_ids",
        "kit/analysis/check.py",
        "    ids = {str(stream), hex(stream)}",
        "    ids = set()",
        ("tests/test_check.py::test_own_stream_takes_the_label_the_kit_prints_the_stream_id_and_a_glob",),
        "a stream id names its stream",
    ),
    Mutation(
        "own_stream_matches_part_of_a_made_up_label",
        "kit/analysis/check.py",
        "_matches(p, printed, whole=True)",
        "_matches(p, printed, whole=False)",
        ("tests/test_check.py::test_own_stream_takes_the_label_the_kit_prints_the_stream_id_and_a_glob",),
        'a part of a made-up label ("stream") names no stream',
    ),
    Mutation(
        "own_stream_pattern_naming_nothing_passes_silently",
        "kit/analysis/check.py",
        "    if unmatched:\n        raise KitError(_no_such_stream(snap, unmatched))",
        "    if False:\n        raise KitError(_no_such_stream(snap, unmatched))",
        ("tests/test_check.py::test_own_stream_takes_the_label_the_kit_prints_the_stream_id_and_a_glob",),
        "a pattern that names no stream is an error naming the streams",
    ),
    # -- labels and colours (issue 36, item 6)
    Mutation(
        "stream_colours_cycle_a_short_palette",
        "kit/show/pictures.py",
        "        out[key] = next(palette, None) or _spare_colour(n, set(out.values()))\n",
        "        out[key] = OTHER_STREAM_COLOURS[n % 6]\n",
        ("tests/test_colours.py::test_every_stream_of_a_segment_map_has_its_own_colour_and_the_first_ones_look_apart",),
        "past a few streams two streams of one figure shared a colour",
    ),
    Mutation(
        "default_stream_coloured_by_its_label_only",
        "kit/show/pictures.py",
        "        if (key == 0 and not isinstance(key, bool)) or label == DEFAULT_STREAM_LABEL:\n",
        "        if label == DEFAULT_STREAM_LABEL:\n",
        ("tests/test_colours.py::test_the_recorded_default_stream_is_not_drawn_like_s1",),
        "a default stream a recorder named 'default' was drawn in a palette colour, next to s1's",
    ),
    Mutation(
        "no_hint_for_lettered_streams",
        "kit/analysis/names.py",
        "    if not lettered:\n        return None\n",
        "    return None\n",
        ("tests/test_tables.py::test_streams_with_no_frame_to_name_them_come_with_a_hint_to_record_frames",),
        "streams named 'stream A' come with the hint that recording frames would name them",
    ),
    Mutation(
        "attribution_takes_other_streams_eager_allocations",
        "kit/analysis/attribution.py",
        "    return pool == own[0] or stream == own[1]",
        "    return True",
        ("tests/test_attribution.py::test_an_inferred_window_never_takes_another_streams_eager_allocations",),
        "a capture window takes what its capture made, not the default stream's eager segments made meanwhile",
    ),
    Mutation(
        "attribution_drops_captures_that_added_nothing",
        "kit/analysis/attribution.py",
        '        if not groups and "pool" in w and "stream" in w:',
        "        if False:",
        ("tests/test_attribution.py::test_every_capture_is_listed_so_their_numbers_have_no_gaps",),
        "a capture that added no segment is listed with 0, so the numbers shown have no gaps",
    ),
    # -- the trace walk on expandable segments (issue 36, item 8)
    Mutation(
        "walk_splits_expandable_blocks_as_large_ones",
        "kit/analysis/trace/rows.py",
        "    split = should_split(gap - rounded, seg.small, expandable)",
        "    split = should_split(gap - rounded, seg.small)",
        ("tests/test_expandable.py::test_the_walk_ends_at_every_expandable_recording",),
        "under expandable_segments:True every pool splits as the small pool does: the walk must too",
    ),
    Mutation(
        "unmap_shrinks_only_the_first_range",
        "kit/analysis/trace/state.py",
        "        for seg in covered:\n",
        "        for seg in covered[:1]:\n",
        ("tests/test_expandable.py::test_the_walk_ends_at_every_expandable_recording",),
        "one unmap can cover two ranges the walk holds apart: both lose their pages",
    ),
    # -- the walk kept beside the cache (issue 36, item 10)
    Mutation(
        "kept_walk_never_read",
        "kit/analysis/trace/walk.py",
        "    if snap.cache_source is None or device not in snap.trace_columns:\n        return None",
        "    if True:\n        return None",
        ("tests/test_cache.py::test_the_walk_is_kept_once_and_equals_a_fresh_walk",),
        "a large file's walk is kept beside its cache and read back, not walked by every command",
    ),
    Mutation(
        "kept_walk_trusted_unchecked",
        "kit/analysis/trace/walk.py",
        '            raise ValueError("its arrays do not fit the trace")',
        "            pass",
        ("tests/test_cache.py::test_a_damaged_kept_walk_is_named_and_walked_again",),
        "a kept walk whose rows do not fit the trace is named and walked again, never trusted",
    ),
    Mutation(
        "report_lost_to_a_what_if_it_cannot_make",
        "kit/show/report.py",
        "        except KitError as e:  # a map the what-if cannot model here",
        "        except ZeroDivisionError as e:  # a map the what-if cannot model here",
        ("tests/test_report.py::test_a_what_if_refused_for_a_valid_map_leaves_the_rest_of_the_report",),
        "a valid map the what-if refuses is one line in its section; the rest of the page is written",
    ),
    # -- issue 37: the vLLM plugin and kit ranks
    Mutation(
        "plugin_hooks_with_no_variable_set",
        "kit/vllm_plugin.py",
        '    if not folder and not policy:\n        return\n    _state["registered"] = True',
        '    _state["registered"] = True',
        ("tests/test_vllm_plugin.py::test_register_imports_nothing_heavy_and_without_the_variables_does_nothing",),
        "without KIT_CAPTURE_DIR or KIT_VLLM_PATCH the plugin must do nothing at all",
    ),
    Mutation(
        "plugin_applies_the_pr_to_any_vllm_release",
        "kit/vllm_plugin.py",
        "    if vllm.__version__ != vllm_patch.SUPPORTED_VERSION:",
        "    if False:",
        ("tests/test_vllm_plugin.py::test_vllm_untouched_when_not_asked_and_an_unknown_vllm_refused_with_one_line",),
        "a vLLM release the kit does not know is refused in one log line and runs unpatched",
    ),
    Mutation(
        "plugin_ends_the_recording_at_the_estimates_capture",
        "kit/vllm_plugin.py",
        '        if recording.profiling or kwargs.get("profile_only"):',
        "        if False:",
        ("tests/test_vllm_plugin.py::test_two_worker_processes_record_their_rank_through_the_plugin_alone",),
        "the recording runs to the end of the real capture_model(), past the estimate's capture",
    ),
    Mutation(
        "ranks_read_the_plugin_manifest_as_a_snapshot",
        "kit/analysis/ranks.py",
        '    return path.suffix == ".json" and any(',
        "    return False and any(",
        ("tests/test_ranks.py",),
        "rank{R}.json beside rank{R}.pickle is the plugin's manifest, not a rank's snapshot",
    ),
    Mutation(
        "ranks_estimate_difference_the_wrong_way_round",
        "kit/analysis/ranks.py",
        "        short = reserved - estimate if isinstance(estimate, int) else None",
        "        short = estimate - reserved if isinstance(estimate, int) else None",
        ("tests/test_ranks.py",),
        "beyond_estimate is the graph pool reserved minus vLLM's estimate",
    ),
    Mutation(
        "ranks_replay_stream_read_off_another_stream",
        "kit/analysis/ranks.py",
        '"replay_stream": by_stream.get(REPLAY_STREAM_LABEL, 0),',
        '"replay_stream": by_stream.get("model graphs stream", 0),',
        ("tests/test_vllm_plugin_recording.py", "tests/test_ranks.py"),
        "the replay graphs' own stream is the one the plugin names after the real capture's replay graphs",
    ),
    Mutation(
        "ranks_name_one_of_two_disagreeing_ranks_as_the_odd_one",
        "kit/analysis/ranks.py",
        "        if 2 * len(peers[largest]) > len(known):",
        "        if 2 * len(peers[largest]) >= len(known):",
        ("tests/test_ranks.py",),
        "a rank is named as the one that differs only against a majority that agrees",
    ),
    # --- issue 38: one word in the data, the registries generated ---
    Mutation(
        "old_recordings_lose_their_replica_scenario",
        "kit/experiments/recorded.py",
        '            if "scenario" in item:\n                item["replica_scenario"] = item.pop("scenario")\n',
        "",
        ("tests/test_safety_run.py::test_a_recording_in_the_words_of_before_reads_as_one_in_todays",),
        "a run recorded as policy=<scenario>, scenario=<replica scenario> reads as today's scenario, replica_scenario",
    ),
    Mutation(
        "safety_json_drops_the_contracts_policy_key",
        "kit/experiments/safety_run/result.py",
        '        pairs.append({**pair, **figures, "policy": pair["scenario"]})',
        "        pairs.append({**pair, **figures})",
        ("tests/test_safety_run.py::test_safety_json_is_the_contract",),
        "kit safety --json keeps the key its contract names, `policy`, beside `scenario`",
    ),
    Mutation(
        "registries_ignore_what_a_test_docstring_names",
        "scripts/registries.py",
        '    found = set(re.findall(r"`(kit[\\w.]*)`", ast.get_docstring(tree) or ""))',
        "    found = set()",
        ("tests/test_layout.py::test_the_registries_see_a_stale_page_a_package_with_no_layer_and_an_untested_module",),
        "a module tested through another is named in the test's docstring, and the table counts it",
    ),
)


def repository_files() -> list[Path]:
    """The repository's files as git sees them: tracked and untracked, less the ignored ones."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [Path(p) for p in listed.decode().split("\0") if p and (ROOT / p).is_file()]


def make_copy(into: Path) -> None:
    for rel in repository_files():
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, into / rel)
    if (ROOT / NODE_MODULES).is_dir():
        (into / NODE_MODULES).symlink_to(ROOT / NODE_MODULES, target_is_directory=True)


def check_sources(mutations: list[Mutation], copy: Path) -> list[str]:
    """Why any mutation cannot be planted: its text is not in its file exactly once (the source moved)."""
    problems = []
    for m in mutations:
        count = (copy / m.file).read_text().count(m.old)
        if count != 1:
            problems.append(
                f"{m.name}: {m.file}: the text to replace occurs {count} times, not once: {m.old.strip()!r}"
            )
    return problems


def run_tests(tests: tuple[str, ...], copy: Path) -> tuple[int, float, str]:
    """pytest on `tests` in the copy, with the copy first on the path: exit status, seconds, the output's tail."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    env |= {"PYTHONDONTWRITEBYTECODE": "1", "CUDA_VISIBLE_DEVICES": ""}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
    )
    return done.returncode, time.perf_counter() - started, (done.stdout + done.stderr)[-3000:]


def first_failure(output: str) -> str:
    """The first test pytest's summary names as failed (or erroring), else its exit line."""
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0].split(" ", 1)[1]
    return output.strip().splitlines()[-1] if output.strip() else "?"


def plant(m: Mutation, copy: Path) -> str:
    """Plant `m` in the copy; returns the file's original text."""
    path = copy / m.file
    original = path.read_text()
    write(path, original.replace(m.old, m.new, 1))
    return original


def write(path: Path, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help='end with {"mutations": [{"name", "caught"}, ...]}')
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="this mutation only (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = parser.parse_args()
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}: {m.file}: {m.what}")
        return 0
    unknown = set(args.only) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"mutations.py: no mutation {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
        return 2
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    copy = Path(tempfile.mkdtemp(prefix="kit-mutations-"))
    try:
        make_copy(copy)
        problems = check_sources(chosen, copy)
        if problems:
            print("mutations.py: cannot plant:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 2
        for tests in dict.fromkeys(m.tests for m in chosen):  # each set of tests once, before any bug is planted
            status, seconds, tail = run_tests(tests, copy)
            print(f"unmutated: {' '.join(tests)}: exit {status} ({seconds:.0f} s)", flush=True)
            if status != 0:
                print(
                    f"mutations.py: the tests fail without any mutation; nothing would be proven:\n{tail}",
                    file=sys.stderr,
                )
                return 2
        results = []
        for m in chosen:
            original = plant(m, copy)
            try:
                status, seconds, tail = run_tests(m.tests, copy)
            finally:
                write(copy / m.file, original)
            caught = status in (1, 2)  # tests failed, or the mutated kit failed to be collected
            results.append({"name": m.name, "caught": caught, "exit": status, "seconds": round(seconds, 1)})
            by = f", by {first_failure(tail)}" if caught else ""
            print(f"{'caught  ' if caught else 'SURVIVED'}  {m.name}  ({m.file}; {seconds:.0f} s{by})", flush=True)
            if not caught:
                print(tail, file=sys.stderr)
        print(f"{sum(r['caught'] for r in results)} of {len(results)} mutations caught")
        if args.json:
            print(json.dumps({"mutations": [{"name": r["name"], "caught": r["caught"]} for r in results]}))
        return 0 if all(r["caught"] for r in results) else 1
    finally:
        if args.keep:
            print(f"the copy: {copy}", file=sys.stderr)
        else:
            shutil.rmtree(copy, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
