"""`RolloutConfig`: how rollouts are generated, the one settings class of the engine and of the trainer's ``rollout``.

The trainer reads it as ``TrainConfig.rollout`` (YAML section ``rollout:``) and hands it to the engine unchanged;
`RolloutEngine` reads the generation and scheduling fields, whoever builds the engine reads ``backend`` and
``policy`` (`rapo_agents.backends`), and ``max_tool_calls`` is the env's limit.
The run's seed and ARPO's branching are not rollout settings: a trainer passes a seed per step to
`RolloutEngine.run`, and ``TrainConfig.arpo`` goes to the engine as ``arpo=``.

Example:
    >>> RolloutConfig(rollout_n=16, max_response_tokens=4096).rollout_n
    16
"""

from __future__ import annotations

import dataclasses

from rapo_agents.policies.base import SamplingParams
from rapo_agents.policies.llama_decoder import WEIGHT_FORMATS

ROLLOUT_BACKENDS = ("local", "ray")
"""Values of ``backend``: where rollouts run."""
POLICY_BACKENDS = ("hf", "vllm")
"""Values of ``policy``: the model backend that generates."""


@dataclasses.dataclass
class RolloutConfig:
    """How rollouts are generated.

    The defaults suit a plain `RolloutEngine`; the trainer's embedded CPU job sets a smaller budget
    (``rapo_agents.config.TrainConfig.rollout``: 4 rollouts, 512 prompt, 256 response, 128 per turn).
    """

    backend: str = "local"
    """Where rollouts run: ``local`` (this process) or ``ray`` (rollout workers on a Ray cluster, see the ``ray``
    section; weights are pushed to them after every update)."""
    policy: str = "hf"
    """The model backend that generates: ``hf`` (transformers; the CPU default, locally it shares the trainer's
    model) or ``vllm`` (GPU, weights synced each step)."""
    weight_format: str | None = None
    """How the fast CPU policy (`FastPolicy`, ``policy=hf`` with ``backend=local``) stores the weights it samples
    rollouts with: ``int8`` (fastest; its greedy answers differ from fp32's where a token is a near tie, and RL then
    partly learns that decoder, docs/training.md "int8 or fp32"), ``bf16`` or ``fp32`` (the trained module's own
    numbers); None: the fastest this CPU has (int8 where torch has fbgemm). Other policies decode their own way."""
    rollout_n: int = 1
    """``ROLLOUT_N``, G: rollouts per question (the group of the advantages; the paper uses 16); rollout i is
    reset with ``rollout_index=i``."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy; the reference uses 1.0)."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    top_logprobs: int = 10
    """Top log-probs kept per token for the reference entropy estimator (0: skip it)."""
    stop: list[str] | None = None
    """Stop strings; None: the closing tags of the env's tools (``info["tools"]``) and ``</answer>``."""
    max_prompt_tokens: int = 1536
    """Longest templated prompt; a longer user turn is cut from the left (its question end kept)."""
    max_response_tokens: int = 4096
    """Token budget of everything after the prompt (policy turns, tool results, retrieved traces)."""
    max_turn_tokens: int | None = None
    """Most tokens of one policy turn (None: the rest of the response budget)."""
    min_tokens_after_splice: int = 0
    """A retrieval splice is skipped (and counted in ``retrieval/skipped_splices``) unless at least this many
    response tokens of the budget remain after its observation, room for the rest of the episode (an answer);
    0: the paper's rule, skip only a splice that does not fit."""
    max_tool_calls: int = 3
    """Tool calls per episode, the env's limit (the reference allows 3); the trainer passes it to the env."""
    gpu_memory_utilization: float = 0.5
    """vLLM only: share of GPU memory for the rollout engine (the rest serves training)."""
    max_concurrent_episodes: int = 64
    """Episodes in flight at once (each holds one env of the pool)."""
    tool_workers: int = 16
    """Threads that run env steps (tool calls) concurrently."""
    overlap: bool = True
    """Generate for ready episodes while other episodes' tools still run (False: strict rounds)."""
    continuous_batching: bool = True
    """With ``overlap`` and a policy that has a running batch (`FastPolicy`, the CPU default): an episode joins the
    decode batch as soon as its tool returns and leaves it when its turn ends (False: each set of ready episodes
    is decoded as one batch, to its longest row, and ``batch_wait_s`` applies)."""
    rejoin_delay_steps: int | None = 2
    """With continuous batching: decode steps the batch runs between the end of an episode's turn and that
    episode's rejoining with its tool result (the batch waits there for a tool still running). Which rows decode
    together then never depends on how long tools take, so a run repeats exactly, to the last bit of every
    log-prob (int8 or fp32 attention rounds differently when a row's batch or cache columns change). None: an
    episode rejoins as soon as its tool returns (no waits, but the tokens depend on the tools' timing): the setting
    for tools slower than a few decode steps, such as live web search and browsing (seconds a call, and answers
    that change anyway), where waiting would idle the batch."""
    batch_wait_s: float | None = None
    """With ``overlap``, how long to wait for running tools to join a generation batch. None: adaptive,
    half the mean duration of a generate call, so that slow generation (HF on CPU, where a batch of 8
    costs about what a batch of 1 does) is not split into small batches, while fast generation is
    not held up by slow tools."""
    show_progress: bool = False
    """Show a tqdm bar of finished episodes."""

    def __post_init__(self) -> None:
        for name in ("rollout_n", "max_prompt_tokens", "max_response_tokens", "max_concurrent_episodes",
                     "tool_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        # The sampling settings' own checks, here so that a bad value stops the run at load, not at the first turn.
        SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                       top_logprobs=self.top_logprobs)
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1 or None, got {self.max_turn_tokens}")
        if self.min_tokens_after_splice < 0:
            raise ValueError(f"min_tokens_after_splice must be >= 0 (0: skip only a splice that does not fit), "
                             f"got {self.min_tokens_after_splice}")
        if self.weight_format not in (None, *WEIGHT_FORMATS):
            raise ValueError(f"rollout.weight_format must be one of {WEIGHT_FORMATS} or null (the fastest this CPU "
                             f"has), got {self.weight_format!r}")
        if self.rejoin_delay_steps is not None and self.rejoin_delay_steps < 0:
            raise ValueError(f"rejoin_delay_steps must be >= 0 or None (rejoin when the tool returns), "
                             f"got {self.rejoin_delay_steps}")
        if self.batch_wait_s is not None and self.batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0 or None, got {self.batch_wait_s}")
        if self.backend in POLICY_BACKENDS:
            raise ValueError(f"rollout.backend now says where rollouts run (local or ray); the model backend moved "
                             f"to rollout.policy: write rollout.policy={self.backend} (and drop rollout.backend)")
        if self.backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"rollout.backend must be local or ray, got {self.backend!r}")
        if self.policy not in POLICY_BACKENDS:
            raise ValueError(f"rollout.policy must be hf or vllm, got {self.policy!r}")
