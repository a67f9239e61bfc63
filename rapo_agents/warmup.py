"""Supervised warm-up: behaviour cloning of the scripted expert before RL.

A 135M model never writes a tool tag or an ``<answer>`` by sampling, so every reward is the
format penalty and every group advantage is 0: RL has nothing to learn from. A short warm-up on
scripted-expert episodes (`rapo_agents.scripted.scripted_expert`: python for math, search for
knowledge questions) teaches the tag protocol; RL then starts from rewards that vary.

The expert's text episodes are tokenized exactly as the rollout engine tokenizes a live episode
(`EpisodeRecord`: chat template once, each action and each observation tokenized once), so the
model is cloned on the very token sequences it will later sample. The loss is the token mean of
the NLL of the expert's action tokens (loss mask 1); prompt and tool results (mask 0) carry none.

Example:
    >>> import gymnasium as gym, rapo_env
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from rapo_agents.policies import ByteTokenizer
    >>> env = gym.make("RAPO-Math-v0", num_tasks=2, sandbox="subprocess", system_prompt="Use python.")
    >>> episodes = expert_episodes(env, num_episodes=2, tokenizer=ByteTokenizer(), max_prompt_tokens=512,
    ...                            max_response_tokens=1024)
    >>> env.close()
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=259, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    >>> result = behaviour_cloning(model, episodes, pad_token_id=0, steps=5, batch_size=2, lr=1e-2,
    ...                            show_progress=False)
    >>> result.loss_after < result.loss_before
    True
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import torch

from rapo_agents.config import OptimConfig, WarmupConfig
from rapo_agents.lora import adapter_trainable, is_adapted
from rapo_agents.model import pad_token_id
from rapo_agents.policies.base import Generation
from rapo_agents.rollout.config import RolloutConfig
from rapo_agents.rollout.collate import collate_trajectories
from rapo_agents.rollout.episode import EpisodeRecord
from rapo_agents.run_control import RunControl
from rapo_agents.scripted import run_text_episode, scripted_expert
from rapo_agents.update import autocast_context, sequence_logprobs
from rapo_env.trajectory import Trajectory


@dataclasses.dataclass
class WarmupResult:
    """What `behaviour_cloning` returns."""

    loss_before: float
    """Token-mean NLL of the expert's actions on the probe (the first ``batch_size`` episodes) before training."""
    loss_after: float
    """The same after the last step."""
    losses: list[float]
    """Training loss of each optimiser step."""
    seconds: float
    """Wall time of the warm-up (evaluations included)."""
    episodes: int = 0
    """Expert episodes cloned."""

    @property
    def metrics(self) -> dict[str, float]:
        """The ``warmup/*`` metrics that the trainer logs at step 0."""
        return {"warmup/loss": self.loss_after, "warmup/loss_before": self.loss_before,
                "warmup/episodes": float(self.episodes), "time/warmup_s": self.seconds}


def tokenize_like_rollouts(
    trajectory: Trajectory,
    tokenizer: Any,
    max_prompt_tokens: int,
    max_response_tokens: int,
    max_turn_tokens: int | None = None,
) -> Trajectory | None:
    """A text trajectory with the token-level record the rollout engine would have built for it.

    Each action becomes a policy turn of ``tokenizer.encode(action)`` (loss mask 1); each observation
    but the last (the engine appends none after the episode ends) is appended with mask 0. Returns
    None when the episode does not fit the budgets, so a sampled rollout could not have produced it.

    Example:
        >>> from rapo_agents.policies import ByteTokenizer
        >>> from rapo_env.trajectory import StepRecord
        >>> text = Trajectory(task_id="q", rollout_index=0, question="?", system_prompt="", prompt="?",
        ...                   steps=[StepRecord(action="<p>", observation=" <r>1</r>", tool=None, tool_ok=None,
        ...                                     retrieval=None), StepRecord(action="A", observation="",
        ...                                     tool=None, tool_ok=None, retrieval=None)],
        ...                   reward=1.0, metrics={}, num_tool_calls=1, end_reason="answer", source="expert")
        >>> record = tokenize_like_rollouts(text, ByteTokenizer(), 100, 100)
        >>> record.loss_mask[record.prompt_length:]
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    """
    record = EpisodeRecord.start(tokenizer, trajectory.system_prompt, trajectory.prompt, max_prompt_tokens,
                                 max_response_tokens)
    vocab_size = len(tokenizer)
    for index, step in enumerate(trajectory.steps):
        token_ids = list(tokenizer.encode(step.action, add_special_tokens=False))
        if len(token_ids) > min(record.remaining, max_turn_tokens or record.remaining):
            return None
        record.add_generation(Generation(token_ids=token_ids, text=step.action, finish_reason="stop"), vocab_size)
        last = index == len(trajectory.steps) - 1
        if not last and (not record.add_observation(step.observation, None) or record.remaining <= 0):
            return None
    return dataclasses.replace(trajectory, steps=record.steps, token_ids=record.token_ids,
                               loss_mask=record.loss_mask, logprobs=record.logprobs,
                               prompt_length=record.prompt_length)


