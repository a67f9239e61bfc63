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
    with pytest.raises(SandboxUnavailableError, match="no Docker engine answers"):
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
