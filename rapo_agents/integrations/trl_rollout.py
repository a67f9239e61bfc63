"""`RapoRollout`: TRL's ``GRPOTrainer`` trains on a rapo env, through its ``rollout_func`` hook.

TRL asks a ``rollout_func(prompts, trainer)`` for prompt ids, completion ids and log-probs, and takes an
``env_mask`` (1 on the model's own tokens) and any other field for its reward functions. `RapoRollout` answers
with whole multi-turn rapo episodes played by rapo's `RolloutEngine` on the trainer's current weights: each
dataset prompt is a task index of the env, TRL's repeated prompts become one group of rollouts, the completion
is everything after the prompt (the policy's turns and the env's text, token in, token out), and
``env_mask`` is the episode's loss mask, so that TRL trains on the policy's tokens only. `rapo_reward` hands the
env's reward to TRL.

Example (the full script is ``examples/trl_grpo.py``):
    >>> from trl import GRPOConfig, GRPOTrainer                                     # doctest: +SKIP
    >>> rollout = RapoRollout("RAPO-Math-v0", env_kwargs={"sandbox": "subprocess"})  # doctest: +SKIP
    >>> trainer = GRPOTrainer(model, reward_funcs=rapo_reward, args=GRPOConfig(...),  # doctest: +SKIP
    ...                       train_dataset=task_dataset(64), rollout_func=rollout)
    >>> trainer.train(); rollout.close()                                            # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from rapo_agents.policies.factory import policy_for_model
from rapo_agents.rollout import RolloutConfig, RolloutEngine



def task_dataset(num_tasks: int):
    """A TRL training dataset whose prompts are the env's task indices ``0 .. num_tasks - 1`` (as strings)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [str(index) for index in range(num_tasks)]})


def rapo_reward(completions: Sequence[Any], rapo_reward: Sequence[float], **_: Any) -> list[float]:
    """TRL reward function: the env's own reward of each episode (`RapoRollout` computed it)."""
    return [float(reward) for reward in rapo_reward]


class RapoRollout:
    """A TRL ``rollout_func`` playing rapo episodes with the trainer's model.

    Args:
        env: a registered rapo env id (or an env factory, as `RolloutEngine` takes).
        env_kwargs: its ``gym.make`` keyword arguments.
        config: rollout settings (`RolloutConfig`; its ``rollout_n`` is unused: TRL's ``num_generations`` sets G).
        wrappers: callables applied to each new env, e.g. a `StepTraceRetrievalWrapper` for RAPO's splices.
        engine: how the trainer's model decodes (`policy_for_model`: ``auto`` is the fast int8 path on a CPU).
        seed: base seed; each call adds the trainer's global step, so that steps sample afresh.
    """

    def __init__(self, env: str | Callable[[], Any] = "RAPO-Math-v0", env_kwargs: dict[str, Any] | None = None,
                 config: RolloutConfig | None = None, wrappers: Sequence[Callable[[Any], Any]] = (),
                 engine: str = "auto", seed: int = 0):
        self.env, self.env_kwargs, self.wrappers = env, env_kwargs, tuple(wrappers)
        self.config = config or RolloutConfig()
        self.engine_kind, self.seed = engine, seed
        self._engine: RolloutEngine | None = None
        self._model: Any = None

    def _engine_for(self, trainer: Any) -> RolloutEngine:
        model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
        if self._engine is None or model is not self._model:
            self.close()
            # The policy shares the trained module: it decodes with the weights of the moment (the fast path
            # repacks them when an optimizer step has changed them).
            policy = policy_for_model(model, trainer.processing_class, engine=self.engine_kind)
            self._engine = RolloutEngine(self.env, policy, self.config, env_kwargs=self.env_kwargs,
                                         wrappers=self.wrappers)
            self._model = model
        return self._engine

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list]:
        try:
            tasks = [int(str(prompt).strip()) for prompt in prompts]
        except ValueError as error:
            raise ValueError("RapoRollout's dataset prompts are task indices of the env (see task_dataset); "
                             f"got {str(prompts[0])[:60]!r}") from error
        # TRL repeats each prompt num_generations times in a row: each run of repeats is one group.
        groups = [(task, len(list(run))) for task, run in itertools.groupby(tasks)]
        sizes = {size for _, size in groups}
        if len(sizes) != 1:
            raise ValueError(
                f"every prompt must come the same number of times in a row, got group sizes {sorted(sizes)}")
        engine = self._engine_for(trainer)
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0))
        trajectories = engine.run([task for task, _ in groups], group_size=sizes.pop(), seed=self.seed + step)
        start = [t.prompt_length for t in trajectories]
        return {
            "prompt_ids": [t.token_ids[:s] for t, s in zip(trajectories, start, strict=True)],
            "completion_ids": [t.token_ids[s:] for t, s in zip(trajectories, start, strict=True)],
            "logprobs": [t.logprobs[s:] for t, s in zip(trajectories, start, strict=True)],
            "env_mask": [t.loss_mask[s:] for t, s in zip(trajectories, start, strict=True)],
            "rapo_reward": [float(t.reward) for t in trajectories],
            "rapo_accuracy": [float(t.metrics.get("accuracy", t.metrics.get("em", 0.0))) for t in trajectories],
            "rapo_tool_calls": [t.num_tool_calls for t in trajectories],
        }

    def close(self) -> None:
        """Release the envs (sandbox workers, search clients) of the engine."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
