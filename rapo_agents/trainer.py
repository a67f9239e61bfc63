"""`RAPOTrainer`: the training loop of RAPO (and of GRPO, which is the same loop with retrieval off).

Before the first step, once: the optional supervised warm-up (`rapo_agents.warmup`), behaviour cloning of
the scripted expert so that a small model writes the tag protocol at all, then the held-out evaluation of the
warm-up-only policy (`rapo_agents.heldout`). One step:

1. sample ``train_batch_size`` questions (seeded epochs, resumable);
2. play ``rollout_n`` rollouts of each through the rollout engine; the env is wrapped in
   `StepTraceRetrievalWrapper`, so rollouts ``>= no_retrieve_first_k`` of every group are hybrid;
3. rewards, ``Z_ret``, ``F_ret`` and advantages (`rapo_agents.batch`, spec §5-6);
4. PPO-style mini-batch updates with gradient accumulation, grad-norm clipping and AdamW
   (bf16 autocast and gradient checkpointing on GPU) (`rapo_agents.update`, spec §7);
5. weight sync to the rollout policy (a repack of the fast CPU decoder's weights; with
   ``rollout.backend=ray``, one copy in Ray's object store that every worker's replica loads);
6. metrics (JSONL, TensorBoard, ...), held-out evaluations every ``evaluation.eval_every`` steps and at the
   end, and checkpoints; Ctrl-C / SIGTERM saves and stops cleanly.

The rollout policy, retriever and engine come from the run's backend (`rapo_agents.backends`, chosen once by
``rollout.backend``): the local `RolloutEngine` or, with ``rollout.backend=ray``, a `RayRolloutEngine`
with the same API: the env (an id and keyword arguments, or a factory) and the retrieval wrapper
(a `functools.partial`) are picklable, so Ray ships them to the workers.

Example:
    >>> from rapo_agents.config_loader import load_config
    >>> trainer = RAPOTrainer(load_config(None, ["total_steps=2", "output_dir=/tmp/rapo-example"]))  # doctest: +SKIP
    >>> result = trainer.train()                                                                    # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from rapo_agents.backends import make_backend
from rapo_agents.batch import build_batch
from rapo_agents.checkpoint import CheckpointManager, load_weights, rng_state, set_rng_state
from rapo_agents.config import TrainConfig
from rapo_agents.heldout import (
    Difference, HeldoutEvaluator, HeldoutResult, HeldoutSchedule, evaluate_under, logged_heldout, paired_difference,
    evaluates, training_evaluator)
from rapo_agents.metrics import MetricsLogger, PhaseTimer, plot_curves, read_history, run_loggers
from rapo_agents.model import autocast_dtype, pad_token_id, reference_model, trainable_model
from rapo_agents.rollout import derive_seed, make_env_factory
from rapo_agents.run_control import RunControl, RunFolderLock
from rapo_agents.sampler import QuestionSampler
from rapo_agents.step_metrics import STEP_PHASES, engine_metrics, prefill_metrics, prefill_snapshot, rollout_metrics
from rapo_agents.update import needs_logprob_correction, update_policy, update_settings
from rapo_agents.warmup import warm_up
from rapo_env.prompts import SHORT_PROMPTS
from rapo_env.trajectory import write_jsonl


@dataclasses.dataclass
class TrainResult:
    """What `RAPOTrainer.train` returns."""

    steps: int
    """The global step reached."""
    history: list[dict[str, Any]]
    """Per-step metrics of the whole run (resumed steps included)."""
    output_dir: Path
    """The run folder."""
    checkpoint: Path | None
    """The last checkpoint written."""
    plot: Path | None
    """``curves.png``, when plotted."""
    interrupted: bool
    """True when a signal stopped the run early."""
    heldout: list[HeldoutResult] = dataclasses.field(default_factory=list)
    """Held-out evaluations of this run, oldest first (the first is the warm-up-only policy, before RL)."""
    profile: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds spent per phase (``prepare``, ``warmup``, ``generate``, ``tools``, ``update``, ``sync``, ``eval``,
    ``checkpoint``) in this process."""
    already_complete: bool = False
    """True when the run folder already held a finished run: nothing was trained or reprinted."""

    @property
    def heldout_difference(self) -> Difference | None:
        """Held-out accuracy after RL minus before (paired over the same questions), when both were measured."""
        if len(self.heldout) < 2 or self.heldout[0].step != 0:
            return None
        return paired_difference(self.heldout[0].correct, self.heldout[-1].correct)


