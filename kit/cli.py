"""The `python -m kit` command line.

Commands (their output is a contract, `docs/commands.md`): `explain`, `table`, `diff`, `reuse`, `report`, `sim`
and `run-workload`; `what-if`, `demo` (the replica's experiments) and
`vllm-diff` (what PR 63155 changes in the installed vLLM; `vllm-patch` is its old name) and `ranks` (a
multi-GPU run's ranks side by side), `check` (a CI guard: exit 1 when a
graph pool stranded memory), `safety` (every replay graph inside every model
graph's break, against eager) and `alternatives` (the PR's alternatives and
what the saving buys) besides. Every command
exits 0 on success and 2 with one line on stderr for a user's mistake
(a missing, corrupt or hostile file), never with a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator

from kit.errors import KitError
from kit.units import GIB


def _print_table(table, as_json: bool, empty: str = "no rows: the table is empty") -> None:
    """The source line, then the table (bytes in binary units); `--json`: its rows. No rows: the `empty` line."""
    from kit.analysis.names import naming_hint
    from kit.analysis.tables import byte_columns, table_records
    from kit.units import format_bytes

    if as_json:
        json.dump(table_records(table), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    print(f"source: {table.attrs.get('source', '?')}")
    if table.empty:  # pandas would print "Empty DataFrame" and the column names
        print(empty)
        return
    shown = table.copy()
    for col in byte_columns(shown):
        shown[col] = shown[col].map(lambda n: "-" if n is None else format_bytes(n))
    made_up = table.attrs.get("generated_labels")
    if made_up:
        print(
            "labels made by the kit (streams from their first allocation's frame, graph pools in the order "
            f"they were made): {'; '.join(made_up)}"
        )
        hint = naming_hint(made_up)
        if hint:
            print(f"hint: {hint}")
    print(shown.to_string(index=False))


NO_SEGMENTS = "no segments: the allocator held no memory when this snapshot was taken"


def cmd_table(args: argparse.Namespace) -> None:
    from kit.analysis.attribution import checked_capture_windows
    from kit.analysis.tables import segment_table
    from kit.load.snapshot import load_snapshot

    snap = load_snapshot(args.snapshot)
    checked_capture_windows(snap)  # a malformed window in the kit key: exit 2, as every command that reads them
    _print_table(segment_table(snap), args.json, NO_SEGMENTS)
    _expandable_note(snap, args.json)


def _expandable_note(snap, as_json: bool) -> None:
    """Text output: a note under the table when the snapshot's segments are expandable (JSON keeps its rows)."""
    from kit.analysis.trace.reports import EXPANDABLE_NOTE

    if snap.expandable and not as_json:
        print(f"note: {EXPANDABLE_NOTE}")


def cmd_diff(args: argparse.Namespace) -> None:
    from kit.analysis.tables import diff_summary, diff_tables, pool_summary, segment_table

    by = "label" if args.by_label else "stream"
    diff = diff_tables(segment_table(args.before), segment_table(args.after), by=by)
    if diff.attrs["paired_generated"]:
        print(
            "kit: warning: --by-label paired groups by labels the kit generated (from first-allocation frames "
            f"and pool order), not names the programs gave: {'; '.join(diff.attrs['paired_generated'])}",
            file=sys.stderr,
        )
    notes = diff.attrs["pairing_notes"]  # pools paired by content or under another label, and pools paired with none
    shown = 20  # a process with hundreds of graph pools would bury the rest
    for note in notes[:shown]:
        print(f"kit: warning: {note}", file=sys.stderr)
    if len(notes) > shown:
        print(
            f"kit: warning: {len(notes) - shown} more pool pairings or non-pairings like these "
            "(all in kit.diff_tables(...).attrs['pairing_notes'])",
            file=sys.stderr,
        )
    if args.pools:
        _print_table(pool_summary(diff), args.json)
        return
    _print_table(diff, args.json)
    if not args.json:
        for line in diff_summary(diff):
            print(line)


