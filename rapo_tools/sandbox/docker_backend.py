"""The ``docker`` backend: warm workers in long-lived, locked-down containers (Docker SDK).

Each worker container runs the same warm-worker program as the local backend
(`rapo_tools.sandbox.worker`) as its main process, with no network
(``network_mode="none"``), memory, CPU and pids limits, a read-only root, a size-limited
tmpfs scratch at ``/tmp``, all capabilities dropped, ``no-new-privileges`` and the
``nobody`` user. Calls are dispatched as frames over the container's attached
stdin/stdout; the engine multiplexes stdout and stderr on that stream, which
`StdStreamDemuxer` takes apart. Needs ``pip install 'rapo[docker]'`` and a running engine.

Example:
    >>> from rapo_tools.sandbox.config import SandboxConfig
    >>> options = container_options(SandboxConfig(backend="docker", memory_mb=512))
    >>> options["network_mode"], options["read_only"], options["mem_limit"]
    ('none', True, '1024m')
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from typing import Any

from rapo_tools.sandbox.config import SandboxConfig
from rapo_tools.sandbox.local_backend import sandbox_environment
from rapo_tools.sandbox.pool import PooledExecutor, SandboxUnavailableError, Worker, WorkerLostError, expect_ready
from rapo_tools.sandbox.worker import FRAME_HEADER, encode_frame, worker_source

WORKER_OVERHEAD_MB = 512
"""Container memory on top of ``memory_mb``: the warm interpreter and its preloaded modules."""

_DOCKER_HEADER = struct.Struct(">BxxxI")
_STDOUT = 1


class StdStreamDemuxer:
    """Splits Docker's multiplexed attach stream (8-byte headers) and frames the worker's stdout.

    Example:
        >>> from rapo_tools.sandbox.worker import encode_frame
        >>> frame = encode_frame({"ready": True})
        >>> demuxer = StdStreamDemuxer()
        >>> demuxer.feed(struct.pack(">BxxxI", 2, 4) + b"oops" + struct.pack(">BxxxI", 1, len(frame)) + frame[:3])
        >>> demuxer.next_message() is None
        True
        >>> demuxer.feed(frame[3:])
        >>> demuxer.next_message(), demuxer.stderr_tail()
        ({'ready': True}, 'oops')
    """

    def __init__(self) -> None:
        self._raw = bytearray()
        self._stdout = bytearray()
        self._stderr = bytearray()

    def feed(self, data: bytes) -> None:
        """Add bytes read from the attach socket (any split is fine)."""
        self._raw += data
        while len(self._raw) >= _DOCKER_HEADER.size:
            stream, length = _DOCKER_HEADER.unpack_from(self._raw)
            if len(self._raw) < _DOCKER_HEADER.size + length:
                return
            payload = bytes(self._raw[_DOCKER_HEADER.size:_DOCKER_HEADER.size + length])
            del self._raw[:_DOCKER_HEADER.size + length]
            if stream == _STDOUT:
                self._stdout += payload
            else:
                self._stderr = (self._stderr + payload)[-4096:]

    def next_message(self) -> dict[str, Any] | None:
        """The next complete protocol frame from the worker's stdout, or None."""
        if len(self._stdout) < FRAME_HEADER.size:
            return None
        (length,) = FRAME_HEADER.unpack_from(self._stdout)
        if len(self._stdout) < FRAME_HEADER.size + length:
            return None
        body = bytes(self._stdout[FRAME_HEADER.size:FRAME_HEADER.size + length])
        del self._stdout[:FRAME_HEADER.size + length]
        return json.loads(body)

    def stderr_tail(self) -> str:
        """The last bytes the worker wrote to stderr (for error messages)."""
        return self._stderr.decode("utf-8", "replace").strip()


def worker_settings(config: SandboxConfig, light: bool = False) -> dict[str, Any]:
    """Settings of a containerised worker: the container is its pid namespace and its user is unprivileged."""
    preload, warmup = config.worker_preload(light)
    return {
        "preload": list(preload),
        "warmup": warmup,
        "scratch_dirs": ["/tmp", "/dev/shm"],
        "own_pid_namespace": True,
        "drop_to": None,
        "limits": config.worker_limits(),
    }


