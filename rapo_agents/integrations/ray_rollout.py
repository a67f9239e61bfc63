"""Distributed rollouts on Ray, with the local engine's API (``rollout.backend: local | ray``).

- `RolloutWorker`: a Ray actor that holds its own `RolloutEngine`, hence its own envs, wrappers
  (retrieval included) and tool pools;
- the policy is whatever the workers can reach: a picklable `Policy` (``ScriptedPolicy``, an
  ``OpenAIPolicy`` pointed at a vLLM/HTTP endpoint), a zero-argument factory run once in each
  worker (e.g. one that loads an ``HFPolicy``), or a `PolicyActor` handle shared by all workers;
- `RayRolloutEngine.run` deals the questions round-robin to the workers and gathers their
  trajectories back in the order of the local engine. Seeds derive from (run seed, question,
  rollout index, turn), so the same seeds give the same trajectories whichever worker ran them;
- `RayRolloutEngine.sync_weights` pushes a trainer's weights (one copy in the object store) to the
  `PolicyActor` or to every worker's own replica, as `RolloutEngine.sync_weights` does locally;
  `hf_replica` builds such a replica (the architecture only; the first sync brings the weights).
  ``rapo train rollout.backend=ray`` wires it all (`rapo_agents.trainer`);
- `serve_retrieval` runs the step-trace ``/retrieve`` service as a Ray Serve deployment; envs
  reach it by URL exactly like a plain ``rapo buffer serve`` server.

`rapo_agents.backends.make_engine` builds either engine from ``rollout.backend`` (``local`` or ``ray``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import ray
import torch

from rapo_agents.lora import merged_weights
from rapo_agents.policies.base import Generation, Policy, SamplingParams
from rapo_agents.rollout import RolloutConfig, RolloutEngine, RolloutStats
from rapo_agents.rollout.branching import ARPOConfig
from rapo_env.trajectory import Trajectory

PolicySpec = Any
"""A `Policy`, a zero-argument callable returning one, or a `PolicyActor` handle."""


class PolicyActor:
    """One policy served to every rollout worker (``ray.remote(PolicyActor)``), e.g. a GPU model.

    Args:
        factory: builds the policy inside the actor (so the model loads where the actor runs).
    """

    def __init__(self, factory: Callable[[], Policy]):
        self.policy = factory()

    def generate(
        self, contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        return self.policy.generate(contexts, sampling)

    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    def vocab_size(self) -> int:
        return int(getattr(self.policy, "vocab_size", None) or len(self.policy.tokenizer))

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> bool:
        return _sync(self.policy, state)


def _sync(policy: Any, state: Mapping[str, torch.Tensor]) -> bool:
    """Load ``state`` into ``policy`` when it keeps weights; whether it did."""
    sync = getattr(policy, "sync_weights", None)
    return bool(sync(state)) if sync is not None else False


def hf_replica(model_config: Any, tokenizer: Any, dtype: torch.dtype = torch.float32, device: str = "auto"):
    """An `HFPolicy` of ``model_config``'s architecture with untrained weights, built inside a Ray worker (on
    its GPU when it has one); the trainer's first weight sync makes it the trained model.

    Example (a picklable factory for `RayRolloutEngine`):
        >>> factory = functools.partial(hf_replica, model.config, tokenizer)   # doctest: +SKIP
        >>> engine = RayRolloutEngine("RAPO-Math-v0", factory, num_workers=2)    # doctest: +SKIP
        >>> engine.sync_weights(model)                                           # doctest: +SKIP
        True
    """
    from transformers import AutoModelForCausalLM

    from rapo_agents.policies.hf import HFPolicy, resolve_device

    model = AutoModelForCausalLM.from_config(model_config, dtype=dtype)
    return HFPolicy(model.to(resolve_device(device)).eval(), tokenizer)


class RemotePolicy:
    """The `Policy` protocol over a `PolicyActor` handle (what a worker holds instead of a model)."""

    def __init__(self, handle: Any):
        self.handle = handle
        self.tokenizer, self.vocab_size = ray.get([handle.tokenizer.remote(), handle.vocab_size.remote()])
        self.name = "RemotePolicy"

    def generate(
        self, contexts: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        return ray.get(self.handle.generate.remote([list(c) for c in contexts], sampling))


def resolve_policy(spec: PolicySpec) -> Policy:
    """The `Policy` a worker uses for ``spec`` (see `PolicySpec`).

    Raises:
        TypeError: for anything else.
    """
    if isinstance(spec, ray.actor.ActorHandle):
        return RemotePolicy(spec)
    if isinstance(spec, Policy):
        return spec
    if callable(spec):
        policy = spec()
        if not isinstance(policy, Policy):
            raise TypeError(f"the policy factory returned {type(policy).__name__}, not a Policy")
        return policy
    raise TypeError(f"policy must be a Policy, a factory or a PolicyActor handle, not {type(spec).__name__}")


class RolloutWorker:
    """A Ray actor that runs a local `RolloutEngine` on its share of the questions.

    Args: those of `RolloutEngine`, with ``policy`` a `PolicySpec`.
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env],
        policy: PolicySpec,
        config: RolloutConfig,
        env_kwargs: dict[str, Any] | None,
        wrappers: Sequence[Callable[[gym.Env], gym.Env]],
        arpo: ARPOConfig | None = None,
    ):
        self.engine = RolloutEngine(env, resolve_policy(policy), dataclasses.replace(config, show_progress=False),
                                    env_kwargs, wrappers, arpo=arpo)

    def run(self, task_indices: list[int], group_size: int, seed: int) -> tuple[list[Trajectory], dict[str, Any]]:
        trajectories = self.engine.run(task_indices, group_size=group_size, seed=seed)
        return trajectories, dataclasses.asdict(self.engine.stats)

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> bool:
        return self.engine.sync_weights(state)

    def close(self) -> None:
        self.engine.close()