def cmd_reuse(args: argparse.Namespace) -> None:
    from kit.analysis.attribution import checked_capture_windows
    from kit.analysis.tables import table_records
    from kit.analysis.trace.reports import reuse_table, stranding_report
    from kit.analysis.trace.walk import walk_trace
    from kit.load.snapshot import load_snapshot
    from kit.units import format_bytes

    snap = load_snapshot(args.snapshot)
    checked_capture_windows(snap)
    walk = walk_trace(snap)
    table = reuse_table(snap, walk)
    report = stranding_report(snap, walk, min_bytes=args.min_bytes)
    if args.json:
        verdicts: dict[tuple, list[str]] = {}
        for pool, stream, verdict in zip(report["pool"], report["stream"], report["verdict"], strict=True):
            verdicts.setdefault((tuple(pool), int(stream)), []).append(verdict)
        rows = table_records(table)
        for row in rows:
            row["verdicts"] = verdicts.get((tuple(row["pool"]), row["stream"]), [])
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    _print_table(table, False, "no allocations in the trace: nothing was reused or needed a new segment")
    _expandable_note(snap, False)
    if report.empty:
        print(f"no stranded segments (no group with {format_bytes(args.min_bytes)} or more)")
    for verdict, frames in zip(report["verdict"], report["frames"], strict=True):
        print(verdict + (f"\n    first such allocation: {frames}" if frames else ""))
    for line in table.attrs["mismatches"]:
        print(f"warning: {line}", file=sys.stderr)


def _byte_count(text: str) -> int:
    """A flag's byte count: a whole number, 0 or more (argparse exits 2 with its usage line otherwise)."""
    try:
        n = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: bytes cannot be negative")
    return n


