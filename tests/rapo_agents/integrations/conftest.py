"""Fixtures of the integration tests: one local Ray for the Ray rollout and TransferQueue tests of this folder."""

from __future__ import annotations

import pytest

RAY_CPUS = 2


@pytest.fixture(scope="package")
def ray_cluster():
    """A local Ray with two CPUs and no dashboard, started once for this folder's tests and shut down after them;
    each module ends the actors it started."""
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
    # Ray Serve gives its HTTP proxy 5 s to start and restarts it after three misses; on a busy 2-core machine
    # (two training processes beside the tests) it took longer every time, and `serve.start` failed. The
    # variable reaches the Serve controller through the local Ray's processes, which inherit this environment.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
