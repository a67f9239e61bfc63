"""StepTraceRetrievalWrapper on a small text env that is not a rapo env, and through gym.make / make_vec."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest

from rapo_buffers.candidates import Candidate, StaticRetriever
from rapo_buffers.client import RetrievalClient
from rapo_buffers.text import normalize_context
from rapo_env.wrappers import StepTraceRetrievalWrapper
from rapo_env.wrappers.retrieval import FALLBACK_TEXT, REFERENCE_TEMPLATE, RetrievalSettings, select_candidate

CHARS = [chr(code) for code in range(32, 127)] + ["\n"]
TOY_ID = "RetrievalToyText-v0"
GOOD_STEP = "<python>2+3</python> <result>\n5\n</result>"


class CountingTextEnv(gym.Env):
    """A tiny text env: every action gets a numbered result; ``<answer>`` ends it, 6 turns truncate it."""

    metadata = {"render_modes": []}
    observation_space = gym.spaces.Text(8192, min_length=0, charset=CHARS)
    action_space = gym.spaces.Text(8192, min_length=0, charset=CHARS)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return "Add 2 and 3, then double it.", {}

    def step(self, action):
        self.turn += 1
        if "<answer>" in action:
            return "", 1.0, True, False, {}
        return f" <result>\n{self.turn}\n</result>", 0.0, False, self.turn >= 6, {}


if TOY_ID not in gym.registry:
    gym.register(TOY_ID, entry_point=CountingTextEnv)


class FailingRetriever:
    """A retriever whose service is down."""

    def __init__(self):
        self.calls = 0

    def retrieve(self, queries, topk):
        self.calls += 1
        raise ConnectionError("retrieval service unreachable")


def good_retriever() -> StaticRetriever:
    return StaticRetriever(
        [
            Candidate(GOOD_STEP, reward=1.0, score=0.9),
            Candidate("<python>5*2</python> <result>\n10\n</result>", reward=0.5, score=0.95),
        ]
    )


def play(env: gym.Env, turns: int, seed: int | None = None) -> list[dict]:
    """Play ``turns`` steps, resetting when an episode ends; return the infos of the tool rounds."""
    env.reset(seed=seed)
    infos = []
    for turn in range(turns):
        _, _, terminated, truncated, info = env.step(f"<python>{turn}</python>")
        if terminated or truncated:
            env.reset()
        else:
            infos.append(info)
    return infos


@pytest.mark.parametrize(("rule", "hybrid_count"), [("paper", 8), ("reference", 7)])
def test_hybrid_split_follows_rollout_index(rule, hybrid_count):
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=1.0, hybrid_rule=rule, seed=0)
    hybrid = []
    for index in range(16):
        _, info = env.reset(options={"rollout_index": index})
        _, _, _, _, step_info = env.step("<python>1</python>")
        hybrid.append(info["hybrid"])
        assert (step_info["retrieval"] is not None) == info["hybrid"]
    assert sum(hybrid) == hybrid_count
    assert hybrid[:8] == [False] * 8  # the first k rollouts of a group stay on-policy under both rules
    # The index is taken within its group: rollout 16 is the first of the next group.
    assert not env.reset(options={"rollout_index": 16})[1]["hybrid"]


def test_without_rollout_index_every_rollout_is_hybrid():
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=1.0, seed=0)
    _, info = env.reset()
    assert info["hybrid"] and info["retrieval"] is None  # never before the first step


def test_retrieve_probability_is_respected():
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=0.3, seed=123)
    rate = np.mean([info["retrieval"] is not None for info in play(env, 600)])
    assert 0.22 < rate < 0.38
    never = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=0.0, seed=0)
    assert all(info["retrieval"] is None for info in play(never, 50))


def test_no_retrieval_on_the_step_that_ends_the_episode():
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=1.0, seed=0)
    env.reset()
    _, _, terminated, _, info = env.step("<answer>\\boxed{10}</answer>")
    assert terminated and info["retrieval"] is None
    env.reset()
    for _ in range(5):
        env.step("<python>1</python>")
    _, _, _, truncated, info = env.step("<python>1</python>")
    assert truncated and info["retrieval"] is None


class NoToolEnv(CountingTextEnv):
    """A rapo-style env that says no tool ran on any round."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated, {"tool": None}


