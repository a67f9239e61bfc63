"""`rapo search build-index` and the reference-style scripts, run for real on a small corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rapo_cli import main
from rapo_tools.serving import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_build_index_then_serve_with_the_reference_script(shared_data, tmp_path, capsys):
    corpus = shared_data / "corpus/searchr1_example_corpus.jsonl"
    index = tmp_path / "example.faiss"
    assert (
        main(
            [
                "search",
                "build-index",
                "--corpus_path",
                str(corpus),
                "--index_path",
                str(index),
                "--index_type",
                "flat",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "indexed 10 passages" in capsys.readouterr().out
    meta = json.loads(Path(f"{index}.json").read_text())
    assert meta["count"] == 10 and meta["config"]["kind"] == "flat"
    assert Path(f"{index}.offsets.npy").is_file()

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    server = subprocess.Popen(
        [
            sys.executable,
            str(REPO_ROOT / "scripts/search_server.py"),
            "--corpus_path",
            str(corpus),
            "--index_path",
            str(index),
            "--topk",
            "2",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        health = _wait_for_health(url, server, deadline_s=120)
        assert health["passages"] == 10 and health["default_topk"] == 2
        answer = httpx.post(f"{url}/wikiSearch", json={"queries": ["Genentech lobbyist"], "topk": 1}, timeout=30)
        assert answer.json()["result"][0][0]["document"].startswith('"Evan Morris"\n')
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_for_health(url: str, server: subprocess.Popen, deadline_s: float) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited: {server.stderr.read().decode()[-2000:]}")
        try:
            return httpx.get(f"{url}/health", timeout=2).json()
        except httpx.TransportError:
            time.sleep(0.25)
    raise AssertionError("the server did not answer in time")
