"""``RAPO-Web-v0`` end to end: the offline site on loopback, real search and browse calls, a scripted agent,
the rewards (reference, F1, EM, LLM judge over a loopback OpenAI-compatible endpoint) and the web benchmarks."""

# No `from __future__ import annotations`: FastAPI must see the real types of the route parameters.
import re

import gymnasium as gym
import httpx
import pytest
from gymnasium.utils.env_checker import check_env

import rapo_env
from rapo_env.envs.web import WebEnv
from rapo_env.rewards.judge import LLMJudgeReward
from rapo_env.tasks.base import Task
from rapo_env.tasks.web_datasets import WEB_DATASET_FILES, load_web_dataset
from rapo_tools.serving import serve_in_thread
from rapo_tools.web.providers.local import page_path

SMALL_BASE = {"num_countries": 3, "num_towns": 8, "num_organizations": 6, "num_people": 16, "num_works": 8}
_URL = re.compile(r"(?:URL: |-> )(http://\S+)")


@pytest.fixture(scope="module")
def embedder(sentence_encoder):
    from rapo_tools.search.embedding import Embedder

    return Embedder(model=sentence_encoder)


@pytest.fixture(scope="module")
def web_options(embedder, tmp_path_factory):
    """A small knowledge base, cached in a temporary folder, searched with the session's encoder."""
    return {"knowledge_base": SMALL_BASE, "cache_dir": str(tmp_path_factory.mktemp("rapo-cache")), "embedder": embedder}


@pytest.fixture(scope="module")
def env(web_options):
    environment = WebEnv(max_tool_calls=4, **web_options)
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def task_indices(env):
    """Three questions of each hop count (1, 2, 3)."""
    by_hops = {1: [], 2: [], 3: []}
    for index, task in enumerate(env.tasks):
        if len(by_hops[task.metadata["hops"]]) < 3:
            by_hops[task.metadata["hops"]].append(index)
    return [index for indices in by_hops.values() for index in indices]


class ScriptedWebAgent:
    """Searches the first entity of the question's chain, browses to each evidence page in turn through the URLs
    of the search results and of the page links, and answers with what the last fetched page says: the gold
    answer only if that page shows it, else "unknown". A wrong index, a dead browse or a broken site lower its
    reward."""

    def __init__(self, task: Task):
        self.task = task
        self.evidence = [page_path(title) for title in task.metadata["evidence_titles"]]

    def act(self, observation: str) -> str:
        if not observation:
            return f"<think>I will search the web.</think>\n<search>{self.task.metadata['search_queries'][0]}</search>"
        if self.evidence:
            target = next((url for url in _URL.findall(observation) if url.endswith(self.evidence[0])), None)
            if target is not None:
                self.evidence.pop(0)
                return f"<think>This page should help.</think>\n<browse>{target}</browse>"
        answer = self.task.answers[0]
        found = answer if not self.evidence and answer in observation else "unknown"
        return f"<think>The page says it.</think>\n<answer>\\boxed{{{found}}}</answer>"


def run_episode(env, task_index: int):
    prompt, info = env.reset(seed=task_index, options={"task_index": task_index})
    task = env.unwrapped.task
    agent, observation, steps = ScriptedWebAgent(task), "", []
    for _ in range(8):
        action = agent.act(observation)
        observation, reward, terminated, truncated, step_info = env.step(action)
        steps.append(step_info)
        if terminated or truncated:
            return reward, steps, info
    raise AssertionError("the episode did not end")


def test_registered_as_nondeterministic():
    assert "RAPO-Web-v0" in rapo_env.RAPO_ENV_IDS
    assert gym.spec("RAPO-Web-v0").nondeterministic is True


