# The kit's two everyday commands: `make lab` (JupyterLab on notebooks/) and
# `make test` (the whole test suite). Both create or update .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_FLAGS ?=
LAB_DIR ?= notebooks
# Jupyter refuses to run as root unless told to; containers and CI machines often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: venv lab test walkthrough recordings plain-recordings lint browser-deps screenshots vllm-bundle vllm-recordings
.PHONY: boundary-recordings mutations merged-recordings merged-spread-recordings safety-recordings

# The browser test (tests/test_browser.py) drives Debian's Chromium with playwright-core from npm;
# no browser is ever downloaded. apt needs root: CI is root, elsewhere sudo is used.
CHROMIUM ?= /usr/bin/chromium
BROWSER_DIR := tests/browser
PLAYWRIGHT_STAMP := $(BROWSER_DIR)/node_modules/.package-lock.json
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --progress-bar off -e '.[vllm,test]'
	touch $(STAMP)

# scripts/lab_config.py saves every notebook output-free and keeps checkpoints under build/.
lab: venv
	$(VENV)/bin/jupyter lab --config=$(CURDIR)/scripts/lab_config.py --notebook-dir=$(LAB_DIR) $(ROOT_FLAG) $(LAB_FLAGS)

# Two workers, each test file whole on one (its module fixtures, JupyterLab among them, start once).
TEST_WORKERS ?= 2

test: venv browser-deps
	KIT_CHROMIUM=$(CHROMIUM) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

browser-deps: $(CHROMIUM) $(PLAYWRIGHT_STAMP)

$(CHROMIUM):
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium fonts-dejavu-core

$(PLAYWRIGHT_STAMP): $(BROWSER_DIR)/package.json $(BROWSER_DIR)/package-lock.json
	cd $(BROWSER_DIR) && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund
	touch $@

# Run the browser test (screenshots of every notebook under build/screenshots/) and copy the
# root-cause notebook's control and figures to docs/root_cause.png for the README.
screenshots: venv browser-deps
	KIT_CHROMIUM=$(CHROMIUM) $(PY) -m pytest tests/test_browser.py -q
	mkdir -p docs
	cp build/screenshots/02_root_cause_control.png docs/root_cause.png
	@test $$(stat -c %s docs/root_cause.png) -le 307200 || { echo "docs/root_cause.png is over 300 KB"; exit 1; }

lint: venv
	$(VENV)/bin/ruff check kit tests scripts notebooks

# Execute every notebook headless and write its HTML under build/.
walkthrough: venv
	$(PY) scripts/walkthrough.py --out build

# Re-record the shipped H200 recordings (kit/recordings): the model-and-replay experiment, the simulator's
# fidelity corpus and the replica's experiments (needs CUDA).
recordings:
	$(PYTHON) scripts/record_fixtures.py --out kit/recordings
	$(PYTHON) scripts/record_corpus.py --out kit/recordings/corpus
	$(PYTHON) scripts/record_replica.py --out kit/recordings/replica

# Re-record the replica's safety and alternatives experiments at both presets, and the pairings and the
# reads and writes at vLLM's default presets (kit/recordings/{safety,readwrite,drafter,alternatives};
# needs CUDA). The alternatives run alone: its profile_only estimate reads the device's free memory.
safety-recordings:
	for preset in small large; do \
	  $(PYTHON) -m kit.experiments.safety_run --preset $$preset --out kit/recordings/safety && \
	  $(PYTHON) -m kit.experiments.readwrite_run --preset $$preset --out kit/recordings/readwrite && \
	  $(PYTHON) -m kit.experiments.drafter_run --preset $$preset --out kit/recordings/drafter && \
	  $(PYTHON) -m kit.experiments.alternatives --preset $$preset --out kit/recordings/alternatives || exit 1; \
	done
	for preset in h200-default gb200-default; do \
	  $(PYTHON) -m kit.experiments.safety_run --preset $$preset --out kit/recordings/safety && \
	  $(PYTHON) -m kit.experiments.readwrite_run --preset $$preset --out kit/recordings/readwrite || exit 1; \
	done

# Re-record the plain snapshots (kit/recordings/plain) from programs the kit did not write (needs CUDA).
plain-recordings:
	$(PYTHON) scripts/record_plain.py --out kit/recordings/plain

# Re-record what-if's ground truth (kit/recordings/merged): each workload as written and with stream s2 merged
# onto s1, on the real allocator (needs CUDA); scripts/whatif_vs_merged.py compares them.
merged-recordings:
	$(PYTHON) scripts/record_merged.py --out kit/recordings/merged

# The longer pairs where the default pool moves (kit/recordings/merged_spread, shipped gzipped).
merged-spread-recordings:
	$(PYTHON) scripts/record_merged.py --set spread --out kit/recordings/merged_spread

# Record only the corpus's boundary workloads (every split rule on both sides) and add their provenance (needs CUDA).
boundary-recordings:
	$(PYTHON) scripts/record_corpus.py --boundary-only --out kit/recordings/corpus

# Plant each of scripts/mutations.py's single bugs in a copy of the kit and check its tests catch it (minutes).
mutations: venv browser-deps
	KIT_CHROMIUM=$(CHROMIUM) $(PY) scripts/mutations.py

# vLLM 0.33's own capture path on a GPU machine without vLLM (docs/vllm.md): `make vllm-bundle` here builds
# build/vllm_bundle (the sources checked against the wheel, and the wheels the imports need); carry it, and
# `make vllm-recordings` there records every variant into kit/recordings/vllm.
vllm-bundle: venv
	$(PY) scripts/vllm_bundle.py

vllm-recordings:
	bash scripts/vllm_on_device.sh build/vllm_out
	mkdir -p kit/recordings/vllm
	cp build/vllm_out/*.pickle build/vllm_out/PROVENANCE.json kit/recordings/vllm/
