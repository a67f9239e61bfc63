"""The ``<browse> url </browse>`` tool: fetch a page, extract its readable text, optionally summarise it.

Example:
    >>> tool = BrowseTool()
    >>> result = tool.call("file:///etc/passwd")
    >>> result.ok, result.error
    (False, 'bad_input')
    >>> tool.close()
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from rapo_tools.aio import run_sync
from rapo_tools.base import BadToolInputError, Tool, ToolResult
from rapo_tools.web.chat import ChatClient, ChatConfig
from rapo_tools.web.extract import PageText, extract_page
from rapo_tools.web.fetch import PageFetcher, Resolver, system_resolver
from rapo_tools.web.summarize import PageSummarizer


@dataclasses.dataclass
class BrowseConfig:
    """Limits and options of the ``<browse>`` tool."""

    max_bytes: int = 2_000_000
    """Largest download kept per page; bigger pages are cut (and marked as cut)."""
    timeout_s: float = 15.0
    """Time limit of one fetch, redirects included."""
    max_redirects: int = 5
    """Redirect hops followed before giving up."""
    allow_private: bool = False
    """Allow private/loopback/link-local addresses (tests and local mirrors need it; keep off for the open web)."""
    allowed_origins: tuple[str, ...] = ()
    """Origins (``http://127.0.0.1:8000``) browsable even though internal, e.g. the offline site."""
    max_result_chars: int = 10_000
    """Longest observation (page text or summary) shown to the model."""
    max_links: int = 20
    """Links listed under the page text, so that the agent can browse on (0 lists none)."""
    summarizer: ChatConfig | dict[str, Any] | None = None
    """An OpenAI-compatible chat endpoint that summarises each page against the question; None shows the page text."""


class BrowseTool(Tool):
    """Fetches the URL in the argument and returns the page's main text (or its summary).

    Args:
        config: Limits and options (see `BrowseConfig`).
        resolver: Host name -> addresses, for the address policy and the connection alike (the system's by default).
    """

    name = "browse"

    def __init__(self, config: BrowseConfig | dict[str, Any] | None = None, resolver: Resolver = system_resolver):
        if config is None:
            config = BrowseConfig()
        elif isinstance(config, dict):
            config = BrowseConfig(**config)
        self.config = config
        self.max_result_chars = config.max_result_chars
        # The question of the current episode: the summariser keeps what bears on it (the env sets it on reset).
        self.question = ""
        self._fetcher = PageFetcher(
            config.max_bytes,
            config.timeout_s,
            config.max_redirects,
            config.allow_private,
            tuple(config.allowed_origins),
            resolver,
        )
        self._summarizer = PageSummarizer(ChatClient(config.summarizer)) if config.summarizer is not None else None

    async def read(self, url: str) -> PageText:
        """Fetch and extract ``url`` (typed errors on failure)."""
        fetched = await self._fetcher.fetch(url)
        # Parsing a large page is CPU work; keep the portal loop free for other episodes' calls.
        return await asyncio.to_thread(extract_page, fetched, self.config.max_links)

    async def _execute(self, argument: str) -> ToolResult:
        url = argument.strip().strip("<>\"'")
        if not url:
            raise BadToolInputError("the <browse> block is empty; put one URL between <browse> and </browse>")
        if any(character.isspace() for character in url):
            raise BadToolInputError("put exactly one URL (no spaces) between <browse> and </browse>")
        page = await self.read(url)
        header = [f"URL: {page.url}"]
        if page.title:
            header.append(f"Title: {page.title}")
        if self._summarizer is not None:
            body = await self._summarizer.summarize(self.question, page.url, page.title, page.text)
            return ToolResult(text="\n".join(header + ["Summary:", body]), ok=True)
        if page.truncated:
            header.append(f"(the page is larger than {self.config.max_bytes} bytes; only its beginning was read)")
        parts = ["\n".join(header), page.text or "(the page has no readable text)"]
        if page.links and self.config.max_links:
            parts.append("Links:\n" + "\n".join(f"- {text or url} -> {url}" for text, url in page.links))
        return ToolResult(text="\n\n".join(parts), ok=True, truncated=page.truncated)

    def close(self) -> None:
        fetcher, self._fetcher = self._fetcher, None
        if fetcher is not None:
            run_sync(fetcher.aclose())
        summarizer, self._summarizer = self._summarizer, None
        if summarizer is not None:
            run_sync(summarizer.aclose())
