# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL ?= rnnlm
GPUS ?= 2
STEPS ?= 20
HOSTS ?=
MICRO ?=

.PHONY: install test demo bench bench-quick train notebooks clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[tf,dev,notebooks]"
	$(BIN)/python -c "from pesto.engine import warm_up; warm_up()"
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/python -m pytest -n 2 -q

demo: install
	$(if $(HOSTS),$(BIN)/python -m tf_patch.demo_hosts --hosts $(HOSTS),$(BIN)/python -m tf_patch.demo --gpus $(GPUS) $(if $(MICRO),--micro-batches $(MICRO)))

train: install
	$(BIN)/python -m tf_patch.demo --model $(MODEL) --gpus $(GPUS) --steps $(STEPS) $(if $(MICRO),--micro-batches $(MICRO))

notebooks: install
	$(BIN)/python notebooks/execute.py

bench: install
	$(BIN)/python -m benchmarks.run_all $(if $(PLACEMENT),--placement $(PLACEMENT))

bench-quick: install
	$(BIN)/python -m benchmarks.run_all --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
