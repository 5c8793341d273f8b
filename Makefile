# pandastack: `make run` sets up the host and serves; `make test` is what CI runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PANDASTACK_HOME ?= /var/lib/pandastack

.PHONY: run test deps venv lint typecheck layers pytest bench clean-state cluster cluster-down

run: deps venv
	$(BIN)/pandastack setup
	$(BIN)/pandastack serve

test: deps venv lint typecheck layers pytest

HOSTS ?= 2
# N agents and one API server (127.0.0.1:8080) driving them as a pool: scripts/cluster.py.
cluster: deps venv
	$(BIN)/pandastack setup
	$(BIN)/python scripts/cluster.py up --hosts $(HOSTS)

cluster-down: venv
	$(BIN)/python scripts/cluster.py down

deps:
	@bash scripts/host-deps.sh

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

lint: venv
	$(BIN)/ruff check src tests bench

typecheck: venv
	$(BIN)/mypy
	$(BIN)/mypy bench

layers: venv
	$(BIN)/lint-imports

pytest: venv
	$(BIN)/pytest

bench: deps venv
	$(BIN)/python bench/create.py
	$(BIN)/python bench/fork.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/code.py
	$(BIN)/python bench/build.py
