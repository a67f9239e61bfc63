"""The rollout engine against the real RAPO-Math-v0 env and python tool."""

from __future__ import annotations

import copy
import dataclasses
import random
import time

import gymnasium as gym
import pytest
import torch

from rapo_agents.policies import SamplingParams, ScriptedPolicy
from rapo_agents.policies.fast import FastPolicy
from rapo_agents.rollout import RolloutConfig, RolloutEngine, collate_trajectories
from rapo_agents.rollout.episode import PromptTooLongError, fit_prompt
from rapo_env.trajectory import read_jsonl, write_jsonl

ENV_KWARGS = {"num_tasks": 6, "sandbox": "subprocess"}
TURNS = ["<think>compute</think>\n<python>\nprint(6 * 7)\n</python>", "<answer>\\boxed{42}</answer>"]


def decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


def check_token_record(trajectory, tokenizer):
    """Masks are exact: mask-1 tokens are exactly the policy's turns, and the rest is prompt or observations."""
    ids, mask = trajectory.token_ids, trajectory.loss_mask
    assert len(ids) == len(mask) == len(trajectory.logprobs)
    assert all(m == 0 for m in mask[: trajectory.prompt_length])
    policy_tokens = [i for i, m in enumerate(mask) if m]
    step_tokens = [i for s in trajectory.steps for i in range(s.token_start, s.token_end)]
    assert policy_tokens == step_tokens
    for step in trajectory.steps:
        assert decode(tokenizer, ids[step.token_start : step.token_end]).startswith(step.action)
    response = tokenizer.decode(ids[trajectory.prompt_length :], skip_special_tokens=True)
    expected = "".join(s.action + s.observation + (s.retrieval["text"] if s.retrieval else "")
                       for s in trajectory.steps)
    assert expected.startswith(response)
    if trajectory.end_reason != "length":
        assert response == expected
    assert all(lp == 0.0 for lp, m in zip(trajectory.logprobs, mask, strict=True) if not m)


def test_scripted_groups_masks_and_jsonl(tmp_path):
    policy = ScriptedPolicy(TURNS)
    with RolloutEngine("RAPO-Math-v0", policy, RolloutConfig(rollout_n=3), env_kwargs=ENV_KWARGS) as engine:
        trajectories = engine.run([4, 1])
    assert [(t.extra["task_index"], t.rollout_index, t.extra["group_index"]) for t in trajectories] == [
        (4, 0, 0), (4, 1, 0), (4, 2, 0), (1, 0, 1), (1, 1, 1), (1, 2, 1)]
    assert len({t.task_id for t in trajectories[:3]}) == 1 and trajectories[0].task_id != trajectories[3].task_id
    for trajectory in trajectories:
        assert trajectory.end_reason == "answer" and trajectory.num_tool_calls == 1
        assert trajectory.steps[0].tool == "python" and trajectory.steps[0].tool_ok
        assert trajectory.steps[0].observation == " <result>\n42\n</result>"
        check_token_record(trajectory, policy.tokenizer)
        observation_ids = trajectory.token_ids[trajectory.steps[0].token_end : trajectory.steps[1].token_start]
        assert decode(policy.tokenizer, observation_ids) == " <result>\n42\n</result>"
        assert trajectory.question in trajectory.prompt
    assert engine.stats.tool_calls == 6 and engine.stats.episodes == 6
    path = tmp_path / "rollouts.jsonl"
    write_jsonl(path, trajectories)
    again = read_jsonl(path)
    assert [t.token_ids for t in again] == [t.token_ids for t in trajectories]
    batch = collate_trajectories(again, pad_token_id=0)
    assert batch["input_ids"].shape == (6, max(len(t.token_ids) for t in trajectories))
    assert batch["group_ids"].tolist() == [0, 0, 0, 1, 1, 1]
    assert batch["loss_mask"].sum().item() == sum(sum(t.loss_mask) for t in trajectories)
    assert batch["step_mask"].sum().item() == 12 and not batch["step_retrieved"].any()


