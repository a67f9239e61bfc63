"""ARPO-style branching rollouts: the slot bookkeeping, the entropy rule, and whole groups on the real math env."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rapo_agents.batch import build_batch
from rapo_agents.policies import ScriptedPolicy
from rapo_agents.rapo import group_normalize
from rapo_agents.rollout import RolloutConfig, RolloutEngine
from rapo_agents.rollout.branching import ARPOConfig, branch_count, initial_reserves, split_reserve

ENV_KWARGS = {"num_tasks": 4, "sandbox": "subprocess"}
TURNS = ["<python>\nprint(6 * 7)\n</python>", "<python>\nprint(6 * 7 + 0)\n</python>", "<answer>\\boxed{42}</answer>"]
CALM, UNSURE = [-0.01, -5.0], [-0.7, -0.7]  # top-2 log-probs of a confident and of a torn token


class EntropyScriptedPolicy(ScriptedPolicy):
    """Plays TURNS; the turns after a tool result are as unsure as ``after_tool`` says (the first is calm)."""

    def __init__(self, after_tool):
        super().__init__(TURNS)
        self.after_tool = after_tool

    def response(self, context):
        """What follows the prompt (whose system turn explains the tags, <result> included)."""
        return self.tokenizer.decode(context).split("<|im_start|>assistant", 1)[-1]

    def generate(self, contexts, sampling):
        generations = super().generate(contexts, sampling)
        return [
            dataclasses.replace(generation, top_logprobs=[self.after_tool if "<result>" in self.response(context)
                                                          else CALM] * generation.num_tokens)
            for context, generation in zip(contexts, generations, strict=True)
        ]


def run(after_tool, arpo: ARPOConfig, tasks=(2,), group_size=4, seed=0):
    config = RolloutConfig(rollout_n=group_size)
    with RolloutEngine("RAPO-Math-v0", EntropyScriptedPolicy(after_tool), config, ENV_KWARGS, arpo=arpo) as engine:
        return engine.run(list(tasks), seed=seed), engine.stats


def test_slots_are_dealt_once_and_branch_rule_follows_entropy():
    for group_size, initial in ((16, 8), (4, 1), (5, 2), (3, 3)):
        reserves = initial_reserves(group_size, initial)
        slots = sorted(list(range(initial)) + [slot for reserve in reserves for slot in reserve])
        assert slots == list(range(group_size))
    parent, children = split_reserve([4, 5, 6, 7, 8], branches=2)
    assert children == [(4, [7]), (5, [8])] and parent == [6]
    assert split_reserve([4], branches=3) == ([], [(4, [])])
    # tau = 0.5, w = 0.2: a rise of the entropy turns a refused draw into a branch, a fall the other way round.
    assert branch_count(0.0, [0.6], 0.2, 0.5) == 0 and branch_count(1.0, [0.6], 0.2, 0.5) == 1
    assert branch_count(-1.0, [0.45], 0.2, 0.5) == 0 and branch_count(0.0, [0.45, 0.2, 0.9], 0.2, 0.5) == 2
    with pytest.raises(ValueError, match="exceeds the group size"):
        ARPOConfig(initial_rollouts=5).enabled(4)


def test_entropy_rise_after_tool_results_branches_the_group_to_rollout_n():
    # tau = 0 and a large weight make the draw irrelevant: branch exactly when the entropy rose.
    arpo = ARPOConfig(initial_rollouts=1, beam_size=2, branch_probability=0.0, entropy_weight=100.0)
    trajectories, stats = run(UNSURE, arpo)
    assert [t.rollout_index for t in trajectories] == [0, 1, 2, 3]
    assert stats.branches == 3 and stats.refills == 0 and stats.episodes == 4
    by_index = {t.rollout_index: t for t in trajectories}
    assert "branch_parent" not in by_index[0].extra
    for branch in trajectories[1:]:
        parent = by_index[branch.extra["branch_parent"]]
        shared = branch.extra["branch_prefix_tokens"]
        # The branch is a whole trajectory whose prefix (up to a tool result) is the parent's, token for token.
        assert branch.token_ids[:shared] == parent.token_ids[:shared]
        assert branch.loss_mask[:shared] == parent.loss_mask[:shared]
        assert branch.logprobs[:shared] == parent.logprobs[:shared]
        assert branch.question == parent.question and branch.prompt_length == parent.prompt_length
        prefix = branch.token_ids[branch.prompt_length: shared]
        assert EntropyScriptedPolicy(UNSURE).tokenizer.decode(prefix).endswith("</result>")
        assert branch.end_reason == "answer" and branch.reward == by_index[0].reward  # scored on the whole transcript
        # The env went on from the copied state: tool calls counted from the parent's.
        assert branch.num_tool_calls == 2 and len(branch.steps) == 3
        policy_tokens = [i for i, m in enumerate(branch.loss_mask) if m]
        assert policy_tokens == [i for s in branch.steps for i in range(s.token_start, s.token_end)]
    # Each branch is a full member of its question's group for the advantages.
    for index, trajectory in enumerate(trajectories):
        trajectory.reward = float(index % 2)
    batch = build_batch(trajectories, pad_token_id=0)
    torch.testing.assert_close(batch.advantages, group_normalize(batch.rewards, torch.zeros(4, dtype=torch.long)))


def test_flat_entropy_never_branches_and_fresh_rollouts_fill_the_group():
    arpo = ARPOConfig(initial_rollouts=1, beam_size=2, branch_probability=0.0, entropy_weight=100.0)
    trajectories, stats = run(CALM, arpo)
    assert [t.rollout_index for t in trajectories] == [0, 1, 2, 3]
    assert stats.branches == 0 and stats.refills == 3
    assert all("branch_parent" not in t.extra and t.num_tool_calls == 2 for t in trajectories)


def test_random_branching_fills_every_group_exactly_and_reproduces():
    arpo = ARPOConfig(initial_rollouts=2, beam_size=3, branch_probability=0.5, entropy_weight=0.2)
    first, stats = run(UNSURE, arpo, tasks=(0, 3, 1), group_size=6, seed=4)
    assert [(t.extra["group_index"], t.rollout_index) for t in first] == [(g, i) for g in range(3) for i in range(6)]
    assert stats.branches + stats.refills == 3 * 4 and stats.branches > 0
    again, _ = run(UNSURE, arpo, tasks=(0, 3, 1), group_size=6, seed=4)
    assert [t.token_ids for t in again] == [t.token_ids for t in first]
    assert [t.extra.get("branch_parent") for t in again] == [t.extra.get("branch_parent") for t in first]
