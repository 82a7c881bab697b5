#!/usr/bin/env bash
# vLLM 0.33's own capture path on the GPU machine, from build/vllm_bundle (scripts/vllm_bundle.py).
#
#   bash scripts/vllm_on_device.sh "$OUT/vllm"
#
# 1. checks the bundle against its MANIFEST.json;
# 2. installs into $WORK/site the bundle's wheels whose module this Python lacks
#    (pip, --no-index: nothing is fetched), and unpacks vLLM's sources into $WORK/src;
# 3. copies onto the import path only the stubs (kit/experiments/vllm/stubs) whose real package is missing;
#    vLLM's compiled extensions (MANIFEST.json's "extensions": none is carried) are stood in by
#    empty modules when kit.experiments.vllm.capture starts, before vLLM imports;
# 4. runs the import probe (probe.json, and in run.txt: each capture module, ok or what stopped it;
#    after a failure it goes on in a fresh process from the next module);
# 5. runs every scenario (python -m kit.experiments.vllm.capture --out DIR): <scenario>.pickle,
#    PROVENANCE.json, run.txt. In each scenario's process: the capture under the capture recorder
#    and the read/write recorder (phases from vLLM's breakable wrapper), the graphs against eager,
#    the read/write obligation over the dispatchable pairings and the pairings themselves against
#    eager (kit.experiments.vllm.safety), all in the snapshot's kit key. A scenario whose
#    GPUModelRunner.capture_model path fails is run again through the two managers' captures; what
#    stopped each (the step it had reached, the error, the output's last lines) is kept in
#    PROVENANCE.json, written after every scenario. About 3.5 minutes on the H200 in all.
# Ship: copy DIR's PROVENANCE.json and <scenario>.pickle files to kit/recordings/vllm/ (not probe.json,
# run.txt); KIT_VLLM_RECORDINGS=DIR pytest tests/test_vllm_recording.py checks them first.
# KIT_VLLM_SCENARIOS=a,b records only those scenarios (a run under the GPU machine's 10-minute limit).
# Exits 0 only if every scenario was recorded; whatever was had is under DIR either way.
# KIT_VLLM_RUN=plugin runs, instead of the scenarios, vLLM's estimate and capture with the kit installed as a
# vLLM plugin and turned on by KIT_CAPTURE_DIR / KIT_VLLM_PATCH alone (scripts/vllm_plugin_capture.py),
# unpatched and patched: DIR/unpatched, DIR/patched (rank0.pickle, rank0.json) and DIR/<arm>.run.json, each
# folder with its PROVENANCE.json (scripts/plugin_provenance.py): ship with cp -r DIR/. kit/recordings/vllm_plugin/.
set -u
DIR=${1:?usage: bash scripts/vllm_on_device.sh OUT_DIR}
PY=${PYTHON:-python3}
WORK=${KIT_VLLM_WORK:-/tmp/kit_vllm}
BUNDLE=${KIT_VLLM_BUNDLE:-$PWD/build/vllm_bundle}
rm -rf "$WORK/site" "$WORK/src" "$WORK/stubs"  # nothing left from an earlier run on this machine
mkdir -p "$DIR" "$WORK/site" "$WORK/src" "$WORK/stubs"

run() {
echo "== bundle: $BUNDLE"
"$PY" scripts/vllm_bundle.py --check --out "$BUNDLE" || { echo "bundle check failed"; return 2; }

echo "== wheels this Python lacks -> $WORK/site"
WHEELS=$("$PY" - "$BUNDLE" <<'EOF'
import glob, importlib.util, json, os, sys
bundle = sys.argv[1]
found = json.load(open(os.path.join(bundle, "MANIFEST.json")))
def norm(s): return s.lower().replace("-", "_")
for name, wheel in found["wheels"].items():
    if importlib.util.find_spec(wheel["module"]) is None:
        for path in glob.glob(os.path.join(bundle, "*.whl")):
            if norm(os.path.basename(path).split("-")[0]) == norm(name):
                print(path)
EOF
)
if [ -n "$WHEELS" ]; then
    echo "$WHEELS" | xargs -n1 basename
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" $WHEELS \
        || { echo "pip install of the bundle's wheels failed"; return 2; }
fi
tar -xzf "$BUNDLE"/vllm-*-py.tar.gz -C "$WORK/src" || { echo "unpacking vLLM's sources failed"; return 2; }

echo "== stubs for packages this Python lacks -> $WORK/stubs"
cp kit/experiments/vllm/stubs/_vllm_stub.py "$WORK/stubs/"
for stub in kit/experiments/vllm/stubs/*/; do
    name=$(basename "$stub")
    if ! PYTHONPATH="$WORK/site" "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$name') is None)" 2>/dev/null; then
        cp -r "$stub" "$WORK/stubs/$name"
        echo "  $name"
    fi
done

export PYTHONPATH="$WORK/site:$WORK/src:$WORK/stubs:$PWD"
export KIT_VLLM_BUNDLE="$BUNDLE" VLLM_USE_BREAKABLE_CUDAGRAPH=1 VLLM_USE_V2_MODEL_RUNNER=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} TOKENIZERS_PARALLELISM=false

if [ "${KIT_VLLM_RUN:-scenarios}" = plugin ]; then
    # The kit as a plugin (scripts/vllm_plugin_capture.py): installed, so vLLM finds its entry point, and
    # turned on by environment variables only; DIR/unpatched and DIR/patched get rank0.pickle and rank0.json.
    echo "== install the kit (its vllm.general_plugins entry point) -> $WORK/kit"
    rm -rf "$WORK/kit"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$WORK/kit" "$PWD"
    then  # no setuptools to build with: the distribution's metadata alone, which is what entry points are read from
        echo "pip could not build the kit here; writing its dist-info (METADATA, entry_points.txt) by hand"
        "$PY" - "$WORK/kit" <<'EOF'
import pathlib, sys, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
info = pathlib.Path(sys.argv[1]) / f"kit-{project['version']}.dist-info"
info.mkdir(parents=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kit\nVersion: {project['version']}\n")
groups = project["entry-points"]
(info / "entry_points.txt").write_text("".join(
    f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items()))
EOF
    fi
    export PYTHONPATH="$PYTHONPATH:$WORK/kit"
    status=0
    for arm in unpatched patched; do
        policy=""
        [ "$arm" = patched ] && policy=pr
        echo "== $arm: KIT_CAPTURE_DIR=$DIR/$arm KIT_VLLM_PATCH=$policy"
        KIT_CAPTURE_DIR="$DIR/$arm" KIT_VLLM_PATCH="$policy" VLLM_LOGGING_LEVEL=INFO \
            "$PY" scripts/vllm_plugin_capture.py || status=1
    done
    "$PY" scripts/plugin_provenance.py "$DIR" || status=1
    ls -laR "$DIR"
    return $status
fi

echo "== import probe"
"$PY" -m kit.experiments.vllm.capture --probe --out "$DIR"
probe=$?
[ "$probe" -eq 0 ] || echo "the probe says which module stopped; the capture is tried anyway"

echo "== capture, every scenario"
"$PY" -m kit.experiments.vllm.capture --out "$DIR" ${KIT_VLLM_SCENARIOS:+--scenarios "$KIT_VLLM_SCENARIOS"}
status=$?
echo "== done (exit $status); files:"
ls -la "$DIR"
return $status
}

run 2>&1 | tee "$DIR/run.txt"
exit "${PIPESTATUS[0]}"
