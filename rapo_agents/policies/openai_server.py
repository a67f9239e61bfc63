"""An OpenAI-compatible server for any rapo `Policy`: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

It lets HTTP clients (`OpenAIPolicy`, LLM-judge and summariser code, any OpenAI SDK)
talk to a local model, e.g. SmolLM2 on the CPU. Concurrent requests are micro-batched:
whatever arrives while the policy is busy goes into its next ``generate`` call.

Extensions that vLLM's server also speaks: ``top_k``, ``seed``, ``include_stop_str_in_output``,
``return_token_ids`` (the choice then carries ``token_ids``), a prompt given as token ids,
and ``stop_reason`` on each choice.

Run it:
    python -m rapo_agents.policies.openai_server --port 8000       # embedded SmolLM2 via HFPolicy

Example:
    >>> from fastapi.testclient import TestClient
    >>> from rapo_agents.policies import ScriptedPolicy
    >>> client = TestClient(create_app(ScriptedPolicy(["<answer>\\\\boxed{3}</answer>"]), model_name="scripted"))
    >>> body = {"model": "scripted", "prompt": "1+2?", "max_tokens": 64, "stop": ["</answer>"]}
    >>> client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    '<answer>\\\\boxed{3}'
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from rapo_agents.policies.base import Generation, Policy, SamplingParams

MAX_BATCH = 64


class _SamplingFields(BaseModel):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = 0
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class _Batcher:
    """Collects concurrent generation requests and runs them as one ``policy.generate`` call."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None

    async def generate(self, context: list[int], params: SamplingParams) -> Generation:
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.worker = asyncio.get_running_loop().create_task(self._run())
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((context, params, future))
        return await future

    async def _run(self) -> None:
        while True:
            items = [await self.queue.get()]
            while not self.queue.empty() and len(items) < MAX_BATCH:
                items.append(self.queue.get_nowait())
            try:
                results = await asyncio.to_thread(self.policy.generate, [i[0] for i in items], [i[1] for i in items])
            except Exception as error:  # a failing policy fails these requests, not the server
                results = [error] * len(items)
            for (_, _, future), result in zip(items, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in stops):
        raise HTTPException(400, "stop strings must be non-empty")
    return stops


def _visible_text(generation: Generation, include_stop: bool) -> str:
    """OpenAI semantics: the text ends before the stop string unless asked to keep it."""
    text = generation.text
    if generation.stop_string and not include_stop:
        at = text.rfind(generation.stop_string)
        if at >= 0:
            text = text[:at]
    return text


