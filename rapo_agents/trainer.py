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
    >>> from rapo_agents.config import load_config
    >>> trainer = RAPOTrainer(load_config(None, ["total_steps=2", "output_dir=/tmp/rapo-example"]))  # doctest: +SKIP
    >>> result = trainer.train()                                                                    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from rapo_agents.backends import make_backend
from rapo_agents.batch import TrainBatch, build_batch
from rapo_agents.checkpoint import CheckpointManager, load_weights, rng_state, set_rng_state
from rapo_agents.config import TrainConfig
from rapo_agents.heldout import Difference, HeldoutEvaluator, HeldoutResult, paired_difference
from rapo_agents.metrics import MetricsLogger, plot_curves, read_metrics
from rapo_agents.rollout import derive_seed, make_env_factory
from rapo_agents.run_control import RunControl, RunFolderLock
from rapo_agents.sampler import QuestionSampler
from rapo_agents.update import UpdateSettings, needs_logprob_correction, ppo_update, recompute_logprobs
from rapo_env.prompts import SHORT_PROMPTS
from rapo_env.rewards.text import FORMAT_PENALTY
from rapo_env.trajectory import Trajectory, write_jsonl


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


def _flag(setting: str, on_gpu: bool) -> bool:
    """Resolve an ``auto``/``true``/``false`` setting."""
    value = str(setting).lower()
    if value not in ("auto", "true", "false"):
        raise ValueError(f"expected auto, true or false, got {setting!r}")
    return on_gpu if value == "auto" else value == "true"


