"""The `python -m kit` command line.

Commands (contract in DESIGN.md): `table`, `diff` and `report`. Every command
exits 0 on success and 2 with one line on stderr for a user's mistake
(a missing, corrupt or hostile file), never with a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from kit.errors import KitError


def _print_table(table, as_json: bool) -> None:
    from kit.tables import format_bytes, table_records

    if as_json:
        json.dump(table_records(table), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    shown = table.copy()
    for col in shown.columns:
        base = col.removesuffix("_before").removesuffix("_after")
        if base in ("reserved", "allocated", "active", "free", "largest_free"):
            shown[col] = shown[col].map(format_bytes)
    print(f"source: {table.attrs.get('source', '?')}")
    print(shown.to_string(index=False))


def cmd_table(args: argparse.Namespace) -> None:
    from kit.tables import segment_table

    _print_table(segment_table(args.snapshot), args.json)


def cmd_diff(args: argparse.Namespace) -> None:
    from kit.tables import diff_tables, segment_table

    by = "label" if args.by_label else "stream"
    _print_table(diff_tables(segment_table(args.before), segment_table(args.after), by=by), args.json)


def cmd_report(args: argparse.Namespace) -> None:
    from kit.report import write_report

    write_report(args.snapshot, args.output)
    print(f"wrote {args.output}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kit", description="CUDA-graph memory investigation kit")
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
        help="match groups by stream name, not id (snapshots of two different processes)",
    )
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("report", help="self-contained HTML page of tables and figures")
    p.add_argument("snapshot")
    p.add_argument("-o", "--output", required=True, help="HTML file to write")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except KitError as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 0
