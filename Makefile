# The two commands of the README:
#   make run    set up .venv on first use, then run the default job (ARGS="..." adds overrides)
#   make test   set up .venv on first use, then lint and run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch 2.13.0 is the CPU build these machines carry on disk; anything in the project's
# range (>=2.4,<2.15) works, e.g. TORCH=torch==2.14.1 for a CUDA build.
TORCH ?= torch==2.13.0

.PHONY: run test bench

$(BIN)/art-hydra: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

run: $(BIN)/art-hydra
	$(BIN)/art-hydra $(ARGS)

test: $(BIN)/art-hydra
	$(BIN)/ruff check art_hydra hydra_plugins conf tests bench
	$(BIN)/ruff format --check art_hydra hydra_plugins conf tests bench
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(BIN)/art-hydra
	$(BIN)/python bench/cli_rejection.py
	$(BIN)/python bench/sweep_preflight.py
	$(BIN)/python bench/engine.py