def test_by_default_a_round_without_a_tool_call_is_a_retrieval_round():
    """The reference's rule: a model that never calls a tool is still shown expert steps."""
    env = StepTraceRetrievalWrapper(NoToolEnv(), good_retriever(), retrieve_prob=1.0, seed=0)
    assert env.settings.retrieve_after == "any_round"
    infos = play(env, 3)
    assert len(infos) == 3 and all(info["retrieval"] is not None for info in infos)


def test_tool_round_rule_retrieves_only_after_a_tool_ran():
    env = StepTraceRetrievalWrapper(NoToolEnv(), good_retriever(), retrieve_prob=1.0, retrieve_after="tool_round",
                                    seed=0)
    assert all(info["retrieval"] is None for info in play(env, 3))
    with_tools = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=1.0,
                                           retrieve_after="tool_round", seed=0)
    assert all(info["retrieval"] is not None for info in play(with_tools, 3))


def test_first_round_rule_retrieves_once_per_episode():
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=1.0,
                                    retrieve_after="first_round", seed=0)
    for _ in range(2):  # and again after a reset
        env.reset()
        spliced = [env.step(f"<python>{turn}</python>")[4]["retrieval"] is not None for turn in range(4)]
        assert spliced == [True, False, False, False]


def spliced_share(retrieve_after: str, rounds: int, episodes: int = 400) -> float:
    """The share of episodes of ``rounds`` tool rounds (then an answer) that got at least one splice."""
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=0.5,
                                    retrieve_after=retrieve_after, seed=0)
    spliced = 0
    for episode in range(episodes):
        env.reset(seed=episode)
        retrievals = [env.step(f"<python>{turn}</python>")[4]["retrievals"] for turn in range(rounds)]
        env.step("<answer>5</answer>")
        spliced += retrievals[-1] > 0
    return spliced / episodes


def test_under_the_first_round_rule_whether_a_rollout_is_spliced_does_not_depend_on_its_length():
    """Under ``any_round`` a long episode is spliced far more often than a short one (1 - 0.5^rounds), so the
    unspliced rollouts are mostly short ones; under ``first_round`` both are spliced at ``retrieve_prob``."""
    assert spliced_share("any_round", 4) - spliced_share("any_round", 1) > 0.3
    short, long = spliced_share("first_round", 1), spliced_share("first_round", 4)
    assert abs(short - 0.5) < 0.08 and abs(long - 0.5) < 0.08


@pytest.mark.parametrize(("retrieve_after", "spliced"), [("any_round", [True, True]), ("tool_round", [False, True])])
def test_retrieval_rounds_in_the_math_env(retrieve_after, spliced):
    """RAPO-Math-v0 with its real python tool: a turn with no tool call (or one cut off mid-call by the turn's
    token limit) is answered with a hint and the episode goes on; ``any_round`` retrieves after it too."""
    import rapo_env  # noqa: F401  (registers RAPO-Math-v0)

    base = gym.make("RAPO-Math-v0", num_tasks=2, sandbox="subprocess", disable_env_checker=True)
    env = StepTraceRetrievalWrapper(base, good_retriever(), retrieve_prob=1.0, retrieve_after=retrieve_after,
                                    no_retrieve_first_k=0, seed=0)
    try:
        env.reset(seed=0, options={"task_index": 0, "rollout_index": 0})
        rounds = []
        for action in ("<think>Let me see. The orchard has", "<python>\nprint(6 * 7)\n</python>"):
            _, _, terminated, truncated, info = env.step(action)
            assert not (terminated or truncated)
            rounds.append(info["retrieval"] is not None)
        _, _, terminated, _, info = env.step("<answer>\\boxed{42}</answer>")
        assert terminated and info["retrieval"] is None  # never on the step that ends the episode
    finally:
        env.close()
    assert rounds == spliced


def test_span_marks_exactly_the_spliced_text():
    # max_reward: the reference's rule picks the rewarded step over the closer one.
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=1.0, seed=0, select="max_reward")
    env.reset()
    observation, _, _, _, info = env.step("<python>1</python>")
    retrieval = info["retrieval"]
    start, end = retrieval["span"]
    assert observation[start:end] == retrieval["text"]
    assert observation[:start] == " <result>\n1\n</result>"  # the env's own observation is untouched
    assert end == len(observation)
    assert retrieval["text"] == REFERENCE_TEMPLATE.replace("{value}", GOOD_STEP)
    assert retrieval["candidates"][retrieval["chosen"]] == GOOD_STEP
    assert retrieval["scores"] == [0.95, 0.9] and retrieval["rewards"] == [0.5, 1.0]
    assert env.context.endswith(observation)