def load_model_and_tokenizer(config: TrainConfig, device: torch.device):
    """The trainable causal LM and its tokenizer (``embedded`` = SmolLM2-135M-Instruct)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rapo_agents.policies.hf import default_policy_path

    model_config = config.model
    path = default_policy_path() if model_config.path == "embedded" else model_config.path
    extra = {"gguf_file": model_config.gguf_file} if model_config.gguf_file else {}
    if model_config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, model_config.dtype)
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)
    return model.to(device), tokenizer


def freeze_all_but_last_layers(model: torch.nn.Module, count: int) -> None:
    """Leave only the last ``count`` decoder layers and the final norm trainable (embeddings and any tied
    ``lm_head`` frozen); a ``count`` of at least the number of layers leaves the whole model trainable.

    Raises:
        ValueError: when ``count`` is below 1 or the model has no ``layers`` list.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"model.trainable_layers needs a decoder with a layers list; {type(model).__name__} has none")
    if count < 1:
        raise ValueError(f"model.trainable_layers must be >= 1 (or None for the whole model), got {count}")
    if count >= len(layers):
        model.requires_grad_(True)
        return
    model.requires_grad_(False)
    for layer in layers[len(layers) - count:]:
        layer.requires_grad_(True)
    norm = getattr(decoder, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


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

    def __init__(
        self,
        config: TrainConfig,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        policy: Any = None,
        env_factory: Callable[[], gym.Env] | None = None,
        retriever: Any = None,
    ):
        from rapo_agents.policies.hf import resolve_device

        prepare_started = time.perf_counter()
        self.config = config
        self.device = resolve_device(config.device)
        on_gpu = self.device.type == "cuda"
        torch.manual_seed(config.seed)
        if model is None:
            model, tokenizer = load_model_and_tokenizer(config, self.device)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with the model")
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        if config.model.trainable_layers is not None:
            freeze_all_but_last_layers(self.model, config.model.trainable_layers)
        if _flag(config.model.gradient_checkpointing, on_gpu):
            self.model.gradient_checkpointing_enable()
        self.autocast_dtype = torch.bfloat16 if _flag(config.model.bf16_autocast, on_gpu) else None
        self.reference_model = None
        if config.algorithm.kl_coef > 0:
            self.reference_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        optim = config.optim
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
        self.retriever = None
        if config.retrieval.enabled:
            self.retriever = retriever if retriever is not None else self.backend.make_retriever()
        self.num_tasks = self._count_tasks()
        self._engine = None
        self.sampler = QuestionSampler(self.num_tasks, optim.train_batch_size, config.seed, config.data.shuffle)
        self.step = 0
        self.warmup_done = config.warmup.sft_steps == 0
        self.warmup_steps_done = 0
        self.control = RunControl()  # what a signal does in each phase; `train` installs it
        self.output_dir = Path(config.logging.output_dir)
        self.checkpoints = CheckpointManager(self.output_dir / "checkpoints", config.logging.keep_last)
        self.update_settings = UpdateSettings(
            mini_batch_rows=optim.ppo_mini_batch_size * config.rollout.rollout_n,
            micro_batch_size=optim.micro_batch_size,
            ppo_epochs=optim.ppo_epochs,
            grad_clip=optim.grad_clip,
            autocast_dtype=self.autocast_dtype,
        )
        one_step = optim.ppo_epochs == 1 and optim.ppo_mini_batch_size == optim.train_batch_size
        if self._recomputes_old_logprobs and one_step:
            # One optimiser step per batch: the update's own forward pass gives the recomputed logp_old.
            self.update_settings.old_logprobs_from_current = True
        self._heldout: HeldoutEvaluator | None = None
        self.profile: dict[str, float] = {"prepare": time.perf_counter() - prepare_started}

    # ---- construction ------------------------------------------------------------------------

    @property
    def engine(self):
        """The rollout engine, started on first use (again after `close`): local, or Ray workers holding the
        current weights."""
        if self._engine is None:
            wrappers = [retrieval_wrapper(self.config, self.retriever)] if self.retriever is not None else []
            self._engine = self.backend.make_engine(self._env, self._env_kwargs, self.policy, wrappers)
        return self._engine

    def _count_tasks(self) -> int:
        env = self._env_factory()
        try:
            return len(env.unwrapped.tasks)
        finally:
            env.close()

    # ---- warm-up ---------------------------------------------------------------------------------

    def warm_up(self) -> dict[str, float]:
        """Behaviour-clone the scripted expert on the training questions (``config.warmup``); returns its metrics."""
        from rapo_agents.warmup import behaviour_cloning, expert_episodes

        config, rollout = self.config, self.config.rollout
        env, episodes = self._env_factory(), None
        try:
            with self.control.phase("warm-up episodes", abortable=True):
                episodes = expert_episodes(
                    env, config.warmup.num_expert_episodes, self.tokenizer, rollout.max_prompt_tokens,
                    rollout.max_response_tokens, rollout.max_turn_tokens, rollout.max_tool_calls,
                    show_progress=config.logging.progress)
        finally:
            env.close()
        if episodes is None:  # a signal stopped the warm-up before its first step
            return {}
        steps = config.warmup.sft_steps - self.warmup_steps_done
        # The warm-up trains the whole model; ``model.trainable_layers`` restricts the RL updates only.
        trainable = [parameter.requires_grad for parameter in self.model.parameters()]
        self.model.requires_grad_(True)
        try:
            with self.control.phase("warm-up"):  # a signal stops it after the current optimiser step
                print(f"warm-up: behaviour cloning, {steps} steps on {len(episodes)} expert episodes", flush=True)
                result = behaviour_cloning(
                    self.model, episodes, self._pad_token_id(), steps=steps, batch_size=config.warmup.sft_batch_size,
                    lr=config.warmup.sft_lr, micro_batch_size=config.optim.micro_batch_size,
                    grad_clip=config.optim.grad_clip, seed=config.seed, autocast_dtype=self.autocast_dtype,
                    show_progress=config.logging.progress, should_stop=lambda: self.control.requested)
        finally:
            for parameter, flag in zip(self.model.parameters(), trainable, strict=True):
                parameter.requires_grad_(flag)
        self.sync_policy()
        self.warmup_steps_done += len(result.losses)
        self.warmup_done = self.warmup_steps_done >= config.warmup.sft_steps
        print(f"warm-up: {len(result.losses)} steps on {len(episodes)} expert episodes, action NLL "
              f"{result.loss_before:.3f} -> {result.loss_after:.3f} ({result.seconds:.0f} s)")
        return {"warmup/loss": result.loss_after, "warmup/loss_before": result.loss_before,
                "warmup/episodes": float(len(episodes)), "time/warmup_s": result.seconds}

    # ---- one step ------------------------------------------------------------------------------

    def rollout(self, task_indices: Sequence[int]) -> list[Trajectory]:
        """``rollout_n`` rollouts of each task, group by group, seeded by the step (so a resume replays them)."""
        return self.engine.run(task_indices, seed=derive_seed(self.config.seed, self.step))

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """The PPO-style update of one batch (spec §7); a batch without reward variance is skipped."""
        algorithm = self.config.algorithm
        if not batch.advantages.any() and algorithm.kl_coef == 0 and algorithm.entropy_coef == 0:
            # No group has reward variance: the loss is identically 0, so the forward and backward passes
            # would only buy AdamW's weight decay. Skip them (counted), as GRPO-style trainers that drop
            # zero-variance groups do.
            return {"optim/skipped_zero_advantage": 1.0, "time/update_s": 0.0}
        if self._recomputes_old_logprobs and not self.update_settings.old_logprobs_from_current:
            batch.old_logprobs = recompute_logprobs(self.model, batch, self.update_settings)
        stats = ppo_update(self.model, self.optimizer, batch, algorithm, self.update_settings, self.reference_model)
        return {**stats, "optim/skipped_zero_advantage": 0.0}

    def train_step(self) -> dict[str, float]:
        """One full step (rollout, advantages, update, sync); returns its metrics."""
        config = self.config
        started = time.perf_counter()
        # 1-2. The step's questions and their rollout groups (hybrid rollouts splice retrieved step traces).
        trajectories = self.rollout(self.sampler.next_batch())
        rollout_seconds = time.perf_counter() - started
        engine_stats = self.engine.stats
        # 3. Rewards, Z_ret, F_ret and the fused advantages.
        batch = build_batch(trajectories, self._pad_token_id(), config.algorithm)
        # 4. The update (a vLLM policy sleeps meanwhile).
        with self.backend.updating(self.policy):
            update_stats = self.update(batch)
        # 5. Weight sync to the rollout policy.
        sync_started = time.perf_counter()
        self.sync_policy()
        sync_seconds = time.perf_counter() - sync_started

        self.step += 1
        if config.logging.save_trajectories:
            write_jsonl(self.output_dir / "trajectories.jsonl", trajectories, append=True)
        hybrid_from = config.retrieval.no_retrieve_first_k if self.retriever is not None else None
        metrics = rollout_metrics(trajectories, batch, hybrid_from)
        metrics.update(update_stats)
        metrics.update({
            "advantage/mean": float(batch.advantages.mean()),
            "advantage/abs_mean": float(batch.advantages.abs().mean()),
            "time/rollout_s": rollout_seconds,
            "time/generate_s": engine_stats.generate_s,
            "time/env_step_s": engine_stats.env_step_s,
            "time/sync_s": sync_seconds,
            "time/step_s": time.perf_counter() - started,
            "throughput/generate_tokens_per_s": engine_stats.generated_tokens / max(engine_stats.generate_s, 1e-9),
            "throughput/episodes_per_s": len(trajectories) / max(rollout_seconds, 1e-9),
            "rollout/branches": float(engine_stats.branches),
            "rollout/refills": float(engine_stats.refills),
            "retrieval/skipped_splices": float(engine_stats.skipped_splices),
            "data/epoch": float(self.sampler.epoch),
        })
        return metrics

    def sync_policy(self) -> None:
        """Bring the rollout policy up to date with the trained weights (free when it shares the module)."""
        # Ray workers not started yet get the weights when they start.
        if self._engine is not None or self.backend.engine_outlives_close():
            self.engine.sync_weights(self.model)

    def _pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    # ---- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state(),
            "sampler": self.sampler.state_dict(),
            "trainer": {"step": self.step, "epoch": self.sampler.epoch, "warmup_done": self.warmup_done,
                        "warmup_steps_done": self.warmup_steps_done,
                        "config": self.config.to_dict()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict` (optimizer moments, RNG, data position, step); the weights are loaded
        apart (`rapo_agents.checkpoint.load_weights`)."""
        self.optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["trainer"]["step"])
        # A checkpoint without the flag predates the warm-up: its weights are already past it.
        self.warmup_done = bool(state["trainer"].get("warmup_done", True))
        self.warmup_steps_done = int(state["trainer"].get("warmup_steps_done", 0))
        self.sync_policy()

    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the current step: the policy in Hugging Face format and the trainer state."""
        started = time.perf_counter()
        path = self.checkpoints.save(self.step, self.state_dict(), self.model, self.tokenizer)
        self._add_time("checkpoint", time.perf_counter() - started)
        return path

    def maybe_resume(self) -> Path | None:
        """Load the newest checkpoint of the run folder that loads, if resuming is on; returns its folder."""
        if not self.config.logging.resume:
            return None
        found = self.checkpoints.load_latest()
        if found is None:
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

    # ---- what the run is ------------------------------------------------------------------------------

    @property
    def method(self) -> str:
        """What the run trains with, for titles: RAPO, GRPO, ARPO (GRPO with branching rollouts) or RAPO+ARPO."""
        branching = self.config.arpo.enabled(self.config.rollout.rollout_n)
        if self.retriever is not None:
            return "RAPO+ARPO" if branching else "RAPO"
        return "ARPO" if branching else "GRPO"

    @property
    def total_steps(self) -> int:
        """Steps of the run: ``total_steps``, capped by ``total_epochs`` passes over the questions."""
        optim = self.config.optim
        return min(optim.total_steps, optim.total_epochs * self.sampler.batches_per_epoch)

    @property
    def _recomputes_old_logprobs(self) -> bool:
        """Whether ``logp_old`` comes from the trained module rather than the rollout engine (asked for, or the
        engine's log-probs are inexact)."""
        return self.config.optim.recompute_old_logprobs or needs_logprob_correction(self.policy)

    def _add_time(self, phase: str, seconds: float) -> None:
        self.profile[phase] = self.profile.get(phase, 0.0) + seconds

    # ---- held-out evaluation ----------------------------------------------------------------------

    @property
    def heldout(self) -> HeldoutEvaluator | None:
        """The held-out evaluator (same engine class and policy as training, greedy), or None when off.

        It needs the training env's ``gym.make`` keyword arguments (to pick the held-out split): a run
        given its own ``env_factory`` evaluates only with ``evaluation.heldout_env_kwargs``, and a Ray run not at all.
        """
        evaluation = self.config.evaluation
        if not evaluation.enabled or not self.backend.evaluates_heldout:
            return None
        if self._env_kwargs is None and not evaluation.heldout_env_kwargs:
            return None
        if self._heldout is None:
            self._heldout = HeldoutEvaluator(self.config.data.env_id if self._env_kwargs is None else self._env,
                                             self._env_kwargs or {}, self.policy, self.config.rollout, evaluation,
                                             seed=self.config.seed)
        return self._heldout

    def evaluate_heldout(self, logger: MetricsLogger | None = None) -> HeldoutResult | None:
        """Evaluate the current policy on the held-out questions; logs ``eval/*`` to ``logger`` (``eval/``)."""
        evaluator = self.heldout
        if evaluator is None or self.control.requested:
            return None
        result = None
        with self.control.phase("evaluation", abortable=True):
            print(f"held-out evaluation at step {self.step}: {evaluator.num_tasks} questions", flush=True)
            result = evaluator.evaluate(self.step, show_progress=self.config.logging.progress)
        if result is None:  # stopped by a signal
            return None
        self._add_time("eval", result.metrics["time/eval_s"])
        metrics = result.metrics
        print(f"held-out accuracy at step {self.step}: {metrics['eval/accuracy']:.3f} "
              f"[{metrics['eval/accuracy_ci_low']:.3f}, {metrics['eval/accuracy_ci_high']:.3f}] on "
              f"{len(result.correct)} questions, format rate {metrics['eval/format_rate']:.2f} "
              f"({metrics['time/eval_s']:.0f} s)")
        if logger is not None:
            logger.log(self.step, {**metrics, "correct": result.correct})
        return result

    def _logged_heldout(self) -> list[HeldoutResult]:
        """The held-out evaluations already recorded in the run folder, up to the current step."""
        path = self.output_dir / "eval" / "metrics.jsonl"
        if not path.is_file():
            return []
        return [HeldoutResult(step=record["step"], correct=list(record.get("correct") or []),
                              metrics={k: v for k, v in record.items() if k not in ("step", "correct")})
                for record in read_metrics(path) if record["step"] <= self.step]

    # ---- the loop ---------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Run (or resume) the loop to ``total_steps``; always leaves a checkpoint and the metrics behind.

        The held-out split is evaluated before RL (right after the warm-up), every ``evaluation.eval_every``
        steps and at the end. A run folder whose newest checkpoint is already at ``total_steps`` is not trained
        again: the result says ``already_complete`` (start another run with a new ``logging.output_dir`` or with
        ``logging.resume=false``). The run folder is locked meanwhile (`RunFolderLock`): a second run on it is
        refused. One signal handler covers every phase (`RunControl`) and leaves a resumable checkpoint.
        """
        with RunFolderLock(self.output_dir):
            return self._train()

    def _train(self) -> TrainResult:
        from tqdm import tqdm

        config = self.config
        logging_config = config.logging
        resumed = self.maybe_resume()
        if resumed is not None and self.step >= self.total_steps:
            return TrainResult(steps=self.step, history=self._history(), output_dir=self.output_dir,
                               checkpoint=resumed, plot=None, interrupted=False, heldout=self._logged_heldout(),
                               already_complete=True)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        config.to_yaml(self.output_dir / "config.yaml")
        interrupted = False
        checkpoint = None
        heldout = self._logged_heldout() if resumed is not None else []
        every = config.evaluation.eval_every
        with MetricsLogger(
            self.output_dir, tensorboard=logging_config.tensorboard, wandb=logging_config.wandb,
            swanlab=logging_config.swanlab, project=logging_config.project, run_name=self.output_dir.name,
            config=config.to_dict(),
        ) as logger, MetricsLogger(self.output_dir / "eval", tensorboard=logging_config.tensorboard) as eval_logger, \
                RunControl() as interrupt:
            self.control = interrupt
            for note in logger.notes:
                print(note)
            if not self.warmup_done:
                started = time.perf_counter()
                warmup_metrics = self.warm_up()
                self._add_time("warmup", time.perf_counter() - started)
                logger.log(self.step, {**warmup_metrics, "time/prepare_s": self.profile["prepare"]})
                if self.warmup_done:  # the warm-up's result is kept whatever happens next
                    checkpoint = self.save_checkpoint()
            if self.step == 0 and not heldout and not interrupt.requested:
                heldout.append(self.evaluate_heldout(eval_logger))
            progress = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                            disable=not logging_config.progress)
            while self.step < self.total_steps and not interrupt.requested:
                with interrupt.phase("step"):
                    last = self.train_step()
                for phase, key in (("rollout", "time/rollout_s"), ("generate", "time/generate_s"),
                                   ("tools", "time/env_step_s"), ("update", "time/update_s"),
                                   ("sync", "time/sync_s")):
                    self._add_time(phase, float(last.get(key, 0.0)))
                # Seconds per phase so far (this process), so that every record shows where the time went.
                last.update({f"profile/{phase}_s": seconds for phase, seconds in self.profile.items()})
                logger.log(self.step, last)
                progress.update(1)
                progress.set_postfix(reward=f"{last['reward/mean']:.3f}", acc=f"{last['accuracy']:.2f}")
                if logging_config.save_every and self.step % logging_config.save_every == 0:
                    checkpoint = self.save_checkpoint()
                if every and self.step % every == 0 and self.step < self.total_steps:
                    heldout.append(self.evaluate_heldout(eval_logger))
            progress.close()
            interrupted = interrupt.requested
            if interrupted:
                print(f"{interrupt.signal_name}: saving a checkpoint at step {self.step} and stopping")
            elif not any(result is not None and result.step == self.step for result in heldout):
                heldout.append(self.evaluate_heldout(eval_logger))
            if checkpoint is None or not checkpoint.name.endswith(f"{self.step:06d}"):
                checkpoint = self.save_checkpoint()
            (self.output_dir / "profile.json").write_text(json.dumps(self.profile, indent=2), encoding="utf-8")
        self.close()
        heldout = [result for result in heldout if result is not None]
        history = self._history()
        plot = None
        if logging_config.plot and history:
            plot = plot_curves({self.method: history}, self.output_dir / "curves.png", title=str(self.output_dir),
                               heldout={self.method: [{"step": r.step, **r.metrics} for r in heldout]})
        return TrainResult(steps=self.step, history=history, output_dir=self.output_dir, checkpoint=checkpoint,
                           plot=plot, interrupted=interrupted, heldout=heldout, profile=dict(self.profile))

    def _history(self) -> list[dict[str, Any]]:
        # Step 0 holds the warm-up's record, not a training step's.
        path = self.output_dir / "metrics.jsonl"
        return [record for record in read_metrics(path) if record["step"] > 0] if path.is_file() else []


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


def retrieval_wrapper(config: TrainConfig, retriever: Any) -> Callable[[gym.Env], gym.Env]:
    """The (picklable) wrapper of hybrid rollouts (spec §4): rollouts ``>= no_retrieve_first_k`` of a group
    retrieve from ``retriever`` (a `Retriever` or a service URL)."""
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

    retrieval = config.retrieval
    return functools.partial(
        StepTraceRetrievalWrapper, retriever=retriever, retrieve_prob=retrieval.retrieve_prob, topk=retrieval.topk,
        select=config.select_rule, no_retrieve_first_k=retrieval.no_retrieve_first_k,
        group_size=config.rollout.rollout_n, hybrid_rule=config.algorithm.hybrid_rule,
        retrieve_after=retrieval.retrieve_after, seed=config.seed)


def rollout_metrics(trajectories: Sequence[Trajectory], batch: TrainBatch,
                    hybrid_from: int | None = None) -> dict[str, float]:
    """Outcome and behaviour statistics of one step's rollouts.

    ``hybrid_from`` is the first rollout index of a group that may retrieve (``no_retrieve_first_k``; None
    without retrieval). The ``mechanism/*`` keys compare spliced rollouts with the others (the paper's Fig. 3-4):
    reward, response tokens and tool calls of each, and the step entropy before and after a splice.
    """
    rewards = batch.rewards.double()
    accuracy = torch.tensor([float(t.metrics.get("accuracy", t.metrics.get("em", 0.0))) for t in trajectories])
    format_ok = torch.tensor([float(t.metrics.get("format_ok", 0.0)) for t in trajectories])
    tool_calls = torch.tensor([float(t.num_tool_calls) for t in trajectories])
    response_tokens = (batch.lengths - batch.prompt_lengths).double()
    answered = torch.tensor([float(t.end_reason == "answer") for t in trajectories])
    retrievals = batch.retrievals.double()
    with_retrieval = retrievals > 0

    def mean_where(values: torch.Tensor) -> float:
        return float(values[with_retrieval].double().mean()) if with_retrieval.any() else 0.0

    def mean_of(values: torch.Tensor, rows: torch.Tensor) -> float:
        chosen = values[rows].double()
        chosen = chosen[~chosen.isnan()]
        return float(chosen.mean()) if len(chosen) else float("nan")

    hybrid = torch.tensor([hybrid_from is not None and t.rollout_index >= hybrid_from for t in trajectories])
    mechanism = {}
    for name, rows in (("spliced", with_retrieval), ("unspliced", ~with_retrieval)):
        mechanism.update({f"mechanism/{name}_reward": mean_of(rewards, rows),
                          f"mechanism/{name}_response_tokens": mean_of(response_tokens, rows),
                          f"mechanism/{name}_tool_calls": mean_of(tool_calls, rows)})
    mechanism.update({"mechanism/entropy_before_splice": mean_of(batch.entropy_pre, with_retrieval),
                      "mechanism/entropy_after_splice": mean_of(batch.entropy_post, with_retrieval),
                      # Of the rollouts allowed to retrieve, the share that got at least one splice.
                      "retrieval/hybrid_splice_rate": mean_of(with_retrieval.double(), hybrid)})
    return {**mechanism,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        # Rollouts whose reward is above the format penalty's floor: the only ones that can carry a gradient
        # when the rest of their group sits at the floor.
        "reward/above_penalty_rate": float((rewards > rewards.new_tensor(FORMAT_PENALTY)).double().mean()),
        "accuracy": float(accuracy.mean()),
        "format_rate": float(format_ok.mean()),
        "answered_rate": float(answered.mean()),
        "tool_calls/mean": float(tool_calls.mean()),
        "response_tokens/mean": float(response_tokens.mean()),
        "retrieval/count_mean": float(retrievals.mean()),
        "retrieval/rollouts_with_retrieval": float(with_retrieval.double().mean()),
        "retrieval/z_ret_mean": mean_where(batch.z_ret),
        "retrieval/f_ret_mean": mean_where(batch.f_ret),
    }
