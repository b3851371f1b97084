# `make demo` and `make test` each create or refresh .venv, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,timm]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/smoothcert demo --out runs/demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
