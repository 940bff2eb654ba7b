# ckpt-sidecar: `make run` starts the daemon on the defaults, `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck unit venv clean demo

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --silent
	touch node_modules/.installed

run: $(STAMP)
	mkdir -p checkpoints
	$(BIN)/ckpt-sidecar run

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) $(if $(wildcard package.json),node_modules/.installed)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PATH="$(CURDIR)/$(BIN):$(CURDIR)/node_modules/.bin:$$PATH" $(BIN)/pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=20

clean:
	rm -rf $(VENV) node_modules .ckpt-remote

# A training job loses its machine to a (simulated) preemption notice and finishes on another,
# bit for bit: examples/demo.py tells the story in about a minute. Installs PyTorch if missing.
demo: $(STAMP)
	$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/pip install --quiet torch==2.13.0 numpy
	$(BIN)/python examples/demo.py
