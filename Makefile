# The kit's two everyday commands: `make lab` (JupyterLab on notebooks/) and
# `make test` (the whole test suite). Both create or update .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_FLAGS ?=
# Jupyter refuses to run as root unless told to; containers and CI machines often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: venv lab test walkthrough fixtures lint

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --progress-bar off -e '.[vllm,test]'
	touch $(STAMP)

lab: venv
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_FLAGS)

test: venv
	$(PY) -m pytest

lint: venv
	$(VENV)/bin/ruff check kit tests scripts notebooks

# Execute every notebook headless and write its HTML under build/.
walkthrough: venv
	$(PY) scripts/walkthrough.py --out build

# Re-record the real-GPU fixtures, the simulator's fidelity corpus and the replica's experiments (needs CUDA).
fixtures:
	$(PYTHON) scripts/record_fixtures.py --out tests/fixtures
	$(PYTHON) scripts/record_corpus.py --out tests/fixtures/corpus
	$(PYTHON) scripts/record_replica.py --out tests/fixtures/replica
