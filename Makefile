# Set-up and entry points. `make repro` and `make test` create .venv when missing, install the pinned
# versions from requirements.lock, then run the pipeline / the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
# The venv first on PATH for the targets below (dvc, python, ruff, ampbench); the stages find it themselves
# (pipeline/python), so `.venv/bin/dvc exp run …` works outside make too.
export PATH := $(BIN):$(PATH)

.PHONY: install install-cluster repro test test-fast test-cluster test-gpu-slot lint docs params ui team-server lock clean

install: $(VENV)/.installed  ## create .venv and install the pinned versions (the first step of every target)

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

install-cluster: $(VENV)/.cluster-installed  ## add the pinned Ray (requirements-ray.lock) for `ampbench cluster repro`

$(VENV)/.cluster-installed: requirements-ray.lock $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-ray.lock
	touch $@

repro: $(VENV)/.installed  ## run the whole pipeline on params.yaml
	dvc repro

# The suite runs its files on TEST_WORKERS processes (pytest-xdist; most tests wait on subprocesses, imports and
# small models, so two workers keep two cores busy; one torch thread each, so they do not fight over the cores),
# then the tests that time speed ratios alone, on a quiet machine.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: $(VENV)/.installed  ## run the test suite (no GPU or network needed)
	OMP_NUM_THREADS=1 python -m pytest -q $(PARALLEL) -m "not timing and not cluster and not gpu_slot"
	python -m pytest -q -m timing

# A real Ray cluster on this machine (a head and a worker node, each `ray start`), the team MLflow server
# (AMPBENCH_TEAM_SERVER) and a local DVC remote: a tiny grid, and a worker stopped mid-cell (tests/test_cluster.py).
test-cluster: $(VENV)/.cluster-installed  ## the cluster tests (needs the team server: make team-server)
	python -m pytest -q -m cluster

# The GPU slot's two commands (scripts/gpu_check.sh) run dry on this CPU, on a simulated GPU machine that has only
# what the lent one has plus the wheel set: the API check, bench, pytest -m gpu, a real dvc repro, the packing.
test-gpu-slot: $(VENV)/.installed  ## the GPU slot's scripts, dry on the CPU (tests/test_gpu_slot.py; CI runs it)
	python -m pytest -q -m gpu_slot

test-fast: $(VENV)/.installed  ## unit tests only, skips the slow end-to-end ones
	OMP_NUM_THREADS=1 python -m pytest -q $(PARALLEL) -m "not slow and not timing and not cluster and not gpu_slot"

lint: $(VENV)/.installed  ## ruff: pyflakes, pycodestyle, import order, bugbear (settings in pyproject.toml)
	ruff check .

docs: $(VENV)/.docs-installed  ## build the docs site into site/ (mkdocs build --strict: a broken link or page fails)
	mkdocs build --strict

$(VENV)/.docs-installed: requirements-docs.lock $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-docs.lock
	touch $@

params: $(VENV)/.installed  ## after changing src/ampbench/config/params.py: rewrite params.yaml's comments and dvc.yaml's params lists
	ampbench sync-params

ui: $(VENV)/.installed  ## open the MLflow UI (127.0.0.1) on the pipeline's store
	ampbench ui

team-server: $(VENV)/.installed  ## PostgreSQL-backed MLflow server on 127.0.0.1:5001 (docs/operations.md, team mode)
	bash scripts/team_server.sh start

lock:  ## refresh requirements.lock from the current venv (leaving out the docs, ci and ray locks' packages)
	cat requirements-docs.lock requirements-ci.lock requirements-ray.lock | sed -n 's/^\([^#][^=]*==\).*/\1/p' > $(VENV)/.docs-names
	(echo "# Exact versions for a reproducible run (Python 3.11, x86_64 Linux). Regenerate: make lock"; \
	 $(BIN)/python -m pip freeze --exclude-editable | grep -v '^ampbench' | grep -vF -f $(VENV)/.docs-names) \
	 > requirements.lock

clean:  ## remove pipeline outputs (not the MLflow store)
	rm -rf data/prepared models reports/report.md reports/details.json reports/figures dvc_plots
