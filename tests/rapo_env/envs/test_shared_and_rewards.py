"""What the three envs share: one process-wide cache of heavy resources, and one way to resolve a reward name."""

from __future__ import annotations

import multiprocessing
import urllib.request

import pytest

from rapo_env.envs.math import MathEnv
from rapo_env.envs.qa import QAEnv
from rapo_env.envs.reward_spec import resolve_reward
from rapo_env.envs.shared import SHARED, ProcessCache
from rapo_env.envs.web import WebEnv
from rapo_env.rewards.qa import QAReward
from rapo_env.tasks.base import Task
from rapo_tools.search.embedding import Embedder

SMALL_KB = {"num_countries": 3, "num_towns": 8, "num_organizations": 6, "num_people": 16, "num_works": 10}


@pytest.fixture(scope="module")
def kb_options(sentence_encoder, rapo_cache_dir) -> dict:
    return {"knowledge_base": SMALL_KB, "cache_dir": rapo_cache_dir, "embedder": Embedder(sentence_encoder)}


def test_envs_of_one_process_share_one_loaded_index_and_one_site(kb_options):
    first, second = QAEnv(**kb_options), QAEnv(**kb_options)
    web_a, web_b = WebEnv(**kb_options), WebEnv(**kb_options)
    try:
        assert first.tools["search"].backend.wiki is second.tools["search"].backend.wiki  # one WikiSearch
        assert web_a.offline_web is web_b.offline_web
        site = web_a.offline_web.base_url
        # The web env's index is the very one the QA env loaded for the same knowledge base.
        assert web_a.offline_web.provider.wiki is first.tools["search"].backend.wiki
    finally:
        first.close(), second.close()
        web_a.close()
        assert urllib.request.urlopen(site, timeout=5).status == 200  # web_b still serves it
        web_b.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(site, timeout=5)  # the last user stopped the server


def _child_builds_its_own(cache: ProcessCache, queue) -> None:
    queue.put(cache.get("key", lambda: "built in the child"))


def test_a_forked_child_builds_its_own_value_and_release_closes_once():
    cache = ProcessCache()
    assert cache.get("key", lambda: "built in the parent") == "built in the parent"
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_builds_its_own, args=(cache, queue))
    child.start()
    child.join(30)
    assert queue.get(timeout=5) == "built in the child"
    closed = []
    assert cache.acquire("site", lambda: "server") == cache.acquire("site", lambda: "another") == "server"
    cache.release("site", closed.append)
    assert closed == []
    cache.release("site", closed.append)
    assert closed == ["server"] and cache.acquire("site", lambda: "restarted") == "restarted"
    assert SHARED is not cache  # the envs' store is one module-level instance


@pytest.mark.parametrize("name", ["f1", "em", "reference"])
def test_a_reward_name_means_the_same_in_every_env(name):
    task = Task(id="t", question="Who?", answers=["Ada Lovelace"], source="test")
    response = "<think>I know it.</think>\n<answer>\\boxed{Ada Lovelace}</answer>"
    allowed = {"RAPO-QA-v0": ("f1", "em", "substring", "reference"), "RAPO-Web-v0": ("reference", "f1", "em")}
    rewards = [resolve_reward(name, ("search",), names, env) for env, names in allowed.items()]
    assert all(isinstance(reward, QAReward) and reward.kind == name for reward in rewards)
    assert len({reward(response, task).reward for reward in rewards}) == 1


def test_env_rewards_are_resolved_by_name_and_bad_names_say_what_exists():
    assert isinstance(MathEnv(num_tasks=2, sandbox="subprocess", reward="reference").reward_fn, QAReward)
    with pytest.raises(ValueError, match="unknown RAPO-Math-v0 reward 'f1'; use 'math_verify', 'reference'"):
        MathEnv(num_tasks=2, sandbox="subprocess", reward="f1")
    with pytest.raises(ValueError, match="needs judge="):
        resolve_reward("judge", ("search",), ("judge",), "RAPO-Web-v0")
    custom = lambda response, task: None  # noqa: E731
    assert resolve_reward(custom, ("python",), (), "RAPO-Math-v0") is custom
