"""The docker backend: container settings and stream handling here; real containers where an engine answers."""

from __future__ import annotations

import struct

import pytest

from rapo_tools.sandbox import PythonSandbox, SandboxConfig, SandboxUnavailableError
from rapo_tools.sandbox.docker_backend import StdStreamDemuxer, connect, container_options
from rapo_tools.sandbox.worker import encode_frame


def _engine_answers() -> bool:
    try:
        connect(SandboxConfig(backend="docker"))
    except SandboxUnavailableError:
        return False
    return True


def test_worker_containers_are_locked_down():
    config = SandboxConfig(backend="docker", memory_mb=256, max_processes=20, docker_cpus=0.5, scratch_mb=32)
    options = container_options(config)
    assert options["network_mode"] == "none" and options["read_only"] is True
    assert options["mem_limit"] == options["memswap_limit"] == "768m"
    assert options["nano_cpus"] == 500_000_000 and options["pids_limit"] == 28
    assert options["tmpfs"] == {"/tmp": "size=32m,mode=1777"}
    assert options["cap_drop"] == ["ALL"] and "no-new-privileges" in options["security_opt"]
    assert options["user"] == "65534:65534" and options["stdin_open"] and not options["tty"]
    assert options["command"][:3] == ["python", "-I", "-c"] and "def _execute" in options["command"][3]


def test_demuxer_reassembles_frames_split_anywhere():
    messages = [{"ready": True}, {"stdout": "x" * 300, "exit_code": 0}]
    frames = b"".join(encode_frame(message) for message in messages)
    stream = b""
    for start in range(0, len(frames), 97):  # stdout chunks, interleaved with stderr noise
        chunk = frames[start:start + 97]
        stream += struct.pack(">BxxxI", 1, len(chunk)) + chunk
        stream += struct.pack(">BxxxI", 2, 5) + b"warn\n"
    for step in (1, 7, 64, len(stream)):
        demuxer, received = StdStreamDemuxer(), []
        for start in range(0, len(stream), step):
            demuxer.feed(stream[start:start + step])
            while (message := demuxer.next_message()) is not None:
                received.append(message)
        assert received == messages
        assert demuxer.stderr_tail().endswith("warn")


def test_no_engine_is_a_clear_error():
    # Without the SDK (the [docker] extra) the error says so; with it, that no engine answers.
    with pytest.raises(SandboxUnavailableError, match="no Docker engine answers|needs the Docker SDK"):
        PythonSandbox({"backend": "docker", "docker_base_url": "unix:///nonexistent/docker.sock"})


@pytest.mark.docker
@pytest.mark.skipif(not _engine_answers(), reason="no Docker engine answers on this machine")
def test_containers_run_code_and_contain_attacks():
    config = {"backend": "docker", "pool_size": 1, "preload_modules": ["math"], "timeout_s": 5, "memory_mb": 256}
    with PythonSandbox(config) as sandbox:
        assert sandbox.run_sync("x = 6\nx * 7").text == "42\n"
        assert sandbox.run_sync("import time\ntime.sleep(30)").timed_out
        network = sandbox.run_sync("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)")
        assert not network.ok
        assert not sandbox.run_sync("open('/etc/escaped', 'w')").ok
        assert not sandbox.run_sync("import os\nos.kill(os.getppid(), 9)").ok
        assert sandbox.run_sync("import os\nos.listdir('/tmp')").text == "[]\n"


class _AttachBridge:
    """Plays the engine's attach stream for a real worker process: stdin raw, stdout/stderr multiplexed."""

    def __init__(self, worker_argv: list[str]) -> None:
        import socket
        import subprocess
        import threading

        self.engine_side, self.client_side = socket.socketpair()
        self.process = subprocess.Popen(worker_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
        self.removed = False
        for target in (self._to_worker, self._from_worker):
            threading.Thread(target=target, daemon=True).start()

    def _to_worker(self) -> None:
        try:
            while data := self.engine_side.recv(65536):
                self.process.stdin.write(data)
                self.process.stdin.flush()
        except OSError:
            pass  # the worker died: its stdin is gone

    def _from_worker(self) -> None:
        import os

        try:
            while data := os.read(self.process.stdout.fileno(), 65536):
                self.engine_side.sendall(struct.pack(">BxxxI", 1, len(data)) + data)
        finally:
            self.engine_side.close()  # as the engine ends the attach stream when the container stops

    def remove(self, force: bool = False) -> None:  # the container API the worker calls on close
        self.removed = True
        self.process.kill()
        self.process.wait()


def test_docker_worker_protocol_over_a_multiplexed_socket():
    import json
    import sys

    from rapo_tools.aio import run_sync
    from rapo_tools.sandbox.docker_backend import DockerWorker, worker_settings
    from rapo_tools.sandbox.pool import WorkerLostError
    from rapo_tools.sandbox.worker import worker_source

    settings = {**worker_settings(SandboxConfig(backend="docker", preload_modules=("math",)), light=True),
                "scratch_dirs": [], "own_pid_namespace": False}  # a plain process here, not a container
    bridge = _AttachBridge([sys.executable, "-I", "-c", worker_source(), json.dumps(settings)])
    worker = DockerWorker(bridge, bridge.client_side)
    assert worker.exchange(None, 30)["ready"] is True
    message = {"code": "import math\nmath.factorial(4)", "timeout_s": 5, "max_output_bytes": 1000}
    reply = run_sync(worker.request(message, 10))
    assert reply["stdout"] == "24\n" and reply["exit_code"] == 0
    bridge.process.kill()  # the container dies: the next request reports a lost worker
    with pytest.raises(WorkerLostError):
        run_sync(worker.request(message, 5))
    assert not worker.alive and bridge.removed