def cmd_check(args: argparse.Namespace) -> int:
    from kit.analysis.check import DEFAULT_OWN_STREAM, check_snapshot

    own_stream = tuple(args.own_stream) if args.own_stream is not None else DEFAULT_OWN_STREAM
    if any(p.strip().casefold() == "none" for p in own_stream):
        if len(own_stream) > 1:
            others = ", ".join(repr(p) for p in own_stream)
            raise KitError(f"--own-stream none allows nothing: it cannot be given with other patterns ({others})")
        own_stream = ()
    result = check_snapshot(args.snapshot, pools=args.pools, max_stranded=args.max_stranded, own_stream=own_stream)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for line in result.lines() + result.allowed_lines():  # offending groups first, then the allowed ones
            print(line)
        if result.expandable:
            from kit.analysis.trace.reports import EXPANDABLE_NOTE

            print(f"note: {EXPANDABLE_NOTE}")
        print(result.summary(), file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1  # a snapshot it cannot judge (a trace whose walk misses it) raised: exit 2


def parse_stream_map(items: list[str]) -> dict[str, str]:
    """`--map FROM=TO` options as a dict; each side a stream id (decimal or hex) or label as `table` prints it."""
    mapping = {}
    for item in items:
        source, sep, target = item.partition("=")
        if not sep or not source.strip() or not target.strip():
            raise KitError(f"--map {item!r}: expected FROM=TO, two streams (ids or labels as `table` prints them)")
        mapping[source.strip()] = target.strip()
    return mapping


def cmd_what_if(args: argparse.Namespace) -> None:
    from kit.analysis.whatif import what_if

    if args.rank:
        if args.map:
            raise KitError("--rank tries every map of the snapshot's graph pools; give it without --map")
        return _rank(args)
    if not args.map:
        raise KitError("what-if: give --map FROM=TO (repeatable), or --rank to simulate and rank every map")
    result = what_if(args.snapshot, parse_stream_map(args.map))
    if args.json:
        json.dump(_what_if_json(result), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    _print_what_if(result)


def _rank(args: argparse.Namespace) -> None:
    from kit.analysis.ranking import SHARING_CAVEAT, rank_maps

    ranked = rank_maps(args.snapshot)
    if args.json:
        rows = ranked.rows.drop(columns="moves")
        out = {
            "ranked": [
                {**r, "saved": [{"pool": pool, "bytes": b} for pool, b in r["saved"].items()]}
                for r in rows.to_dict(orient="records")
            ],
            "refused": ranked.refused,
            "best": None if ranked.best is None else _what_if_json(ranked.best),
            "caveat": SHARING_CAVEAT if ranked.saves else None,
            "source": ranked.source,
        }
        json.dump(out, sys.stdout, indent=1, default=int)
        sys.stdout.write("\n")
        return
    print(f"source: {ranked.source}")
    for line in ranked.lines():
        print(line)
    if ranked.best is not None:
        _print_what_if(ranked.best)


def _what_if_json(result) -> dict:
    from kit.analysis.ranking import SHARING_CAVEAT
    from kit.analysis.tables import table_records

    return {
        "predicted": table_records(result.predicted),
        "baseline": table_records(result.baseline),
        "saved": [
            {"pool": list(p), "pool_label": result.pools.get(p, str(p)), "bytes": b} for p, b in result.saved.items()
        ],
        "map": [
            {"from": a, "from_label": result.labels[a], "to": b, "to_label": result.labels[b]}
            for a, b in result.stream_map.items()
        ],
        "corrections": result.corrections,
        "modelled": result.modelled,
        "spread": None
        if result.spread is None
        else [{"pool": list(p), "low": lo, "high": hi} for p, (lo, hi) in result.spread.items()],
        "caveat": SHARING_CAVEAT if result.stream_map else None,
        "source": result.predicted.attrs["source"],
    }


def _print_what_if(result) -> None:
    for a, b in result.stream_map.items():
        print(f"map: {result.labels[a]} ({a:#x}) onto {result.labels[b]} ({b:#x})")
    if not result.stream_map:
        print("map: every stream onto itself (the trace as recorded)")
    _print_table(result.predicted, False)
    for line in result.summary():
        print(line)
    for line in result.modelled:
        print(f"modelled: {line}")
    for line in result.corrections:
        print(f"correction: {line}")
    if result.stream_map:
        from kit.analysis.ranking import SHARING_CAVEAT

        print(f"caveat: {SHARING_CAVEAT}")


def cmd_ranks(args: argparse.Namespace) -> None:
    from kit.analysis.ranks import compare_ranks
    from kit.analysis.tables import table_records

    ranks = compare_ranks(args.folder, args.figure)
    if args.json:
        answer = {
            "source": ranks.groups.attrs.get("source"),
            "ranks": table_records(ranks.summary),
            "differences": ranks.differences,
            "estimates": ranks.estimates,
            "groups": table_records(ranks.groups),
            "verdicts": ranks.verdicts,
        }
        json.dump(answer, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    shown = ranks.summary.drop(columns=["by_stream", "stranded_why"])
    plain = [c for c in shown.columns if c not in shown.attrs["byte_columns"]]
    shown[plain] = shown[plain].map(lambda v: "-" if v is None else v)
    _print_table(shown, False)
    for line in ranks.estimates + (ranks.differences or ["the ranks agree on their graph pools"]):
        print(line)
    for row in ranks.summary.itertuples():
        if row.stranded_why:
            print(f"rank {row.rank}: stranded not computed ({row.stranded_why})")
    print()
    _print_table(ranks.groups, False)
    for line in ranks.verdicts or ["the ranks agree: no group differs by more than 5% and 2 MiB"]:
        print(line)


def cmd_explain(args: argparse.Namespace) -> None:
    from kit.analysis.answer import explain

    answer = explain(args.snapshot)
    if args.json:
        json.dump(answer.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    print(f"source: {answer.source}")
    print(answer.paragraph())


def cmd_report(args: argparse.Namespace) -> None:
    from kit.show.report import write_report

    if os.path.isdir(args.snapshot):  # a folder of ranks: every rank on one page
        from kit.show.rank_report import write_rank_report

        if args.map:
            raise KitError("--map is for one snapshot; a folder of ranks is reported without one")
        write_rank_report(args.snapshot, args.output)
        print(f"wrote {args.output}")
        return
    stream_map = parse_stream_map(args.map) if args.map else None  # given: a what-if that fails exits 2
    write_report(args.snapshot, args.output, stream_map=stream_map)
    print(f"wrote {args.output}")


def _write_snapshot(snap: dict, path: str, as_json: bool) -> None:
    import pickle

    from kit.fileio import atomic_write

    with atomic_write(path, "w" if as_json else "wb") as f:
        if as_json:
            json.dump(snap, f)
        else:
            pickle.dump(snap, f)


def cmd_sim(args: argparse.Namespace) -> None:
    from kit.allocator.simulator import recorded_range_bases, recorded_segment_addresses, simulate
    from kit.allocator.workload import load_workload
    from kit.analysis.tables import segment_table
    from kit.load.snapshot import load_snapshot

    ops = load_workload(args.workload)
    addresses = stream_ids = None
    if args.addresses_from:
        recorded = load_snapshot(args.addresses_from).raw
        if args.expandable_segments:
            addresses, stream_ids = recorded_range_bases(recorded), (recorded.get("kit") or {}).get("streams")
        else:
            addresses = recorded_segment_addresses(recorded)
    snap = simulate(
        ops, addresses=addresses, expandable_segments=args.expandable_segments, stream_ids=stream_ids
    ).snapshot()
    if args.output:
        _write_snapshot(snap, args.output, args.json)
        print(f"wrote {args.output}")
    else:
        _print_table(segment_table(load_snapshot(snap, label=args.workload)), args.json)


def cmd_run_workload(args: argparse.Namespace) -> None:
    from kit.allocator.workload import load_workload
    from kit.record.workload import run_on_gpu

    snap = run_on_gpu(load_workload(args.workload))
    _write_snapshot(snap, args.output, args.json)
    print(f"wrote {args.output}")


def cmd_demo(args: argparse.Namespace) -> None:
    from kit.experiments.scenarios import LIVE_NEEDS_CUDA, check_preset, replica_runs, run_all, scenario_lines
    from kit.experiments.summary import saved_by_the_patch, summarize
    from kit.record.provenance import require_cuda

    if args.vllm or args.json:
        from kit.experiments.vllm.recordings import demo

        demo(live=args.live, as_json=args.json, vllm=args.vllm)
        return
    check_preset(args.preset)
    if args.live:
        import tempfile

        require_cuda(LIVE_NEEDS_CUDA)  # before any folder or process is made
        out = args.out or tempfile.mkdtemp(prefix="kit-replica-")
        summaries = run_all(args.preset, out)
        print(f"snapshots in {out}")
    else:
        runs = replica_runs(args.preset, source="recorded")
        summaries = {name: summarize(snapshot) for name, snapshot in runs.items()}
    for summary in summaries.values():
        print("\n".join(scenario_lines(summary)))
    saved = saved_by_the_patch(summaries)
    if saved is not None:
        print(f"graph pool saved by the patch: {saved / GIB:.3f} GiB ({saved} bytes)")


def cmd_safety(args: argparse.Namespace) -> None:
    from kit.experiments.early_aux import early_aux_lines, replica_shape_lines, replica_shapes
    from kit.experiments.readwrite_run.result import recorded_if_any
    from kit.experiments.safety_run.result import load_recording, safety_json, safety_lines
    from kit.experiments.safety_run.run import run_live
    from kit.experiments.vllm.recordings import recorded_early_aux_verdict, shipped_invariants
    from kit.experiments.vllm.safety import vllm_invariant_lines

    data = run_live(args.preset) if args.live else load_recording(args.preset)
    readwrite = None if args.live else recorded_if_any(args.preset)  # the invariant's recording, beside the pairings
    vllm = shipped_invariants()
    early = recorded_early_aux_verdict()  # vLLM's path, from its recordings, live or not
    if args.json:
        shapes = replica_shapes(data.get("scenarios") or {})
        early_json = {"early_aux_shapes": shapes, "early_aux_vllm": early}
        json.dump({**safety_json(data, readwrite), "vllm_invariant": vllm, **early_json}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    lines = [
        *safety_lines(data, readwrite, vllm_invariant_lines(vllm)),
        *replica_shape_lines(data.get("scenarios") or {}),
        "",
        *early_aux_lines(early),
    ]
    print("\n".join(lines))


def cmd_alternatives(args: argparse.Namespace) -> None:
    from kit.experiments.alternatives.result import alternatives_json, alternatives_lines
    from kit.experiments.drafter_run import load_alternatives, run_alternatives_live

    data = run_alternatives_live(args.preset) if args.live else load_alternatives(args.preset)
    if args.json:
        json.dump(alternatives_json(data), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    print("\n".join(alternatives_lines(data)))


def cmd_vllm_diff(args: argparse.Namespace) -> None:
    import kit.patch.vllm as patch_vllm

    with patch_vllm.quiet_import():  # diff() imports vLLM, whose import logs and warns on a machine without a GPU
        text = patch_vllm.diff()
    print(f"PR 63155 applies to the installed vLLM {patch_vllm._version()}" if args.check else text)


def _add_run_flags(parser: argparse.ArgumentParser, default: object = False) -> None:
    """`--no-cache` and `--quiet`, before the command or after it."""
    parser.add_argument(
        "--no-cache",
        action="store_true",
        default=default,
        help="neither read nor write the cache of a snapshot's columns (kit.load.cache)",
    )
    parser.add_argument("--quiet", action="store_true", default=default, help="show no progress bars")


@contextlib.contextmanager
def _run_flags(args: argparse.Namespace) -> Iterator[None]:
    """The process-wide settings of `--no-cache` and `--quiet`, put back after the command (tests call main)."""
    from kit import progress
    from kit.load import cache

    was = cache.enabled(), progress.is_quiet()
    cache.set_enabled(was[0] and not getattr(args, "no_cache", False))
    progress.set_quiet(was[1] or getattr(args, "quiet", False))
    try:
        yield
    finally:
        cache.set_enabled(was[0])
        progress.set_quiet(was[1])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kit", description="CUDA-graph memory investigation kit")
    _add_run_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("table", help="segment-by-stream table of a snapshot")
    p.add_argument("snapshot", help="snapshot pickle or JSON file")
    p.add_argument("--json", action="store_true", help="exact bytes as JSON rows")
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("diff", help="change of each (pool, stream) group between two snapshots")
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--by-label",
        action="store_true",
        help="match streams by label, not id (snapshots of two processes); pools pair by id and content either way",
    )
    p.add_argument(
        "--pools",
        action="store_true",
        help="one row per pool: how it was paired, reserved before and after, the saving (with --json too)",
    )
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("reuse", help="per (pool, stream): allocations reused, new segments, stranded bytes")
    p.add_argument("snapshot", help="snapshot with a trace (record_memory_history)")
    p.add_argument("--json", action="store_true", help="exact bytes as JSON rows, each with its group's verdicts")
    p.add_argument(
        "--min-bytes",
        type=_byte_count,
        default=1 << 20,
        metavar="BYTES",
        help="leave out verdicts of groups that made fewer new bytes than this (default 1 MiB, 1048576)",
    )
    p.set_defaults(func=cmd_reuse)

    p = sub.add_parser("check", help="CI guard: exit 1 if a graph pool stranded memory on a second stream")
    p.add_argument("snapshot", help="snapshot with a trace (record_memory_history)")
    p.add_argument(
        "--pools", choices=("graph", "all"), default="graph", help="graph (default): every pool but (0, 0); all"
    )
    p.add_argument(
        "--max-stranded",
        type=_byte_count,
        default=0,
        metavar="BYTES",
        help="fail only for groups that stranded more than this many bytes (default 0)",
    )
    p.add_argument(
        "--own-stream",
        action="append",
        metavar="PATTERN",
        help="captures that may keep a stream of their own: PATTERN, case-insensitive, is part of a recorded "
        "capture's manager name or of the stream's label the snapshot gives; their groups are listed as allowed, "
        "not failed. Repeat for more; 'none' allows nothing (default: the speculator's, as PR 63155 argues: "
        "speculator, drafter)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='{"ok", "offending", "source", "allowed", "own_stream"} as JSON, bytes exact',
    )
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("what-if", help="predict the table had some streams been others (any snapshot with a trace)")
    p.add_argument("snapshot")
    p.add_argument(
        "--map",
        action="append",
        metavar="FROM=TO",
        help="move stream FROM onto stream TO; each an id (decimal or hex) or a label as `table` prints it",
    )
    p.add_argument(
        "--rank",
        action="store_true",
        help="simulate every move of a graph pool's stream onto another (and all onto one), best saving first",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_what_if)

    p = sub.add_parser("ranks", help="the ranks of a multi-GPU run side by side (a folder of rank<N> snapshots)")
    p.add_argument("folder", help="folder of per-rank snapshots")
    p.add_argument("--figure", default="reserved", help="reserved (default), allocated, active, free, segments")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ranks)

    p = sub.add_parser("explain", help="one paragraph: the biggest pools, what stranded where and why, the best map")
    p.add_argument("snapshot")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("report", help="self-contained HTML page of tables, figures, verdicts and attribution")
    p.add_argument("snapshot", help="a snapshot file, or a folder of per-rank snapshots (every rank on one page)")
    p.add_argument("-o", "--output", required=True, help="HTML file to write")
    p.add_argument(
        "--map",
        action="append",
        metavar="FROM=TO",
        help="add the what-if of stream FROM moved onto TO (as `what-if --map`); repeatable",
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("sim", help="run a workload on the allocator simulator")
    p.add_argument("workload", help="workload JSON, format version 1")
    p.add_argument("--addresses-from", metavar="SNAPSHOT", help="take segment addresses from a recording")
    p.add_argument(
        "--expandable-segments", action="store_true", help="simulate PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )
    p.add_argument("-o", "--output", help="write the snapshot here (default: print its table)")
    p.add_argument("--json", action="store_true", help="JSON instead of pickle (or table rows as JSON)")
    p.set_defaults(func=cmd_sim)

    p = sub.add_parser("run-workload", help="run a workload on this process's real GPU allocator")
    p.add_argument("workload")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--json", action="store_true", help="write JSON instead of pickle")
    p.set_defaults(func=cmd_run_workload)

    p = sub.add_parser("demo", help="the replica's experiments: unpatched, patched, early aux (live needs CUDA)")
    p.add_argument("--live", action="store_true", help="run them on this GPU, each in a fresh process")
    p.add_argument("--preset", default="small", help="replica size: small, or large (near DeepSeek's hidden size)")
    p.add_argument("--out", help="folder for the live snapshots (default: a new temporary folder)")
    p.add_argument("--vllm", action="store_true", help="vLLM 0.33's own capture path on the H200 (kit/recordings/vllm)")
    p.add_argument("--json", action="store_true", help="with --vllm: the figures per scenario as JSON")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("safety", help="every replay graph replayed in every model graph's break, against eager")
    p.add_argument(
        "--preset",
        default="small",
        help="replica size: small, large (near DeepSeek's hidden size), or vLLM's defaults h200-default, gb200-default",
    )
    p.add_argument("--live", action="store_true", help="run it on this GPU now, each policy in a fresh process")
    p.add_argument("--json", action="store_true", help='{"pairs": [...], "source", "provenance"} as JSON')
    p.set_defaults(func=cmd_safety)

    p = sub.add_parser("alternatives", help="the PR's alternatives with the speculator, and the KV cache it frees")
    p.add_argument("--preset", default="small", help="replica size: small, or large (near DeepSeek's hidden size)")
    p.add_argument("--live", action="store_true", help="run it on this GPU now, each scenario in a fresh process")
    p.add_argument("--json", action="store_true", help="unpatched, pr, share_all, cap_replay_sizes, kv_cache as JSON")
    p.set_defaults(func=cmd_alternatives)

    # Named for what it prints; `vllm-patch`, its first name, read as if it installed something.
    p = sub.add_parser(
        "vllm-diff",
        aliases=["vllm-patch"],
        help="PR 63155's change to the installed vLLM, as a diff (installs nothing)",
    )
    p.add_argument("--check", action="store_true", help="only say whether it applies (exit 2 with the reason if not)")
    p.set_defaults(func=cmd_vllm_diff)
    for command in {id(c): c for c in sub.choices.values()}.values():  # an alias maps to its command's parser
        _add_run_flags(command, default=argparse.SUPPRESS)  # given after the command, they count too
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _run_flags(args):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        status = args.func(args)  # a command returns its exit status (check: 1 on failure), or None for 0
    except KitError as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as e:  # a folder that does not exist, no permission, a full disk: the user's to fix
        where = f"{e.filename}: " if e.filename else ""
        print(f"kit: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kit: interrupted; nothing half-written was left behind", file=sys.stderr)
        return 130
    return status if isinstance(status, int) else 0