class RayRolloutEngine:
    """`RolloutEngine`'s API over ``num_workers`` Ray actors; call it where ``ray.init`` has run.

    Args:
        env, policy, config, env_kwargs, wrappers, arpo: as for `RolloutEngine` (``policy`` may also be a
            factory or a `PolicyActor` handle). Everything is shipped to the workers, so it must
            pickle (Ray's cloudpickle handles lambdas and closures).
        num_workers: rollout actors.
        worker_options: ``.options(...)`` of each actor (``num_cpus``, ``num_gpus``, ``resources``, ...).
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env],
        policy: PolicySpec,
        config: RolloutConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
        arpo: ARPOConfig | None = None,
        num_workers: int = 2,
        worker_options: dict[str, Any] | None = None,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not ray.is_initialized():
            raise RuntimeError("RayRolloutEngine needs a Ray cluster: call ray.init(...) first")
        self.config = config or RolloutConfig()
        self.policy_actor = policy if isinstance(policy, ray.actor.ActorHandle) else None
        options = {"num_cpus": 1, **(worker_options or {})}
        actor = ray.remote(RolloutWorker).options(**options)
        self.workers = [actor.remote(env, policy, self.config, env_kwargs, list(wrappers), arpo)
                        for _ in range(num_workers)]
        self.stats = RolloutStats()

    def run(
        self,
        task_indices: Sequence[int],
        group_size: int | None = None,
        seed: int = 0,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Play ``group_size`` rollouts of each task on the workers; the result is in the local engine's order.

        ``on_trajectory`` is called for each trajectory as soon as the worker that ran it returns.
        """
        group_size = group_size or self.config.rollout_n
        tasks = [int(q) for q in task_indices]
        started = time.perf_counter()
        shares = {w: list(range(w, len(tasks), len(self.workers))) for w in range(len(self.workers))}
        futures = {
            self.workers[w].run.remote([tasks[p] for p in positions], group_size, seed): positions
            for w, positions in shares.items() if positions
        }
        by_group: dict[int, list[Trajectory]] = {}
        totals = RolloutStats()
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            trajectories, stats = ray.get(done[0])
            positions = futures[done[0]]
            for offset, trajectory in enumerate(trajectories):
                # Workers number groups within their share; restore the position in this run.
                group = positions[offset // group_size]
                trajectory.extra["group_index"] = group
                by_group.setdefault(group, []).append(trajectory)
                if on_trajectory is not None:
                    on_trajectory(trajectory)
            for name, value in stats.items():
                if name not in ("episodes", "wall_s"):
                    setattr(totals, name, getattr(totals, name) + value)
        totals.episodes = len(tasks) * group_size
        totals.wall_s = time.perf_counter() - started
        self.stats = totals
        return [trajectory for group in range(len(tasks)) for trajectory in by_group[group]]

    def sync_weights(self, source: torch.nn.Module | Mapping[str, torch.Tensor]) -> bool:
        """Push ``source``'s weights to the shared `PolicyActor`, else to every worker's policy, and wait until
        they hold them; whether any policy took them (a scripted or HTTP policy keeps no weights)."""
        state = merged_weights(source)
        # One copy in the object store, whichever number of workers reads it.
        state_ref = ray.put({name: tensor.detach().cpu() for name, tensor in state.items()})
        targets = [self.policy_actor] if self.policy_actor is not None else self.workers
        return any(ray.get([target.sync_weights.remote(state_ref) for target in targets]))

    def close(self) -> None:
        """Close every worker's envs and end the actors."""
        if self.workers:
            ray.get([worker.close.remote() for worker in self.workers])
            for worker in self.workers:
                ray.kill(worker)
            self.workers = []

    def __enter__(self) -> RayRolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_retrieval(
    retriever_factory: Callable[[], Any],
    name: str = "rapo-retrieve",
    route_prefix: str = "/",
    num_replicas: int = 1,
    http_port: int = 8000,
) -> str:
    """Run the step-trace ``/retrieve`` service as a Ray Serve deployment; returns its base URL.

    The replicas build their retriever with ``retriever_factory`` (e.g. ``lambda: default_retriever()``
    or ``lambda: InProcessRetriever.from_files(...)``) and serve `rapo_buffers.service`'s app, so
    clients (``StepTraceRetrievalWrapper(env, retriever=url)``) cannot tell it from a plain server. On a busy
    small machine Serve's HTTP proxy can take longer than the 5 s Serve gives it to start, and ``serve.start``
    fails: set ``RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S=60`` in the environment before Ray starts.
    """
    from ray import serve

    from rapo_buffers.service import create_retrieval_app

    app = create_retrieval_app(_LazyRetriever(retriever_factory))

    @serve.deployment(name=name, num_replicas=num_replicas, ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class RetrievalDeployment:
        """One replica of the ``/retrieve`` service."""

    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    serve.run(RetrievalDeployment.bind(), name=name, route_prefix=route_prefix)
    return f"http://127.0.0.1:{http_port}{route_prefix.rstrip('/')}"


class _LazyRetriever:
    """Builds the retriever on first use, inside the Serve replica rather than in the driver."""

    def __init__(self, factory: Callable[[], Any]):
        self.factory = factory
        self.retriever = None

    def retrieve(self, queries: list[str], topk: int):
        if self.retriever is None:
            self.retriever = self.factory()
        return self.retriever.retrieve(queries, topk)
