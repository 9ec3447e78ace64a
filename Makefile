# The two commands a new user types: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	scripts/isolated-net $(VENV)/bin/chaos demo

test: $(STAMP)
	scripts/isolated-net $(PY) -m pytest $(PYTEST_ARGS)

# The long soaks and benchmarks the default run leaves out (pytest's -m: the last one given wins over addopts').
test-slow: $(STAMP)
	scripts/isolated-net $(PY) -m pytest -m slow $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
