"""The layers import one way (docs/architecture.md): a package never imports one above it, not even in a function.

Bottom to top: rapo_tools, rapo_buffers, rapo_env, rapo_agents, rapo_cli. ``scripts/`` and ``benchmarks/`` are
entry points: no package imports them. Every ``.py`` file is parsed, and every import statement in it (module level,
inside functions, classes, ``try`` or ``if TYPE_CHECKING`` blocks) is checked, as are string imports through
``importlib.import_module("...")`` and Gymnasium entry points (``"package.module:Class"``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["rapo_tools", "rapo_buffers", "rapo_env", "rapo_agents", "rapo_cli"]
"""Bottom to top."""
ENTRY_POINTS = ["scripts", "benchmarks"]
"""Folders that may import everything and that nothing imports."""
RANK = {package: rank for rank, package in enumerate(LAYERS)} | {folder: len(LAYERS) for folder in ENTRY_POINTS}


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``source``, at any depth, including string imports.

    Example:
        >>> imported_modules("def f():\\n    from rapo_env import core\\n")
        [(2, 'rapo_env')]
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            # "package.module:attr" entry points and import_module("package.module") strings naming a layer.
            head = text.split(":", 1)[0]
            if head.split(".")[0] in RANK and head.replace(".", "").replace("_", "").isalnum() and (
                    ":" in text or "." in head):
                found.append((node.lineno, head))
    return sorted(found)


def back_arrows(package: str, root: Path = ROOT) -> list[str]:
    """``file:line: module`` for each import in ``root/package`` of a layer above it (or of an entry point)."""
    rank = RANK[package]
    arrows = []
    for path in sorted((root / package).rglob("*.py")):
        for line, module in imported_modules(path.read_text(encoding="utf-8")):
            top = module.split(".")[0]
            if top in RANK and RANK[top] > rank or top in ENTRY_POINTS:
                arrows.append(f"{path.relative_to(root)}:{line}: imports {module}")
    return arrows


@pytest.mark.parametrize("package", LAYERS)
def test_no_layer_imports_a_layer_above_it(package):
    assert back_arrows(package) == []


def test_entry_points_are_imported_by_no_package():
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            tops = {module.split(".")[0] for _, module in imported_modules(path.read_text(encoding="utf-8"))}
            assert not tops & set(ENTRY_POINTS), path


def test_the_rule_catches_function_local_and_string_imports(tmp_path):
    """The checker itself: a lower layer importing a higher one inside a function, or by name, is reported."""
    fake = tmp_path / "rapo_tools"
    fake.mkdir()
    (fake / "bad.py").write_text(
        "import os\n"
        "def helper():\n"
        "    if True:\n"
        "        from rapo_agents.trainer import RAPOTrainer\n"
        "    return RAPOTrainer\n"
        "class Late:\n"
        "    def method(self):\n"
        "        import rapo_env.core\n"
        "ENTRY = 'rapo_cli.main:main'\n",
        encoding="utf-8")
    assert back_arrows("rapo_tools", root=tmp_path) == [
        "rapo_tools/bad.py:4: imports rapo_agents.trainer", "rapo_tools/bad.py:8: imports rapo_env.core",
        "rapo_tools/bad.py:9: imports rapo_cli.main"]


def test_same_layer_and_lower_imports_are_allowed():
    lines = imported_modules("from rapo_tools.base import Tool\nimport rapo_buffers.schema\n")
    assert [module for _, module in lines] == ["rapo_tools.base", "rapo_buffers.schema"]


def test_the_algorithm_module_imports_only_the_standard_library_and_torch():
    """`rapo_agents/rapo.py` is the paper's maths as pure functions: another trainer can copy it whole."""
    import sys

    source = (ROOT / "rapo_agents" / "rapo.py").read_text(encoding="utf-8")
    tops = {module.split(".")[0] for _, module in imported_modules(source)}
    assert tops - {"torch"} <= set(sys.stdlib_module_names), sorted(tops)


def episode_field_writes(source: str, fields: set[str]) -> list[str]:
    """``line: target`` for each assignment in ``source`` to a field of `Episode` on anything but ``self``
    (plain, augmented or annotated assignments, ``del`` and ``setattr``).

    Example:
        >>> episode_field_writes("episode.reward += 1.0\\nself.ready = []\\n", {"reward", "ready"})
        ['1: episode.reward']
    """
    writes = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and name.value in fields:
                writes.append(f"{node.lineno}: setattr(..., {name.value!r})")
        for target in targets:
            for item in ast.walk(target):  # tuple targets: a.b, c.d = ...
                if (isinstance(item, ast.Attribute) and item.attr in fields
                        and not (isinstance(item.value, ast.Name) and item.value.id == "self")):
                    writes.append(f"{item.lineno}: {ast.unparse(item)}")
    return sorted(writes, key=lambda write: int(write.split(":")[0]))


def test_only_episode_changes_an_episode():
    """docs/architecture.md: `Episode` alone changes a running episode; the engine, the scheduler, the env pool and
    the integrations (verl's agent loop, the skrl agent) call its methods (`start`, `branch`, `add_generation`,
    `add_step`, `record_outcome`, `add_observation`, `release`, ...) and never write its fields."""
    import dataclasses

    from rapo_agents.rollout.episode import Episode

    fields = {field.name for field in dataclasses.fields(Episode)}
    drivers = [*sorted((ROOT / "rapo_agents" / "rollout").glob("*.py")),
               *sorted((ROOT / "rapo_agents" / "integrations").rglob("*.py"))]
    writes = {str(path.relative_to(ROOT)): episode_field_writes(path.read_text(encoding="utf-8"), fields)
              for path in drivers if path.name != "episode.py"}
    assert {path: found for path, found in writes.items() if found} == {}


def test_the_episode_rule_catches_writes_through_any_name():
    source = "e.env = None\nother.turn, x = 1, 2\nsetattr(ep, 'reserve', [])\ndel ep.prompt\nself.env = 1\n"
    assert episode_field_writes(source, {"env", "turn", "reserve", "prompt"}) == [
        "1: e.env", "2: other.turn", "3: setattr(..., 'reserve')", "4: ep.prompt"]


def test_the_trainer_and_the_engine_stay_readable_in_one_pass():
    """Issue #28's limits: `RAPOTrainer` at most 250 lines; `trainer.py`, `config.py` and `rollout/engine.py` at
    most 450; no function over 60 lines in `trainer.py`, `rollout/` and `rapo_env/wrappers/` (`rapo.py` and the
    sandbox worker are one job each and may stay whole)."""
    trainer = ast.parse((ROOT / "rapo_agents" / "trainer.py").read_text(encoding="utf-8"))
    (trainer_class,) = [node for node in trainer.body if isinstance(node, ast.ClassDef) and node.name == "RAPOTrainer"]
    assert trainer_class.end_lineno - trainer_class.lineno + 1 <= 250
    for name in ("trainer.py", "config.py", "rollout/engine.py"):
        assert len((ROOT / "rapo_agents" / name).read_text(encoding="utf-8").splitlines()) <= 450, name
    files = [ROOT / "rapo_agents" / "trainer.py", *(ROOT / "rapo_agents" / "rollout").glob("*.py"),
             *(ROOT / "rapo_env" / "wrappers").glob("*.py")]
    long = [f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)" for path in files
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert long == []
