# Set-up and entry points. `make demo` and `make test` each create .venv when needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The pinned CPU wheel first: a bare `torch` requirement must never be resolved by pip.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test,examples]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/quickstart.py --out results

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]" || echo "some peer libraries failed to install; their rows are skipped"
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) results build *.egg-info