def test_query_is_the_episode_context_so_far():
    retriever = good_retriever()
    env = StepTraceRetrievalWrapper(CountingTextEnv(), retriever, retrieve_prob=1.0, seed=0)
    prompt, _ = env.reset()
    first, *_ = env.step("<python>A</python>")
    env.step("<python>B</python>")
    expected_second = prompt + "<python>A</python>" + first + "<python>B</python>" + " <result>\n2\n</result>"
    assert retriever.queries == [
        normalize_context(prompt + "<python>A</python>" + " <result>\n1\n</result>"),
        normalize_context(expected_second),
    ]


def test_retrieval_calls_are_deterministic_under_a_seed():
    def decisions(seed):
        retriever = good_retriever()
        env = StepTraceRetrievalWrapper(CountingTextEnv(), retriever, retrieve_prob=0.5, seed=seed)
        flags = [info["retrieval"] is not None for info in play(env, 60)]
        return flags, retriever.queries

    first, second, other = decisions(7), decisions(7), decisions(8)
    assert first == second
    assert first[0] != other[0]
    # reset(seed=...) reseeds the wrapper too
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=0.5, seed=0)
    runs = [[info["retrieval"] is not None for info in play(env, 5, seed=42)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_selection_rules_and_fallback():
    candidates = [
        Candidate("a", reward=0.2, score=0.9),
        Candidate("b", reward=0.8, score=0.5),
        Candidate("c", 0.8, 0.4),
    ]
    assert select_candidate(candidates, "max_reward") == 1  # ties in reward: the more similar one
    assert select_candidate(candidates, "most_similar") == 0
    with pytest.raises(ValueError):
        select_candidate(candidates, "random")

    bad = StaticRetriever([Candidate("<python>wrong</python>", reward=0.0, score=0.99)])
    env = StepTraceRetrievalWrapper(CountingTextEnv(), bad, retrieve_prob=1.0, seed=0)
    env.reset()
    observation, _, _, _, info = env.step("<python>1</python>")
    assert info["retrieval"]["chosen"] is None and info["retrieval"]["fallback"]
    assert FALLBACK_TEXT in observation and "<python>wrong</python>" not in observation


def test_a_final_answer_step_is_never_spliced_as_it_is_unless_asked():
    final = Candidate("<answer>\\boxed{10}</answer>", reward=1.0, score=0.99, is_final=True)
    unmarked_final = Candidate("<think>done</think><answer>\\boxed{10}</answer>", reward=1.0, score=0.98)
    retriever = StaticRetriever([final, unmarked_final, Candidate(GOOD_STEP, reward=0.5, score=0.5)])

    def first_step(**settings):
        env = StepTraceRetrievalWrapper(CountingTextEnv(), retriever, retrieve_prob=1.0, seed=0, **settings)
        env.reset()
        return env.step("<python>1</python>")

    observation, _, _, _, info = first_step()  # next_best: the final steps are dropped, the best other one spliced
    assert "<answer>" not in observation
    assert info["retrieval"]["candidates"] == [GOOD_STEP]
    observation, _, _, _, info = first_step(final_steps="skip")  # the most similar is final: nothing this round
    assert info["retrieval"] is None and observation == " <result>\n1\n</result>"
    observation, _, _, _, info = first_step(final_steps="skip", select="max_reward")  # the rule picks the final
    assert info["retrieval"] is None
    observation, *_ = first_step(final_steps="splice")
    assert "<answer>" in observation
    with pytest.raises(ValueError, match="final_steps must be one of"):
        RetrievalSettings(final_steps="drop")


def test_skipping_final_steps_still_splices_a_step_the_rule_picks_over_them():
    final = Candidate("<answer>\\boxed{10}</answer>", reward=1.0, score=0.4, is_final=True)
    retriever = StaticRetriever([Candidate(GOOD_STEP, reward=0.5, score=0.9), final])
    env = StepTraceRetrievalWrapper(CountingTextEnv(), retriever, retrieve_prob=1.0, seed=0, final_steps="skip")
    env.reset()
    info = env.step("<python>1</python>")[4]
    assert info["retrieval"]["chosen"] == 0 and info["retrieval"]["text"].count(GOOD_STEP) == 1


def test_retriever_failure_is_counted_and_the_episode_goes_on():
    failing = FailingRetriever()
    env = StepTraceRetrievalWrapper(CountingTextEnv(), failing, retrieve_prob=1.0, seed=0)
    env.reset()
    infos = [env.step("<python>1</python>")[4] for _ in range(3)]
    assert [info["retrieval_errors"] for info in infos] == [1, 2, 3]
    assert all(info["retrieval"] is None for info in infos)
    assert "unreachable" in infos[0]["retrieval_error"]
    _, _, terminated, _, _ = env.step("<answer>\\boxed{10}</answer>")
    assert terminated
    assert env.reset()[1]["retrieval_errors"] == 0  # counted per episode


def test_dead_http_service_is_a_counted_failure():
    client = RetrievalClient("http://127.0.0.1:9", timeout_s=0.5, retries=0)
    env = StepTraceRetrievalWrapper(CountingTextEnv(), client, retrieve_prob=1.0, seed=0)
    env.reset()
    observation, _, _, _, info = env.step("<python>1</python>")
    assert info["retrieval"] is None and info["retrieval_errors"] == 1
    assert observation == " <result>\n1\n</result>"


def test_length_budget_skips_the_splice():
    env = StepTraceRetrievalWrapper(
        CountingTextEnv(), good_retriever(), retrieve_prob=1.0, max_context_chars=80, seed=0
    )
    env.reset()
    _, _, _, _, info = env.step("<python>1</python>")
    assert info["retrieval"] is None and info["retrieval_errors"] == 0


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="retrieve_after"):
        StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_after="sometimes")
    for kwargs in (
        {"retrieve_prob": 1.5},
        {"topk": 0},
        {"select": "best"},
        {"hybrid_rule": "other"},
        {"template": "no placeholder"},
        {"max_context_chars": 0},
    ):
        with pytest.raises(ValueError):
            StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), **kwargs)
    with pytest.raises(TypeError):
        StepTraceRetrievalWrapper(CountingTextEnv(), object())
    with pytest.raises(ValueError):
        StepTraceRetrievalWrapper(CountingTextEnv(), "not-a-retriever")