def test_scripted_agent_solves_offline_episodes(env, task_indices):
    rewards, browsed, evidence_pages = [], 0, 0
    for task_index in task_indices:
        reward, steps, info = run_episode(env, task_index)
        assert info["tools"] == ["search", "browse"] and "<browse>" in info["system_prompt"]
        assert all(step["tool_ok"] in (True, None) for step in steps), steps
        assert steps[0]["tool"] == "search" and steps[-1]["episode_end"] == "answer"
        browsed += sum(step["tool"] == "browse" for step in steps)
        evidence_pages += len(env.task.metadata["evidence_titles"])
        rewards.append(reward)
    # Every evidence page is found (by search, then through page links) and fetched over HTTP.
    assert rewards == [1.0] * len(task_indices)
    assert browsed == evidence_pages > len(task_indices)


def test_env_passes_the_gymnasium_checker(web_options):
    # Built directly: gym.make's spec would deep-copy the loaded embedder (the default env is checked by
    # test_registered_envs.py).
    with WebEnv(**web_options) as env:
        check_env(env, skip_render_check=True)


def test_info_never_leaks_the_answer(env):
    prompt, info = env.reset(options={"task_index": 0})
    answer = env.task.answers[0]
    _, _, _, _, step_info = env.step(f"<search>{prompt}</search>")
    assert answer not in repr(info) and answer not in repr(step_info)


def test_tool_failures_become_observations(env):
    prompt, _ = env.reset(options={"task_index": 1})
    obs, reward, terminated, truncated, info = env.step("<browse>file:///etc/passwd</browse>")
    assert "only http and https" in obs and info["tool_ok"] is False and info["tool_error"] == "bad_input"
    obs, *_, info = env.step("<browse>http://127.0.0.1:9/</browse>")
    assert info["tool_error"] == "blocked_address"  # only the offline site's origin is open
    obs, reward, terminated, truncated, info = env.step("<think>t</think><answer>\\boxed{nobody}</answer>")
    assert terminated and reward == 0.0 and info["metrics"]["f1"] == 0.0


def test_bing_provider_against_the_sites_v7_endpoint(env, web_options, task_indices, monkeypatch):
    monkeypatch.setenv("RAPO_TEST_SITE_KEY", "any")
    endpoint = f"{env.offline_web.base_url}/v7.0/search"
    # A second env on the same site searches it through the Bing v7 JSON over HTTP instead of in-process.
    bing_env = WebEnv(
        max_tool_calls=4,
        search={"provider": "bing", "endpoint": endpoint, "api_key_env": "RAPO_TEST_SITE_KEY"},
        **web_options,
    )
    try:
        assert bing_env.offline_web is env.offline_web  # one server and one index per process
        reward, steps, _ = run_episode(bing_env, task_indices[-1])
        assert reward == 1.0 and steps[0]["tool_ok"]
    finally:
        bing_env.close()
    assert httpx.get(f"{endpoint}?q=test").status_code == 200  # the first env's site is still up


def test_f1_em_and_python_options(web_options):
    env = WebEnv(reward="em", python=True, sandbox="subprocess", **web_options)
    try:
        prompt, info = env.reset(options={"task_index": 0})
        assert info["tools"] == ["search", "browse", "python"]
        obs, *_ = env.step("<python>print(6 * 7)</python>")
        assert "42" in obs
        gold = env.task.answers[0]
        *_, info = env.step(f"<answer>\\boxed{{{gold} perhaps}}</answer>")
        assert info["metrics"]["em"] == 0.0 and 0 < info["metrics"]["f1"] < 1
    finally:
        env.close()
    with pytest.raises(ValueError, match="judge"):
        WebEnv(reward="judge", **web_options)


def build_judge_app():
    from fastapi import FastAPI, Request

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        prompt = (await request.json())["messages"][-1]["content"]
        golds = re.search(r"Labeled answer: (.*)", prompt).group(1).lower().split(" or ")
        predicted = re.search(r"Predicted answer: (.*)", prompt).group(1).lower().strip()
        verdict = "Correct" if predicted and any(gold.strip() in predicted for gold in golds) else "Incorrect"
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": verdict}}]}

    return app


