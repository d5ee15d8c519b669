# The two set-up commands (see README): `make run` starts a node, `make test` runs every test. Both set up first.
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup run test lint chaos bench image
setup:
	./scripts/setup.sh

run: setup
	.venv/bin/appliance run

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check . && .venv/bin/mypy

RUNS ?= 1000
chaos: setup
	$(PY) -m tests.chaos.run --runs $(RUNS)

bench: setup
	$(PY) -m bench.run

image: setup
	./image/build.sh