def test_rebuilt_from_env_spec():
    env = StepTraceRetrievalWrapper(gym.make(TOY_ID), good_retriever(), retrieve_prob=1.0, topk=2, seed=5)
    rebuilt = gym.make(env.spec)
    assert isinstance(rebuilt, StepTraceRetrievalWrapper)
    assert (rebuilt.settings.retrieve_prob, rebuilt.settings.topk) == (1.0, 2)
    rebuilt.reset()
    assert rebuilt.step("<python>1</python>")[4]["retrieval"] is not None


def test_through_make_vec():
    wrapper = functools.partial(
        StepTraceRetrievalWrapper, retriever=good_retriever(), retrieve_prob=0.5, seed=3, vector_safe_info=True,
        select="max_reward",
    )
    envs = gym.make_vec(TOY_ID, num_envs=3, vectorization_mode="sync", wrappers=[wrapper])
    envs.reset(seed=0)
    spliced = 0
    for _ in range(4):
        observations, _, _, _, infos = envs.step(("<python>1</python>",) * 3)
        mask = infos.get("_retrieval", np.zeros(3, dtype=bool))
        for position in np.flatnonzero(mask):
            start, end = infos["retrieval"]["span"][position]
            assert observations[position][start:end] == infos["retrieval"]["text"][position]
            spliced += 1
        assert all(GOOD_STEP in observations[i] for i in np.flatnonzero(mask))
        assert not any("<retrieve>" in observations[i] for i in np.flatnonzero(~mask))
    assert 0 < spliced < 12
    envs.close()


def test_the_default_settings_are_the_papers_rules_together():
    settings = RetrievalSettings()
    assert (settings.hybrid_rule, settings.select) == ("paper", "most_similar")
    assert (settings.no_retrieve_first_k, settings.group_size) == (8, 16)
    env = StepTraceRetrievalWrapper(CountingTextEnv(), good_retriever(), retrieve_prob=1.0, seed=0)
    env.reset()
    info = env.step("<python>1</python>")[4]
    assert info["retrieval"]["scores"][info["retrieval"]["chosen"]] == 0.95  # the most similar candidate