def test_llm_judge_reward_over_an_openai_compatible_endpoint():
    task = Task(id="t", question="Where was Ada Lovelace born?", answers=("London",), source="toy")
    with serve_in_thread(build_judge_app()) as base_url:
        judge = LLMJudgeReward({"base_url": f"{base_url}/v1", "model": "judge", "api_key_env": None}, ("search",))
        right = judge("<answer>\\boxed{in London, England}</answer>", task)
        wrong = judge("<answer>\\boxed{Paris}</answer>", task)
        bad_format = judge("<answer>no box</answer><answer>twice</answer>", task)
        judge.close()
    assert right.reward == 1.0 and right.metrics["judge"] == 1.0 and right.metrics["f1"] < 1.0
    assert wrong.reward == 0.0 and wrong.metrics["judge_error"] == 0.0
    assert bad_format.reward == -1.0


def test_dead_judge_falls_back_to_f1():
    task = Task(id="t", question="q", answers=("London",), source="toy")
    judge = LLMJudgeReward({"base_url": "http://127.0.0.1:9/v1", "model": "m", "retries": 0, "timeout_s": 1.0}, ())
    score = judge("<answer>\\boxed{London}</answer>", task)
    judge.close()
    assert score.reward == 1.0 and score.metrics["judge_error"] == 1.0


def test_web_benchmarks_load_in_their_reference_formats(shared_data):
    web = shared_data / "web"
    sizes = {name: len(load_web_dataset(name, data_dir=web)) for name in WEB_DATASET_FILES}
    assert sizes == {"simpleqa": 500, "gaia": 103, "webwalker": 200, "webwalkerqa": 680, "deepsearch": 1071}
    gaia = load_web_dataset("gaia", data_dir=web, level=1)
    assert gaia[0].id.startswith("gaia-") and all(task.metadata["Level"] == 1 for task in gaia)
    english = load_web_dataset("webwalkerqa", data_dir=web, lang="en", limit=5)
    assert len(english) == 5 and english[0].metadata["root_url"].startswith("http")
    deep = load_web_dataset("deepsearch", data_dir=web, limit=3)
    assert deep[0].answers == ("E. H. Shepard",) and "<search>" in deep[0].metadata["system_prompt"]


def test_benchmark_env_with_replayed_search(shared_data, monkeypatch):
    monkeypatch.setenv("RAPO_WEB_DATA", str(shared_data / "web"))
    env = gym.make(
        "RAPO-Web-v0",
        dataset="simpleqa",
        limit=3,
        reward="f1",
        search={"provider": "replay", "replay_path": str(shared_data / "web" / "arpo_search_cache.json")},
    )
    try:
        prompt, info = env.reset(options={"task_index": 0})
        assert prompt == "Who received the IEEE Frank Rosenblatt Award in 2010?"
        obs, *_, step_info = env.step("<search>Amy Smart film debut Campfire Tales</search>")
        assert step_info["tool_ok"] and "Page 1: The film is made up" in obs
        obs, *_, step_info = env.step(f"<search>{prompt}</search>")
        assert step_info["tool_error"] == "replay_miss" and "not in the recorded results" in obs
    finally:
        env.close()


def test_judge_through_rapos_own_openai_server():
    from rapo_agents.policies import ScriptedPolicy
    from rapo_agents.policies.openai_server import create_app

    def judge_rule(context: str) -> str:
        return "Correct" if "Predicted answer: in London" in context else "Incorrect"

    task = Task(id="t", question="Where was Ada Lovelace born?", answers=("London",), source="toy")
    with serve_in_thread(create_app(ScriptedPolicy(judge_rule), model_name="judge")) as base_url:
        judge = LLMJudgeReward({"base_url": f"{base_url}/v1", "model": "judge", "api_key_env": None}, ())
        right, wrong = (
            judge("<answer>\\boxed{in London}</answer>", task),
            judge("<answer>\\boxed{Paris}</answer>", task),
        )
        judge.close()
    assert (right.reward, wrong.reward) == (1.0, 0.0) and right.metrics["judge_error"] == 0.0