def expert_episodes(
    env: gym.Env,
    num_episodes: int,
    tokenizer: Any,
    max_prompt_tokens: int,
    max_response_tokens: int,
    max_turn_tokens: int | None = None,
    max_tool_calls: int = 3,
    show_progress: bool = False,
) -> list[Trajectory]:
    """Scripted-expert episodes (`scripted_expert`) on the env's first ``num_episodes`` tasks, tokenized like
    rollouts.

    Only correct episodes that fit the token budgets are kept.

    Raises:
        ValueError: when no episode qualifies (nothing to clone).
    """
    from tqdm.auto import tqdm

    tasks = env.unwrapped.tasks
    agent = scripted_expert(tasks, max_tool_calls=max_tool_calls)
    episodes = []
    for task_index in tqdm(range(min(num_episodes, len(tasks))), desc="expert episodes", unit="ep",
                           disable=not show_progress):
        text = run_text_episode(env, agent, task_index=task_index)
        if text.end_reason != "answer" or text.reward <= 0:
            continue
        tokenized = tokenize_like_rollouts(text, tokenizer, max_prompt_tokens, max_response_tokens, max_turn_tokens)
        if tokenized is not None:
            episodes.append(tokenized)
    if not episodes:
        raise ValueError("no expert episode is correct and fits the token budgets; raise max_response_tokens")
    return episodes


