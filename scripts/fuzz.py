"""The long fuzz run: the snapshot loaders and the workload parser, with the figures for a closing note.

    python scripts/fuzz.py --minutes 10                 # atheris (coverage-guided) if installed
    python scripts/fuzz.py --minutes 2 --engine mutate  # the mutation fuzzer of tests/fuzz_targets.py

It first replays every stored reproducer of a crash found and fixed earlier
(tests/fixtures/fuzz/*.bin.gz), then fuzzes each target for its share of the
time, each in a process of its own with a memory limit: `snapshot` (the bytes
of a snapshot file: loading, normalising, table, trace walk, reuse,
stranding, captures, what-if) and `workload` (a workload file: parsing,
validation, simulation). Inputs start from the recorded fixtures and the
foreign-version snapshots and are mutated at the byte level and in their
decoded structure (tests/fuzz_targets.py). An input that ends in anything but
a result or a one-line `KitError` (another exception, one over the time
limit, code run while decoding) is a crash; one reproducer per distinct
signature (exception type and the kit line that raised it) is written under
--out. Once fixed, `python scripts/fuzz.py --keep OUT` stores each reproducer
that no longer crashes in tests/fixtures/fuzz (gzipped, listed in its
MANIFEST.json with the crash it caused), where tests/test_fuzz.py replays it.

Prints inputs tried, crashes found and distinct signatures per target, and
exits 1 if any crash is open (a reproducer that still crashes at the end).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PER_INPUT_SECONDS = 10
MEMORY_LIMIT = 6 << 30
SHARES = {"snapshot": 0.75, "workload": 0.25}
CHUNK_SECONDS = 45


def recorded_crashes(out: Path, target: str | None = None) -> list[dict]:
    """The crashes a run recorded under `out` (one per distinct signature), oldest first."""
    found = sorted(out.glob(f"crash-{target or '*'}-*.json"), key=lambda p: p.stat().st_mtime)
    return [json.loads(p.read_text()) for p in found]


class Hang(Exception):
    """An input ran past the per-input time limit."""


def _on_alarm(signum, frame):
    raise Hang(f"over {PER_INPUT_SECONDS} s")


class Worker:
    """Runs one target on inputs, records crashes and figures under `out`."""

    def __init__(self, target: str, out: Path, chunk: int) -> None:
        from tests import fuzz_targets

        self.ft = fuzz_targets
        self.target = target
        self.chunk = chunk
        self.run = fuzz_targets.TARGETS[target]
        self.out = out
        self.marker = str(out / f"pwned-{target}")
        self.counts = {"inputs": 0, "ok": 0, "kit error": 0, "crashes": 0}
        self.signatures: dict[str, str] = {}
        self.known = {c["signature"] for c in recorded_crashes(out, target)}  # what earlier chunks found
        self.last_write = 0.0
        signal.signal(signal.SIGALRM, _on_alarm)

    def one(self, data: bytes) -> None:
        self.counts["inputs"] += 1
        signal.setitimer(signal.ITIMER_REAL, PER_INPUT_SECONDS)
        try:
            if self.target == "snapshot" and self.counts["inputs"] % 25 == 0:
                self.counts[self.ft.snapshot_target(data, report=True)] += 1  # the HTML report too, now and then
            else:
                self.counts[self.run(data)] += 1
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - every other ending is a crash to record
            self.crash(data, self.ft.crash_signature(e), e)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if os.path.exists(self.marker):
            os.unlink(self.marker)
            self.crash(data, "code execution: a hostile pickle ran its command", None)
        if time.monotonic() - self.last_write > 1:
            self.write_stats()

    def crash(self, data: bytes, signature: str, exc: BaseException | None) -> None:
        self.counts["crashes"] += 1
        if signature not in self.signatures and signature not in self.known:
            from kit.fileio import atomic_write

            stem = f"crash-{self.target}-{hashlib.sha256(data).hexdigest()[:12]}"
            with atomic_write(self.out / f"{stem}.bin", "wb") as f:
                f.write(data)
            self.signatures[signature] = f"{stem}.bin"
            detail = f"{type(exc).__name__}: {str(exc)[:300]}" if exc is not None else ""
            with atomic_write(self.out / f"{stem}.json") as f:
                f.write(json.dumps({"signature": signature, "file": f"{stem}.bin", "detail": detail}))
        self.write_stats()

    def write_stats(self) -> None:
        from kit.fileio import atomic_write

        self.last_write = time.monotonic()
        with atomic_write(self.out / f"stats-{self.target}-{self.chunk}.json") as f:
            f.write(json.dumps({**self.counts, "signatures": self.signatures}))

    def seeds(self) -> list[bytes]:
        found = self.ft.seed_snapshots() if self.target == "snapshot" else self.ft.seed_workloads()
        return list(found.values())


def run_mutate(target: str, seconds: float, out: Path, seed: int, chunk: int) -> None:
    worker = Worker(target, out, chunk)
    from tests import fuzz_targets

    fuzz_targets.warm_up()
    seeds = worker.seeds()
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    for data in seeds:
        worker.one(data)
    while time.monotonic() < deadline:
        worker.one(fuzz_targets.next_input(target, seeds, rng, worker.marker))
    worker.write_stats()


def run_atheris(target: str, seconds: float, out: Path, seed: int, chunk: int) -> None:
    import atheris

    with atheris.instrument_imports(include=["kit"]):
        import kit  # noqa: F401 - instrumented for coverage before anything else imports it
        import kit.show.report  # noqa: F401
    from tests import fuzz_targets

    fuzz_targets.warm_up()
    worker = Worker(target, out, chunk)
    seeds = worker.seeds()
    corpus = out / f"corpus-{target}"  # shared by the chunks: each starts where the last one got to
    if not corpus.exists():
        from kit.fileio import atomic_write

        corpus.mkdir()
        for i, data in enumerate(seeds):
            with atomic_write(corpus / f"seed-{i}", "wb") as f:
                f.write(data)

    def mutator(data: bytes, max_size: int, mutator_seed: int) -> bytes:
        rng = random.Random(mutator_seed)
        if rng.random() < 0.4:
            return atheris.Mutate(data, max_size)
        made = fuzz_targets.next_input(target, [data] if data else seeds, rng, worker.marker)
        return made if len(made) <= max_size else atheris.Mutate(data, max_size)

    args = [
        sys.argv[0],
        f"-max_total_time={int(seconds)}",
        f"-seed={seed}",
        "-max_len=120000",
        "-timeout=120",
        "-rss_limit_mb=0",
        "-print_final_stats=1",
        str(corpus),
    ]
    atheris.Setup(args, worker.one, custom_mutator=mutator)
    atheris.Fuzz()  # exits the process when the time is up; figures are in the stats file


def worker_main(args: argparse.Namespace) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))  # a memory bomb is a MemoryError
    out = Path(args.out)
    if args.engine == "atheris":
        run_atheris(args.worker, args.seconds, out, args.seed, args.chunk)
    else:
        run_mutate(args.worker, args.seconds, out, args.seed, args.chunk)
    return 0


def replay(target: str, data: bytes) -> str | None:
    """Run one stored input; the crash signature if it still crashes, else None."""
    from tests import fuzz_targets

    try:
        fuzz_targets.TARGETS[target](data)
    except BaseException as e:  # noqa: BLE001
        return fuzz_targets.crash_signature(e)
    return None


def keep(run: Path) -> int:
    """Store the reproducers of `run` that no longer crash as regression inputs, with what they crashed with."""
    import gzip

    from kit.fileio import atomic_write
    from tests import fuzz_targets

    folder = fuzz_targets.REGRESSIONS
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    kept = still = 0
    for crash in recorded_crashes(run):
        target = crash["file"].split("-")[1]
        data = (run / crash["file"]).read_bytes()
        if replay(target, data):
            still += 1
            continue
        slug = re.sub(r"[^A-Za-z0-9]+", "-", crash["signature"]).strip("-").lower()
        name = f"{target}-{slug}-{hashlib.sha256(data).hexdigest()[:8]}.bin.gz"
        with atomic_write(folder / name, "wb") as f:
            f.write(gzip.compress(data, mtime=0))
        manifest[name] = {"crashed with": crash["signature"], "detail": crash["detail"]}
        kept += 1
    with atomic_write(manifest_path) as f:
        f.write(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    print(f"kept {kept} reproducers in {folder}; {still} still crash (fix them first)")
    return 1 if still else 0


def run_chunk(target: str, engine: str, seconds: float, seed: int, out: Path, chunk: int) -> tuple[int | None, dict]:
    """Run one worker process: the inputs libFuzzer says it ran (0 without libFuzzer, None on failure), its figures."""
    log = out / f"worker-{target}-{chunk}.log"
    command = [
        sys.executable,
        __file__,
        f"--worker={target}",
        f"--engine={engine}",
        f"--seconds={seconds}",
        f"--seed={seed}",
        f"--chunk={chunk}",
        f"--out={out}",
    ]
    with open(log, "w") as f:  # streamed log, not a result: exempt from atomic writes
        proc = subprocess.Popen(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            proc.kill()  # libFuzzer sometimes lingers after its last line; the figures are written by then
            proc.wait()
    text = log.read_text(errors="replace")
    stats_path = out / f"stats-{target}-{chunk}.json"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    done = re.findall(r"Done (\d+) runs", text)
    if proc.returncode not in (0, -signal.SIGKILL) or not stats or (engine == "atheris" and not done):
        tail = "\n  ".join(text.strip().splitlines()[-5:])
        print(f"{target}: the fuzzing process ended with status {proc.returncode} ({log}):\n  {tail}")
        return None, stats
    return int(done[-1]) if done else 0, stats


def pick_engine(engine: str) -> str:
    if engine != "auto":
        return engine
    try:
        import atheris  # noqa: F401
    except ImportError:
        return "mutate"
    return "atheris"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="total fuzzing time, split over the targets")
    parser.add_argument("--engine", choices=("auto", "atheris", "mutate"), default="auto")
    parser.add_argument("--targets", default="snapshot,workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="folder for figures and crash reproducers (default: a new one)")
    parser.add_argument("--keep", metavar="OUT", help="store the fixed reproducers of an earlier run's OUT as tests")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)
    if args.keep:
        return keep(Path(args.keep))

    from tests import fuzz_targets

    out = Path(args.out or tempfile.mkdtemp(prefix="kit-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    engine = pick_engine(args.engine)
    stored = fuzz_targets.regression_inputs()
    still = [(t, name, s) for t, name, data in stored if (s := replay(t, data))]
    print(f"regression inputs (crashes found and fixed earlier): {len(stored)}, still crashing: {len(still)}")
    for t, name, s in still:
        print(f"  OPEN {t} {name}: {s}")

    targets = [t for t in args.targets.split(",") if t]
    total = {"inputs": 0, "crashes": 0}
    open_crashes = len(still)
    for target in targets:
        seconds = 60 * args.minutes * SHARES.get(target, 1 / len(targets)) / sum(SHARES.get(t, 0) for t in targets)
        started = time.monotonic()
        inputs = crashes = 0
        signatures: dict[str, str] = {}
        chunk = 0
        while time.monotonic() - started < seconds - 1:
            # Chunks of at most a minute, each a fresh process: libFuzzer's memory grows with the
            # run, and the corpus folder carries what the coverage-guided search learned onwards.
            length = min(CHUNK_SECONDS, seconds - (time.monotonic() - started))
            ran, stats = run_chunk(target, engine, length, args.seed + chunk, out, chunk)
            if ran is None:
                open_crashes += 1
            inputs += max(stats.get("inputs", 0), ran or 0)
            crashes += stats.get("crashes", 0)
            signatures.update(stats.get("signatures", {}))
            chunk += 1
        print(
            f"{target}: {engine}, {time.monotonic() - started:.0f} s, {inputs} inputs tried, "
            f"{crashes} crashing inputs, {len(signatures)} distinct crashes"
        )
        for signature, name in signatures.items():
            now = replay(target, (out / name).read_bytes())
            state = "OPEN" if now else "no longer crashes"
            open_crashes += bool(now)
            print(f"  {state}: {signature} ({out / name})")
        total["inputs"] += inputs
        total["crashes"] += crashes
    print(
        f"total: {total['inputs']} inputs tried, {total['crashes']} crashing inputs, "
        f"{open_crashes} open; reproducers and figures in {out}"
    )
    return 1 if open_crashes else 0


if __name__ == "__main__":
    sys.exit(main())
