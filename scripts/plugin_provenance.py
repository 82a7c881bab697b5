"""Write the PROVENANCE.json files of a plugin run, so that its folder ships as it is.

    python scripts/plugin_provenance.py DIR        # run by KIT_VLLM_RUN=plugin bash scripts/vllm_on_device.sh DIR

`KIT_VLLM_RUN=plugin bash scripts/vllm_on_device.sh DIR` leaves, per arm
(`unpatched`, `patched`), `DIR/ARM/rank*.pickle` and `rank*.json` (what the
plugin wrote) and `DIR/ARM.run.json` (what the capture script stood in). This
stamps each arm's folder with the GPU, torch, CUDA and vLLM of its ranks'
manifests, the date, the command and the sha256 of every file, and `DIR`
itself likewise for the run files. Ship with `cp -r DIR/. kit/recordings/vllm_plugin/`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.record.provenance import file_hashes, write_manifest  # noqa: E402

COMMAND = (
    "KIT_VLLM_RUN=plugin bash scripts/vllm_on_device.sh OUT (scripts/vllm_plugin_capture.py, unpatched and patched)"
)
ARMS = ("unpatched", "patched")


def stamp(folder: Path, what: str, files: list[Path], manifest: dict) -> None:
    """`folder/PROVENANCE.json`: the machine and date of `manifest` (a rank's), the command, `files`' sha256."""
    keys = ("gpu", "torch", "cuda", "vllm", "date")
    write_manifest(folder, {**{k: manifest.get(k) for k in keys}, "command": COMMAND, "what": what,
                            "files": file_hashes(files)})  # fmt: skip


def main() -> int:
    out = Path(sys.argv[1])
    first = None
    for arm in ARMS:
        ranks = sorted((out / arm).glob("rank*.json"))
        if not ranks:
            print(f"plugin_provenance.py: error: no rank*.json in {out / arm}; the run wrote nothing", file=sys.stderr)
            return 1
        manifest = json.loads(ranks[0].read_text())
        first = first or manifest
        files = sorted(
            p for p in (out / arm).iterdir() if p.suffix in (".pickle", ".json") and p.stem.startswith("rank")
        )
        stamp(out / arm, f"the kit's vLLM plugin ({arm}): each rank's snapshot and its manifest", files, manifest)
    runs = [out / f"{arm}.run.json" for arm in ARMS if (out / f"{arm}.run.json").is_file()]
    stamp(out, "each arm's run file: the estimate, capture_model's figure, what was stood in", runs, first)
    return 0


if __name__ == "__main__":
    sys.exit(main())
