# Two commands do all the set-up: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0
PROFILE ?= paper-machine-b
GPUS ?= 4
SSDS ?= 8

.PHONY: run test venv install install-dev lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[dev,train,serve]' $(TORCH_PIN)
	touch $@

venv: $(VENV)/.installed
install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: $(VENV)/.installed
	$(BIN)/moment plan --profile $(PROFILE) --gpus $(GPUS) --ssds $(SSDS)

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check moment tests bench

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/plan_time.py
	$(BIN)/python bench/maxflow_backends.py

clean:
	rm -rf $(VENV) build *.egg-info
