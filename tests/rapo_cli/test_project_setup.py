"""What a new user meets before the first command: declared dependencies, a quiet setup, a CI log that shows slow
tests, caches that ``make clean`` removes, and ``rapo envs`` with every cell filled."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_license_is_an_spdx_string_so_setuptools_does_not_warn():
    assert PROJECT["license"] == "Apache-2.0"


def test_tensorboard_is_declared_because_it_is_on_by_default_and_accelerate_is_not_because_nothing_imports_it():
    names = requirement_names(PROJECT["dependencies"])
    assert "tensorboard" in names and "accelerate" not in names
    packages = ["rapo_env", "rapo_agents", "rapo_tools", "rapo_buffers", "rapo_cli", "scripts", "benchmarks"]
    used = subprocess.run(["grep", "-rlE", r"^\s*(import|from) accelerate", *packages], cwd=ROOT, capture_output=True,
                          text=True)
    assert used.stdout == ""


def test_verl_has_an_extra_with_its_light_dependencies():
    extra = requirement_names(PROJECT["optional-dependencies"]["verl"])
    assert {"verl", "tensordict", "hydra-core", "omegaconf"} <= extra


def test_the_ci_run_lists_the_slowest_tests():
    assert "--durations=15" in (ROOT / ".ci" / "run").read_text()


def test_the_environment_make_setup_built_has_every_requirement_met():
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"pip check found conflicts (run `make setup` again):\n{result.stdout}"
    assert "pip check" in (ROOT / ".ci" / "run").read_text()


def test_make_clean_removes_rapo_cache(tmp_path):
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    dry_run = subprocess.run(["make", "-n", "clean"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    command = next(line for line in dry_run.splitlines() if "RAPO_CACHE_DIR" in line)
    subprocess.run(["bash", "-c", command], env={"RAPO_CACHE_DIR": str(cache), "HOME": str(tmp_path)}, check=True)
    assert not cache.exists()


def test_envs_has_no_empty_cell():
    result = subprocess.run([sys.executable, "-m", "rapo_cli", "envs", "--json"], capture_output=True, text=True,
                            timeout=120)
    rows = json.loads(result.stdout)
    assert {row["id"] for row in rows} >= {"RAPO-Math-v0", "RAPO-QA-v0", "RAPO-Web-v0"}
    assert all(value for row in rows for value in row.values()), rows
    web = next(row for row in rows if row["id"] == "RAPO-Web-v0")
    assert "search" in web["tools"] and "browse" in web["tools"]


def test_make_setup_installs_the_local_cpu_torch_first_then_resolves_twice_with_uv():
    dry_run = subprocess.run(["make", "-n", "-B", "setup"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    torch_line = next(i for i, line in enumerate(dry_run) if "torch==" in line)  # the local wheel, or pip's
    resolves = [i for i, line in enumerate(dry_run) if "uv pip install" in line and "-e '." in line]
    assert len(resolves) == 2 and torch_line < resolves[0]  # verl's resolve is the second one
    assert not any("torch" in dry_run[i] for i in resolves)  # uv never chooses torch (it would take CUDA's)
    assert "--reinstall" not in " ".join(dry_run) and "--upgrade" not in " ".join(dry_run)
    makefile = (ROOT / "Makefile").read_text()
    assert "unsafe-best-match" in makefile and "pip\", \"config\", \"list\"" in makefile
