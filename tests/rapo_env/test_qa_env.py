"""RAPO-QA-v0 end to end: the generated knowledge base, real datasets over a real index, QA rewards,
and search services that are dead or slow (the episode goes on)."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import pytest
from fastapi import FastAPI
from gymnasium.utils.env_checker import check_env

import rapo_env  # noqa: F401  (registers the envs)
from rapo_agents.scripted import SearchExpert, run_text_episode
from rapo_env.envs.qa import QADatasetError, QAEnv, _hotpotqa_corpus
from rapo_env.rewards.qa import QAReward
from rapo_env.rewards.text import normalize_answer
from rapo_env.tasks.base import Task
from rapo_env.tasks.hotpotqa import load_hotpotqa
from rapo_env.tasks.knowledge_base import KnowledgeBase, KnowledgeBaseConfig, KnowledgeBaseError
from rapo_tools.search.cache import cached_corpus_index
from rapo_tools.search.embedding import Embedder
from rapo_tools.search.server import create_wiki_search_app
from rapo_tools.search.wiki_search import WikiSearch
from rapo_tools.serving import free_port, serve_in_thread

SMALL_KB = {"num_countries": 3, "num_towns": 8, "num_organizations": 6, "num_people": 16, "num_works": 10}
HOTPOTQA_CORPUS = "corpus/hipporag_hotpotqa_train_corpus.json"
HOTPOTQA_QUESTIONS = "qa/hipporag_hotpotqa_train_100.json"


@pytest.fixture(scope="module")
def embedder(sentence_encoder) -> Embedder:
    return Embedder(sentence_encoder)


@pytest.fixture(scope="module")
def kb_options(embedder, rapo_cache_dir) -> dict:
    return {"knowledge_base": SMALL_KB, "cache_dir": rapo_cache_dir, "embedder": embedder}


@pytest.fixture(scope="module")
def hotpotqa_index(shared_data, embedder, rapo_cache_dir):
    """The session's MiniLM index of the HotpotQA corpus (shared with tests/rapo_tools/search through the cache)."""
    return cached_corpus_index(shared_data / HOTPOTQA_CORPUS, embedder, cache_dir=rapo_cache_dir, show_progress=False)


@pytest.fixture(scope="module")
def hotpotqa_service(hotpotqa_index, embedder):
    with serve_in_thread(create_wiki_search_app(WikiSearch.load(hotpotqa_index, embedder=embedder))) as url:
        yield url


# ----- the generated knowledge base -----------------------------------------------------------------------


def test_knowledge_base_is_deterministic_and_its_evidence_is_in_the_passages():
    kb = KnowledgeBase.generate(seed=3, **SMALL_KB)
    again = KnowledgeBase.generate(seed=3, **SMALL_KB)
    other = KnowledgeBase.generate(seed=4, **SMALL_KB)
    assert [t.question for t in kb.questions] == [t.question for t in again.questions]
    assert kb.passages == again.passages and kb.passages != other.passages
    assert {t.metadata["hops"] for t in kb.questions} == {1, 2, 3}
    assert len({p.title for p in kb.passages}) == len(kb.passages)  # unique titles
    for task in kb.questions:
        titles = task.metadata["evidence_titles"]
        texts = [kb.passage_by_title[title].text for title in titles]
        assert titles[0] in task.question
        for previous_text, title in zip(texts, titles[1:], strict=False):
            assert title in previous_text  # each hop's entity is named in the previous hop's passage
        assert normalize_answer(task.answers[0]) in normalize_answer(texts[-1])  # the answer is in the last one
    assert {t.metadata["split"] for t in kb.questions} == {"train", "validation", "test"}
    with pytest.raises(KnowledgeBaseError):
        KnowledgeBaseConfig(max_hops=4)
    with pytest.raises(KnowledgeBaseError):
        kb.split("dev")


def test_cached_base_is_built_once_and_reloaded(tmp_path, embedder):
    kb, index_path = KnowledgeBase.cached(seed=5, cache_dir=tmp_path, embedder=embedder, **SMALL_KB)
    stamp = index_path.stat().st_mtime_ns
    reloaded, same_index = KnowledgeBase.cached(seed=5, cache_dir=tmp_path, embedder=embedder, **SMALL_KB)
    assert same_index == index_path and index_path.stat().st_mtime_ns == stamp
    assert reloaded.questions[0] == kb.questions[0] and reloaded.passages == kb.passages
    assert (
        WikiSearch.load(index_path, embedder=embedder).search([kb.passages[0].title], 1)[0][0].passage == kb.passages[0]
    )


