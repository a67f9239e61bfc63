"""Fixtures of the integration tests: one local Ray for the Ray rollout and TransferQueue tests of this folder."""

from __future__ import annotations

import pytest

RAY_CPUS = 2


@pytest.fixture(scope="package")
def ray_cluster():
    """A local Ray with two CPUs and no dashboard, started once for this folder's tests and shut down after them;
    each module ends the actors it started."""
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
    ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
