"""The official RAPO retrieval client, as written in its ``RetrieveTool``, against ``rapo buffer serve``.

`reference_retrieve` posts and parses exactly as the reference's tool does (Gross-barium938/RAPO at commit 480af9d,
``verl/workers/rollout/tools/retrieve_tool.py``): the reference JSON body, then per query the hit of highest
``reward``, whose ``document`` is spliced when the reward is positive (else the reference's fallback sentence).
"""

from __future__ import annotations

import sys

from rapo_tools.serving import free_port, serve_command

REFERENCE_FALLBACK = (
    " \n<think> Solve this problem carefully using own reasoning without tool calls. "
    "Think step by step and self-check before answering.</think>\n"
)


def reference_retrieve(response) -> str:
    """The text the reference ``RetrieveTool.execute(query)`` returns for the reply to its POST (`reference_post`)."""
    try:
        selected = []
        for retrieval in response.json().get("result", []):
            best = max(retrieval, key=lambda item: item["reward"])
            positive = best.get("reward", 0) > 0
            selected.append(best.get("document", "No retrieval results provided.") if positive else REFERENCE_FALLBACK)
        return "\n---\n".join(selected) if selected else "No retrieve results found."
    except Exception as error:  # the reference tool reports any parsing failure as its text
        return f"Error processing retrieve results: {error}"


def test_the_reference_retrieve_tool_reads_rapo_buffer_serve(scripted_buffer, reference_post):
    port = free_port()
    serve = [
        *(sys.executable, "-m", "rapo_cli", "buffer", "serve"),
        *("--corpus_path", str(scripted_buffer.corpus_path), "--index_path", str(scripted_buffer.index_path)),
        *("--port", str(port), "--device", "cpu"),
    ]
    with serve_command(serve, port) as url:
        step = reference_retrieve(reference_post(f"{url}/retrieve", scripted_buffer.traces[3].key))
    assert step in {trace.value for trace in scripted_buffer.traces if trace.reward > 0}
    assert "<" in step and "Error processing" not in step  # a tool-call step trace, spliced as is
