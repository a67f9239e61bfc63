"""Branching an episode in progress into another env (`rapo_env.core.copy_episode`), wrappers included."""

from __future__ import annotations

import gymnasium as gym
import pytest

import rapo_env  # noqa: F401  (registers the envs)
from rapo_buffers.candidates import Candidate, StaticRetriever
from rapo_env.core import copy_episode
from rapo_env.wrappers import StepTraceRetrievalWrapper

TRACE = "<python>\nprint(3 * 14)\n</python> <result>\n42\n</result>"


def make(retrieve_prob=None):
    env = gym.make("RAPO-Math-v0", disable_env_checker=True, num_tasks=3, sandbox="subprocess", max_tool_calls=2)
    if retrieve_prob is None:
        return env
    retriever = StaticRetriever([Candidate(TRACE, reward=1.0, score=0.9)])
    return StepTraceRetrievalWrapper(env, retriever, retrieve_prob=retrieve_prob, no_retrieve_first_k=1, group_size=4)


def test_a_copied_episode_goes_on_from_the_source_state_independently():
    source, target = make(retrieve_prob=1.0), make(retrieve_prob=1.0)
    source.reset(seed=0, options={"task_index": 2, "rollout_index": 1})
    observation, *_, info = source.step("<python>print(6 * 7)</python>")
    assert info["retrieval"] is not None  # hybrid rollout: the splice is part of the copied context
    target.reset(seed=1, options={"task_index": 2, "rollout_index": 0})
    copy_episode(source, target)
    assert target.context == source.context and target.unwrapped.transcript == source.unwrapped.transcript
    assert target.unwrapped.tool_calls == 1 and target.unwrapped.turn == 1
    assert not target.settings.is_hybrid(0) and target.step("<python>print(1)</python>")[4]["retrieval"] is None
    # The tool-call limit counts the copied call: one more call is allowed, the next truncates.
    *_, truncated, info = target.step("<python>print(2)</python>")
    assert truncated and info["episode_end"] == "tool_limit"
    # The source is untouched by the target's steps.
    assert source.unwrapped.tool_calls == 1 and source.unwrapped.transcript.count("<python>") == 1
    *_, terminated, _, _ = source.step("<answer>\\boxed{1}</answer>")
    assert terminated
    source.close()
    target.close()


def test_copying_needs_the_same_stack_and_task():
    source, plain, other = make(retrieve_prob=0.5), make(), make(retrieve_prob=0.5)
    source.reset(options={"task_index": 0})
    plain.reset(options={"task_index": 0})
    with pytest.raises(TypeError, match="built the same way"):
        copy_episode(source, plain)
    other.reset(options={"task_index": 1})
    with pytest.raises(ValueError, match="source's task"):
        copy_episode(source, other)
    for env in (source, plain, other):
        env.close()
