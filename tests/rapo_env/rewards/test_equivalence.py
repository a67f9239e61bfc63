"""The math-verify worker pool: checks run side by side, and a hung worker is killed, never waited on."""

import os
import signal
import threading

import pytest

from rapo_env.rewards.equivalence import VerifierPool, default_pool_size


@pytest.fixture
def pool():
    verifiers = VerifierPool(2)
    yield verifiers
    verifiers.stop()


def hang(pool: VerifierPool) -> int:
    """Start both workers, then freeze the one lent next (as an expression stuck in C code would); its pid."""
    checks = [threading.Thread(target=pool.equivalent, args=("\\frac{1}{2}", "0.5", 30.0)) for _ in range(2)]
    for check in checks:
        check.start()
    for check in checks:
        check.join()
    assert all(worker._process is not None for worker in pool._all), "both workers should have started"
    stuck = pool._idle[-1]._process  # a stack: the last one returned is lent first
    os.kill(stuck.pid, signal.SIGSTOP)
    return stuck.pid


def test_a_hung_worker_does_not_hold_up_other_checks(pool):
    hang(pool)
    verdicts = []
    blocked = threading.Thread(target=lambda: verdicts.append(pool.equivalent("x^2", "x \\cdot x", timeout_s=10.0)))
    blocked.start()  # borrows the frozen worker and waits on it
    while len(pool._idle) != 1:
        threading.Event().wait(0.01)
    assert pool.equivalent("\\sqrt{4}", "2", timeout_s=10.0)  # the other worker answers meanwhile
    assert blocked.is_alive(), "the second check should not have waited for the hung one"
    blocked.join()
    assert verdicts == [False]


def test_a_hung_worker_is_killed_and_replaced(pool):
    pid = hang(pool)
    assert pool.equivalent("\\frac{3}{4}", "0.75", timeout_s=1.0) is False  # timed out on the frozen worker
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left behind
    assert pool.equivalent("\\frac{3}{4}", "0.75", timeout_s=5.0)  # a fresh worker takes its place


def test_pool_size_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("RAPO_VERIFY_WORKERS", "3")
    assert default_pool_size() == 3
    monkeypatch.setenv("RAPO_VERIFY_WORKERS", "many")
    with pytest.raises(ValueError, match="RAPO_VERIFY_WORKERS must be a whole number"):
        default_pool_size()
    monkeypatch.delenv("RAPO_VERIFY_WORKERS")
    assert 1 <= default_pool_size() <= 4
    with pytest.raises(ValueError, match="at least one worker"):
        VerifierPool(0)


def test_a_caller_is_served_in_turn_while_other_threads_keep_sending_slow_expressions():
    """Two threads send expressions that use their whole time limit, back to back, on a one-worker
    pool. A check that arrives after them waits for the checks already running or queued, not for
    everything the two threads send later."""
    verifiers = VerifierPool(1)
    done: list[str] = []
    lock = threading.Lock()

    def hostile() -> None:
        for _ in range(4):
            verifiers.equivalent("2", "9^{9^{9}}", timeout_s=1.0)
            with lock:
                done.append("hostile")

    try:
        assert verifiers.equivalent("1", "1.0", timeout_s=5.0)  # the worker is warm
        threads = [threading.Thread(target=hostile) for _ in range(2)]
        for thread in threads:
            thread.start()
        threading.Event().wait(0.3)  # one hostile check runs, the other waits
        assert verifiers.equivalent("\\sqrt{4}", "2", timeout_s=5.0)
        with lock:
            done.append("innocent")
        for thread in threads:
            thread.join()
    finally:
        verifiers.stop()
    assert done.index("innocent") <= 2, done