def test_a_cached_base_cut_short_is_generated_again_not_kept(tmp_path, embedder):
    kb, _ = KnowledgeBase.cached(seed=5, cache_dir=tmp_path, embedder=embedder, **SMALL_KB)
    (folder,) = (tmp_path / "knowledge_base").iterdir()
    for name in ("passages.jsonl", "questions.jsonl"):  # a copy or a write that stopped half-way
        file = folder / name
        file.write_bytes(file.read_bytes()[:100])
        reloaded, _ = KnowledgeBase.cached(seed=5, cache_dir=tmp_path, embedder=embedder, **SMALL_KB)
        assert list(reloaded.questions) == list(kb.questions) and reloaded.passages == kb.passages
        assert len(file.read_text(encoding="utf-8").splitlines()) > 1  # the file on disk is whole again


def test_envs_of_one_process_share_one_read_knowledge_base(kb_options):
    first, second = gym.make("RAPO-QA-v0", **kb_options), gym.make("RAPO-QA-v0", split="test", **kb_options)
    assert first.unwrapped.knowledge_base is second.unwrapped.knowledge_base, "each env read the base again"
    other = gym.make("RAPO-QA-v0", **{**kb_options, "knowledge_base": {**SMALL_KB, "num_works": 7}})
    assert other.unwrapped.knowledge_base is not first.unwrapped.knowledge_base  # other sizes, another base
    assert len(other.unwrapped.knowledge_base.entities) != len(first.unwrapped.knowledge_base.entities)
    for env in (first, second, other):
        env.close()


def test_default_env_passes_the_gymnasium_checker(kb_options):
    env = gym.make("RAPO-QA-v0", **kb_options)
    check_env(env.unwrapped, skip_render_check=True)
    prompt, info = env.reset(seed=0, options={"task_index": 0})
    assert info["tools"] == ["search"] and "<search>" in info["system_prompt"]
    assert prompt == env.unwrapped.tasks[0].question
    env.close()


def test_scripted_agent_solves_one_two_and_three_hop_questions(kb_options):
    env = gym.make("RAPO-QA-v0", **kb_options)
    tasks = env.unwrapped.tasks
    agent = SearchExpert(tasks)
    for hops in (1, 2, 3):
        indexes = [i for i, task in enumerate(tasks) if task.metadata["hops"] == hops][:3]
        assert indexes
        for index in indexes:
            trajectory = run_text_episode(env, agent, task_index=index)
            assert trajectory.reward == 1.0 and trajectory.end_reason == "answer"
            assert trajectory.num_tool_calls == hops and trajectory.metrics["em"] == 1.0
            assert all(step.tool_ok for step in trajectory.steps if step.tool == "search")
    env.close()


def test_reference_reward_with_python_gives_the_multi_tool_bonus(kb_options):
    env = QAEnv(tools=("search", "python"), reward="reference", sandbox="subprocess", **kb_options)
    prompt, info = env.reset(seed=0, options={"task_index": 0})
    assert info["tools"] == ["search", "python"]
    gold = env.task.answers[0]
    obs, *_ = env.step(f"<think>look it up</think><search>{prompt}</search>")
    assert obs.startswith(" <result>\nDoc 1 (Title: ")
    obs, *_ = env.step("<python>print(len('check'))</python>")
    assert "5" in obs
    _, reward, terminated, _, info = env.step(f"<answer>\\boxed{{{gold}}}</answer>")
    assert terminated and reward == pytest.approx(1.1) and info["metrics"]["format_ok"] == 1.0
    env.close()


def test_bad_tool_lists_are_rejected(kb_options):
    with pytest.raises(ValueError, match="tools"):
        QAEnv(tools=("python",), **kb_options)
    with pytest.raises(ValueError, match="tools"):
        QAEnv(tools=("search", "browse"), **kb_options)


# ----- real datasets over a real index ----------------------------------------------------------------------


