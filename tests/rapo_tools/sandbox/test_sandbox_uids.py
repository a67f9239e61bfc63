"""Sandbox uids (when rapo runs as root): two live sandboxes never share one, so never share a process budget.

The red team restarted workers 256 times and got a uid that a live worker still ran as: the second sandbox
then could not fork at all (``RLIMIT_NPROC`` counts processes per uid)."""

from __future__ import annotations

import os
import subprocess

import pytest

from rapo_tools.sandbox import PythonSandbox, SandboxConfig
from rapo_tools.sandbox.local_backend import UIDS_PER_PROCESS, UidAllocator
from rapo_tools.sandbox.pool import SandboxUnavailableError

from .conftest import TEST_LIMITS

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are used only when rapo runs as root")


def test_a_live_uid_is_never_handed_out_again():
    uids = UidAllocator(300_000, size=300)
    handed = [uids.acquire() for _ in range(300)]  # more than the 256 after which uids used to repeat
    assert len(set(handed)) == 300
    with pytest.raises(SandboxUnavailableError, match="300 sandbox uids"):
        uids.acquire()
    uids.release(handed[17])
    assert uids.acquire() == handed[17]


def test_each_process_draws_from_a_band_larger_than_256():
    assert UIDS_PER_PROCESS > 256


@as_root
def test_a_uid_that_a_host_process_runs_as_is_skipped():
    uids = UidAllocator(310_000, size=4)
    squatter = subprocess.Popen(["sleep", "60"], user=310_000, group=65534)
    try:
        assert uids.acquire() == 310_001
    finally:
        squatter.kill()
        squatter.wait()


@as_root
def test_workers_of_two_live_sandboxes_run_as_different_uids_and_can_both_fork():
    code = "import os, subprocess\nprint(os.getuid(), subprocess.run(['true']).returncode)"
    configs = [SandboxConfig(pool_size=1, light_pool=False, preload_modules=("math",), warmup_code="",
                             sandbox_uid_base=base, **TEST_LIMITS) for base in (320_000, 320_000 + 1)]
    with PythonSandbox(configs[0]) as first, PythonSandbox(configs[1]) as second:
        results = [first.run_sync(code), second.run_sync(code)]
    assert all(result.ok for result in results), [result.text for result in results]
    uids = [result.text.split()[0] for result in results]
    assert uids[0] != uids[1] and all(result.text.split()[1] == "0" for result in results)
