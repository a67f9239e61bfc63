"""Helpers of the service benchmarks: start a server script in a subprocess, and plot two modes side by side."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "scripts"


def free_port() -> int:
    """A TCP port that is free on the loopback interface right now."""
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def script_command(script: str, port: int, flags: dict[str, object], switches: Sequence[str] = ()) -> list[str]:
    """``python scripts/<script> --<flag> <value> ... --port <port> <switches>`` with this interpreter."""
    arguments = [item for flag, value in flags.items() for item in (f"--{flag}", str(value))]
    return [sys.executable, str(SCRIPTS_DIR / script), *arguments, "--port", str(port), *switches]


@contextlib.contextmanager
def script_server(command: Sequence[str], port: int, startup_timeout_s: float = 300.0) -> Iterator[str]:
    """Run a server command (which must listen on ``port``) and yield its URL once ``/health`` answers."""
    import httpx

    log = tempfile.TemporaryFile()
    process = subprocess.Popen(
        list(command),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{Path(command[1]).name} exited:\n{log.read().decode()[-2000:]}")
            try:
                httpx.get(f"{url}/health", timeout=2.0).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{Path(command[1]).name} did not start within {startup_timeout_s:.0f} s"
                    ) from None
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def plot_modes(rows: list[dict], path: Path, title: str, modes: Sequence[str], levels: Sequence[int]) -> None:
    """Grouped bars of ``qps`` per concurrency level, one bar per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(modes)
    for position, mode in enumerate(modes):
        values = [next(r["qps"] for r in rows if r["mode"] == mode and r["concurrency"] == c) for c in levels]
        offset = (position - (len(modes) - 1) / 2) * width
        axis.bar([i + offset for i in range(len(levels))], values, width=width, label=mode)
    axis.set_xticks(range(len(levels)), [str(c) for c in levels])
    axis.set_xlabel("concurrent clients")
    axis.set_ylabel("queries per second")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