def test_hotpotqa_with_context_over_the_real_index(shared_data, hotpotqa_index, embedder, rapo_cache_dir):
    env = QAEnv(
        dataset=shared_data / HOTPOTQA_QUESTIONS,
        corpus_path=shared_data / HOTPOTQA_CORPUS,
        limit=8,
        embedder=embedder,
        cache_dir=rapo_cache_dir,
        reward="reference",
    )
    tasks = env.tasks
    assert len(tasks) == 8 and tasks[0].metadata["supporting_titles"] == ["Alû", "Lilu (mythology)"]
    agent = SearchExpert(tasks, max_tool_calls=3)
    rewards = [run_text_episode(env, agent, task_index=i).reward for i in range(len(tasks))]
    env.close()
    assert all(reward >= 0 for reward in rewards)  # the scripted agent always keeps the format
    assert sum(rewards) / len(rewards) >= 0.6  # it answers only what the real searches returned


def test_hotpotqa_contexts_become_the_corpus(shared_data, tmp_path):
    corpus = _hotpotqa_corpus(shared_data / HOTPOTQA_QUESTIONS, tmp_path)
    titles = [json.loads(line)["title"] for line in corpus.read_text().splitlines()]
    expected = json.loads((shared_data / HOTPOTQA_CORPUS).read_text())
    assert len(titles) == 994 and set(titles) == set(expected)
    assert load_hotpotqa(shared_data / HOTPOTQA_QUESTIONS, limit=3)[2].metadata["type"] in ("bridge", "comparison")


def test_arpo_jsonl_through_the_search_service(shared_data, hotpotqa_service):
    env = gym.make(
        "RAPO-QA-v0", dataset=str(shared_data / "qa/arpo_hotpotqa_test.jsonl"), search_url=hotpotqa_service, limit=5
    )
    prompt, info = env.reset(seed=0, options={"task_index": 1})
    obs, reward, terminated, truncated, info = env.step(f"<search>{prompt}</search>")
    assert info["tool_ok"] and obs.count("Doc ") == 3 and not (terminated or truncated)
    gold = env.unwrapped.task.answers[0]
    _, reward, terminated, _, info = env.step(f"<answer>It is \\boxed{{{gold}}}</answer>")
    assert terminated and reward == 1.0 and info["search_errors"] == 0
    env.close()


def test_deepresearcher_parquet_filters_sources_and_scores_the_best_alias(shared_data, hotpotqa_service):
    env = QAEnv(dataset=shared_data / "qa/deepresearcher_dev.parquet", data_source="tq", search_url=hotpotqa_service)
    assert len(env.tasks) == 125 and all(task.metadata["data_source"] == "tq" for task in env.tasks)
    index = next(i for i, task in enumerate(env.tasks) if len(task.answers) > 3)
    env.reset(options={"task_index": index})
    alias = env.task.answers[-1]
    _, reward, terminated, _, info = env.step(f"<answer>\\boxed{{{alias}}}</answer>")
    assert terminated and reward == 1.0 and info["metrics"]["em"] == 1.0
    env.close()


def test_file_datasets_need_a_corpus(shared_data):
    with pytest.raises(QADatasetError, match="search_url"):
        QAEnv(dataset=shared_data / "qa/arpo_bamboogle_test.jsonl")


def test_hops_keeps_the_questions_of_those_hop_counts_in_the_splits_order(kb_options, shared_data):
    every = QAEnv(split="train", **kb_options).tasks
    two_and_three = QAEnv(split="train", hops=[2, 3], **kb_options).tasks
    assert [task.id for task in two_and_three] == [task.id for task in every if task.metadata["hops"] > 1]
    assert [task.id for task in QAEnv(split="train", hops=1, limit=5, **kb_options).tasks] == [
        task.id for task in every if task.metadata["hops"] == 1][:5]
    with pytest.raises(KnowledgeBaseError, match="hop counts among 1-3, got \\[4\\]"):
        QAEnv(hops=[4], **kb_options)
    with pytest.raises(QADatasetError, match="no hop counts"):
        QAEnv(dataset=shared_data / "qa/arpo_bamboogle_test.jsonl", hops=[2], search_url="http://127.0.0.1:9")


# ----- failing services never crash an episode --------------------------------------------------------------


