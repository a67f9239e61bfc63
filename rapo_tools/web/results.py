"""The normalised shape of one web search hit, and how a list of hits is shown to the model.

Every provider (Bing, Brave, replay, local) returns `SearchResult`s; `render_results`
turns them into the observation text.

Example:
    >>> hits = [SearchResult(title="Ada Lovelace", url="https://en.wikipedia.org/wiki/Ada_Lovelace",
    ...                      snippet="English mathematician.")]
    >>> print(render_results(hits, style="reference"))
    Page 1: English mathematician.
    >>> print(render_results(hits, style="detailed"))
    Page 1: Ada Lovelace
    URL: https://en.wikipedia.org/wiki/Ada_Lovelace
    English mathematician.
"""

from __future__ import annotations

import dataclasses
import html
import re
from typing import Literal

ResultStyle = Literal["reference", "detailed"]

NO_RESULTS_TEXT = "No search results found."
"""What the reference tool (and its recorded cache) says for an empty result list."""

_TAG = re.compile(r"</?[a-zA-Z][^>]*>")
_SPACE = re.compile(r"\s+")


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """One search hit, normalised across providers."""

    title: str
    """Page title ("" when the provider does not give one, e.g. replayed snippets)."""
    url: str
    """Page address ("" when unknown)."""
    snippet: str
    """The provider's text excerpt of the page."""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SearchResult:
        return cls(title=str(data.get("title", "")), url=str(data.get("url", "")), snippet=str(data.get("snippet", "")))


def clean_text(text: object) -> str:
    """Plain one-line text from a provider field: inline markup (Brave's ``<strong>``) and entities removed."""
    if text is None:
        return ""
    return _SPACE.sub(" ", html.unescape(_TAG.sub("", str(text)))).strip()


def render_results(results: list[SearchResult], style: ResultStyle = "detailed") -> str:
    """The observation text for ``results``.

    ``reference`` is the reference tool's format (``Page i: snippet`` lines, what its cache holds);
    ``detailed`` adds each page's title and URL, which an agent needs in order to ``<browse>`` a hit.
    """
    if style not in ("reference", "detailed"):
        raise ValueError(f"unknown result style {style!r}; use 'reference' or 'detailed'")
    if not results:
        return NO_RESULTS_TEXT
    lines = []
    for number, hit in enumerate(results, start=1):
        if style == "reference" or not (hit.title or hit.url):
            lines.append(f"Page {number}: {hit.snippet}")
            continue
        block = [f"Page {number}: {hit.title or hit.url}"]
        if hit.url:
            block.append(f"URL: {hit.url}")
        if hit.snippet:
            block.append(hit.snippet)
        lines.append("\n".join(block))
    return "\n".join(lines) if style == "reference" else "\n\n".join(lines)