def test_retrieval_spans_map_to_the_spliced_tokens():
    from rapo_buffers.candidates import Candidate, StaticRetriever
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

    value = "<python>\nprint(2 * 21)\n</python> <result>\n42\n</result>"
    retriever = StaticRetriever([Candidate(value, reward=1.0, score=0.9)])
    turns = [TURNS[0], "<python>\nprint(42)\n</python>", TURNS[1]]
    policy = ScriptedPolicy(turns)

    def wrap(env):
        return StepTraceRetrievalWrapper(env, retriever, retrieve_prob=1.0, no_retrieve_first_k=1, group_size=2,
                                         seed=0)

    with RolloutEngine("RAPO-Math-v0", policy, RolloutConfig(rollout_n=2), env_kwargs=ENV_KWARGS,
                       wrappers=[wrap]) as engine:
        on_policy, hybrid = engine.run([0])
    assert all(step.retrieval is None for step in on_policy.steps) and on_policy.extra["retrieval_tokens"] == 0
    spliced = [step for step in hybrid.steps if step.retrieval is not None]
    assert len(spliced) == 2  # after each of the two tool rounds, never after the answer
    total = 0
    for step in spliced:
        start, end = step.retrieval["token_span"]
        assert decode(policy.tokenizer, hybrid.token_ids[start:end]) == step.retrieval["text"]
        assert value in step.retrieval["text"] and step.retrieval["text"] not in step.observation
        assert not any(hybrid.loss_mask[start:end])
        total += end - start
    assert hybrid.extra["retrieval_tokens"] == total
    assert [tuple(span) for span in hybrid.extra["retrieval_token_spans"]] == [
        tuple(s.retrieval["token_span"]) for s in spliced]
    check_token_record(hybrid, policy.tokenizer)
    batch = collate_trajectories([on_policy, hybrid], pad_token_id=0)
    assert batch["retrieval_mask"][1].sum().item() == total
    assert batch["step_retrieved"][1].tolist() == [True, True, False]


def test_response_budget_truncates_cleanly():
    policy = ScriptedPolicy(TURNS)
    config = RolloutConfig(max_response_tokens=60)
    with RolloutEngine("RAPO-Math-v0", policy, config, env_kwargs=ENV_KWARGS) as engine:
        [trajectory] = engine.run([2])
    assert trajectory.end_reason == "length"
    assert len(trajectory.token_ids) - trajectory.prompt_length == 60
    check_token_record(trajectory, policy.tokenizer)
    assert len(trajectory.steps) == 1 and trajectory.reward <= 0.0  # scored by the env: no answer


def test_prompt_truncation_keeps_the_question_end_and_rejects_an_impossible_budget():
    from rapo_agents.policies import ByteTokenizer

    tokenizer = ByteTokenizer()
    ids, truncated = fit_prompt(tokenizer, "system", "x" * 500 + " what is 6*7?", max_tokens=120)
    assert truncated and len(ids) <= 120 and "what is 6*7?" in tokenizer.decode(ids)
    with pytest.raises(PromptTooLongError):
        fit_prompt(tokenizer, "a long system prompt " * 20, "q", max_tokens=50)


class _BrokenEnv(gym.Env):
    observation_space = action_space = gym.spaces.Text(100)

    def reset(self, *, seed=None, options=None):
        return "question", {"task_id": "broken", "tools": ["python"]}

    def step(self, action):
        raise RuntimeError("the tool backend exploded")


def test_a_broken_env_ends_its_episode_not_the_run():
    with RolloutEngine(_BrokenEnv, ScriptedPolicy(TURNS), RolloutConfig(rollout_n=2)) as engine:
        trajectories = engine.run([0])
    assert [t.end_reason for t in trajectories] == ["env_error", "env_error"]
    assert "exploded" in trajectories[0].extra["error"]


