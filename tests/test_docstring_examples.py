"""Every ``>>>`` example in the packages' docstrings runs and shows what it says (the docs lean on them).

Each module that holds an example is one test, so ``make test`` (and ``make test-fast``) runs them all. None is
left out quietly: a module whose examples doctest cannot find fails, and one that cannot be imported fails too,
unless what it misses is an optional extra (``[ray]``, ``[skrl]``, ``[verl]``, ...), which is a skip that names
the package. An example that needs what a test machine lacks (a GPU, a downloaded model) says so itself with
``# doctest: +SKIP``.
"""

from __future__ import annotations

import doctest
import importlib
import io
import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["rapo_tools", "rapo_buffers", "rapo_env", "rapo_agents", "rapo_cli"]


def modules_with_examples(root: Path = ROOT) -> list[str]:
    """Dotted names of the package modules whose source holds a ``>>>`` example.

    Example:
        >>> "rapo_agents.config" in modules_with_examples()
        True
    """
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if ">>> " in path.read_text(encoding="utf-8"):
                parts = path.relative_to(root).with_suffix("").parts
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def import_or_skip_extra(name: str):
    """The module; a skip naming the missing package when an optional extra is not installed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if not missing or missing in PACKAGES:
            raise
        pytest.skip(f"{name} needs {missing}, an optional extra that is not installed")


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    module = import_or_skip_extra(name)
    tests = [test for test in doctest.DocTestFinder().find(module) if test.examples]
    assert tests, f"{name} has '>>> ' in its source, but doctest finds no example in its docstrings"
    output = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    # The examples make scratch folders with tempfile (one points RAPO_CACHE_DIR at one and fills it with a
    # converted model, 0.5 GB): they go under this test's tmp_path, which pytest removes, and the environment
    # the examples change is put back, so nothing leaks into /tmp or into the tests that follow.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    environment = dict(os.environ)
    try:
        for test in tests:
            runner.run(test, out=output.write)
    finally:
        os.environ.clear()
        os.environ.update(environment)
    assert runner.failures == 0, output.getvalue()
