"""`ContinuousBatch`: a running decode batch of a `FastPolicy` that rows join and leave at any token.

A rollout asks for an episode's next turn as soon as its tool returns. Decoding each set of ready episodes as a
batch of its own (`Policy.generate`) lets the batch drain: rows that stop early leave a shrinking batch to the
longest one, and episodes whose tools return meanwhile wait for it. ``rapo eval`` of a checkpoint on the default
math task (100 questions, batches of 32) decoded 9.6 rows per step on average that way, and a decode step of int8
weights costs little more at 10 rows than at 1 (36 ms against about 30 ms on one core). Here a row joins at the next
step (what its context adds to the policy's prefix cache is prefilled, and its KV placed into the running cache) and
leaves the step it finishes, so the batch stays as full as the work allows.

Layout: every live row's tokens end at one shared cache column, ``written``; a row that joins is placed just
before it, and decode steps write column ``written`` for all rows. Attention reads from the first column that a
live row uses (a view, no copy), so columns that only finished rows used cost nothing; the cache is copied into
a larger one only when it is full or a joining context is longer than the columns before ``written``.

A row's tokens are those it would get in `FastPolicy.generate`: the same seeded `Row`, the same prefill through
the prefix cache, per-row int8 activations. As there, int8 results may move within int8's rounding when the
padding or the prefill split around a row changes.

Example:
    >>> from rapo_agents.policies.base import SamplingParams
    >>> policy = FastPolicy.from_pretrained()                        # doctest: +SKIP
    >>> greedy = SamplingParams(temperature=0, max_new_tokens=5)
    >>> with policy.continuous_batch() as batch:                     # doctest: +SKIP
    ...     batch.add("q1", policy.tokenizer.encode("The capital of France is"), greedy)
    ...     finished = []
    ...     while batch:
    ...         finished += batch.step()
    >>> finished[0][1].text                                          # doctest: +SKIP
    ' Paris.'
"""

from __future__ import annotations

from typing import Any

import torch

from rapo_agents.policies.base import Generation, SamplingParams, check_contexts
from rapo_agents.policies.decoding import Row, max_stop_chars, step_rows
from rapo_agents.policies.fast import CACHE_CHUNK, FastPolicy
from rapo_agents.policies.llama_decoder import KVCache


