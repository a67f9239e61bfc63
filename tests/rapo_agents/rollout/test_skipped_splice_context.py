"""D10: a splice the episode skips for its token budget leaves the retrieval context too.

The policy never sees a skipped splice, so the queries of later retrievals (the episode's text so
far) must not hold it either.
"""

import gymnasium as gym

import rapo_env  # noqa: F401  (registers the envs)
from rapo_agents.policies import ByteTokenizer, Generation
from rapo_agents.rollout.episode import Episode
from rapo_buffers.candidates import Candidate
from rapo_env.wrappers import StepTraceRetrievalWrapper

LONG_TRACE = "<python>print('a long step trace')</python> <result>\n" + "x" * 400 + "\n</result>"


class RecordingRetriever:
    """Answers one long step trace and keeps every query it was asked."""

    def __init__(self):
        self.queries = []

    def retrieve(self, queries, topk):
        self.queries.extend(queries)
        return [[Candidate(LONG_TRACE, reward=1.0, score=0.9)] for _ in queries]


def test_a_skipped_splice_is_not_part_of_later_queries():
    retriever = RecordingRetriever()
    env = StepTraceRetrievalWrapper(gym.make("RAPO-Math-v0", num_tasks=1, sandbox="subprocess", max_turns=10),
                                    retriever, retrieve_prob=1.0, seed=0)
    tokenizer = ByteTokenizer()
    episode = Episode(0, 0, 0, env=env)
    prompt, info = env.reset()
    episode.begin(prompt, info, tokenizer, max_prompt_tokens=4000, max_response_tokens=120)
    for _ in range(2):
        action = "<python>print(1)</python>"
        episode.add_generation(Generation(token_ids=tokenizer.encode(action), text=action, finish_reason="stop"),
                               len(tokenizer))
        episode.add_step(*env.step(action))
    assert episode.record.skipped_splices == 2  # the trace never fits the 120-token budget
    assert len(retriever.queries) == 2
    assert "a long step trace" not in retriever.queries[1]
    assert "a long step trace" not in env.context
