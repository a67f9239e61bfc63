"""The official RAPO search client, as written in its ``WikiSearchTool``, against ``rapo search serve``.

`reference_wiki_search` posts and parses exactly as the reference's tool does (Gross-barium938/RAPO at commit 480af9d,
``verl/workers/rollout/tools/wiki_search_tool.py``): a ``requests`` session with the environment's proxies
ignored, the reference JSON body, then ``document.split("\\n")`` on every hit. Its errors come back as text,
as the tool's do, so a reply it cannot parse shows up as ``Error processing search results: ...``.
"""

from __future__ import annotations

import sys

from rapo_cli import main
from rapo_tools.serving import free_port, serve_command


def reference_wiki_search(response) -> str:
    """The observation the reference ``WikiSearchTool.execute(query)`` returns for the reply to its POST
    (`reference_post`)."""
    try:
        pretty = []
        for retrieval in response.json().get("result", []):
            reference = ""
            for rank, item in enumerate(retrieval):
                content = item["document"]
                title = content.split("\n")[0]
                text = "\n".join(content.split("\n")[1:])
                reference += f"Doc {rank + 1} (Title: {title})\n{text}\n\n"
            pretty.append(reference.strip())
        return "\n---\n".join(pretty) if pretty else "No search results found."
    except Exception as error:  # the reference tool reports any parsing failure as its observation
        return f"Error processing search results: {error}"


def test_the_reference_search_tool_reads_rapo_search_serve(shared_data, tmp_path, reference_post):
    corpus = shared_data / "corpus/searchr1_example_corpus.jsonl"
    index = tmp_path / "reference.faiss"
    port = free_port()
    build = ["build-index", "--corpus_path", str(corpus), "--index_path", str(index), "--index_type", "flat"]
    serve = ["serve", "--index_path", str(index), "--port", str(port), "--device", "cpu"]
    # `rapo search build-index` in this process (its command line, without another interpreter's start-up), then
    # `rapo search serve` as its own process, as a user runs it.
    assert main(["search", *build, "--device", "cpu", "--encoder", "reference"]) == 0
    with serve_command([sys.executable, "-m", "rapo_cli", "search", *serve], port) as url:
        observation = reference_wiki_search(reference_post(f"{url}/wikiSearch", "Genentech lobbyist", topk=2))
    assert observation.startswith('Doc 1 (Title: "Evan Morris")\n'), observation
    assert "\nDoc 2 (Title: " in observation and "Error processing" not in observation
