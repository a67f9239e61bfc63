"""The splice for a non-positive-reward candidate: the reference's sentence in its ``<think>`` wrapper."""

import gymnasium as gym

from rapo_buffers.candidates import Candidate, StaticRetriever
from rapo_env.prompts import REFERENCE_FALLBACK_TEXT
from rapo_env.wrappers import StepTraceRetrievalWrapper
from rapo_env.wrappers.retrieval import FALLBACK_TEXT, REFERENCE_EMPTY_TEXT, REFERENCE_ERROR_PREFIX

# What the reference's rollout appends (vllm_rollout_with_tools.py formats RetrieveTool's fallback so).
REFERENCE_SPLICE = (
    " Additional context is enclosed in <retrieve> </retrieve> tags. Use it if helpful. <retrieve>\n"
    " \n<think> Solve this problem carefully using own reasoning without tool calls. Think step by step and "
    "self-check before answering.</think>\n"
    "\n</retrieve>"
)


class EchoEnv(gym.Env):
    """Every turn gets a result; nothing ends the episode."""

    observation_space = action_space = gym.spaces.Text(4096)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "question", {}

    def step(self, action):
        return " <result>\n1\n</result>", 0.0, False, False, {"tool": "python"}


def spliced(**kwargs) -> str:
    worthless = StaticRetriever([Candidate("<python>wrong</python>", reward=0.0, score=0.99)])
    env = StepTraceRetrievalWrapper(EchoEnv(), worthless, retrieve_prob=1.0, no_retrieve_first_k=0, seed=0, **kwargs)
    env.reset(options={"rollout_index": 1})
    observation, _, _, _, info = env.step("<python>1</python>")
    assert info["retrieval"]["fallback"]
    return observation


def test_reference_rule_splices_the_reference_sentence_exactly():
    assert spliced(hybrid_rule="reference").endswith(REFERENCE_SPLICE)
    assert REFERENCE_FALLBACK_TEXT in REFERENCE_SPLICE


def test_paper_rule_keeps_rapos_wording_and_an_explicit_text_wins():
    assert FALLBACK_TEXT in spliced(hybrid_rule="paper")
    assert REFERENCE_FALLBACK_TEXT not in spliced(hybrid_rule="paper")
    assert "my own hint" in spliced(hybrid_rule="reference", fallback_text="my own hint")


# D1: when retrieval fails or finds nothing, the reference still splices text (its RetrieveTool returns
# ``Retrieve error: ...`` for a failed call and, for an empty hit list, the error of ``max()`` over it);
# the paper mode splices nothing.


class DownRetriever:
    def retrieve(self, queries, topk):
        raise ConnectionError("retrieval service unreachable")


def first_step(retriever, rule):
    env = StepTraceRetrievalWrapper(EchoEnv(), retriever, retrieve_prob=1.0, hybrid_rule=rule, seed=0)
    env.reset()
    observation, _, _, _, info = env.step("<python>1</python>")
    return observation, info


def test_a_failed_retrieval_splices_its_error_in_reference_mode():
    observation, info = first_step(DownRetriever(), "reference")
    error = f"{REFERENCE_ERROR_PREFIX}ConnectionError: retrieval service unreachable"
    assert f"<retrieve>\n{error}\n</retrieve>" in observation
    assert info["retrieval"]["fallback"] and info["retrieval_errors"] == 1
    assert "unreachable" in info["retrieval_error"]


def test_an_empty_retrieval_splices_the_references_text_in_reference_mode():
    observation, info = first_step(StaticRetriever([]), "reference")
    assert f"<retrieve>\n{REFERENCE_EMPTY_TEXT}\n</retrieve>" in observation
    assert info["retrieval"]["candidates"] == [] and info["retrieval_error"] is None


def test_the_paper_mode_splices_nothing_for_either():
    for retriever in (DownRetriever(), StaticRetriever([])):
        observation, info = first_step(retriever, "paper")
        assert observation == " <result>\n1\n</result>" and info["retrieval"] is None
