"""Rollout backends of the trainer: where rollouts run and what generates them, chosen once per run.

The training loop (`rapo_agents.trainer.RAPOTrainer`) never branches on the backend; it asks its backend for
the rollout policy, the retriever of hybrid rollouts and the rollout engine, and lets it bracket each update:

- `LocalBackend` (``rollout.backend=local``): rollouts in this process. The policy is `FastPolicy` (or `HFPolicy`)
  over the trained module on CPU, or a `VLLMPolicy` (``rollout.policy=vllm``) that sleeps while the trainer
  uses the GPU;
- `RayBackend` (``rollout.backend=ray``): rollouts on Ray workers, each with a replica of the weights (or one
  shared `PolicyActor`); the default in-process buffer is served to them by Ray Serve, since it does not pickle.

`make_engine` is the one place that turns ``rollout.backend`` into an engine, for the backends and for anyone
who wants an engine without a trainer.

Example:
    >>> from rapo_agents.config_loader import load_config
    >>> type(make_backend(load_config(None, []), model=None, tokenizer=None)).__name__
    'LocalBackend'
    >>> from rapo_agents.policies import ScriptedPolicy
    >>> policy = ScriptedPolicy(["<python>\\nprint(2 + 2)\\n</python>", "<answer>\\\\boxed{4}</answer>"])
    >>> with make_engine("RAPO-Math-v0", policy, RolloutConfig(rollout_n=2),  # backend="ray" after ray.init
    ...                  env_kwargs={"num_tasks": 4, "sandbox": "subprocess"}) as engine:
    ...     [(t.end_reason, t.num_tool_calls) for t in engine.run([0])]
    [('answer', 1), ('answer', 1)]
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rapo_agents.config import ConfigError, RayConfig, TrainConfig
from rapo_agents.rollout import RolloutConfig, RolloutEngine
from rapo_agents.rollout.branching import ARPOConfig


def make_engine(env: Any, policy: Any, config: RolloutConfig | None = None, env_kwargs: dict[str, Any] | None = None,
                wrappers: Sequence[Callable[[Any], Any]] = (), arpo: ARPOConfig | None = None,
                ray: RayConfig | None = None) -> Any:
    """The rollout engine that ``config.backend`` names: a `RolloutEngine` in this process (``local``), or a
    `RayRolloutEngine` with the API of one over ``ray``'s workers (``ray``; call ``ray.init`` first).

    Args:
        env, policy, config, env_kwargs, wrappers, arpo: as for `RolloutEngine` (with Ray, ``policy`` may also be
            a factory or a `PolicyActor` handle, and everything must pickle).
        ray: the workers of the ``ray`` backend (default `RayConfig`); the local engine ignores it.
    """
    config = config or RolloutConfig()
    if config.backend == "local":
        return RolloutEngine(env, policy, config, env_kwargs, wrappers, arpo=arpo)
    from rapo_agents.integrations.ray_rollout import RayRolloutEngine

    ray = ray or RayConfig()
    return RayRolloutEngine(
        env, policy, config, env_kwargs, wrappers, arpo=arpo, num_workers=ray.num_workers,
        worker_options={"num_cpus": ray.num_cpus_per_worker, "num_gpus": ray.num_gpus_per_worker})


class LocalBackend:
    """Rollouts in this process, with the trained module (CPU) or vLLM (GPU).

    Args:
        config: the run's settings.
        model, tokenizer: the trained module and its tokenizer.
    """

    evaluates_heldout = True
    """Whether the held-out evaluation can run on this backend's policy in this process."""

    def __init__(self, config: TrainConfig, model: Any, tokenizer: Any):
        self.config, self.model, self.tokenizer = config, model, tokenizer

    def _vllm_policy_factory(self) -> Callable[[], Any]:
        from rapo_agents.policies.vllm import VLLMPolicy

        config, rollout = self.config, self.config.rollout
        return functools.partial(
            VLLMPolicy.from_pretrained, config.model.path, gpu_memory_utilization=rollout.gpu_memory_utilization,
            max_model_len=rollout.max_prompt_tokens + rollout.max_response_tokens, seed=config.seed)

    def make_policy(self) -> Any:
        """The rollout policy: vLLM for ``rollout.policy=vllm``, else the fast CPU path over the trained module."""
        if self.config.rollout.policy == "vllm":
            return self._vllm_policy_factory()()
        from rapo_agents.policies.factory import policy_for_model

        return policy_for_model(self.model, self.tokenizer,  # FastPolicy on CPU (issue #19)
                                weight_format=self.config.rollout.weight_format)

    def make_retriever(self) -> Any:
        """The retriever of hybrid rollouts that ``retrieval.retriever`` names."""
        return retriever_factory(self.config)()

    def make_engine(self, env: Any, env_kwargs: dict[str, Any] | None, policy: Any,
                    wrappers: Sequence[Callable[[Any], Any]]) -> Any:
        """The rollout engine over ``env`` (an id with its keyword arguments, or a factory)."""
        config = self.config
        return make_engine(env, policy, config.rollout, env_kwargs, wrappers, arpo=config.arpo, ray=config.ray)

    @contextlib.contextmanager
    def updating(self, policy: Any) -> Iterator[None]:
        """Bracket one update: a vLLM policy that shares the GPU sleeps (weights offloaded, KV cache freed)."""
        sleeps = self.config.rollout.policy == "vllm" and hasattr(policy, "sleep")
        if sleeps:
            policy.sleep()
        try:
            yield
        finally:
            if sleeps:
                policy.wake_up()

    def engine_outlives_close(self) -> bool:
        """Whether a closed engine can be used again (local envs restart; Ray workers must be rebuilt)."""
        return True


