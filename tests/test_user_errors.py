"""A user's small mistakes get one line that names the real cause (issue 18's "smaller" list).

Each test runs what a new user tried and asserts the exact line: a folder as
`report -o`, `demo --live` without CUDA, an unknown `demo --preset`,
`vllm-diff --check`'s output, `sim`'s source label, a compressed file or a
`torch.save` archive given as a snapshot, a segment larger than any GPU,
`ranks` with a rank that lacks a group, and a malformed capture window in the
snapshot's `kit` key.
"""

from __future__ import annotations

import bz2
import copy
import gzip
import io
import lzma
import os
import pickle
import subprocess
import sys
import zipfile

import pytest

from kit import KitError, load_snapshot
from kit.analysis.ranks import rank_table, rank_verdicts
from kit.load.columns import _fast_segment_columns
from kit.load.rows import MAX_DEVICE_BYTES, parse_segment, parse_trace_entry
from kit.load.snapshot import snapshot_from_bytes

from .helpers import FIXTURES, MIB, RECORDED, segment

TIB = 1 << 40


def _kit(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _refused(done: subprocess.CompletedProcess, line: str) -> None:
    """Exit 2 with exactly `kit: error: <line>` on stderr and nothing else."""
    assert (done.returncode, done.stderr, done.stdout) == (2, f"kit: error: {line}\n", "")


# 1. report -o FOLDER


def test_report_into_a_folder_names_the_folder_not_a_temporary_file(tmp_path):
    done = _kit("report", str(RECORDED["two_streams"]), "-o", str(tmp_path))
    _refused(done, f"{tmp_path}: is a directory")
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind either


# 2. demo --live without CUDA


def test_demo_live_without_cuda_is_one_line_before_any_process_or_folder(tmp_path):
    out = tmp_path / "live"
    done = _kit("demo", "--live", "--out", str(out), env={"CUDA_VISIBLE_DEVICES": ""})
    _refused(
        done, "live replica runs need CUDA, and this process has none; without --live, demo shows the H200 recordings"
    )
    assert not out.exists()


# 3. demo --preset huge


def test_an_unknown_demo_preset_lists_the_presets_and_suggests_no_live_run():
    for args in (["demo", "--preset", "huge"], ["demo", "--live", "--preset", "huge"]):
        refusal = "unknown preset 'huge': one of small, large, small_half, large_half, h200-default, gb200-default"
        _refused(_kit(*args, env={"CUDA_VISIBLE_DEVICES": ""}), refusal)


# 4. vllm-diff --check (and its old name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vllm-diff", "vllm-patch"])  # vllm-patch: the command's old name, kept
def test_vllm_diff_check_prints_its_answer_and_nothing_else(name):
    done = _kit(name, "--check", "--quiet")
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "PR 63155 applies to the installed vLLM 0.33.0\n")


# 5. sim's source label


def test_sim_labels_its_source_by_the_workload_file():
    workload = FIXTURES / "corpus" / "pr_two_streams.json"
    for extra in ([], ["--json"]):
        done = _kit("sim", str(workload), *extra)
        assert done.returncode == 0, done.stderr
        assert "in-memory" not in done.stdout
    done = _kit("sim", str(workload))
    assert done.stdout.splitlines()[0] == f"source: simulator ({workload})"


# 6. compressed files and torch.save archives


def _torch_save(**kwargs) -> bytes:
    import torch  # installed with vLLM, as CI has it

    out = io.BytesIO()
    torch.save({"segments": []}, out, **kwargs)
    return out.getvalue()


