"""The Step-Trace Buffer at run time (spec §3): schema, index, in-process retriever, service and client.

It sits above `rapo_tools` and below `rapo_env`: it knows no env, agent or trainer. Building a buffer runs
envs and experts, so that pipeline lives above them, in `rapo_agents.buffer_build`.

Typical use:

    >>> from rapo_buffers import StepTrace, StaticRetriever, Candidate
    >>> StepTrace(key="2+2?", value="<python>2+2</python> <result>\\n4\\n</result>", reward=1.0).final
    False

Build a buffer from rollouts with ``rapo buffer build``, index it with ``rapo buffer index`` and
serve it with ``rapo buffer serve``, or load your own buffer in-process with
``InProcessRetriever.from_files(buffer_jsonl, index_path)`` (what ``StepTraceRetrievalWrapper`` takes as its
``retriever``); `rapo_agents.buffer_build.defaults.default_retriever` gives the embedded default buffer.
`InProcessRetriever` is imported on first use, so ``import rapo_buffers`` stays light.
"""

from typing import Any

from rapo_buffers.candidates import Candidate, Retriever, StaticRetriever
from rapo_buffers.schema import BufferReadStats, StepTrace, read_buffer, write_buffer

__all__ = [
    "BufferReadStats",
    "Candidate",
    "InProcessRetriever",
    "Retriever",
    "StaticRetriever",
    "StepTrace",
    "read_buffer",
    "write_buffer",
]


def __getattr__(name: str) -> Any:
    if name == "InProcessRetriever":  # FAISS and the encoder load only when it is used
        from rapo_buffers.retriever import InProcessRetriever

        return InProcessRetriever
    raise AttributeError(f"module 'rapo_buffers' has no attribute {name!r}")
