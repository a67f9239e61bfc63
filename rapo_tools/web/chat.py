"""A small client for OpenAI-compatible ``/v1/chat/completions`` (vLLM, llama.cpp, rapo's own server, OpenAI).

Used to summarise browsed pages and to judge answers. Requests go through
`RetryingClient`: 429/5xx are retried with back-off and failures become typed errors.

Example:
    >>> client = ChatClient(ChatConfig(base_url="http://127.0.0.1:8000/v1", model="judge"))
    >>> client.config.model
    'judge'
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from typing import Any

from rapo_tools.base import ServiceUnavailableError
from rapo_tools.web.providers.base import HeaderClient


@dataclasses.dataclass
class ChatConfig:
    """Where and how to ask an OpenAI-compatible chat model."""

    base_url: str
    """The API root that ``/chat/completions`` hangs under, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str
    """The ``model`` field of each request."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding a bearer key; unset or empty sends no Authorization header (local servers)."""
    temperature: float = 0.0
    """Sampling temperature (0: the most reproducible judgements)."""
    max_tokens: int = 512
    """Longest reply."""
    timeout_s: float = 60.0
    """Time limit of one attempt."""
    retries: int = 2
    """Extra attempts after a 429, a 5xx or a connection failure."""
    backoff_s: float = 0.5
    """Delay before the first retry; doubles at each further retry."""

    @classmethod
    def from_value(cls, value: ChatConfig | dict[str, Any]) -> ChatConfig:
        return value if isinstance(value, cls) else cls(**value)


class ChatClient:
    """Sends chat-completion requests and returns the reply text."""

    def __init__(self, config: ChatConfig | dict[str, Any]):
        self.config = ChatConfig.from_value(config)
        parts = urllib.parse.urlsplit(self.config.base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL, got {self.config.base_url!r}")
        self._path = f"{parts.path}/chat/completions"
        key = os.environ.get(self.config.api_key_env or "", "").strip() if self.config.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = HeaderClient(
            f"{parts.scheme}://{parts.netloc}",
            headers,
            timeout_s=self.config.timeout_s,
            retries=self.config.retries,
            backoff_s=self.config.backoff_s,
        )

    async def complete(self, messages: list[dict[str, str]], max_tokens: int | None = None) -> str:
        """The assistant's reply to ``messages``."""
        payload = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": max_tokens or self.config.max_tokens,
        }
        answer = await self._client.post_json(self._path, payload)
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as error:
            raise ServiceUnavailableError(
                f"the chat endpoint answered without choices[0].message.content: {str(answer)[:200]}"
            ) from error
        return content if isinstance(content, str) else ""

    async def aclose(self) -> None:
        await self._client.aclose()
