"""What a retriever returns, and the protocol every step-trace retriever implements.

Both the in-process `rapo_buffers.retriever.InProcessRetriever` and the HTTP
`rapo_buffers.client.RetrievalClient` implement `Retriever`, so the retrieval wrapper works with
either. `StaticRetriever` answers from a fixed table: handy for wiring tests and examples.

Example:
    >>> retriever = StaticRetriever([Candidate(value="<python>1+1</python>", reward=1.0, score=0.9)])
    >>> retriever.retrieve(["any query"], topk=1)[0][0].value
    '<python>1+1</python>'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rapo_buffers.schema import is_final_step_text


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One retrieved step trace."""

    value: str
    """The step's text (model turn plus its `` <result>...</result>``)."""
    reward: float
    """The reward of the trajectory the step comes from."""
    score: float
    """Similarity of the query to the step's key (inner product of normalised embeddings)."""
    is_final: bool = False
    """True when the step writes the final ``<answer>``."""

    @classmethod
    def from_json(cls, item: dict) -> Candidate:
        """Parse one item of the reference's ``/retrieve`` answer (``document``, ``reward``, ``score``).

        Raises:
            ValueError: when ``document`` is not a string or ``reward``/``score`` are not numbers.
        """
        if not isinstance(item, dict) or not isinstance(item.get("document"), str):
            raise ValueError(f"a retrieval result needs a string 'document', got {item!r:.200}")
        document = item["document"]
        try:
            reward = float(item.get("reward", 0.0))
            score = float(item.get("score", 0.0))
        except (TypeError, ValueError) as error:
            raise ValueError(f"bad reward or score in a retrieval result: {error}") from error
        is_final = item.get("is_final")
        return cls(
            value=document,
            reward=reward,
            score=score,
            is_final=is_final if isinstance(is_final, bool) else is_final_step_text(document),
        )


@runtime_checkable
class Retriever(Protocol):
    """Anything that maps a batch of queries to their top-k step traces, best first."""

    def retrieve(self, queries: list[str], topk: int) -> list[list[Candidate]]:
        """Return, for each query, up to ``topk`` candidates sorted by decreasing score."""
        ...


class StaticRetriever:
    """A `Retriever` that returns the same candidates (sorted by score) for every query, and logs the queries."""

    def __init__(self, candidates: Sequence[Candidate]):
        self.candidates = sorted(candidates, key=lambda candidate: -candidate.score)
        self.queries: list[str] = []

    def retrieve(self, queries: list[str], topk: int) -> list[list[Candidate]]:
        self.queries.extend(queries)
        return [list(self.candidates[:topk]) for _ in queries]
