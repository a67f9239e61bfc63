"""What a splice carries on multi-hop QA (`benchmarks/_splices.py`): each splice classified against the question's
relation chain and what the rollout had seen, and the randomised comparison at the first tool round."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
CHAINS = {"two": ["Ann", "Bob"], "three": ["Cy", "Dee", "Eve"]}


@pytest.fixture(scope="module")
def splices():
    spec = importlib.util.spec_from_file_location("splices_benchmark", BENCHMARKS / "_splices.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def search(entity: str, splice: str | None = None, tool: bool = True) -> dict:
    """A policy step searching ``entity``, with the search of a spliced step after its result if ``splice``."""
    retrieval = {"text": f"<retrieve><search>{splice}</search> <result>...</result></retrieve>"} if splice else None
    return {"action": f"<think>...</think>\n<search>{entity}</search>", "tool": "search" if tool else None,
            "retrieval": retrieval}


ANSWER = {"action": "<answer>\\boxed{x}</answer>", "tool": None, "retrieval": None}


def rollout(task: str, index: int, reward: float, steps: list[dict], end: str = "answer") -> dict:
    return {"task_id": task, "rollout_index": index, "reward": reward, "steps": steps, "end_reason": end}


@pytest.mark.parametrize(("entity", "seen", "kind"), [
    ("Dee", ["Cy"], "next"),            # the hop the rollout needs
    ("Cy", ["Cy"], "repeat"),           # what it already searched
    ("Eve", ["Cy"], "later"),           # a hop past the next one
    ("Zed", ["Cy"], "off_chain"),       # another question's entity
    ("Eve", ["Cy", "Dee"], "next"),
    ("Eve", ["Cy", "Dee", "Eve"], "repeat"),
    (None, ["Cy"], "off_chain"),        # a spliced step without a search
])
def test_a_splice_is_classified_against_the_chain_and_what_the_rollout_has_seen(splices, entity, seen, kind):
    assert splices.splice_kind(entity, CHAINS["three"], seen) == kind


def test_a_runs_splices_are_counted_by_kind_with_the_reward_of_the_rollouts_holding_them(splices):
    trajectories = [
        rollout("three", 0, 1.0, [search("Cy", splice="Dee"), search("Eve"), ANSWER]),  # next
        rollout("three", 1, 0.0, [search("Cy", splice="Cy"), ANSWER]),                  # repeat
        rollout("two", 0, 0.0, [search("Ann", splice="Zed"), ANSWER]),                  # off chain
        rollout("two", 1, 1.0, [search("Ann"), search("Bob"), ANSWER]),                 # none
    ]
    content = splices.splice_content(trajectories, CHAINS)
    assert content["splices_next"] == content["splices_repeat"] == content["splices_off_chain"] == pytest.approx(1 / 3)
    assert content["splices_later"] == 0.0
    assert (content["reward_after_next_splice"], content["reward_after_repeat_splice"]) == (1.0, 0.0)


def test_the_first_round_effect_compares_rollouts_of_one_group_at_the_same_state(splices):
    group = [
        rollout("three", 0, 0.0, [search("Cy"), ANSWER]),                  # no splice, state {Cy}
        rollout("three", 1, 1.0, [search("Cy"), search("Dee"), ANSWER]),   # no splice, state {Cy}
        rollout("three", 2, 1.0, [search("Cy", splice="Dee"), ANSWER]),    # next hop spliced
        rollout("three", 3, 0.0, [search("Cy", splice="Zed"), ANSWER]),    # another question's step
    ]
    elsewhere = [rollout("three", 4, 0.0, [search("Zed", splice="Cy"), ANSWER])]  # state {}: nothing to match
    next_group = [rollout("three", 0, 1.0, [search("Cy", splice="Dee"), ANSWER])]  # next step: its own group
    effects = splices.first_round_effects(group + elsewhere + next_group, CHAINS)
    assert sorted((e["kind"], e["hops"], e["difference"]) for e in effects) == [("next", 3, 0.5), ("other", 3, -0.5)]
    pooled = splices.pooled(effects + [{"kind": "next", "difference": -0.5}], ("kind",), "difference")
    assert [(row["kind"], row["n"], row["difference"]) for row in pooled] == [("next", 2, 0.0), ("other", 1, -0.5)]
    assert pooled[0]["low"] == -0.5 and pooled[0]["high"] == 0.5  # the bootstrap over the two records
    assert pooled[1]["low"] == pooled[1]["high"] == -0.5


def test_at_a_3_hop_questions_second_hop_it_is_told_how_it_came_and_what_followed(splices):
    trajectories = [
        rollout("three", 0, 0.0, [search("Cy", splice="Dee"), ANSWER]),                          # splice, answer
        rollout("three", 1, 0.0, [search("Cy", splice="Dee"), search("Eve")], end="length"),      # splice, third
        rollout("three", 2, 1.0, [search("Cy"), search("Dee"), search("Eve"), ANSWER]),           # own, third
        rollout("two", 0, 1.0, [search("Ann"), search("Bob"), ANSWER]),                           # not 3-hop
        rollout("three", 3, 0.0, [search("Dee"), ANSWER]),                                        # hop 1 never seen
    ]
    records = splices.after_two_hops(trajectories, CHAINS)
    assert [(r["reached"], r["then"], r["length_cut"]) for r in records] == [
        ("splice", "answer", False), ("splice", "third", True), ("own", "third", False)]


def test_held_out_hop_counts_are_given_only_when_they_reproduce_the_runs_own_accuracy_by_hops(splices, tmp_path):
    from rapo_agents.config import load_config
    from rapo_agents.heldout import accuracy_by_hops
    from rapo_env.tasks.knowledge_base import KnowledgeBase

    config = load_config(str(BENCHMARKS.parent / "configs" / "qa.yaml"), [])
    config.to_yaml(tmp_path / "config.yaml")
    tasks = KnowledgeBase.generate(0, **config.data.env_kwargs["knowledge_base"]).split("test")[:12]
    correct = [float(task.metadata["hops"] == 1) for task in tasks]  # right on 1-hop questions only
    evaluation = {"correct": correct, **accuracy_by_hops(tasks, correct)}
    assert splices.heldout_hops(tmp_path, evaluation) == [task.metadata["hops"] for task in tasks]
    shifted = {**evaluation, "correct": correct[1:] + correct[:1]}  # another order than the one evaluated
    assert splices.heldout_hops(tmp_path, shifted) is None
    assert splices.heldout_hops(tmp_path, {"correct": correct}) is None  # a run that did not record its hops


def test_a_two_hop_runs_chains_are_its_two_hop_training_questions(splices, tmp_path):
    from rapo_agents.config import load_config

    load_config(str(BENCHMARKS.parent / "configs" / "qa.yaml"), ["data.env_kwargs.hops=[2]"]).to_yaml(
        tmp_path / "config.yaml")
    chains = splices.training_chains(tmp_path)
    assert len(chains) > 256 and {len(chain) for chain in chains.values()} == {2}