def test_hf_policy_token_in_token_out_logprobs_match_a_forward_pass(tiny_policy):
    config = RolloutConfig(rollout_n=2, max_response_tokens=120, max_turn_tokens=40, temperature=1.0)
    with RolloutEngine("RAPO-Math-v0", tiny_policy, config, env_kwargs={**ENV_KWARGS, "max_turns": 3}) as engine:
        trajectories = engine.run([0, 3], seed=7)
        overlap_free = RolloutEngine("RAPO-Math-v0", tiny_policy,
                                     RolloutConfig(**{**config.__dict__, "overlap": False, "tool_workers": 1}),
                                     env_kwargs={**ENV_KWARGS, "max_turns": 3})
        with overlap_free:
            again = overlap_free.run([0, 3], seed=7)
    assert [t.token_ids for t in again] == [t.token_ids for t in trajectories]  # seeds make batching irrelevant
    model = tiny_policy.model
    for trajectory in trajectories:
        check_token_record(trajectory, tiny_policy.tokenizer)
        assert len(trajectory.token_ids) - trajectory.prompt_length <= 120
        ids = torch.tensor([trajectory.token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits.float()[0], dim=-1)
        recomputed = torch.zeros(len(trajectory.token_ids))
        recomputed[1:] = logprobs[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
        mask = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(trajectory.logprobs)[mask], recomputed[mask], atol=2e-4, rtol=2e-4)
        for step in trajectory.steps:
            assert step.entropy_paper is not None and 0 < step.entropy_paper <= torch.log(torch.tensor(259.0))
            assert step.entropy_reference is not None and step.entropy_reference > 0
    assert [t.rollout_index for t in trajectories] == [0, 1, 0, 1]


def test_fast_policy_episodes_join_a_continuous_batch_and_get_the_tokens_of_per_turn_batches(tiny_policy,
                                                                                              monkeypatch):
    fast = FastPolicy(copy.deepcopy(tiny_policy.model), tiny_policy.tokenizer, weight_format="fp32")
    config = RolloutConfig(rollout_n=2, max_response_tokens=120, max_turn_tokens=40, temperature=1.0)
    env_kwargs = {**ENV_KWARGS, "max_turns": 3}
    with RolloutEngine("RAPO-Math-v0", fast, dataclasses.replace(config, continuous_batching=False),
                       env_kwargs=env_kwargs) as per_turn:
        expected = per_turn.run([0, 3], seed=7)
        turns = per_turn.stats.generate_calls
    fast.prefix_cache.clear()
    monkeypatch.setattr(fast, "generate", lambda *args: pytest.fail("a continuous batch never calls generate"))
    with RolloutEngine("RAPO-Math-v0", fast, config, env_kwargs=env_kwargs) as engine:
        trajectories = engine.run([0, 3], seed=7)
    assert [t.token_ids for t in trajectories] == [t.token_ids for t in expected]  # per-row seeds, fp32
    for got, reference in zip(trajectories, expected, strict=True):
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(reference.logprobs), atol=1e-4, rtol=1e-4)
        check_token_record(got, tiny_policy.tokenizer)
    assert engine.stats.generated_tokens == per_turn.stats.generated_tokens
    assert engine.stats.generate_calls > turns  # one per decode step, not one per batch of turns


class ToolLatency(gym.Wrapper):
    """Env steps that take a random while (0-30 ms, from ``rng``): tools whose timing changes from run to run."""

    def __init__(self, env: gym.Env, rng: random.Random):
        super().__init__(env)
        self.rng = rng

    def step(self, action):
        time.sleep(self.rng.uniform(0.0, 0.03))
        return self.env.step(action)


@pytest.mark.parametrize("weight_format", ["int8", "fp32"])
def test_a_continuous_batch_run_repeats_to_the_last_bit_whatever_the_tools_timing(tiny_policy, weight_format):
    """Episodes rejoin the batch at fixed decode steps, so which rows decode together never depends on when a tool
    returns (before, 21-22 of 24 int8 episodes changed log-probs, and 1-2 changed tokens, under this jitter)."""
    config = RolloutConfig(rollout_n=4, max_response_tokens=200, max_turn_tokens=40, temperature=1.0)
    runs = []
    for latency_seed in (None, 1, 2):
        fast = FastPolicy(copy.deepcopy(tiny_policy.model), tiny_policy.tokenizer, weight_format=weight_format,
                          max_batch_size=8)
        rng = random.Random(latency_seed)
        wrappers = [lambda env, rng=rng: ToolLatency(env, rng)] if latency_seed is not None else []
        with RolloutEngine("RAPO-Math-v0", fast, config, env_kwargs={**ENV_KWARGS, "max_turns": 4},
                           wrappers=wrappers) as engine:
            runs.append(engine.run(list(range(6)), seed=7))
    first = runs[0]
    assert sum(len(trajectory.steps) for trajectory in first) > len(first)  # episodes rejoin after env steps
    for again in runs[1:]:
        assert [t.token_ids for t in again] == [t.token_ids for t in first]
        assert [t.logprobs for t in again] == [t.logprobs for t in first]  # exact, not within a tolerance


