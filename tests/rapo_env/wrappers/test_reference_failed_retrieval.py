"""D1: when retrieval fails or finds nothing, the reference still splices text; the paper mode splices nothing.

The reference's ``RetrieveTool`` returns ``Retrieve error: ...`` for a failed call and, for an empty hit
list, the error of ``max()`` over it; its rollout splices that as it splices a step trace.
"""

import gymnasium as gym

from rapo_buffers.candidates import StaticRetriever
from rapo_env.wrappers import StepTraceRetrievalWrapper
from rapo_env.wrappers.retrieval import REFERENCE_EMPTY_TEXT, REFERENCE_ERROR_PREFIX


class EchoEnv(gym.Env):
    """Every turn gets a result; nothing ends the episode."""

    observation_space = action_space = gym.spaces.Text(4096)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "question", {}

    def step(self, action):
        return " <result>\n1\n</result>", 0.0, False, False, {"tool": "python"}


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
    assert f"<retrieve>\n{REFERENCE_ERROR_PREFIX}ConnectionError: retrieval service unreachable\n</retrieve>" in observation
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
