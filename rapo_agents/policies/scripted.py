"""`ScriptedPolicy`: plays fixed or rule-based turns, for tests and benchmarks.

It goes through the same token-level interface as the model backends, so the rollout
engine's masks, step boundaries and truncation are exercised without a model. Its
log-probs are 0 (each turn is certain) and its entropies 0.

`ByteTokenizer` is a model-free tokenizer (one token per UTF-8 byte, a ChatML-style
chat template) that lets a scripted policy run without any model files.

Example:
    >>> policy = ScriptedPolicy(["<python>\\nprint(1)\\n</python>", "<answer>\\\\boxed{1}</answer>"])
    >>> context = policy.tokenizer.encode("Q")
    >>> first = policy.generate([context], SamplingParams())[0]
    >>> first.text
    '<python>\\nprint(1)\\n</python>'
    >>> second = policy.generate([context + first.token_ids + policy.tokenizer.encode(" <result>1</result>")],
    ...                          SamplingParams())[0]
    >>> second.text
    '<answer>\\\\boxed{1}</answer>'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rapo_agents.policies.base import (
    Generation,
    SamplingParams,
    check_contexts,
    find_stop,
    per_context_sampling,
)

TurnRule = Callable[[str], str]
"""A rule maps the decoded context so far to the next turn's text."""


class ByteTokenizer:
    """A model-free tokenizer: token ``b + 3`` is byte ``b``; 0 = pad, 1 = bos, 2 = eos.

    Enough of the Hugging Face tokenizer interface for the rollout engine
    (``encode``, ``decode``, ``apply_chat_template``, ``eos_token_id``, ``pad_token_id``).
    """

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    eos_token = "<|im_end|>"
    offset = 3
    vocab_size = 256 + 3

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [b + self.offset for b in text.encode("utf-8")]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        data = bytearray()
        for token in token_ids:
            if token >= self.offset:
                data.append(int(token) - self.offset)
            elif not skip_special_tokens and token == self.eos_token_id:
                data.extend(self.eos_token.encode())
        return data.decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        """One unique string per id: printable ASCII bytes as themselves, others as ``<0xHH>``."""
        special = {self.pad_token_id: "<pad>", self.bos_token_id: "<s>", self.eos_token_id: self.eos_token}
        names = []
        for token in token_ids:
            byte = token - self.offset
            names.append(special.get(token) or (chr(byte) if 32 <= byte < 127 else f"<0x{byte:02X}>"))
        return names

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], tokenize: bool = False, add_generation_prompt: bool = True, **_: Any
    ) -> str | list[int]:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text


class ScriptedPolicy:
    """Plays ``turns`` in order, or asks ``rule`` for each turn.

    Args:
        turns: a fixed list of turn texts, or a `TurnRule` called with the decoded context.
            With a list, the next turn is the first one not yet found (in order) in the context,
            so the same policy serves many episodes at once; after the last, it repeats the last.
        tokenizer: any Hugging Face tokenizer; the default `ByteTokenizer` needs no model.
        end_with_eos: append an EOS token to a turn that ends without a stop string.
    """

    def __init__(
        self,
        turns: Sequence[str] | TurnRule,
        tokenizer: Any = None,
        end_with_eos: bool = True,
    ):
        if not callable(turns):
            turns = list(turns)
            if not turns:
                raise ValueError("ScriptedPolicy needs at least one turn")
        self.turns = turns
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.end_with_eos = end_with_eos
        self.name = "scripted"

    def _next_turn(self, context_text: str, stops: Sequence[str]) -> str:
        if callable(self.turns):
            return self.turns(context_text)
        position = 0
        for turn in self.turns:
            stop = find_stop(turn, stops)
            found = context_text.find(turn[: stop[0]] if stop else turn, position)
            if found < 0:
                return turn
            position = found + 1
        return self.turns[-1]

    def generate(
        self, contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        contexts = check_contexts(contexts)
        return [
            self._generate_one(context, params)
            for context, params in zip(contexts, per_context_sampling(contexts, sampling), strict=True)
        ]

    def _generate_one(self, context: list[int], params: SamplingParams) -> Generation:
        text = self._next_turn(self.tokenizer.decode(context, skip_special_tokens=True), params.stop)
        stop = find_stop(text, params.stop)
        stop_string = None
        if stop is not None:
            text, stop_string = text[: stop[0]], stop[1]
        tokens = list(self.tokenizer.encode(text, add_special_tokens=False))
        if len(tokens) > params.max_new_tokens:
            tokens, reason = tokens[: params.max_new_tokens], "length"
            stop_string = None
        elif stop_string is not None:
            reason = "stop"
        elif self.end_with_eos and len(tokens) < params.max_new_tokens:
            tokens, reason = tokens + [self.tokenizer.eos_token_id], "eos"
        else:
            reason = "length"
        n = len(tokens)
        return Generation(
            token_ids=tokens,
            text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            finish_reason=reason,
            logprobs=[0.0] * n if params.logprobs else None,
            entropies=[0.0] * n if params.entropies else None,
            top_logprobs=[[0.0] for _ in range(n)] if params.top_logprobs else None,
            stop_string=stop_string,
        )