class RayBackend(LocalBackend):
    """Rollouts on Ray workers; joins ``ray.address`` (or the running cluster, or starts a local one)."""

    evaluates_heldout = False

    def __init__(self, config: TrainConfig, model: Any, tokenizer: Any):
        import ray

        super().__init__(config, model, tokenizer)
        if not ray.is_initialized():
            ray.init(address=config.ray.address, include_dashboard=False)

    def make_policy(self) -> Any:
        """What the workers generate with: a replica of the model each, or one shared `PolicyActor`."""
        import ray

        from rapo_agents.integrations.ray_rollout import PolicyActor, hf_replica

        config = self.config
        if config.rollout.policy == "vllm":
            factory = self._vllm_policy_factory()
        else:
            dtype = next(self.model.parameters()).dtype
            factory = functools.partial(hf_replica, self.model.config, self.tokenizer, dtype)
        if config.ray.policy_placement == "workers":
            return factory
        return ray.remote(PolicyActor).options(num_cpus=0, num_gpus=config.ray.policy_actor_gpus).remote(factory)

    def make_retriever(self) -> Any:
        if self.config.retrieval.retriever.startswith(("http://", "https://")):
            return super().make_retriever()
        # An in-process buffer (model and FAISS index) does not pickle: Ray Serve runs it, the workers reach it
        # by URL like a `rapo buffer serve` server.
        from rapo_agents.integrations.ray_rollout import serve_retrieval
        from rapo_tools.serving import free_port

        return serve_retrieval(retriever_factory(self.config), http_port=free_port())

    def make_engine(self, env: Any, env_kwargs: dict[str, Any] | None, policy: Any,
                    wrappers: Sequence[Callable[[Any], Any]]) -> Any:
        engine = super().make_engine(env, env_kwargs, policy, wrappers)
        engine.sync_weights(self.model)  # replicas start untrained
        return engine

    @contextlib.contextmanager
    def updating(self, policy: Any) -> Iterator[None]:
        yield  # the workers' policies live elsewhere

    def engine_outlives_close(self) -> bool:
        return False


BACKENDS = {"local": LocalBackend, "ray": RayBackend}
"""``rollout.backend`` -> its class."""


def make_backend(config: TrainConfig, model: Any, tokenizer: Any) -> LocalBackend:
    """The backend ``config.rollout.backend`` names."""
    return BACKENDS[config.rollout.backend](config, model, tokenizer)


def default_buffer_config(config: TrainConfig):
    """The embedded default buffer of the task family ``config`` trains on: the expert solves the very training
    questions the policy trains on, as the paper's buffer does. None when no embedded expert plays them.

    Example:
        >>> from rapo_agents.config_loader import load_config
        >>> default_buffer_config(load_config("configs/qa.yaml", [])).task
        'qa'
    """
    from rapo_agents.buffer_build.defaults import DefaultBufferConfig

    data = config.data
    common = {"max_tool_calls": config.rollout.max_tool_calls, "index_kind": "flat",
              "encoder": config.algorithm.fidelity}
    if data.source == "procedural_math":
        return DefaultBufferConfig(num_tasks=data.num_tasks, difficulty=data.difficulty, **common)
    if data.source == "procedural_kb":
        knowledge_base = data.env_kwargs.get("knowledge_base") or {}
        topk = (data.env_kwargs.get("search") or {}).get("topk", 3)
        hops = data.env_kwargs.get("hops")
        return DefaultBufferConfig(task="qa", num_tasks=data.max_tasks or 100_000,
                                   knowledge_base=tuple(sorted(knowledge_base.items())), search_topk=topk,
                                   hops=None if hops is None else tuple(hops), **common)
    return None


def retriever_factory(config: TrainConfig) -> Callable[[], Any]:
    """A picklable factory of the step-trace retriever ``config.retrieval.retriever`` names (drawing at random
    from it with ``retrieval.random``).

    Raises:
        ConfigError: ``default`` for training questions that no embedded expert plays.
    """
    factory = nearest_retriever_factory(config)
    if config.retrieval.random:
        from rapo_buffers.retriever import RandomRetriever

        return functools.partial(RandomRetriever.over, factory, config.seed)
    return factory


def nearest_retriever_factory(config: TrainConfig) -> Callable[[], Any]:
    """A picklable factory of the retriever ``config.retrieval.retriever`` names (nearest keys first)."""
    from rapo_agents.buffer_build.defaults import resolve_retriever

    spec = config.retrieval.retriever
    if spec == "default":
        from rapo_agents.buffer_build.defaults import default_retriever

        buffer = default_buffer_config(config)
        if buffer is None:
            raise ConfigError(
                f"retrieval.retriever=default has an embedded buffer only for procedural math and the generated "
                f"knowledge base (data.source=procedural_kb), not for data.source={config.data.source!r}"
                f"; give a buffer JSONL (rapo buffer build) or a /retrieve service URL")
        return functools.partial(default_retriever, buffer, show_progress=config.logging.progress)
    if spec.endswith(".jsonl"):
        from rapo_buffers.retriever import InProcessRetriever

        return functools.partial(InProcessRetriever.from_files, spec, config.retrieval.index_path)
    return functools.partial(resolve_retriever, spec)
