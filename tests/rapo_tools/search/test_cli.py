"""`rapo search build-index` and the reference-style scripts, run for real on a small corpus."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from rapo_cli import main
from rapo_tools.serving import free_port, serve_command

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
    command = [
        sys.executable,
        str(REPO_ROOT / "scripts/search_server.py"),
        *("--corpus_path", str(corpus), "--index_path", str(index), "--topk", "2"),
        *("--port", str(port), "--device", "cpu"),
    ]
    with serve_command(command, port) as url:
        health = httpx.get(f"{url}/health", timeout=30).json()
        assert health["passages"] == 10 and health["default_topk"] == 2
        answer = httpx.post(f"{url}/wikiSearch", json={"queries": ["Genentech lobbyist"], "topk": 1}, timeout=30)
        assert answer.json()["result"][0][0]["document"].startswith('"Evan Morris"\n')
