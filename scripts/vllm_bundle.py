"""Build build/vllm_bundle/: vLLM 0.33.0's Python sources and the wheels its capture path imports.

    .venv/bin/python scripts/vllm_bundle.py              # build/vllm_bundle (about 11 MiB)
    .venv/bin/python scripts/vllm_bundle.py --check      # verify an existing bundle, build nothing

The kit's GPU machine (Python 3.12, torch 2.11) has no vLLM and no registry,
and vLLM with the torch it pins is far too large to carry. Its capture path
(`parallel_state.graph_capture`, `CudaGraphManager.capture`, the breakable
PIECEWISE wrapper, `DecoderReplayCudaGraphManager`,
`GPUModelRunner.capture_model`) is Python, so this carries exactly that:

- `vllm-0.33.0-py.tar.gz`: every `.py` file of the installed vLLM wheel
  (`.venv`), each checked against the wheel's own `RECORD` sha256 (a file
  that differs, or is missing, stops the build), plus its `METADATA` so
  `importlib.metadata.version("vllm")` answers; no compiled extension
  (`vllm._C_stable_libtorch` and friends are not carried: the capture path
  calls none of their ops but one, which `kit.experiments.vllm.capture`
  registers from Python; MANIFEST.json lists every extension the wheel has,
  and the capture stands each in with an empty module,
  `kit/experiments/vllm/stubs/_vllm_stub.py`, since `vllm.platforms.cuda` imports
  `vllm._C_stable_libtorch` unconditionally);
- `*.whl`: the pure-Python or manylinux cp312 wheels the imports need and the
  GPU machine lacks (`WHEELS`), at the versions installed in `.venv`,
  fetched with `pip download --no-deps --only-binary=:all:`;
- `MANIFEST.json`: each file with its bytes and sha256, the vLLM version,
  the count of source files checked, and the wheel's compiled extension
  modules (`extensions`, from its RECORD).

What the import path drags in but never uses (servers, tokenizers,
grammars) is stood in by the stub modules in `kit/experiments/vllm/stubs/`, which
travel with the working tree, not in the bundle; docs/vllm.md lists them.
`scripts/vllm_on_device.sh` unpacks the bundle on the GPU machine.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.fileio import atomic_write  # noqa: E402

OUT = ROOT / "build" / "vllm_bundle"
VLLM_VERSION = "0.33.0"
SOURCES = f"vllm-{VLLM_VERSION}-py.tar.gz"
LIMIT = 50 << 20  # what the lead may carry for it (the carry limit is 64 MiB in all)

# What the GPU machine lacks among the imports of vLLM's capture path, with why each is needed.
# Found by importing the capture modules from the bundle alone in a Python 3.12 venv holding
# torch 2.11 and the machine's packages (docs/vllm.md, "vLLM's own code on the H200").
WHEELS = {
    # name: (the module it installs, why the capture path needs it)
    "pydantic": ("pydantic", "vllm.config is pydantic dataclasses"),
    "pydantic_core": ("pydantic_core", "pydantic's compiled core"),
    "annotated-types": ("annotated_types", "pydantic's dependency"),
    "typing-inspection": ("typing_inspection", "pydantic's dependency"),
    "pyzmq": ("zmq", "vllm.utils.network_utils, imported by vllm.distributed"),
    "msgspec": ("msgspec", "vllm.v1 request structs, imported by the V2 runner"),
    "cbor2": ("cbor2", "vllm.v1.serial_utils, imported by the V1 KV-cache code"),
    "cachetools": ("cachetools", "vllm.utils caches, imported by vllm.config"),
    "pybase64": ("pybase64", "vllm's serialization helpers, imported by vllm.multimodal"),
    "blake3": ("blake3", "vllm.utils.hashing, imported by vllm.config"),
    "openai": ("openai", "vllm.entrypoints builds pydantic models over openai.types.chat when the V2 runner imports"),
    "jiter": ("jiter", "openai's dependency (compiled)"),
    "sniffio": ("sniffio", "openai's dependency"),
    # openai's dependencies the GPU machine may already have (huggingface_hub brings them):
    # installed there only where missing.
    "anyio": ("anyio", "openai's dependency"),
    "httpx2": ("httpx2", "openai's dependency"),
    "httpcore2": ("httpcore2", "httpx2's dependency"),
    "h11": ("h11", "httpcore2's dependency"),
    "idna": ("idna", "httpx2's dependency"),
    "truststore": ("truststore", "httpx2's dependency"),
    "urllib3": ("urllib3", "vllm.utils.network_utils parses URLs with it (imported by parallel_state)"),
}


def record_hash(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it: `sha256=` and urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def installed_vllm() -> tuple[Path, Path]:
    """The site-packages folder holding vLLM and its dist-info folder; refuses any version but 0.33.0."""
    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        sys.exit("vllm_bundle: vLLM is not installed in this Python (run `make venv`, then .venv/bin/python)")
    if dist.version != VLLM_VERSION:
        sys.exit(f"vllm_bundle: vLLM {dist.version} is installed; the bundle is of {VLLM_VERSION}")
    site = Path(dist.locate_file(""))
    info = Path(str(dist._path))  # noqa: SLF001 - the dist-info folder, for RECORD and METADATA
    return site, info


def checked_sources(site: Path, info: Path) -> list[tuple[str, bytes]]:
    """Every `vllm/**.py` the wheel's RECORD lists, read and checked against its sha256; exits on a mismatch."""
    files, bad = [], []
    with open(info / "RECORD", newline="") as f:
        for row in csv.reader(f):
            name, digest = row[0], row[1] if len(row) > 1 else ""
            if not (name.startswith("vllm/") and name.endswith(".py")):
                continue
            path = site / name
            if not path.is_file():
                bad.append(f"{name}: missing")
                continue
            data = path.read_bytes()
            if record_hash(data) != digest:
                bad.append(f"{name}: sha256 differs from the wheel's RECORD")
                continue
            files.append((name, data))
    if bad:
        sys.exit(f"vllm_bundle: {len(bad)} source file(s) differ from the wheel: {'; '.join(bad[:5])}")
    if not files:
        sys.exit("vllm_bundle: the wheel's RECORD lists no vllm/*.py files")
    metadata = (info / "METADATA").read_bytes()
    files.append((f"vllm-{VLLM_VERSION}.dist-info/METADATA", metadata))
    return files


