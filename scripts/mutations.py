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
        "        split = should_split(remaining, small)",
        "        split = should_split(remaining, small) or (not small and remaining == 1 << 20)",
        (BOUNDARIES, SIM_FIDELITY),
        "PyTorch splits a large-pool block only when more than 1 MiB is left",
    ),
    Mutation(
        "simulator_splits_a_small_block_only_above_512_B",
        "kit/allocator/simulator.py",
        "        split = should_split(remaining, small)",
        "        split = should_split(remaining, small) and not (small and remaining == 512)",
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
        'return ("early_aux_shared" if shares else "early_aux_pr"), shares',
        'return ("early_aux_pr" if shares else "early_aux_shared"), shares',
        (
            "tests/test_notebooks.py::test_notebook_runs_headless_and_shows_its_figures[04_safety]",
            "tests/test_browser.py::test_notebook_renders_and_reacts_in_jupyterlab[04_safety]",
        ),
        "the policy explorer's branches swapped: forced sharing shows the PR's safe capture",
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
        "rounded if should_split(gap - rounded, seg.small) else max(gap, rounded)",
        "rounded if should_split(gap - rounded, seg.small) or gap - rounded == 1 << 20 else max(gap, rounded)",
        (BOUNDARIES,),
        "the row walk must place blocks as the allocator split them, or it ends elsewhere than the snapshot",
    ),
    Mutation(
        "columnar_walk_splits_a_small_block_only_above_512_B",
        "kit/analysis/trace/columnar.py",
        "sizes_of[addr] = need if gap - need > seg.limit else max(gap, need)",
        "sizes_of[addr] = need if gap - need > max(seg.limit, 512) else max(gap, need)",
        (BOUNDARIES,),
        "the columnar walk must place blocks as the allocator split them",
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
        "kit/analysis/trace/columnar.py",
        "if found and found[0] >= rounded and",
        "if found and found[0] > rounded and",
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
        "                freed_pools |= _graph_pools_freed(entries, i, recorded_pool)",
        "                freed_pools |= _graph_pools_freed(entries, i, {a: b.pool for a, b in sim.segments.items()})",
        (WHATIF_MERGED + "test_what_if_predicts_every_pool_the_merged_run_reserved_on_the_gpu",),
        "which graph pools a segment-free run releases is read off the recording, not the mapped simulation",
    ),
    Mutation(
        "whatif_keeps_a_moved_streams_workspace",
        "kit/analysis/whatif.py",
        "                key = (kind, moves.get(e.stream, e.stream))",
        "                key = (kind, e.stream)",
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
        "readwrite_summary_counts_holding_pairings_as_violated",
        "kit/experiments/readwrite_run.py",
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
        "low <= i < high",
        "low < i < high",
        (
            "tests/test_attribution.py::test_another_streams_graph_pool_allocation_right_after_a_window_starts_another_capture",
        ),
        "another stream's graph-pool allocation right after a window parts it from the next: two captures",
    ),
    Mutation(
        "inferred_capture_window_ends_one_entry_early",
        "kit/analysis/attribution.py",
        "windows.append((first, last + 1, stream, pool))",
        "windows.append((first, last, stream, pool))",
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
        "kit/experiments/readwrite_run.py",
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
        "check_ignores_a_trace_that_does_not_replay",
        "kit/analysis/check.py",
        "        if replay.mismatches:\n",
        "        if replay.mismatches and False:\n",
        (
            "tests/test_check.py::test_a_trace_that_does_not_replay_exits_2_in_one_line",
            "tests/test_check.py::test_check_snapshot_and_assert_no_stranding_raise_kit_error_for_a_trace_that_does_not_replay",
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
    # -- diff --by-label pairs graph pools by role and content (the leftover-pool issue)
    Mutation(
        "diff_pairs_graph_pools_by_their_number",
        "kit/analysis/tables.py",
        "            score = _likeness(b, a)\n",
        "            score = (3, True) if b.label == a.label else _likeness(b, a)\n",
        ("tests/test_diff_pairing.py::test_a_leftover_pool_numbered_first_is_not_paired_with_the_real_one",),
        "a leftover pool made first takes number 1: pairing by the number pairs it with the real pool",
    ),
    Mutation(
        "diff_guesses_among_equally_matching_pools",
        "kit/analysis/tables.py",
        "if tops_b[kb] == [ka] and tops_a[ka] == [kb]]",
        "if tops_b[kb][0] == ka and tops_a[ka][0] == kb]",
        (
            "tests/test_diff_pairing.py::test_a_leftover_holding_the_same_captures_is_refused_not_guessed",
            "tests/test_diff_pairing.py::test_two_indistinguishable_leftovers_for_one_are_refused",
        ),
        "two pools that match one equally cannot be told apart: diff refuses rather than take the first",
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
        "        elif order > boundary:",
        "        elif order > boundary and access.phase.part != AFTER_REPLAY:",
        ("tests/test_readwrite.py",),
        "a read of a break input after R starts, in the rest of the break, is carried across R",
    ),
    Mutation(
        "dispatch_allows_only_replay_graphs_smaller_than_the_model_graph",
        "kit/experiments/dispatch.py",
        "    return {s for s in replay_sizes if largest is None or s <= largest}",
        "    return {s for s in replay_sizes if s < model_size}",
        ("tests/test_dispatch.py", "tests/test_safety_recording.py"),
        "vLLM's dispatch pads N rows to the smallest replay size that fits: R = N and R > N can run",
    ),
    Mutation(
        "eager_replay_rows_not_padded_to_the_graphs_size",
        "kit/replica/model_state.py",
        "ForwardContext(num_rows, CUDAGraphMode.NONE), num_padded=size)",
        "ForwardContext(num_rows, CUDAGraphMode.NONE), num_padded=None)",
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
        "kit/experiments/vllm_standin.py",
        '    if aux_return != "flat" or BreakableCUDAGraphCapture.current() is None:',
        '    if BreakableCUDAGraphCapture.current() is None:',
        ("tests/test_vllm_safety.py::test_the_early_aux_leaves_a_captured_forward_weak_only_when_returned_flat",),
        "on vLLM's path the early aux leaves a capture weak only in the hypothetical flat scenarios",
    ),
    Mutation(
        "old_vllm_recordings_read_by_their_file_name",
        "kit/experiments/vllm_capture.py",
        '    return base + FLAT_SUFFIX if aux_return_of({"variant": variant}) == "flat" else base',
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