def _token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def create_app(policy: Policy, model_name: str = "rapo-policy", default_max_tokens: int = 256) -> FastAPI:
    """The FastAPI app serving ``policy`` under the model id ``model_name``."""
    app = FastAPI(title="rapo OpenAI-compatible policy server")
    batcher = _Batcher(policy)
    tokenizer = policy.tokenizer

    def sampling(request: _SamplingFields, max_tokens: int | None, top_logprobs: int) -> SamplingParams:
        try:
            return SamplingParams(
                temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                max_new_tokens=max_tokens or default_max_tokens, stop=_stops(request.stop),
                seed=request.seed, top_logprobs=top_logprobs,
            )
        except ValueError as error:
            raise HTTPException(400, str(error)) from error

    def check_model(request: _SamplingFields) -> None:
        if request.model not in (None, model_name):
            raise HTTPException(404, f"model {request.model!r} is not served here; use {model_name!r}")

    async def run(context: list[int], params: SamplingParams) -> Generation:
        if not context:
            raise HTTPException(400, "the prompt is empty")
        if min(context) < 0 or max(context) >= len(tokenizer):
            raise HTTPException(400, f"token ids must lie in [0, {len(tokenizer)})")
        generation = await batcher.generate(context, params)
        if generation.finish_reason == "error":
            raise HTTPException(500, generation.error or "generation failed")
        return generation

    def finish(generation: Generation) -> tuple[str, str | int | None]:
        if generation.finish_reason == "length":
            return "length", None
        if generation.stop_string:
            return "stop", generation.stop_string
        return "stop", generation.token_ids[-1] if generation.token_ids else None

    def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "rapo"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        check_model(request)
        prompts = request.prompt
        if not prompts:
            raise HTTPException(400, "the prompt is empty")
        if isinstance(prompts, str) or isinstance(prompts[0], int):
            prompts = [prompts]
        contexts = [list(tokenizer.encode(p, add_special_tokens=False)) if isinstance(p, str) else list(p)
                    for p in prompts]
        params = sampling(request, request.max_tokens or 16, request.logprobs or 0)
        generations = await asyncio.gather(*(run(context, params) for context in contexts))
        choices = []
        for index, generation in enumerate(generations):
            reason, stop_reason = finish(generation)
            text = _visible_text(generation, request.include_stop_str_in_output)
            choice: dict[str, Any] = {"index": index, "text": text,
                                      "finish_reason": reason, "stop_reason": stop_reason, "logprobs": None}
            if request.logprobs is not None:
                choice["logprobs"] = _completion_logprobs(tokenizer, generation)
            if request.return_token_ids:
                choice["token_ids"] = generation.token_ids
                choice["prompt_token_ids"] = contexts[index]
            choices.append(choice)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model_name, "choices": choices,
                "usage": usage(sum(map(len, contexts)), sum(g.num_tokens for g in generations))}

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest) -> dict[str, Any]:
        check_model(request)
        messages = [m.model_dump() for m in request.messages]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        context = list(tokenizer.encode(text, add_special_tokens=False))
        top = request.top_logprobs or (1 if request.logprobs else 0)
        generation = await run(context, sampling(request, request.max_completion_tokens or request.max_tokens, top))
        reason, stop_reason = finish(generation)
        choice: dict[str, Any] = {
            "index": 0, "finish_reason": reason, "stop_reason": stop_reason, "logprobs": None,
            "message": {"role": "assistant", "content": _visible_text(generation, request.include_stop_str_in_output)},
        }
        if request.logprobs:
            choice["logprobs"] = {"content": _chat_logprobs(tokenizer, generation, request.top_logprobs or 0)}
        if request.return_token_ids:
            choice["token_ids"] = generation.token_ids
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name, "choices": [choice], "usage": usage(len(context), generation.num_tokens)}

    return app


def _top_pairs(tokenizer: Any, generation: Generation, position: int) -> list[tuple[str, float]]:
    """The top-k (token, log-prob) pairs at ``position``; tokens as vocabulary strings, unique per id
    (decoded text would merge distinct tokens, e.g. partial UTF-8 bytes)."""
    values = (generation.top_logprobs or [[]] * (position + 1))[position]
    ids = (generation.top_token_ids or [[]] * (position + 1))[position]
    if len(ids) != len(values):
        ids = [generation.token_ids[position]] * len(values)
    to_tokens = getattr(tokenizer, "convert_ids_to_tokens", None)
    names = to_tokens(list(ids)) if to_tokens is not None else _token_strings(tokenizer, ids)
    return list(zip(names, values, strict=True))


def _completion_logprobs(tokenizer: Any, generation: Generation) -> dict[str, Any]:
    tokens = _token_strings(tokenizer, generation.token_ids)
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": generation.logprobs or [0.0] * len(tokens),
        "top_logprobs": [dict(_top_pairs(tokenizer, generation, i)) for i in range(len(tokens))],
        "text_offset": offsets,
    }


def _chat_logprobs(tokenizer: Any, generation: Generation, top: int) -> list[dict[str, Any]]:
    tokens = _token_strings(tokenizer, generation.token_ids)
    logprobs = generation.logprobs or [0.0] * len(tokens)
    return [
        {"token": token, "logprob": logprob,
         "top_logprobs": [{"token": t, "logprob": lp} for t, lp in _top_pairs(tokenizer, generation, i)[:top]]}
        for i, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True))
    ]


def main(argv: list[str] | None = None) -> int:
    """Serve a model (default: the embedded SmolLM2 through `HFPolicy`)."""
    import uvicorn

    parser = argparse.ArgumentParser(description="OpenAI-compatible server for a rapo policy")
    parser.add_argument("--model", default=None, help="HF model folder (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--model-name", default="rapo-policy", help="model id clients send")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    from rapo_agents.policies.hf import HFPolicy

    uvicorn.run(create_app(HFPolicy.from_pretrained(args.model), args.model_name), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
