"""What every web search provider implements, and the HTTP plumbing the keyed APIs share.

A provider turns a query into at most ``top_k`` normalised `SearchResult`s, or raises
one of `rapo_tools.base`'s typed errors (`ServiceUnavailableError`, `ToolTimeoutError`,
`BadToolInputError`, `MissingApiKeyError`, `ReplayMissError`), which the ``search``
tool turns into a clear failed observation.
"""

from __future__ import annotations

import abc
import os
import urllib.parse
from typing import Any, ClassVar

from rapo_tools.base import ToolError
from rapo_tools.http_client import RetryingClient
from rapo_tools.web.results import SearchResult


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