class RAPOTrainer:
    """Trains a policy with RAPO as ``config`` says.

    Args:
        config: the run's settings.
        model, tokenizer: a model to train instead of loading ``config.model`` (tests, notebooks).
        policy: the rollout policy; default an `HFPolicy` sharing ``model`` (or a `VLLMPolicy` for ``policy: vllm``).
            With ``rollout.backend=ray`` anything `RayRolloutEngine` takes (a picklable policy, a factory, a
            `PolicyActor` handle); default a replica of the model in every worker (or one shared actor).
        env_factory: builds the (unwrapped) env; default ``gym.make(config.data.env_id, ...)``. With Ray it
            must pickle (cloudpickle: closures are fine, not a trainer's bound method).
        retriever: the step-trace retriever; default resolves ``config.retrieval.retriever``. With Ray it must
            pickle; the default in-process buffer is served to the workers by Ray Serve instead.
    """

    def __init__(self, config: TrainConfig, model: torch.nn.Module | None = None, tokenizer: Any = None,
                 policy: Any = None, env_factory: Callable[[], gym.Env] | None = None, retriever: Any = None):
        from rapo_agents.policies.hf import resolve_device

        prepare_started = time.perf_counter()
        self.config, optim = config, config.optim
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        self.model, self.tokenizer = trainable_model(config.model, self.device, model, tokenizer)
        self.autocast_dtype = autocast_dtype(config.model, self.device)
        self.reference_model = reference_model(self.model, config.algorithm.kl_coef)
        self.optimizer = torch.optim.AdamW(
            [parameter for parameter in self.model.parameters() if parameter.requires_grad], lr=optim.lr,
            betas=optim.betas, weight_decay=optim.weight_decay
        )
        self.backend = make_backend(config, self.model, self.tokenizer)
        self.policy = policy if policy is not None else self.backend.make_policy()
        # An env id with its keyword arguments (or the caller's factory): Ray ships them to its workers.
        self._env = env_factory if env_factory is not None else config.data.env_id
        self._env_kwargs = None if env_factory is not None else training_env_kwargs(config)
        self._env_factory = make_env_factory(self._env, self._env_kwargs)
        self.retriever = None if not config.retrieval.enabled else (
            retriever if retriever is not None else self.backend.make_retriever())
        self._engine = self._heldout = None
        self.sampler = QuestionSampler(count_tasks(self._env_factory), optim.train_batch_size, config.seed,
                                       config.data.shuffle)
        # ``total_steps``, capped by ``total_epochs`` passes over the questions.
        self.total_steps = min(optim.total_steps, optim.total_epochs * self.sampler.batches_per_epoch)
        self.step = 0
        self.warmup_done = config.warmup.sft_steps == 0
        self.control = RunControl()  # what a signal does in each phase; `train` installs it
        self.output_dir = Path(config.logging.output_dir)
        self.checkpoints = CheckpointManager(self.output_dir / "checkpoints", config.logging.keep_last)
        # logp_old from the trained module rather than the rollout engine: asked for, or the engine's are inexact.
        self.recompute_old_logprobs = optim.recompute_old_logprobs or needs_logprob_correction(self.policy)
        self.update_settings = update_settings(optim, config.rollout.rollout_n, self.autocast_dtype,
                                               self.recompute_old_logprobs)
        self.timer = PhaseTimer()
        self.timer.add("prepare", time.perf_counter() - prepare_started)

    @property
    def engine(self):
        """The rollout engine, started on first use (again after `close`): local, or Ray workers (current weights)."""
        if self._engine is None:
            wrappers = [retrieval_wrapper(self.config, self.retriever)] if self.retriever is not None else []
            self._engine = self.backend.make_engine(self._env, self._env_kwargs, self.policy, wrappers)
        return self._engine

    @property
    def heldout(self) -> HeldoutEvaluator | None:
        """The held-out evaluator (same engine class and policy as training, greedy: `training_evaluator`), or None
        when off; a Ray run has none."""
        if self._heldout is None and self.backend.evaluates_heldout:
            self._heldout = training_evaluator(self._env, self._env_kwargs, self.config, self.policy)
        return self._heldout

    @property
    def method(self) -> str:
        """What the run trains with, for titles (`TrainConfig.method`)."""
        return self.config.method(self.retriever is not None)

    # ---- the loop: resume -> warm-up -> evaluate -> (step, log, save, evaluate)* -> end ------------------

    def train(self) -> TrainResult:
        """Run (or resume) the loop to ``total_steps``; always leaves a checkpoint and the metrics behind.

        Held-out evaluations follow `HeldoutSchedule`. A run folder whose newest checkpoint is already at
        ``total_steps`` is not trained again: the result says ``already_complete`` (start another run with a new
        ``logging.output_dir`` or ``logging.resume=false``). The folder is locked meanwhile (`RunFolderLock`), and
        one signal handler covers every phase (`RunControl`), leaving a resumable checkpoint.
        """
        with RunFolderLock(self.output_dir):
            resumed = self.maybe_resume()
            logged = logged_heldout(self.output_dir / "eval", self.step) if resumed is not None else []
            evaluated = not evaluates(self.config, self._env_kwargs) or any(r.step == self.step for r in logged)
            if resumed is not None and self.step >= self.total_steps and evaluated:
                return TrainResult(steps=self.step, history=read_history(self.output_dir), output_dir=self.output_dir,
                                   checkpoint=resumed, plot=None, interrupted=False, heldout=logged,
                                   already_complete=True)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.config.to_yaml(self.output_dir / "config.yaml")
            with run_loggers(self.output_dir, self.config.logging, self.config.to_dict()) as (logger, eval_logger), \
                    RunControl() as control:
                self.control = control
                schedule = HeldoutSchedule(functools.partial(self.evaluate_heldout, eval_logger),
                                           self.config.evaluation.eval_every, self.total_steps, logged)
                checkpoint = self._warm_up(logger)
                schedule.before_rl(self.step)
                checkpoint = self._loop(logger, schedule) or checkpoint
                interrupted = control.requested
                if interrupted:
                    print(f"{control.signal_name}: saving a checkpoint at step {self.step} and stopping")
                else:
                    schedule.at_end(self.step)
                if checkpoint is None or not checkpoint.name.endswith(f"{self.step:06d}"):
                    checkpoint = self.save_checkpoint()
                (self.output_dir / "profile.json").write_text(json.dumps(self.timer.seconds, indent=2), "utf-8")
            self.close()
            return self._result(checkpoint, schedule.results, interrupted)

    def _warm_up(self, logger: MetricsLogger) -> Path | None:
        """The warm-up, unless done (or stopped before its first step); its checkpoint once it is complete."""
        if self.warmup_done:
            return None
        config = self.config
        with self.timer.time("warmup"):
            result = warm_up(self.model, self.tokenizer, self._env_factory, config.warmup, config.rollout,
                             config.optim, self.control, seed=config.seed,
                             autocast_dtype=self.autocast_dtype, show_progress=config.logging.progress)
            if result is not None:
                self.sync_policy()
                self.warmup_done = len(result.losses) >= config.warmup.sft_steps
        logger.log(self.step, {**(result.metrics if result else {}), "time/prepare_s": self.timer.seconds["prepare"]})
        # The warm-up's result is kept whatever happens next.
        return self.save_checkpoint() if self.warmup_done else None

    def _loop(self, logger: MetricsLogger, schedule: HeldoutSchedule) -> Path | None:
        """RL steps until ``total_steps`` or a signal: step, log, save, evaluate; the last checkpoint saved."""
        from tqdm import tqdm

        checkpoint, save_every = None, self.config.logging.save_every
        progress = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                        disable=not self.config.logging.progress)
        while self.step < self.total_steps and not self.control.requested:
            with self.control.phase("step"):
                metrics = self.train_step()
            for phase, key in STEP_PHASES.items():
                self.timer.add(phase, float(metrics.get(key, 0.0)))
            # Seconds per phase so far (this process), so that every record shows where the time went.
            metrics.update({f"profile/{phase}_s": seconds for phase, seconds in self.timer.seconds.items()})
            logger.log(self.step, metrics)
            progress.update(1)
            progress.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.2f}")
            if save_every and self.step % save_every == 0:
                checkpoint = self.save_checkpoint()
            schedule.after_step(self.step)
        progress.close()
        return checkpoint

    def train_step(self) -> dict[str, float]:
        """One full step (rollout, advantages, update, sync); returns its metrics."""
        config = self.config
        started = time.perf_counter()
        # 1-2. The step's questions and their rollout groups (hybrid rollouts splice retrieved step traces),
        # seeded by the step so that a resume replays them.
        prefill_before = prefill_snapshot(self.policy)
        trajectories = self.engine.run(self.sampler.next_batch(), seed=derive_seed(config.seed, self.step))
        rollout_seconds = time.perf_counter() - started
        # 3. Rewards, Z_ret, F_ret and the fused advantages.
        batch = build_batch(trajectories, pad_token_id(self.tokenizer), config.algorithm)
        # 4. The update (a vLLM policy sleeps meanwhile).
        with self.backend.updating(self.policy):
            update_stats = update_policy(self.model, self.optimizer, batch, config.algorithm, self.update_settings,
                                         self.reference_model, self.recompute_old_logprobs)
        # 5. Weight sync to the rollout policy.
        sync_started = time.perf_counter()
        self.sync_policy()
        sync_seconds = time.perf_counter() - sync_started
        self.step += 1
        if config.logging.save_trajectories:
            write_jsonl(self.output_dir / "trajectories.jsonl", trajectories, append=True)
        hybrid_from = config.retrieval.no_retrieve_first_k if self.retriever is not None else None
        return {**rollout_metrics(trajectories, batch, hybrid_from), **update_stats,
                **engine_metrics(self.engine.stats, rollout_seconds, len(trajectories)),
                **prefill_metrics(prefill_before, prefill_snapshot(self.policy)),
                "time/sync_s": sync_seconds, "time/step_s": time.perf_counter() - started,
                "data/epoch": float(self.sampler.epoch)}

    def sync_policy(self) -> None:
        """Bring the rollout policy up to date with the trained weights (free when it shares the module)."""
        # Ray workers not started yet get the weights when they start.
        if self._engine is not None or self.backend.engine_outlives_close():
            self.engine.sync_weights(self.model)

    def evaluate_heldout(self, logger: MetricsLogger | None = None, step: int | None = None) -> HeldoutResult | None:
        """Evaluate the current policy on the held-out questions; logs ``eval/*`` to ``logger`` (``eval/``).
        None when evaluation is off or a signal stopped it."""
        step = self.step if step is None else step
        result = evaluate_under(self.control, self.heldout, step, self.config.logging.progress)
        if result is not None:
            self.timer.add("eval", result.metrics["time/eval_s"])
            if logger is not None:
                logger.log(step, {**result.metrics, "correct": result.correct})
        return result

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs."""
        return {"optimizer": self.optimizer.state_dict(), "rng": rng_state(), "sampler": self.sampler.state_dict(),
                "trainer": {"step": self.step, "epoch": self.sampler.epoch, "warmup_done": self.warmup_done,
                            "config": self.config.to_dict()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict` (optimizer moments, RNG, data position, step); the weights are loaded
        apart (`rapo_agents.checkpoint.load_weights`)."""
        self.optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        self.sampler.load_state_dict(state["sampler"])
        progress = state["trainer"]
        # A checkpoint without the flag predates the warm-up: its weights are already past it.
        self.step, self.warmup_done = int(progress["step"]), bool(progress.get("warmup_done", True))
        self.sync_policy()

    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the current step: the policy in Hugging Face format and the trainer state."""
        with self.timer.time("checkpoint"):
            return self.checkpoints.save(self.step, self.state_dict(), self.model, self.tokenizer)

    def maybe_resume(self) -> Path | None:
        """Load the newest checkpoint of the run folder that loads, if resuming is on and it was not saved during
        the warm-up (`restarts_warm_up`); returns its folder."""
        found = self.checkpoints.load_latest() if self.config.logging.resume else None
        if found is None or restarts_warm_up(*found, self.config.model.path):
            return None
        folder, state = found
        load_weights(self.model, folder)
        self.load_state_dict(state)
        return folder

    def close(self) -> None:
        """Release the rollout envs and their tool workers, or the Ray workers (restarted if training goes on)."""
        if self._engine is not None:
            self._engine.close()
            if not self.backend.engine_outlives_close():
                self._engine = None
        if self._heldout is not None:
            self._heldout.close()
            self._heldout = None

    def _result(self, checkpoint: Path, heldout: list[HeldoutResult], interrupted: bool) -> TrainResult:
        history, plot = read_history(self.output_dir), None
        if self.config.logging.plot and history:
            plot = plot_curves({self.method: history}, self.output_dir / "curves.png", title=str(self.output_dir),
                               heldout={self.method: [{"step": r.step, **r.metrics} for r in heldout]})
        return TrainResult(steps=self.step, history=history, output_dir=self.output_dir, checkpoint=checkpoint,
                           plot=plot, interrupted=interrupted, heldout=heldout, profile=dict(self.timer.seconds))


def restarts_warm_up(folder: Path, state: dict[str, Any], model_path: str) -> bool:
    """Whether checkpoint ``folder`` (its trainer ``state``) was saved during the warm-up, so that the warm-up starts
    again from the model's own weights instead: continuing it would need its AdamW moments and episode order, which
    are not kept (two steps continued with a new optimiser raised the action NLL from 0.066 to 0.254 and left a QA
    policy at 0.000 held-out)."""
    if state["trainer"].get("warmup_done", True):  # a checkpoint without the flag predates the warm-up
        return False
    print(f"{folder} was saved during the warm-up: the warm-up starts again from the model's own weights "
          f"(model.path: {model_path})")
    return True


def count_tasks(make_env: Callable[[], gym.Env]) -> int:
    """The number of questions of the env that ``make_env`` builds (built once, then closed)."""
    env = make_env()
    try:
        return len(env.unwrapped.tasks)
    finally:
        env.close()


def training_env_kwargs(config: TrainConfig) -> dict[str, Any]:
    """``gym.make`` keyword arguments of ``config.data.env_id`` for the training questions."""
    data = config.data
    kwargs: dict[str, Any] = {"max_tool_calls": config.rollout.max_tool_calls}
    if data.env_id in SHORT_PROMPTS and data.system_prompt is not None:
        kwargs["system_prompt"] = data.system_prompt
    if data.source == "procedural_math":
        kwargs.update(dataset="procedural", num_tasks=data.num_tasks, difficulty=data.difficulty)
    elif data.source == "procedural_kb":
        kwargs.update(dataset="procedural", limit=data.max_tasks)
    else:
        kwargs.update(dataset=data.source, limit=data.max_tasks)
    kwargs.update(data.env_kwargs)
    return kwargs


def retrieval_settings(config: TrainConfig) -> Any:
    """The run's `rapo_env.wrappers.retrieval.RetrievalSettings` (spec §4)."""
    from rapo_env.wrappers.retrieval import RetrievalSettings

    retrieval = config.retrieval
    return RetrievalSettings(
        retrieve_prob=retrieval.retrieve_prob, topk=retrieval.topk, select=config.select_rule,
        no_retrieve_first_k=retrieval.no_retrieve_first_k, group_size=config.rollout.rollout_n,
        hybrid_rule=config.algorithm.hybrid_rule, retrieve_after=retrieval.retrieve_after,
        final_steps=retrieval.final_steps, seed=config.seed)


def retrieval_wrapper(config: TrainConfig, retriever: Any) -> Callable[[gym.Env], gym.Env]:
    """The (picklable) wrapper of hybrid rollouts (spec §4): rollouts ``>= no_retrieve_first_k`` of a group
    retrieve from ``retriever`` (a `Retriever` or a service URL)."""
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

    return functools.partial(StepTraceRetrievalWrapper, retriever=retriever, settings=retrieval_settings(config))