def test_sampling_params_come_from_the_config():
    seen: list[SamplingParams] = []

    class Recorder(ScriptedPolicy):
        def generate(self, contexts, sampling):
            seen.extend(sampling)
            return super().generate(contexts, sampling)

    config = RolloutConfig(temperature=0.6, top_p=0.95, top_k=20, max_turn_tokens=50)
    with RolloutEngine("RAPO-Math-v0", Recorder(TURNS), config, env_kwargs=ENV_KWARGS) as engine:
        engine.run([0], seed=3)
    assert {(p.temperature, p.top_p, p.top_k, p.max_new_tokens) for p in seen} == {(0.6, 0.95, 20, 50)}
    assert seen[0].stop == ("</python>", "</answer>") and seen[0].seed != seen[1].seed


def test_a_splice_over_the_response_budget_is_skipped_and_the_episode_goes_on():
    """Spec §4: a retrieved step that does not fit the budget is left out; the rollout keeps its turns."""
    from rapo_buffers.candidates import Candidate, StaticRetriever
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

    long_step = "<python>\n" + "x = 1\n" * 80 + "print(42)\n</python> <result>\n42\n</result>"
    retriever = StaticRetriever([Candidate(long_step, reward=1.0, score=0.9)])

    def wrap(env):
        return StepTraceRetrievalWrapper(env, retriever, retrieve_prob=1.0, no_retrieve_first_k=0, seed=0)

    policy = ScriptedPolicy(TURNS)
    with RolloutEngine("RAPO-Math-v0", policy, RolloutConfig(max_response_tokens=200), env_kwargs=ENV_KWARGS,
                       wrappers=[wrap]) as engine:
        [trajectory] = engine.run([0])
        stats = engine.stats
    assert len(long_step) > 200  # the splice alone exceeds the whole budget
    assert trajectory.end_reason == "answer" and len(trajectory.steps) == 2  # the answer turn was still played
    assert all(step.retrieval is None for step in trajectory.steps)
    assert trajectory.extra["retrieval_tokens"] == 0 and trajectory.extra["retrieval_token_spans"] == []
    assert trajectory.extra["skipped_splices"] == 1 and stats.skipped_splices == 1
    check_token_record(trajectory, policy.tokenizer)


def test_a_splice_that_fits_is_kept_and_only_the_env_text_is_ever_cut():
    from rapo_agents.policies import ByteTokenizer, Generation
    from rapo_agents.rollout.episode import EpisodeRecord

    record = EpisodeRecord.start(ByteTokenizer(), "", "q", max_prompt_tokens=100, max_response_tokens=12)
    record.add_generation(Generation(token_ids=[70, 71], text="CD", finish_reason="stop"), vocab_size=259)
    fits = {"span": (3, 6)}
    assert record.add_observation(" r>SPL", fits) and fits["token_span"] == (record.prompt_length + 5,
                                                                             record.prompt_length + 8)
    too_long = {"span": (2, 10)}
    assert record.add_observation(" s" + "X" * 8, too_long)  # 2 env tokens fit, the 8 spliced ones do not
    assert "token_span" not in too_long and record.skipped_splices == 1 and record.remaining == 2
    assert not record.add_observation(" more", None)  # the env's own text is cut to the budget: the episode ends


def test_a_policy_that_never_calls_a_tool_is_shown_expert_steps_in_hybrid_rollouts():
    """The no-warm-up case: under the reference's rule (the wrapper's default) a round without a tool call is a
    retrieval round too, so the hybrid rollout's context holds spliced expert steps, masked out of the loss."""
    from rapo_buffers.candidates import Candidate, StaticRetriever
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

    retriever = StaticRetriever([Candidate("<python>\nprint(6 * 7)\n</python> <result>\n42\n</result>", 1.0, 0.9)])

    def wrap(env):
        return StepTraceRetrievalWrapper(env, retriever, retrieve_prob=1.0, no_retrieve_first_k=1, group_size=2,
                                         seed=0)

    policy = ScriptedPolicy(["I am not sure how to start.", "<answer>\\boxed{42}</answer>"])
    with RolloutEngine("RAPO-Math-v0", policy, RolloutConfig(rollout_n=2), env_kwargs=ENV_KWARGS,
                       wrappers=[wrap]) as engine:
        on_policy, hybrid = engine.run([0])
    assert on_policy.num_tool_calls == hybrid.num_tool_calls == 0
    assert on_policy.extra["retrieval_tokens"] == 0
    assert [step.retrieval is not None for step in hybrid.steps] == [True, False]
    start, end = hybrid.steps[0].retrieval["token_span"]
    assert "print(6 * 7)" in decode(policy.tokenizer, hybrid.token_ids[start:end])
    assert not any(hybrid.loss_mask[start:end])
    check_token_record(hybrid, policy.tokenizer)
