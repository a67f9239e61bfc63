"""`OpenAIPolicy`: any OpenAI-compatible ``/v1/completions`` endpoint (vLLM, SGLang, llama.cpp server, ...).

For evaluation, and for collecting off-policy traces from a stronger model. Token in:
contexts are sent as token-id prompts when the server accepts them (vLLM, SGLang and
rapo's own server do), else as text. Token out: the server's ``token_ids`` when it
returns them (``return_token_ids``), else the text tokenized locally. Log-probs and
top-k log-probs come back when the server returns them; entropies are then the top-k
entropy (``entropy_kind="top_k"``), never the full-vocabulary one.

Requests run concurrently (at most ``concurrency`` at once) on rapo's portal event loop,
with a timeout each, under rapo's one retry policy (`rapo_tools.http_client.RetryPolicy`):
connection failures, 408, 429 and 5xx are retried, after the server's ``Retry-After`` when it
sends one; a generation that timed out is not sent again (the server may still be generating it,
and bills it). A request that still fails yields ``Generation(finish_reason="error")``, not an
exception, so one bad request never ends a rollout.

Example:
    >>> policy = OpenAIPolicy("http://127.0.0.1:8000/v1", tokenizer="path/to/tokenizer")  # doctest: +SKIP
    >>> policy.generate([policy.tokenizer.encode("Hi")], SamplingParams(max_new_tokens=8))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx

from rapo_agents.policies.base import (
    Generation,
    SamplingParams,
    check_contexts,
    find_stop,
    per_context_sampling,
    top_k_entropy,
)
from rapo_tools.aio import on_portal, run_sync
from rapo_tools.http_client import RetryPolicy


class OpenAIPolicy:
    """A policy behind an OpenAI-compatible completions API.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        tokenizer: the served model's tokenizer (object or HF folder); the rollout engine needs it.
        model: model id to request (default: the first of ``/models``).
        api_key: sent as a bearer token when given.
        timeout_s: per-request timeout.
        max_retries: retries after the first attempt (connection errors, 408/429/5xx; never a timed-out generation).
        backoff_s: first back-off; doubles each retry, with jitter (a ``Retry-After`` answer sets the wait instead).
        concurrency: most requests in flight.
        token_in: ``auto`` (token ids, falling back to text when the server refuses), ``ids`` or ``text``.
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        concurrency: int = 16,
        token_in: str = "auto",
    ):
        if token_in not in ("auto", "ids", "text"):
            raise ValueError(f"token_in must be auto, ids or text, not {token_in!r}")
        if concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError("concurrency must be >= 1, max_retries >= 0 and timeout_s > 0")
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.retry_policy = RetryPolicy(retries=max_retries, backoff_s=backoff_s)
        self.concurrency = concurrency
        self.token_in = token_in
        self.name = f"openai:{model or base_url}"
        self._client: httpx.AsyncClient | None = None

    # ---- public -------------------------------------------------------------------------------------

    def generate(
        self, contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        contexts = check_contexts(contexts)
        return run_sync(self.agenerate(contexts, per_context_sampling(contexts, sampling)))

    async def agenerate(self, contexts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """The async form of `generate` (runs on the portal loop, whoever awaits it)."""
        return await on_portal(self._generate_all(contexts, params))

    def close(self) -> None:
        """Close the HTTP client."""
        client, self._client = self._client, None
        if client is not None:
            run_sync(client.aclose())

    # ---- internals -------------------------------------------------------------------------------------

    async def _generate_all(self, contexts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers)
        if self.model is None:
            self.model = await self._first_model()
        semaphore = asyncio.Semaphore(self.concurrency)

        async def one(context: list[int], p: SamplingParams) -> Generation:
            async with semaphore:
                try:
                    return await self._complete(context, p)
                except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as error:
                    return Generation(token_ids=[], text="", finish_reason="error",
                                      error=f"{type(error).__name__}: {error}")

        return list(await asyncio.gather(*(one(c, p) for c, p in zip(contexts, params, strict=True))))

    async def _first_model(self) -> str | None:
        try:
            response = await self._post_or_get("GET", "/models", None)
            return response.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return None  # servers that serve one model accept requests without a model id

    async def _post_or_get(self, method: str, path: str, body: dict[str, Any] | None) -> httpx.Response:
        """One request under the retry policy; raises ``httpx.HTTPStatusError`` on a final bad status."""
        response = await self.retry_policy.send(self._client, method, self.base_url + path, json=body)
        response.raise_for_status()
        return response

    def _body(self, context: list[int], p: SamplingParams, as_ids: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": context if as_ids else self.tokenizer.decode(context, skip_special_tokens=False),
            "max_tokens": p.max_new_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "include_stop_str_in_output": True,
            "return_token_ids": True,
        }
        if self.model:
            body["model"] = self.model
        if p.stop:
            body["stop"] = list(p.stop)
        if p.top_k > 0:
            body["top_k"] = p.top_k
        if p.seed is not None:
            body["seed"] = p.seed
        if p.logprobs or p.top_logprobs:
            body["logprobs"] = max(1, p.top_logprobs)
        return body

    async def _complete(self, context: list[int], p: SamplingParams) -> Generation:
        as_ids = self.token_in != "text"
        try:
            response = await self._post_or_get("POST", "/completions", self._body(context, p, as_ids))
        except httpx.HTTPStatusError as error:
            if not (self.token_in == "auto" and as_ids and error.response.status_code in (400, 422)):
                raise
            self.token_in = "text"  # this server takes text prompts only; remember
            response = await self._post_or_get("POST", "/completions", self._body(context, p, False))
        return self._parse(response.json()["choices"][0], p)

    def _parse(self, choice: dict[str, Any], p: SamplingParams) -> Generation:
        text = choice.get("text") or ""
        stop_reason = choice.get("stop_reason")
        if choice.get("finish_reason") == "stop" and isinstance(stop_reason, str) and not text.endswith(stop_reason):
            text += stop_reason  # a server that ignored include_stop_str_in_output
        hit = find_stop(text, p.stop) if p.stop else None
        if hit is not None:
            text = text[: hit[0]]
        token_ids = choice.get("token_ids")
        from_server = isinstance(token_ids, list)
        if not from_server:
            token_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        logprobs_block = choice.get("logprobs") or {}
        logprobs = logprobs_block.get("token_logprobs")
        tops = logprobs_block.get("top_logprobs")
        if not (from_server and logprobs and len(logprobs) == len(token_ids)):
            logprobs, tops = None, None  # they would not line up with the tokens
        top_values = [sorted((tops[i] or {}).values(), reverse=True) for i in range(len(token_ids))] if tops else None
        if choice.get("finish_reason") == "length":
            reason = "length"
        else:
            reason = "stop" if hit is not None else "eos"
        return Generation(
            token_ids=[int(t) for t in token_ids],
            text=text,
            finish_reason=reason,
            logprobs=[float(lp if lp is not None else 0.0) for lp in logprobs] if logprobs and p.logprobs else None,
            entropies=[top_k_entropy(v) for v in top_values] if top_values and p.entropies else None,
            top_logprobs=[v[: p.top_logprobs] for v in top_values] if top_values and p.top_logprobs else None,
            stop_string=hit[1] if hit is not None else None,
            entropy_kind="top_k",
        )
