"""The web ``<search>`` tool: one provider chosen by config, a disk cache, rate limiting, clear errors.

Example (offline, from the reference's recorded Bing results):
    >>> from rapo_tools.web.providers.replay import ReplayProvider
    >>> import json, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "cache.json")
    >>> _ = open(path, "w").write(json.dumps({"ada lovelace": "Page 1: A mathematician.\\nPage 2: Born 1815."}))
    >>> tool = WebSearchTool(WebSearchConfig(provider="replay", replay_path=path, top_k=1))
    >>> print(tool.call("Ada Lovelace").text)
    Page 1: A mathematician.
    >>> tool.call("who is Charles Babbage").error
    'replay_miss'
    >>> tool.close()
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
import threading
from typing import Any

from rapo_tools.aio import run_sync
from rapo_tools.base import BadToolInputError, Tool, ToolResult
from rapo_tools.http_client import retry_after_listener
from rapo_tools.web.cache import SearchCache
from rapo_tools.web.providers.base import SearchProvider
from rapo_tools.web.rate_limit import RateLimiter
from rapo_tools.web.results import ResultStyle, render_results

logger = logging.getLogger(__name__)

PROVIDER_NAMES = ("bing", "brave", "replay", "local")


@dataclasses.dataclass
class WebSearchConfig:
    """How the ``<search>`` tool finds results."""

    provider: str = "bing"
    """One of ``bing``, ``brave``, ``replay``; ``local`` needs an in-process corpus, so pass a `LocalProvider`."""
    endpoint: str | None = None
    """The provider's URL; None uses the provider's public endpoint."""
    api_key_env: str | None = None
    """Environment variable with the API key; None uses the provider's default (``BING_SEARCH_V7_KEY``,
    ``BRAVE_SEARCH_API_KEY``)."""
    replay_path: str | None = None
    """The recorded cache file for ``replay`` (the reference's query -> text JSON)."""
    top_k: int = 10
    """Results shown per query (the reference shows 10)."""
    result_style: ResultStyle = "detailed"
    """``detailed`` (title, URL, snippet; what ``<browse>`` needs) or ``reference`` (``Page i: snippet`` only)."""
    cache_path: str | None = None
    """SQLite file caching live results across runs and processes; None disables the disk cache."""
    rate_per_s: float | None = None
    """Most requests per second sent to the provider's endpoint, shared by all its search tools: by every
    process that uses the same ``cache_path`` (the budget lives in that file), else by this process; a 429's
    ``Retry-After`` pauses the whole budget. None: no limit."""
    burst: int = 1
    """Requests that may start together when the rate limiter has been idle."""
    timeout_s: float = 20.0
    """Time limit of one HTTP attempt."""
    retries: int = 3
    """Extra attempts after a 429, a 5xx or a connection failure."""
    backoff_s: float = 0.5
    """Delay before the first retry; doubles at each further retry."""
    max_query_chars: int = 500
    """Longer queries are refused with a clear observation (search APIs reject them anyway)."""

    def __post_init__(self) -> None:
        if self.provider not in PROVIDER_NAMES:
            raise ValueError(f"unknown search provider {self.provider!r}; choose one of {', '.join(PROVIDER_NAMES)}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")

    @classmethod
    def from_value(cls, value: WebSearchConfig | dict[str, Any] | str | None) -> WebSearchConfig:
        """Accept a config, a dict of its fields, a provider name, or None (defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(provider=value)
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError(f"cannot build a WebSearchConfig from {type(value).__name__}")


def make_provider(config: WebSearchConfig) -> SearchProvider:
    """The provider that ``config`` names (``local`` is built from a corpus, see `LocalProvider`)."""
    options = {"timeout_s": config.timeout_s, "retries": config.retries, "backoff_s": config.backoff_s}
    if config.provider == "bing":
        from rapo_tools.web.providers.bing import BING_ENDPOINT, BING_KEY_ENV, BingProvider

        return BingProvider(config.endpoint or BING_ENDPOINT, config.api_key_env or BING_KEY_ENV, **options)
    if config.provider == "brave":
        from rapo_tools.web.providers.brave import BRAVE_ENDPOINT, BRAVE_KEY_ENV, BraveProvider

        return BraveProvider(config.endpoint or BRAVE_ENDPOINT, config.api_key_env or BRAVE_KEY_ENV, **options)
    if config.provider == "replay":
        if not config.replay_path:
            raise ValueError("the replay provider needs replay_path (e.g. the reference's search_cache.json)")
        from rapo_tools.web.providers.replay import ReplayProvider

        return ReplayProvider(config.replay_path)
    raise ValueError(
        "the local provider searches an in-process corpus: build rapo_tools.web.providers.local.LocalProvider "
        "and pass it as WebSearchTool(provider=...)"
    )


_limiters: dict[tuple[str, str, float | None, int, str | None], RateLimiter] = {}
_limiters_lock = threading.Lock()


def shared_rate_limiter(
    provider: SearchProvider, rate_per_s: float | None, burst: int, path: str | None = None
) -> RateLimiter:
    """One limiter per provider endpoint and rate: a provider's quota is per key, not per env. With ``path``
    (a SQLite file) the budget is shared with every process using that file, else only within this process."""
    key = (provider.name, provider.endpoint, rate_per_s, burst, path)
    with _limiters_lock:
        if key not in _limiters:
            _limiters[key] = RateLimiter(rate_per_s, burst, path, name=f"{provider.name} {provider.endpoint}")
        return _limiters[key]


def _open_cache(path: str) -> SearchCache | None:
    # A corrupt or unwritable cache file costs the cache, never the run.
    try:
        return SearchCache(path)
    except (sqlite3.Error, OSError) as error:
        logger.warning("search cache %s cannot be opened (%s); searching without a disk cache", path, error)
        return None


class WebSearchTool(Tool):
    """``<search> query </search>`` over a web search provider.

    Args:
        config: Provider choice and behaviour (see `WebSearchConfig`).
        provider: A ready provider (e.g. a `LocalProvider`); overrides ``config.provider``.
    """

    name = "search"

    def __init__(
        self, config: WebSearchConfig | dict[str, Any] | str | None = None, provider: SearchProvider | None = None
    ):
        self.config = WebSearchConfig.from_value(config)
        self.provider = provider if provider is not None else make_provider(self.config)
        self._cache = _open_cache(self.config.cache_path) if self.config.cache_path else None
        budget_path = self.config.cache_path if self._cache is not None else None
        self._limiter = shared_rate_limiter(self.provider, self.config.rate_per_s, self.config.burst, budget_path)

    async def search(self, query: str) -> list:
        """The normalised results of ``query`` (cached when a cache is configured)."""
        key = None
        if self._cache is not None:
            key = self._cache.key(self.provider.name, self.provider.endpoint, query, self.config.top_k)
            cached = await asyncio.to_thread(self._cache.get, key)
            if cached is not None:
                return cached
        await self._limiter.acquire()
        listening = retry_after_listener.set(self._limiter.pause)  # a 429's Retry-After pauses the whole budget
        try:
            results = await self.provider.search(query, self.config.top_k)
        finally:
            retry_after_listener.reset(listening)
        if self._cache is not None and key is not None:
            await asyncio.to_thread(self._cache.put, key, results, self.provider.name, query)
        return results

    async def _execute(self, argument: str) -> ToolResult:
        query = " ".join(argument.split())
        if not query:
            raise BadToolInputError("the <search> query is empty; write the query between <search> and </search>")
        if len(query) > self.config.max_query_chars:
            raise BadToolInputError(
                f"the query is {len(query)} characters long; the limit is {self.config.max_query_chars}. "
                "Search with a few keywords"
            )
        results = await self.search(query)
        return ToolResult(text=render_results(results, self.config.result_style), ok=True)

    def close(self) -> None:
        provider, self.provider = self.provider, None
        if provider is not None:
            run_sync(provider.aclose())
        if self._cache is not None:
            self._cache.close()
