"""Fixtures of the sandbox tests: one small pooled local sandbox per module, shared by its tests."""

from __future__ import annotations

import pytest

from rapo_tools.sandbox import PythonSandbox, SandboxConfig

# Small limits keep every attack bounded and the whole folder fast.
TEST_LIMITS = dict(
    timeout_s=3.0,
    cpu_s=3,
    memory_mb=256,
    max_processes=32,
    max_file_mb=4,
    scratch_mb=16,
    max_output_bytes=20_000,
)


@pytest.fixture(scope="module")
def sandbox():
    """A two-worker local sandbox with the default preloaded modules (numpy, sympy, ...)."""
    with PythonSandbox(SandboxConfig(pool_size=2, **TEST_LIMITS)) as shared:
        yield shared


@pytest.fixture(scope="module")
def single_worker_sandbox():
    """A one-worker local sandbox: consecutive calls land on the same worker, so leaks would show."""
    with PythonSandbox(SandboxConfig(pool_size=1, preload_modules=("math", "numpy"), **TEST_LIMITS)) as shared:
        yield shared


@pytest.fixture(scope="module")
def attack_sandbox():
    """The sandbox under attack: one full worker (numpy, sympy preloaded), small limits."""
    with PythonSandbox(SandboxConfig(pool_size=1, light_pool=False, **TEST_LIMITS)) as shared:
        yield shared
