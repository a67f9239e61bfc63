"""The QA training config's three question sets: training, buffer and held-out. The buffer is built from the
training questions (as the paper's is) and the held-out questions share none with either."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import rapo_env  # noqa: F401  (registers the envs)
from rapo_agents.backends import default_buffer_config
from rapo_agents.config import ConfigError, load_config
from rapo_agents.heldout import HeldoutConfig, accuracy_by_hops, heldout_env_kwargs
from rapo_agents.trainer import training_env_kwargs

QA_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "qa.yaml"


def question_sets(overrides: list[str], embedder, rapo_cache_dir) -> dict:
    """The training, held-out and buffer questions of ``configs/qa.yaml`` with ``overrides``."""
    config = load_config(str(QA_CONFIG), overrides)
    shared = {"embedder": embedder, "cache_dir": rapo_cache_dir}
    training_kwargs = training_env_kwargs(config)
    training = gym.make(config.data.env_id, **training_kwargs, **shared)
    heldout = gym.make(config.data.env_id, **heldout_env_kwargs(training_kwargs, config.evaluation), **shared)
    buffer_env = default_buffer_config(config).make_env()  # the env the buffer's expert plays
    sets = {"config": config, "training": list(training.unwrapped.tasks), "heldout": list(heldout.unwrapped.tasks),
            "buffer": list(buffer_env.tasks)}
    for env in (training, heldout, buffer_env):
        env.close()
    return sets


@pytest.fixture(scope="module")
def qa_question_sets(embedder, rapo_cache_dir):
    return question_sets([], embedder, rapo_cache_dir)


def test_the_heldout_questions_share_none_with_the_training_and_buffer_questions(qa_question_sets):
    ids = {name: {task.id for task in qa_question_sets[name]} for name in ("training", "heldout", "buffer")}
    questions = {name: {task.question for task in qa_question_sets[name]} for name in ("training", "heldout", "buffer")}
    assert len(ids["heldout"]) == qa_question_sets["config"].evaluation.heldout_tasks == 200
    assert ids["buffer"] == ids["training"]  # the expert solves the very training questions
    assert not ids["heldout"] & ids["training"] and not questions["heldout"] & questions["training"]
    assert all(task.metadata["split"] == "test" for task in qa_question_sets["heldout"])


def test_the_heldout_questions_mix_every_hop_count(qa_question_sets):
    heldout = qa_question_sets["heldout"]
    by_hops = accuracy_by_hops(heldout, [1.0] * len(heldout))
    assert sorted(by_hops) == ["eval/accuracy_hops1", "eval/accuracy_hops2", "eval/accuracy_hops3"]
    counts = [sum(task.metadata["hops"] == hops for task in heldout) for hops in (1, 2, 3)]
    assert min(counts) >= 50, counts


def test_hops_keeps_the_two_hop_questions_of_every_set_and_their_disjointness(qa_question_sets, embedder,
                                                                             rapo_cache_dir):
    two_hop = question_sets(["data.env_kwargs.hops=[2]"], embedder, rapo_cache_dir)
    assert two_hop["config"].data.env_kwargs["search"] == {"topk": 1}  # the override reaches into qa.yaml's mapping
    for name in ("training", "heldout", "buffer"):
        assert {task.metadata["hops"] for task in two_hop[name]} == {2}, name
    ids = {name: [task.id for task in two_hop[name]] for name in ("training", "heldout", "buffer")}
    assert ids["buffer"] == ids["training"] and len(ids["training"]) == 256
    assert not set(ids["heldout"]) & set(ids["training"])
    # The held-out set is every 2-hop test question (fewer than 200), and it keeps the mixture's order.
    mixed_two_hop = [task.id for task in qa_question_sets["heldout"] if task.metadata["hops"] == 2]
    assert ids["heldout"][: len(mixed_two_hop)] == mixed_two_hop and len(mixed_two_hop) < len(ids["heldout"]) < 200


def test_the_generated_knowledge_base_belongs_to_the_qa_env():
    with pytest.raises(ConfigError, match="data.env_id=RAPO-QA-v0"):
        load_config(None, ["data.source=procedural_kb"])


def test_the_math_heldout_split_keeps_its_own_size_key():
    kwargs = heldout_env_kwargs({"dataset": "procedural", "num_tasks": 128}, HeldoutConfig(heldout_tasks=7))
    assert kwargs == {"dataset": "procedural", "num_tasks": 7, "split": "test"}