def container_options(config: SandboxConfig, light: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``client.containers.create`` for one worker container."""
    memory = f"{int(config.memory_mb) + WORKER_OVERHEAD_MB}m"
    return {
        "image": config.docker_image,
        "command": [config.docker_python, "-I", "-c", worker_source(), json.dumps(worker_settings(config, light))],
        "stdin_open": True,
        "tty": False,
        "network_mode": "none",
        "mem_limit": memory,
        "memswap_limit": memory,
        "nano_cpus": int(config.docker_cpus * 1e9),
        "pids_limit": int(config.max_processes) + 8,
        "read_only": True,
        "tmpfs": {"/tmp": f"size={int(config.scratch_mb)}m,mode=1777"},
        "shm_size": f"{int(config.scratch_mb)}m",
        "user": "65534:65534",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "init": True,
        "environment": sandbox_environment(),
        "working_dir": "/tmp",
        "labels": {"rapo.sandbox": "worker"},
    }


class DockerWorker(Worker):
    """One worker container, reached through its attached stdin/stdout socket (blocking I/O in a thread)."""

    def __init__(self, container: Any, attached: Any) -> None:
        self.alive = True
        self._container = container
        self._attached = attached  # keeps the HTTP response (and so the socket) alive
        self._socket: socket.socket = getattr(attached, "_sock", attached)
        self._demuxer = StdStreamDemuxer()
        self._lock = threading.Lock()
        self._ready_pending = False  # the spawner reads the start-up ready message

    def exchange(self, frame: bytes | None, timeout_s: float) -> dict[str, Any]:
        """Send ``frame`` (if any) and block until the worker's next message; raises `WorkerLostError`."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            try:
                if frame is not None:
                    self._socket.sendall(frame)
                while (message := self._demuxer.next_message()) is None:
                    self._socket.settimeout(max(0.01, deadline - time.monotonic()))
                    data = self._socket.recv(65536)
                    if not data:
                        raise WorkerLostError(f"the worker container exited {self._demuxer.stderr_tail()[-300:]}")
                    self._demuxer.feed(data)
                return message
            except (OSError, ValueError) as error:
                raise WorkerLostError(f"the worker container stopped answering ({error})") from error

    async def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if not self.alive:
            raise WorkerLostError("the worker container had already stopped")
        try:
            return await asyncio.to_thread(self.call, encode_frame(message), timeout_s)
        except BaseException:
            await self.close()  # a half-finished exchange would desynchronise the protocol
            raise

    def call(self, frame: bytes, timeout_s: float) -> dict[str, Any]:
        """Send a request and return its reply, first reading the ready message that followed the previous one."""
        deadline = time.monotonic() + timeout_s
        reply = self.exchange(frame, timeout_s)
        if self._ready_pending:
            expect_ready(reply)  # the ready message came first; the reply follows
            reply = self.exchange(None, max(0.01, deadline - time.monotonic()))
        self._ready_pending = True
        return reply

    async def close(self) -> None:
        if self.alive:
            self.alive = False
            await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        try:
            self._socket.close()
            self._container.remove(force=True)
        except Exception:  # already gone, or the engine went away: nothing left to release
            pass


def connect(config: SandboxConfig) -> Any:
    """A Docker client whose engine answers; raises `SandboxUnavailableError` otherwise."""
    try:
        import docker
    except ImportError as error:
        raise SandboxUnavailableError("the docker backend needs the Docker SDK: pip install 'rapo[docker]'") from error
    try:
        client = docker.DockerClient(base_url=config.docker_base_url) if config.docker_base_url else docker.from_env()
        client.ping()
    except Exception as error:
        raise SandboxUnavailableError(f"no Docker engine answers ({type(error).__name__}: {error})") from error
    return client


class DockerExecutor(PooledExecutor):
    """Runs code in pooled worker containers.

    Raises:
        SandboxUnavailableError: at construction, when the Docker SDK is missing or no engine answers.
    """

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config, self._spawn_worker)
        self.client = connect(config)

    def _start_container(self, light: bool) -> DockerWorker:
        container = self.client.containers.create(**container_options(self.config, light))
        try:
            # Attach before starting, so that the worker's ready message cannot be missed.
            attached = container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            container.start()
        except Exception:
            container.remove(force=True)
            raise
        return DockerWorker(container, attached)

    async def _spawn_worker(self, slot: int, light: bool) -> DockerWorker:
        try:
            worker = await asyncio.to_thread(self._start_container, light)
        except Exception as error:
            raise SandboxUnavailableError(f"worker container {slot} could not start: {error}") from error
        try:
            await asyncio.to_thread(worker.exchange, None, self.config.startup_timeout_s)
        except WorkerLostError as error:
            await worker.close()
            raise SandboxUnavailableError(f"worker container {slot} did not become ready: {error}") from error
        return worker
