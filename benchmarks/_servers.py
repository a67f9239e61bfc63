"""Helpers of the service benchmarks: start a server script in a subprocess, build one-query request bodies, measure
what batching gives the encoder alone, load-test, and plot two modes side by side."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rapo_tools.serving import free_port, serve_command  # noqa: F401  (re-exported for the benchmarks)

script_server = serve_command
"""Run a server script and yield its URL once ``/health`` answers (`rapo_tools.serving.serve_command`)."""

SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "scripts"


def request_bodies(queries: Sequence[str], copies: int = 1) -> list[bytes]:
    """One-query bodies in the reference JSON (``/wikiSearch`` and ``/retrieve`` alike), each query ``copies``
    times in a row, encoded before the clock starts.

    With ``copies=8``, clients 0-7 send the first query at once, 8-15 the second, ...: the hybrid rollouts
    of a RAPO group retrieving with one shared context.
    """
    return [
        json.dumps({"queries": [query], "topk": 3, "return_scores": True}).encode()
        for query in queries
        for _ in range(copies)
    ]


def encoder_batching_gain(embedder, texts: Sequence[str], threads: int = 1, repeats: int = 3) -> dict[str, float]:
    """What batching alone gives the encoder, in process on ``threads`` torch threads (the servers'
    ``intra_op_threads``): ms per text in one batch of ``texts`` vs one call per text, interleaved, medians."""
    import torch

    torch.set_num_threads(threads)
    batched, single = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        embedder.encode(list(texts))
        batched.append(1000 * (time.perf_counter() - started) / len(texts))
        started = time.perf_counter()
        for text in texts:
            embedder.encode([text])
        single.append(1000 * (time.perf_counter() - started) / len(texts))
    return {
        "texts": len(texts),
        "threads": threads,
        "batched_ms_per_text": statistics.median(batched),
        "single_ms_per_text": statistics.median(single),
        "gain": statistics.median(single) / statistics.median(batched),
    }


def script_command(script: str, port: int, flags: dict[str, object], switches: Sequence[str] = ()) -> list[str]:
    """``python scripts/<script> --<flag> <value> ... --port <port> <switches>`` with this interpreter."""
    arguments = [item for flag, value in flags.items() for item in (f"--{flag}", str(value))]
    return [sys.executable, str(SCRIPTS_DIR / script), *arguments, "--port", str(port), *switches]


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


class KeepAliveConnection:
    """One raw HTTP/1.1 keep-alive connection that POSTs JSON bodies (a load-test client that costs little CPU).

    The load generator shares the machine's cores with the server under test: a general client (httpx
    spends milliseconds of CPU per request with 64 connections) would cap both modes at the client's own
    rate. This one writes prebuilt request bytes and reads ``Content-Length`` framed answers, nothing more.

    Example:
        >>> async def ask(url):
        ...     connection = await KeepAliveConnection.open(url)
        ...     status, body = await connection.post("/wikiSearch", b'{"queries": ["Oslo"]}')
        ...     connection.close()
        ...     return status
    """

    def __init__(self, host: str, reader, writer):
        self.host = host
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, url: str) -> KeepAliveConnection:
        """Connect to ``http://host:port``."""
        import asyncio
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(parts.netloc, reader, writer)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``path``; returns (status, answer body)."""
        return await self.request("POST", path, body)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Send one request and read its answer; returns (status, answer body)."""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length = 0
        for line in header.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        """Close the socket."""
        self.writer.close()


def run_load_test(
    url: str, route: str, bodies: Sequence[bytes], concurrency: int, duration_s: float, expected_hits: int
) -> dict[str, float]:
    """``concurrency`` clients, each on its own keep-alive connection, POST ``bodies`` back to back for ``duration_s``.

    A request counts when it gets a 200 whose first result list has ``expected_hits`` entries; anything else is
    a failure. Requests in flight at the deadline are awaited and counted over the whole elapsed time. The mean
    batch size is the server's over the timed requests (its ``/health`` counters before and after). Runs on
    uvloop, like the servers.
    """
    import uvloop

    return uvloop.run(_load(url, route, bodies, concurrency, duration_s, expected_hits))


async def _batches_so_far(url: str) -> int:
    import orjson

    connection = await KeepAliveConnection.open(url)
    answer = (await connection.request("GET", "/health"))[1]
    connection.close()
    return orjson.loads(answer).get("batches") or 0


async def _load(
    url: str, route: str, bodies: Sequence[bytes], concurrency: int, duration_s: float, expected_hits: int
) -> dict[str, float]:
    import asyncio

    import numpy as np
    import orjson

    latencies: list[float] = []
    failures = 0

    async def client(offset: int, deadline: float) -> None:
        # Connected inside the timed loop: a connection left idle past uvicorn's keep-alive timeout (5 s) while
        # others start up is closed by the server. Loopback connection set-up costs well under a millisecond.
        nonlocal failures
        connection = await KeepAliveConnection.open(url)
        position = offset
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            status, answer = await connection.post(route, bodies[position % len(bodies)])
            position += concurrency
            if status == 200 and len(orjson.loads(answer)["result"][0]) == expected_hits:
                latencies.append(time.perf_counter() - sent)
            else:
                failures += 1
        connection.close()

    batches_before = await _batches_so_far(url)
    started = time.perf_counter()
    await asyncio.gather(*(client(i, started + duration_s) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    batches = await _batches_so_far(url) - batches_before
    return {
        "requests": len(latencies),
        "failures": failures,
        "qps": len(latencies) / elapsed,
        "p50_ms": 1000 * float(np.percentile(latencies, 50)) if latencies else float("nan"),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else float("nan"),
        "mean_batch": (len(latencies) + failures) / batches if batches else 1.0,
    }
