"""What every web search provider implements, and the HTTP plumbing the keyed APIs share.

A provider turns a query into at most ``top_k`` normalised `SearchResult`s, or raises
one of `rapo_tools.base`'s typed errors (`ServiceUnavailableError`, `ToolTimeoutError`,
`BadToolInputError`, `MissingApiKeyError`, `ReplayMissError`), which the ``search``
tool turns into a clear failed observation.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import urllib.parse
from typing import Any, ClassVar

from rapo_tools.base import ServiceUnavailableError, ToolError
from rapo_tools.http_client import RetryingClient
from rapo_tools.web.results import SearchResult, clean_text


class MissingApiKeyError(ToolError):
    """The provider needs an API key and its environment variable is unset or empty."""

    kind = "missing_api_key"


class ReplayMissError(ToolError):
    """The recorded results hold nothing for this query (reported as a miss, never invented)."""

    kind = "replay_miss"


class SearchProvider(abc.ABC):
    """A source of web search results."""

    name: ClassVar[str]
    endpoint: str = ""
    """Where results come from; part of the disk-cache key so that two sources never answer for each other."""

    @abc.abstractmethod
    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        """At most ``top_k`` results for ``query``, best first."""

    async def aclose(self) -> None:  # noqa: B027 - providers without connections have nothing to release
        """Release connections; the provider may be used again afterwards."""


def read_api_key(env_var: str, provider: str) -> str:
    """The key in ``env_var``, read at call time so that a key set after start-up is picked up.

    Raises:
        MissingApiKeyError: when the variable is unset or blank.
    """
    key = os.environ.get(env_var, "").strip()
    if not key:
        raise MissingApiKeyError(
            f"no API key for the {provider} search provider: set the environment variable {env_var}"
        )
    return key


class HeaderClient(RetryingClient):
    """`RetryingClient` that sends fixed headers (the API key) with every request."""

    def __init__(self, base_url: str, headers: dict[str, str], **kwargs: Any):
        super().__init__(base_url, **kwargs)
        self._headers = headers

    def _ensure_client(self):
        client = super()._ensure_client()
        client.headers.update(self._headers)
        return client


class KeyedJsonApi:
    """GET/POST JSON to one endpoint with a key header, through `RetryingClient` (retries on 429/5xx).

    Args:
        endpoint: The full endpoint URL, e.g. ``https://api.bing.microsoft.com/v7.0/search``.
        key_header: The header that carries the key.
        key_env: The environment variable that holds the key.
        provider: The provider's name, for error messages.
        timeout_s, retries, backoff_s: Passed to `RetryingClient`.
    """

    def __init__(
        self,
        endpoint: str,
        key_header: str,
        key_env: str,
        provider: str,
        timeout_s: float,
        retries: int,
        backoff_s: float,
    ):
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"the {provider} endpoint must be an http(s) URL, got {endpoint!r}")
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.path = parts.path or "/"
        self.key_header = key_header
        self.key_env = key_env
        self.provider = provider
        self._client_options = {"timeout_s": timeout_s, "retries": retries, "backoff_s": backoff_s}
        self._client: HeaderClient | None = None
        self._client_key: str | None = None

    def _client_for(self, key: str) -> HeaderClient:
        if self._client is None or self._client_key != key:
            self._client = HeaderClient(self.origin, {self.key_header: key}, **self._client_options)
            self._client_key = key
        return self._client

    async def get(self, params: dict[str, Any]) -> Any:
        key = read_api_key(self.key_env, self.provider)
        query = urllib.parse.urlencode({name: value for name, value in params.items() if value is not None})
        return await self._client_for(key).request_json("GET", f"{self.path}?{query}")

    async def post(self, payload: Any) -> Any:
        key = read_api_key(self.key_env, self.provider)
        return await self._client_for(key).request_json("POST", self.path, payload)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


@dataclasses.dataclass(frozen=True)
class KeyedApi:
    """Where a keyed search API lives and how it takes a key.

    Example:
        >>> KeyedApi("https://search.example/api", "EXAMPLE_KEY", key_header="X-Key", max_count=20).max_count
        20
    """

    endpoint: str
    """The default search URL."""
    key_env: str
    """The default environment variable holding the key."""
    key_header: str
    """The header that carries the key."""
    max_count: int
    """The API's largest page."""


@dataclasses.dataclass(frozen=True)
class HitLayout:
    """Where a JSON answer keeps its hit list, and which keys of a hit hold the title, URL and snippet.

    Example:
        >>> layout = HitLayout(("web", "results"), title="title", url="url", snippet="description")
        >>> layout.parse({"web": {"results": [{"title": "A", "url": "u", "description": "<b>x</b>"}, 7]}}, 5, "brave")
        [SearchResult(title='A', url='u', snippet='x')]
    """

    hit_list: tuple[str, str]
    """The two keys that lead to the hit list; an answer without it has no results."""
    title: str
    url: str
    snippet: str

    def parse(self, payload: Any, top_k: int, provider: str) -> list[SearchResult]:
        """The first ``top_k`` hits of an answer; titles and snippets lose inline markup and entities.

        Raises:
            ServiceUnavailableError: when the answer is not a JSON object.
        """
        if not isinstance(payload, dict):
            raise ServiceUnavailableError(
                f"the {provider} endpoint answered {type(payload).__name__}, not a JSON object"
            )
        section = payload.get(self.hit_list[0]) or {}
        values = section.get(self.hit_list[1]) if isinstance(section, dict) else None
        if not isinstance(values, list):
            return []
        hits = [
            SearchResult(
                title=clean_text(item.get(self.title)), url=str(item.get(self.url) or ""),
                snippet=clean_text(item.get(self.snippet)),
            )
            for item in values
            if isinstance(item, dict)
        ]
        return hits[:top_k]


class KeyedSearchProvider(SearchProvider):
    """A search API reached with a key header that lists its hits in a JSON answer (Bing, Brave).

    A subclass names its `KeyedApi` and its `HitLayout`; it may add query parameters.

    Args:
        endpoint: The search URL (default: the provider's own).
        api_key_env: Environment variable holding the key (default: the provider's own).
        timeout_s, retries, backoff_s: Per-attempt time limit and retry policy on 429/5xx.
    """

    api: ClassVar[KeyedApi]
    layout: ClassVar[HitLayout]

    def __init__(
        self,
        endpoint: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 20.0,
        retries: int = 3,
        backoff_s: float = 0.5,
    ):
        self.endpoint = endpoint or self.api.endpoint
        self._api = KeyedJsonApi(self.endpoint, self.api.key_header, api_key_env or self.api.key_env, self.name,
                                 timeout_s, retries, backoff_s)

    def query_params(self, query: str, count: int) -> dict[str, Any]:
        """The GET parameters of one search."""
        return {"q": query, "count": count}

    @classmethod
    def parse(cls, payload: Any, top_k: int) -> list[SearchResult]:
        """The first ``top_k`` hits of an answer (see `HitLayout.parse`)."""
        return cls.layout.parse(payload, top_k, cls.name)

    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        payload = await self._api.get(self.query_params(query, min(top_k, self.api.max_count)))
        return self.parse(payload, top_k)

    async def aclose(self) -> None:
        await self._api.aclose()
