# `make demo` and `make test` each create or refresh .venv, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKERS ?= 2  # pytest-xdist processes: the suite took 132-143 s on 2 idle cores (2026-11-27)

.PHONY: demo test test-portable test-oldest install clean studies-smoke

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

# The suite on torch's portable CPU kernels (ATEN_CPU_CAPABILITY=default: no AVX). Other x86-64
# CPUs round floats as these, avx2 or avx512 do; a test that passes only on this machine's
# kernels (a float compared exactly with a stored value) fails here.
test-portable: $(STAMP)
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -q -n $(WORKERS)

# The suite again on the oldest versions smoothcert supports (pyproject's lower bounds, pinned in
# requirements/oldest.txt; wheels only) in a second venv, .venv-oldest, on the oldest Python.
# PYTHON_OLDEST names that interpreter, e.g. `make test-oldest PYTHON_OLDEST=/usr/bin/python3.10`;
# by default the first that runs of python3.10 on PATH and pyenv's 3.10.x builds (a pyenv shim
# on PATH fails where 3.10 is not a selected version). Measured on 2 cores (2026-11-28): the
# install 2.5 min (~2.5 GB of wheels), the suite 10.5 min (3,217 tests; other work shared the
# cores, load ~4: idle, it is nearer `make test`'s).
PYTHON_OLDEST ?= $(firstword $(shell for p in python3.10 $$(pyenv root 2>/dev/null)/versions/3.10*/bin/python3.10; \
    do "$$p" -c '' 2>/dev/null && echo "$$p" && break; done) python3.10)
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed

$(OLDEST_STAMP): pyproject.toml requirements/oldest.txt
	test -x $(OLDEST)/bin/python || $(PYTHON_OLDEST) -m venv $(OLDEST)
	$(OLDEST)/bin/python -c 'import sys; assert sys.version_info[:2] == (3, 10), \
	    f"$(OLDEST) runs Python {sys.version.split()[0]}, not 3.10: make clean, or rm -r $(OLDEST)"'
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet --only-binary=:all: \
	    -c requirements/oldest.txt -e '.[test,timm,diffusion]'
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST)/bin/python -m pytest -q -n $(WORKERS)

# Each study's --quick smoke test (a few minutes; not part of `make test`, which must pass
# without studies/).
studies-smoke: $(STAMP)
	$(BIN)/python -m pytest -q studies

clean:
	rm -rf $(VENV) $(OLDEST) runs .pytest_cache