def test_dead_service_fails_the_search_and_the_episode_goes_on(shared_data):
    env = QAEnv(
        dataset=shared_data / "qa/arpo_bamboogle_test.jsonl",
        search_url=f"http://127.0.0.1:{free_port()}",
        search={"timeout_s": 1.0, "retries": 1, "backoff_s": 0.01},
    )
    env.reset(options={"task_index": 0})
    for expected_errors in (1, 2):
        obs, reward, terminated, truncated, info = env.step("<search>who founded Citibank</search>")
        assert "search failed" in obs and not (terminated or truncated)
        assert info["tool_ok"] is False and info["tool_error"] == "service_unavailable"
        assert info["search_errors"] == expected_errors
    _, reward, terminated, _, info = env.step("<answer>\\boxed{james madison}</answer>")
    assert terminated and reward == 1.0 and info["search_errors"] == 2
    env.reset(options={"task_index": 1})
    assert env.search_errors == 0
    env.close()


def test_slow_service_times_out_without_ending_the_episode(shared_data):
    app = FastAPI()

    @app.post("/wikiSearch")
    async def slow(payload: dict):
        await asyncio.sleep(3.0)
        return {"result": [[] for _ in payload["queries"]]}

    with serve_in_thread(app) as url:
        env = QAEnv(
            dataset=shared_data / "qa/arpo_bamboogle_test.jsonl",
            search_url=url,
            search={"timeout_s": 0.3, "retries": 0},
        )
        env.reset(options={"task_index": 0})
        obs, _, terminated, truncated, info = env.step("<search>Citibank</search>")
        env.close()
    assert "search failed" in obs and info["tool_error"] == "timeout" and info["search_errors"] == 1
    assert not (terminated or truncated)


# ----- rewards ----------------------------------------------------------------------------------------------


def test_qa_rewards_take_the_best_alias():
    task = Task(id="q", question="?", answers=("Barack Obama", "Obama"), source="toy")
    response = "<think>x</think><search>q</search> <result>\nr\n</result><answer>\\boxed{President Obama}</answer>"
    scores = {kind: QAReward(kind, ("search",))(response, task) for kind in ("f1", "em", "substring", "reference")}
    assert scores["f1"].reward == pytest.approx(2 / 3)  # vs "Obama": precision 1/2, recall 1
    assert scores["em"].reward == 0.0 and scores["substring"].reward == 1.0
    assert scores["reference"].reward == pytest.approx(2 / 3)
    assert scores["em"].metrics == scores["f1"].metrics  # every kind reports every metric
    no_answer = QAReward("f1")("I give up", task)
    assert no_answer.reward == 0.0 and no_answer.metrics["answered"] == 0.0
    assert QAReward("reference")("<answer>Obama</answer>", task).reward == -1.0  # no \boxed{}
    with pytest.raises(ValueError, match="unknown QA reward"):
        QAReward("bleu")


def test_a_format_penalty_replaces_the_metric_only_for_badly_formatted_responses():
    task = Task(id="q", question="?", answers=("Obama",), source="toy")
    strict = QAReward("f1", ("search",), format_penalty=-1.0)
    assert strict("<answer>Obama</answer>", task).reward == -1.0  # no \boxed{}: the penalty
    assert QAReward("f1", ("search",))("<answer>Obama</answer>", task).reward == 1.0  # no penalty set
    assert strict("<answer>\\boxed{Obama}</answer>", task).reward == 1.0


def test_a_qa_source_resolves_to_what_it_builds_without_touching_an_env():
    from rapo_env.envs.qa import QADatasetError, QASource, resolve_qa_source
    from rapo_env.tasks import Task

    tasks = [Task(id=f"q{i}", question=f"Who is {i}?", answers=(str(i),), source="test") for i in range(3)]
    resolved, backend, knowledge_base = resolve_qa_source(QASource(dataset=tasks, search_url="http://127.0.0.1:9",
                                                                   limit=2))
    assert [task.id for task in resolved] == ["q0", "q1"] and backend == "http://127.0.0.1:9"
    assert knowledge_base is None  # only the generated base comes back with its tasks
    with pytest.raises(QADatasetError, match="brings no passages"):
        resolve_qa_source(QASource(dataset=tasks))
