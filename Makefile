# `make demo` and `make test` each create or refresh .venv, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKERS ?= 2  # pytest-xdist processes: the suite took 132-143 s on 2 idle cores (2026-11-27)

.PHONY: demo test install clean studies-smoke

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,timm,diffusion]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/smoothcert demo --out runs/demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(WORKERS)

# Each study's --quick smoke test (a few minutes; not part of `make test`, which must pass
# without studies/).
studies-smoke: $(STAMP)
	$(BIN)/python -m pytest -q studies

clean:
	rm -rf $(VENV) runs .pytest_cache