class ContinuousBatch:
    """Rows of a `FastPolicy` decoded together, joining (`add`) and leaving (`step`'s result) at any token.

    Open it with `FastPolicy.continuous_batch` as a context manager: it holds the policy's decoding threads and
    its running cache (``max_batch_size`` rows of KV) until it closes.
    """

    def __init__(self, policy: FastPolicy):
        self.policy = policy
        self.max_rows = policy.max_batch_size
        self.queued: list[tuple[Any, list[int], SamplingParams]] = []
        # One entry per live row, in cache-row order.
        self.keys: list[Any] = []
        self.rows: list[Row] = []
        self.contexts: list[list[int]] = []
        self.starts: list[int] = []
        """First cache column of each live row."""
        self.cache: KVCache | None = None
        self.written = 0
        """Next column a decode step writes (every live row's tokens end just before it)."""
        self.logits: torch.Tensor | None = None
        """``[rows, vocab]``: the logits each live row samples its next token from."""
        self.positions: torch.Tensor | None = None
        """``[rows, 1]``: the RoPE position of each live row's next token."""
        self.stop_chars = 0
        self._threads: int | None = None

    def __enter__(self) -> ContinuousBatch:
        threads = self.policy.threads
        self._threads = torch.get_num_threads()
        if threads is not None and threads != self._threads:
            torch.set_num_threads(threads)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._threads is not None and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        self.cache = self.logits = self.positions = None  # the KV of every row: gigabytes at 64 rows

    def __len__(self) -> int:
        """Rows live or waiting to join."""
        return len(self.rows) + len(self.queued)

    @property
    def free(self) -> int:
        """Rows that may still be added."""
        return self.max_rows - len(self)

    def add(self, key: Any, context: list[int], params: SamplingParams) -> None:
        """Queue ``context`` to join at the next `step`; its `Generation` comes back paired with ``key``."""
        if self.free <= 0:
            raise RuntimeError(f"the batch is full ({self.max_rows} rows): add only while `free` > 0")
        self.queued.append((key, check_contexts([context])[0], params))

    def step(self) -> list[tuple[Any, Generation]]:
        """Let the queued rows join, pick every live row's next token, and feed the ones that go on.

        Returns the rows that finished at this token (EOS, a stop string or their budget), with their keys.
        """
        with torch.inference_mode(), self.policy.throughput:
            finished = self._join() if self.queued else []
            if self.rows:
                finished += self._advance()
        self.policy.throughput.count([generation for _, generation in finished])
        return finished

    # ---- joining ---------------------------------------------------------------------------------------

    def _join(self) -> list[tuple[Any, Generation]]:
        policy = self.policy
        if not self.rows and policy.weights_changed():
            policy.repack()  # between turns of a run nothing updates the weights; a new batch may follow an update
        queued, self.queued = self.queued, []
        finished, joining = [], []
        for key, context, params in queued:
            row = Row(params, min(params.max_new_tokens, policy.max_context - len(context)), policy.device)
            if row.finish is None:
                joining.append((key, context, row))
            else:  # no budget left: nothing to decode
                finished.append((key, row.to_generation(policy.tokenizer)))
        if not joining:
            return finished
        self.stop_chars = max(self.stop_chars, max_stop_chars([row.params for _, _, row in joining]))
        prefilled, logits, _ = policy._prefill([context for _, context, _ in joining], spare=0)
        kv = [prefilled.row_kv(slot) for slot in range(len(joining))]
        longest = max(keys.shape[2] for keys, _ in kv)
        if self.cache is None or longest > self.written:
            self._move_to_new_cache(room_before=longest)
        for (key, context, row), (keys, values) in zip(joining, kv, strict=True):
            slot, start = len(self.rows), self.written - keys.shape[2]
            self.cache.valid[slot] = False  # what a row that left this slot marked
            self.cache.place(slot, start, keys, values)
            self.keys.append(key)
            self.rows.append(row)
            self.contexts.append(context)
            self.starts.append(start)
        positions = torch.tensor([[len(context)] for _, context, _ in joining], device=policy.device)
        self.logits = logits if self.logits is None else torch.cat([self.logits, logits])
        self.positions = positions if self.positions is None else torch.cat([self.positions, positions])
        return finished

    # ---- decoding ----------------------------------------------------------------------------------------

    def _advance(self) -> list[tuple[Any, Generation]]:
        policy = self.policy
        count = len(self.rows)
        every = list(range(count))
        tokens, still_live = step_rows(self.rows, every, self.logits, policy.tokenizer, policy.eos_token_ids,
                                       self.stop_chars)
        live_rows = self._live_rows()
        policy._remember(live_rows, every, still_live, self.contexts, self.rows)
        going_on = set(still_live)
        finished = [(self.keys[slot], self.rows[slot].to_generation(policy.tokenizer))
                    for slot in every if slot not in going_on]
        if len(still_live) < count:
            _, order = live_rows.keep(still_live)
            self.keys, self.rows, self.contexts, self.starts = (
                [items[old] for old in order] for items in (self.keys, self.rows, self.contexts, self.starts))
            tokens = [tokens[old] for old in order]
            if not order:
                self.logits = self.positions = None
                return finished
            self.positions = self.positions[torch.tensor(order, device=policy.device)]
        if self.written == self.cache.capacity:
            self._move_to_new_cache(room_before=0)
        first = min(self.starts)
        window = self._live_rows(first)
        step_input = torch.tensor(tokens, device=policy.device)[:, None]
        self.logits = policy.decoder.forward(step_input, self.positions, window, self.written - first,
                                             torch.ones_like(step_input, dtype=torch.bool))
        self.written += 1
        self.positions = self.positions + 1
        return finished

    def _live_rows(self, first_column: int = 0) -> KVCache:
        """A view of the live rows' cache from ``first_column`` on (writes go to the running cache)."""
        count, cache = len(self.rows), self.cache
        return KVCache(cache.keys[:, :count, :, first_column:], cache.values[:, :count, :, first_column:],
                       cache.valid[:count, first_column:])

    def _move_to_new_cache(self, room_before: int) -> None:
        """Copy the live rows (if any) into a new running cache with ``room_before`` columns before ``written``,
        `CACHE_CHUNK` more before them and `CACHE_CHUNK` free after it; the columns before the first live row's
        are left behind.

        The slack before ``written`` is for the rows that join later: an episode's next turn is longer than the
        columns its batch has written by its tool result, and without the slack most joins after a tool call
        moved the cache (a new cache is gigabytes of fresh memory: 43% of the rollouts of a training run went to
        allocating them).
        """
        old, count = self.cache, len(self.rows)
        first = min(self.starts, default=self.written)
        span = self.written - first
        written = max(span, room_before) + CACHE_CHUNK
        cache = self.policy.decoder.new_cache(self.max_rows, written + CACHE_CHUNK)
        if count:
            cache.keys[:, :count, :, written - span:written] = old.keys[:, :count, :, first:self.written]
            cache.values[:, :count, :, written - span:written] = old.values[:, :count, :, first:self.written]
            cache.valid[:count, written - span:written] = old.valid[:count, first:self.written]
        shift = written - self.written
        self.cache, self.written = cache, written
        self.starts = [start + shift for start in self.starts]
