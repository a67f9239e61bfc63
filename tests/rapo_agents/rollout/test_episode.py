"""`Episode`'s splice rule: a retrieval splice must leave ``min_tokens_after_splice`` tokens of the response budget.

Issue #25: on the one-call math default every kept splice filled the 192-token budget, so the answer was cut and
the hybrid rollout scored -1. ``rollout.min_tokens_after_splice`` skips such a splice (counted like one that does
not fit); 0, the default, is the paper's rule: skip only a splice that does not fit.
"""

import pytest

from rapo_agents.config import ConfigError, load_config
from rapo_agents.policies import ByteTokenizer, Generation, ScriptedPolicy
from rapo_agents.rollout import RolloutConfig, RolloutEngine
from rapo_agents.rollout.episode import Episode
from rapo_agents.step_metrics import engine_metrics

ACTION = "<python>print(1)</python>"
ENV_TEXT = " <result>\n1\n</result>"
SPLICE = " <retrieve>expert step</retrieve>"
OBSERVATION = ENV_TEXT + SPLICE
SPAN = (len(ENV_TEXT), len(OBSERVATION))
AFTER_ACTION = 10
"""Response tokens a kept splice leaves in `started`'s default budget (the byte tokenizer: one token a byte)."""


def started(min_tokens_after_splice: int = 0, left_after_splice: int = AFTER_ACTION) -> Episode:
    """An episode (no env) that played one tool call, with a budget that leaves ``left_after_splice`` tokens once
    `OBSERVATION`, splice and all, is appended."""
    tokenizer = ByteTokenizer()
    budget = len(ACTION) + len(OBSERVATION) + left_after_splice
    episode = Episode(task_index=0, rollout_index=0, group_index=0)
    episode.begin("What is 1?", {"task_id": "q0", "system_prompt": ""}, tokenizer, max_prompt_tokens=200,
                  max_response_tokens=budget, min_tokens_after_splice=min_tokens_after_splice)
    episode.add_generation(Generation(token_ids=tokenizer.encode(ACTION), text=ACTION, finish_reason="stop"),
                           vocab_size=len(tokenizer))
    return episode


def offer_splice(episode: Episode) -> None:
    episode.add_step(OBSERVATION, 0.0, False, False,
                     {"tool": "python", "tool_calls": 1, "retrieval": {"span": SPAN, "text": SPLICE}})


def test_by_default_a_splice_that_fits_with_no_room_left_is_kept_and_the_budget_ends_the_episode():
    episode = started(min_tokens_after_splice=0, left_after_splice=0)
    offer_splice(episode)
    record = episode.record
    assert record.skipped_splices == 0 and record.retrieval_tokens == len(SPLICE)
    assert episode.record.steps[-1].retrieval["token_span"] == (record.prompt_length + len(ACTION) + len(ENV_TEXT),
                                                                len(record.token_ids))
    assert record.remaining == 0 and episode.end_reason == "length"  # no room for the answer: the paper's rule


def test_a_splice_that_would_leave_less_than_the_headroom_is_skipped_and_counted():
    episode = started(min_tokens_after_splice=AFTER_ACTION + 1)
    offer_splice(episode)
    unspliced = started(min_tokens_after_splice=AFTER_ACTION + 1)
    unspliced.add_step(ENV_TEXT, 0.0, False, False, {"tool": "python", "tool_calls": 1})
    record, expected = episode.record, unspliced.record
    assert record.skipped_splices == 1 and record.retrieval_tokens == 0 and record.retrieval_token_spans == []
    assert episode.end_reason is None  # the episode goes on, with room for its answer
    assert record.steps[-1].retrieval is None and record.steps == expected.steps
    assert (record.token_ids, record.loss_mask, record.logprobs) == (
        expected.token_ids, expected.loss_mask, expected.logprobs)  # exactly as if no splice had been offered


def test_a_splice_that_leaves_the_headroom_is_kept():
    episode = started(min_tokens_after_splice=AFTER_ACTION)
    offer_splice(episode)
    assert episode.record.skipped_splices == 0 and episode.record.retrieval_tokens == len(SPLICE)
    assert episode.record.remaining == AFTER_ACTION and episode.end_reason is None


def test_a_negative_headroom_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="min_tokens_after_splice must be >= 0.*got -1"):
        RolloutConfig(min_tokens_after_splice=-1)
    with pytest.raises(ConfigError, match="min_tokens_after_splice must be >= 0"):
        load_config(None, ["rollout.min_tokens_after_splice=-1"])
    assert load_config(None, ["rollout.min_tokens_after_splice=48"]).rollout.min_tokens_after_splice == 48
    assert RolloutConfig().min_tokens_after_splice == 0 and load_config().rollout.min_tokens_after_splice == 0


def test_the_engine_applies_the_headroom_and_reports_the_skip_in_its_metrics():
    """A short expert step fits the 400-token budget, but leaves less than the 300 tokens asked for: skipped, and
    the answer turn is still played."""
    from rapo_buffers.candidates import Candidate, StaticRetriever
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

    retriever = StaticRetriever([Candidate("<python>\nprint(6 * 7)\n</python> <result>\n42\n</result>", 1.0, 0.9)])

    def wrap(env):
        return StepTraceRetrievalWrapper(env, retriever, retrieve_prob=1.0, no_retrieve_first_k=0, seed=0)

    policy = ScriptedPolicy(["<think>compute</think>\n<python>\nprint(6 * 7)\n</python>",
                             "<answer>\\boxed{42}</answer>"])
    config = RolloutConfig(max_response_tokens=400, min_tokens_after_splice=300)
    with RolloutEngine("RAPO-Math-v0", policy, config, env_kwargs={"num_tasks": 1, "sandbox": "subprocess"},
                       wrappers=[wrap]) as engine:
        [trajectory] = engine.run([0])
        stats = engine.stats
    assert trajectory.end_reason == "answer" and len(trajectory.steps) == 2
    assert all(step.retrieval is None for step in trajectory.steps) and trajectory.extra["retrieval_tokens"] == 0
    assert trajectory.extra["skipped_splices"] == 1
    assert engine_metrics(stats, rollout_seconds=1.0, episodes=1)["retrieval/skipped_splices"] == 1.0