def _zip(**members: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def test_a_compressed_file_or_an_archive_is_named_as_such():
    snapshot = RECORDED["two_streams"].read_bytes()
    cases = {
        "gzip, truncated": (
            gzip.compress(snapshot)[:200],
            "a damaged gzip file (Compressed file ended before the end-of-stream marker was reached)",
        ),
        "gzip inside gzip": (gzip.compress(gzip.compress(snapshot)), "gzip inside gzip; not a snapshot"),
        "gzip bomb": (
            gzip.compress(b"\x80" + b"\x00" * (300 << 20)),  # 300 MiB of nothing in 300 KiB
            "gzip expands past 256 MiB (100 times its size): not a snapshot the kit reads compressed; decompress it "
            "yourself if it is one",
        ),
        "bzip2, truncated": (
            bz2.compress(snapshot)[:200],
            "a damaged bzip2 file (Compressed file ended before the end-of-stream marker was reached)",
        ),
        "bzip2 inside gzip": (gzip.compress(bz2.compress(snapshot)), "bzip2 inside gzip; not a snapshot"),
        "xz inside bzip2": (bz2.compress(lzma.compress(snapshot)), "xz inside bzip2; not a snapshot"),
        "xz": (lzma.compress(snapshot), "compressed with xz: unxz it first"),
        "zstd": (b"\x28\xb5\x2f\xfd" + snapshot[:100], "compressed with zstd: unzstd it first"),
        "torch.save": (_torch_save(), "this is a torch.save archive, not a memory snapshot"),
        "torch.save legacy": (
            _torch_save(_use_new_zipfile_serialization=False),
            "this is a torch.save file (its legacy format), not a memory snapshot",
        ),
        "zip": (_zip(**{"snap.pickle": snapshot}), "a zip archive, not a memory snapshot"),
        "torch-like zip without a version": (_zip(**{"a/data.pkl": b"x"}), "a zip archive, not a memory snapshot"),
        "truncated zip": (_zip(**{"a/data.pkl": b"x", "a/version": b"3"})[:30], "a zip archive, not a memory snapshot"),
    }
    for name, (data, message) in cases.items():
        with pytest.raises(KitError) as raised:
            snapshot_from_bytes(data, origin="upload")
        assert str(raised.value) == f"upload: {message}", name
    plain = snapshot_from_bytes(snapshot, origin="upload").raw
    for compress in (gzip.compress, bz2.compress):  # the two compressions snapshots are kept in, read as they are
        assert snapshot_from_bytes(compress(snapshot), origin="upload").raw == plain


def test_the_command_line_reads_a_gzip_snapshot_and_names_a_bomb_and_a_torch_save_archive(tmp_path, monkeypatch):
    gz, bomb, pt = tmp_path / "snap.pickle.gz", tmp_path / "bomb.pickle.bz2", tmp_path / "snap.pt"
    bz = tmp_path / "snap.pickle.bz2"
    gz.write_bytes(gzip.compress(RECORDED["two_streams"].read_bytes()))
    bz.write_bytes(bz2.compress(RECORDED["two_streams"].read_bytes()))
    pt.write_bytes(_torch_save())
    plain = _kit("table", str(RECORDED["two_streams"]))
    for compressed in (gz, bz):
        read = _kit("table", str(compressed))
        same = read.stdout.replace(str(compressed), str(RECORDED["two_streams"]))  # the source line names the file
        assert read.returncode == plain.returncode == 0 and same == plain.stdout  # the same table, compressed
    bomb.write_bytes(bz2.compress(b"\x80" + b"\x00" * (300 << 20)))  # 300 MiB of nothing in a few hundred bytes
    _refused(
        _kit("table", str(bomb)),
        f"{bomb}: bzip2 expands past 256 MiB (100 times its size): not a snapshot "
        "the kit reads compressed; decompress it yourself if it is one",
    )
    _refused(_kit("table", str(pt)), f"{pt}: this is a torch.save archive, not a memory snapshot")


# 7. sizes past what a GPU holds


def _raw(*, segment_size: int = 2 * MIB, block_size: int | None = None, entry_size: int = 512) -> dict:
    segments = [segment((i + 1) << 40, [(2 * MIB, "inactive")]) for i in range(3)]
    segments.append(segment(1 << 48, [(segment_size, "inactive")]))
    if block_size is not None:
        segments[1]["blocks"][0]["size"] = block_size
    entries = [{"action": "alloc", "addr": 0x1000, "size": 512, "stream": 0, "time_us": i} for i in range(3)]
    entries.append({"action": "alloc", "addr": 0x1000, "size": entry_size, "stream": 0, "time_us": 3})
    return {"segments": segments, "device_traces": [entries]}


def test_sizes_past_what_a_gpu_holds_are_refused_in_one_line(tmp_path):
    too_big = 16 * TIB
    limit = "is more than any GPU holds (limit 4 TiB)"
    cases = {
        "segment": (_raw(segment_size=too_big), f"snap.pickle: segment 3: total_size {too_big} {limit}"),
        "block": (_raw(block_size=too_big), f"snap.pickle: segment 1 block 0: size {too_big} {limit}"),
        "trace entry": (_raw(entry_size=too_big), f"snap.pickle: trace 0 entry 3: size {too_big} {limit}"),
    }
    for name, (raw, message) in cases.items():
        with pytest.raises(KitError) as raised:
            load_snapshot(raw, label="snap.pickle")
        assert str(raised.value) == message, name
    # The bulk checks take none of them, and the row parsers refuse each on its own.
    assert _fast_segment_columns(_raw(segment_size=too_big)["segments"]) is None
    with pytest.raises(KitError, match=limit.replace("(", r"\(").replace(")", r"\)")):
        parse_segment(_raw(segment_size=too_big)["segments"][3], "s")
    with pytest.raises(KitError, match="more than any GPU holds"):
        parse_trace_entry(_raw(entry_size=too_big)["device_traces"][0][3], 0, "s", 3)
    # Up to the limit is a GPU's: accepted, by the bulk checks too.
    assert MAX_DEVICE_BYTES == 4 * TIB
    at_limit = _raw(segment_size=MAX_DEVICE_BYTES, entry_size=MAX_DEVICE_BYTES)
    assert _fast_segment_columns(at_limit["segments"]) is not None
    assert load_snapshot(at_limit).columns.total_size.max() == MAX_DEVICE_BYTES
    path = tmp_path / "huge.pickle"
    path.write_bytes(pickle.dumps(_raw(segment_size=too_big)))
    _refused(_kit("table", str(path)), f"{path}: segment 3: total_size {too_big} {limit}")


# 8. ranks with a rank that lacks a group


def _rank(graph_pool_mib: int | None) -> dict:
    segments = [segment(0x1000_0000, [(20 * MIB, "active_allocated")], stream=0)]
    if graph_pool_mib is not None:
        segments.append(segment(0x2000_0000, [(graph_pool_mib * MIB, "inactive")], stream=7, pool=(0, 1)))
    return {
        "segments": segments,
        "device_traces": [[]],
        "kit": {"streams": {"model graphs stream": 7}, "pools": {"global graph pool": [0, 1]}},
    }


def test_a_rank_that_lacks_a_group_is_said_to_lack_it_and_never_counts_as_largest_or_smallest(tmp_path):
    group = "global graph pool / model graphs stream"
    ranks = {0: load_snapshot(_rank(None)), 1: load_snapshot(_rank(64)), 2: load_snapshot(_rank(96))}
    row = rank_table(ranks).set_index(["pool_label", "stream_label"]).loc[("global graph pool", "model graphs stream")]
    assert (row["min"], row["max"], row["spread"], row["largest_rank"], row["missing_on"]) == (
        64 * MIB,
        96 * MIB,
        32 * MIB,
        2,
        [0],
    )
    assert rank_verdicts(rank_table(ranks)) == [
        f"rank 0 has no {group} (96.00 MiB reserved on rank 2)",
        f"{group}: rank 2 has 96.00 MiB reserved, 32.00 MiB more than the smallest rank (64.00 MiB)",
    ]
    # Nothing allocated in the group on the ranks that have it: the rank without it is still not the largest.
    allocated = rank_table(ranks, "allocated").set_index("stream_label").loc["model graphs stream"]
    assert allocated["largest_rank"] in (1, 2) and allocated["missing_on"] == [0]
    for rank, raw in ((0, _rank(None)), (1, _rank(64)), (3, _rank(64))):
        (tmp_path / f"rank{rank}.pickle").write_bytes(pickle.dumps(raw))
    done = _kit("ranks", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert f"rank 0 has no {group} (64.00 MiB reserved on rank 1)" in done.stdout.splitlines()


# 9. a malformed capture window in the kit key (issue 27): refused by every command that reads the windows


def _with_window(change: dict, tmp_path) -> tuple[str, dict]:
    """The small unpatched replica with its second capture window changed; the file's path and the dict."""
    from kit.recordings import recording

    raw = copy.deepcopy(load_snapshot(recording("replica/small_unpatched.pickle")).raw)
    raw["kit"]["captures"][1].update(change)
    path = tmp_path / "window.pickle"
    path.write_bytes(pickle.dumps(raw))
    return str(path), raw


def _trace_entries() -> int:
    from kit.recordings import recording

    return len(load_snapshot(recording("replica/small_unpatched.pickle")).raw["device_traces"][0])


MALFORMED_WINDOWS = {
    "wrong type": ({"trace_begin": "290"}, "capture window 1: 'trace_begin' is '290', expected an integer"),
    "begin after end": (
        {"trace_begin": 300, "trace_end": 290},
        "capture window 1: ends (trace index 290) before it begins (300)",
    ),
    "past the trace": (
        {"trace_end": 5000},
        f"capture window 1: ends at trace index 5000, past the trace's {_trace_entries()} entries "
        "(a window written for another trace)",
    ),
    "unknown pool": (
        {"pool": [0, 99]},
        "capture window 1: pool (0, 99) is not in the snapshot (no segment of it, no allocation into it in the "
        "trace, no name for it in the kit key)",
    ),
    "the default pool": (
        {"pool": [0, 0]},
        "capture window 1: its pool is the default pool (0, 0), which no graph is captured into",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_WINDOWS))
def test_a_malformed_capture_window_is_refused_by_every_analysis_that_reads_windows(case, tmp_path):
    from kit.analysis.attribution import capture_attribution, capture_table, replay_captures_added
    from kit.analysis.check import check_snapshot
    from kit.analysis.liveness import liveness_verdicts
    from kit.analysis.whatif import trace_to_workload

    change, message = MALFORMED_WINDOWS[case]
    path, raw = _with_window(change, tmp_path)
    for analysis in (
        capture_table,
        capture_attribution,
        lambda s: replay_captures_added(s, (0, 1)),
        liveness_verdicts,
        trace_to_workload,
        check_snapshot,
    ):
        with pytest.raises(KitError) as raised:
            analysis(load_snapshot(raw, label="window.pickle"))
        assert str(raised.value) == f"window.pickle: {message}"


def test_a_malformed_capture_window_exits_2_in_one_line_from_table_reuse_and_check(tmp_path, capsys):
    from kit.cli import main

    for change, message in MALFORMED_WINDOWS.values():
        path, _ = _with_window(change, tmp_path)
        for command in (["table"], ["table", "--json"], ["reuse"], ["reuse", "--json"], ["check"], ["check", "--json"]):
            assert main([*command, path]) == 2, command
            out, err = capsys.readouterr()
            assert (out, err) == ("", f"kit: error: {path}: {message}\n"), command
    change, message = MALFORMED_WINDOWS["past the trace"]
    path, _ = _with_window(change, tmp_path)
    _refused(_kit("check", path), f"{path}: {message}")  # in a process of its own too: the line and nothing else


def test_a_well_formed_window_at_the_trace_end_is_taken():
    from kit.analysis.attribution import checked_capture_windows
    from kit.recordings import recording

    raw = copy.deepcopy(load_snapshot(recording("replica/small_unpatched.pickle")).raw)
    raw["kit"]["captures"][-1]["trace_end"] = len(raw["device_traces"][0])  # [begin, end): the end may be the length
    raw["kit"]["graphs"] = {}  # a pool its segments hold needs no name
    assert len(checked_capture_windows(raw)) == len(raw["kit"]["captures"])


def test_a_name_outside_its_set_is_one_short_line_naming_the_set():
    from kit.errors import check_one_of

    assert check_one_of("pr", ("pr", "share"), "stream policy") == "pr"
    with pytest.raises(KitError, match=r"^unknown stream policy 'prr': one of pr, share$"):
        check_one_of("prr", ("pr", "share"), "stream policy")
    with pytest.raises(KitError, match=r"^unknown preset 'x{40}'\.\.\. \(100000 characters\): one of small$"):
        check_one_of("x" * 100_000, {"small": None}, "preset")  # a dict's keys are its set