def extension_modules(info: Path) -> list[str]:
    """The compiled extension modules in RECORD: `vllm/_C_stable_libtorch.abi3.so` is `vllm._C_stable_libtorch`."""
    names = []
    with open(info / "RECORD", newline="") as f:
        for row in csv.reader(f):
            path = row[0]
            if path.startswith("vllm/") and (path.endswith(".so") or ".so." in path):
                folder, _, file = path.rpartition("/")
                names.append(f"{folder.replace('/', '.')}.{file.split('.')[0]}")
    return sorted(set(names))


def write_sources(files: list[tuple[str, bytes]], path: Path) -> None:
    """The files as a reproducible gzipped tarball (sorted, fixed times and owners)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
        for name, data in sorted(files):
            member = tarfile.TarInfo(name)
            member.size, member.mode, member.mtime = len(data), 0o644, 0
            tar.addfile(member, io.BytesIO(data))
    with atomic_write(path, "wb") as f:
        f.write(buffer.getvalue())


def pinned(names: list[str]) -> list[str]:
    """`name==version` at the versions installed beside vLLM; exits if one is not installed."""
    specs, missing = [], []
    for name in names:
        try:
            specs.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        sys.exit(f"vllm_bundle: not installed beside vLLM: {', '.join(missing)}")
    return specs


def download_wheels(specs: list[str], out: Path) -> None:
    """cp312 manylinux (or pure-Python) wheels of `specs`, without their dependencies, into `out`."""
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--platform", "manylinux2014_x86_64",
        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64",
        "--implementation", "cp", "--dest", str(out), *specs,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        sys.exit(f"vllm_bundle: pip download failed (is PyPI reachable?): {last[-1]}")


def manifest(out: Path, checked: int, extensions: list[str]) -> dict:
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(out.iterdir())
        if p.name != "MANIFEST.json"
    }
    wheels = {name: {"module": module, "why": why} for name, (module, why) in WHEELS.items()}
    return {
        "vllm": VLLM_VERSION, "source_files_checked": checked, "files": files, "wheels": wheels,
        "extensions": extensions,
    }  # fmt: skip


def build(out: Path = OUT) -> dict:
    site, info = installed_vllm()
    files = checked_sources(site, info)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    write_sources(files, out / SOURCES)
    download_wheels(pinned(list(WHEELS)), out)
    extensions = extension_modules(info)
    if "vllm._C_stable_libtorch" not in extensions:
        sys.exit(
            "vllm_bundle: the wheel's RECORD lists no vllm/_C_stable_libtorch*.so (vllm.platforms.cuda imports it)"
        )
    found = manifest(out, len(files) - 1, extensions)
    total = sum(f["bytes"] for f in found["files"].values())
    if total > LIMIT:
        sys.exit(f"vllm_bundle: the bundle is {total >> 20} MiB, over the {LIMIT >> 20} MiB it may take")
    with atomic_write(out / "MANIFEST.json") as f:
        f.write(json.dumps(found, indent=1) + "\n")
    return found


def check(out: Path = OUT) -> dict:
    """The bundle's MANIFEST.json, with every file checked against it; exits on a difference."""
    path = out / "MANIFEST.json"
    if not path.is_file():
        sys.exit(f"vllm_bundle: no bundle at {out} (build it: .venv/bin/python scripts/vllm_bundle.py)")
    found = json.loads(path.read_text())
    for name, entry in found["files"].items():
        p = out / name
        if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != entry["sha256"]:
            sys.exit(f"vllm_bundle: {name} is missing or differs from MANIFEST.json")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="verify an existing bundle against its manifest")
    args = parser.parse_args(argv)
    found = check(args.out) if args.check else build(args.out)
    total = sum(f["bytes"] for f in found["files"].values())
    print(f"{args.out}: {len(found['files'])} files, {total / (1 << 20):.1f} MiB")
    for name, entry in found["files"].items():
        print(f"  {name}  {entry['bytes']:>10,}  {entry['sha256'][:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