def action_nll(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], autocast_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL of the loss-mask tokens of a collated batch, and their count (divide for the token mean)."""
    device = next(model.parameters()).device
    loss_mask = batch["loss_mask"].to(device)
    with autocast_context(device, autocast_dtype):
        logprobs = sequence_logprobs(model, batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                     loss_mask).logprobs
    return -logprobs.float().sum(), loss_mask.sum()  # 0 off the loss mask


def _micro_batches(episodes: Sequence[Trajectory], size: int):
    ordered = sorted(episodes, key=lambda t: len(t.token_ids), reverse=True)  # similar lengths: less padding
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


@torch.no_grad()
def mean_action_nll(model: torch.nn.Module, episodes: Sequence[Trajectory], pad_token_id: int,
                    micro_batch_size: int = 8, autocast_dtype: torch.dtype | None = None) -> float:
    """Token-mean NLL of the action tokens of ``episodes`` (the warm-up's loss, without gradients)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0.0
    try:
        for micro in _micro_batches(episodes, micro_batch_size):
            nll, tokens = action_nll(model, collate_trajectories(micro, pad_token_id), autocast_dtype)
            total, count = total + float(nll), count + float(tokens)
    finally:
        model.train(was_training)
    return total / max(count, 1.0)


def behaviour_cloning(
    model: torch.nn.Module,
    episodes: Sequence[Trajectory],
    pad_token_id: int,
    steps: int,
    batch_size: int,
    lr: float,
    micro_batch_size: int = 4,
    grad_clip: float = 1.0,
    weight_decay: float = 0.0,
    seed: int = 0,
    autocast_dtype: torch.dtype | None = None,
    show_progress: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> WarmupResult:
    """Minimise the token-mean NLL of the expert's actions for ``steps`` AdamW steps of ``batch_size`` episodes.

    ``should_stop`` is asked after every optimiser step; True ends the warm-up there (``losses`` then counts the
    steps done), as a signal to ``rapo train`` does.

    Episodes are drawn in seeded shuffled passes; each step accumulates micro-batch gradients so its loss is
    the token mean over the whole batch. The optimiser is the warm-up's own (discarded afterwards).
    """
    from tqdm.auto import tqdm

    if not episodes:
        raise ValueError("behaviour cloning needs at least one episode")
    started = time.perf_counter()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    # A fixed probe, not every episode: on CPU one evaluation pass over all of them costs several steps.
    probe = episodes[:batch_size]
    loss_before = mean_action_nll(model, probe, pad_token_id, micro_batch_size, autocast_dtype)
    order: list[int] = []
    losses = []
    model.train()
    progress = tqdm(range(steps), desc="warm-up", unit="step", disable=not show_progress)
    for _ in progress:
        chosen = []
        while len(chosen) < min(batch_size, len(episodes)):
            if not order:
                order = torch.randperm(len(episodes), generator=generator).tolist()
            chosen.append(episodes[order.pop()])
        normalizer = float(sum(sum(t.loss_mask) for t in chosen))
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for micro in _micro_batches(chosen, micro_batch_size):
            nll, _ = action_nll(model, collate_trajectories(micro, pad_token_id), autocast_dtype)
            (nll / normalizer).backward()
            step_loss += float(nll.detach()) / normalizer
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if math.isfinite(float(grad_norm)):  # a non-finite step is skipped, not applied
            optimizer.step()
        losses.append(step_loss)
        progress.set_postfix(loss=f"{step_loss:.3f}")
        if should_stop is not None and should_stop():
            break
    progress.close()
    optimizer.zero_grad(set_to_none=True)
    loss_after = mean_action_nll(model, probe, pad_token_id, micro_batch_size, autocast_dtype)
    return WarmupResult(loss_before=loss_before, loss_after=loss_after, losses=losses,
                        seconds=time.perf_counter() - started, episodes=len(episodes))


def warm_up(model: torch.nn.Module, tokenizer: Any, make_env: Callable[[], gym.Env], config: WarmupConfig,
            rollout: RolloutConfig, optim: OptimConfig, control: RunControl, *, seed: int = 0,
            autocast_dtype: torch.dtype | None = None, show_progress: bool = False) -> WarmupResult | None:
    """The warm-up of a training run: expert episodes on the env's first questions (within ``rollout``'s budgets),
    then `behaviour_cloning` for ``config.sft_steps`` steps.

    It trains the whole model (``model.trainable_layers`` restricts the RL updates only), or a LoRA model's whole
    adapter (`rapo_agents.lora`: the base weights stay as loaded, so the adapter holds all training), and leaves every
    parameter's ``requires_grad`` as it found it. ``control`` tells what a signal does: while the episodes are
    collected it abandons the warm-up (None is returned), during cloning it stops after the current step.
    """
    env, episodes = make_env(), None
    try:
        with control.phase("warm-up episodes", abortable=True):
            episodes = expert_episodes(env, config.num_expert_episodes, tokenizer, rollout.max_prompt_tokens,
                                       rollout.max_response_tokens, rollout.max_turn_tokens, rollout.max_tool_calls,
                                       show_progress=show_progress)
    finally:
        env.close()
    if episodes is None:
        return None
    steps = config.sft_steps
    trainable = [parameter.requires_grad for parameter in model.parameters()]
    if is_adapted(model):
        adapter_trainable(model)
    else:
        model.requires_grad_(True)
    try:
        with control.phase("warm-up"):
            print(f"warm-up: behaviour cloning, {steps} steps on {len(episodes)} expert episodes", flush=True)
            result = behaviour_cloning(
                model, episodes, pad_token_id(tokenizer), steps=steps, batch_size=config.sft_batch_size,
                lr=config.sft_lr, micro_batch_size=optim.micro_batch_size, grad_clip=optim.grad_clip, seed=seed,
                autocast_dtype=autocast_dtype, show_progress=show_progress, should_stop=lambda: control.requested)
    finally:
        for parameter, flag in zip(model.parameters(), trainable, strict=True):
            parameter.requires_grad_(flag)
    print(f"warm-up: {len(result.losses)} steps on {len(episodes)} expert episodes, action NLL "
          f"{result.loss_before:.3f} -> {result.loss_after:.3f} ({result.seconds:.0f} s)")
    return result
