"""A math episode's context retrieves a step of the same problem (the buffer holds the expert's traces of it)."""

from __future__ import annotations

from rapo_agents.scripted import ExpertAgent
from rapo_env.wrappers.retrieval import split_spliced_text
from rapo_buffers.candidates import Retriever
from rapo_env.envs.math import MathEnv
from rapo_env.wrappers import StepTraceRetrievalWrapper



class RewordedExpert(ExpertAgent):
    """The expert's computations in other words and code style: an on-policy agent that is not the buffer's."""

    name = "reworded"

    def act(self, observation: str) -> str:
        turn = super().act(observation)
        return (
            turn.replace("Let me compute it.", "I will check this with a short program.")
            .replace("print(", "result = (")
            .replace("</python>", "print(result)\n</python>")
        )


def test_hit_rate_on_the_questions_of_the_buffer(scripted_buffer):
    question_of = {trace.value: trace.question_id for trace in scripted_buffer.traces}
    SCRIPTED_TASKS = len(set(question_of.values()))  # noqa: N806 (the buffer's question count)
    assert isinstance(scripted_buffer.retriever, Retriever)
    env = MathEnv(split="train", num_tasks=SCRIPTED_TASKS, sandbox="subprocess")
    wrapped = StepTraceRetrievalWrapper(env, scripted_buffer.retriever, retrieve_prob=1.0, seed=0)
    agent = RewordedExpert(env.tasks)
    hits = retrievals = 0
    try:
        for task_index in range(SCRIPTED_TASKS):
            prompt, info = wrapped.reset(options={"task_index": task_index})
            agent.reset(prompt, info)
            observation, done = prompt, False
            while not done:
                observation, reward, terminated, truncated, step_info = wrapped.step(agent.act(observation))
                done = terminated or truncated
                retrieval = step_info["retrieval"]
                # The scripted agent reads the env's own result; a model would read the splice too.
                observation = split_spliced_text(observation, step_info)
                if retrieval is not None:
                    retrievals += 1
                    most_similar = retrieval["candidates"][0]
                    hits += question_of[most_similar] == info["task_id"]
                    assert retrieval["chosen"] is not None  # every expert trace has reward 1
                    assert "<answer>" not in retrieval["text"]
            assert reward == 1.0  # splices never break the agent's own answer or its scoring
    finally:
        wrapped.close()
    hit_rate = hits / retrievals
    chance = 1 / SCRIPTED_TASKS
    assert retrievals >= SCRIPTED_TASKS
    assert hit_rate >= 0.75, f"hit rate {hit_rate:.2f} over {retrievals} retrievals (chance {chance:.2f})"


def test_gsm8k_context_retrieves_its_own_next_step(gsm8k_buffer):
    # A context made of the question and the first step in the model's own words.
    by_question = {}
    for trace in gsm8k_buffer.traces:
        by_question.setdefault(trace.question_id, []).append(trace)
    hits = 0
    queries, expected = [], []
    for traces in by_question.values():
        if len(traces) < 3:
            continue
        first_step = traces[0].value.replace("<think>\n", "<think>\nFirst, ")
        queries.append(traces[0].key + first_step)
        expected.append(traces[1].value)
    results = gsm8k_buffer.retriever.retrieve(queries, topk=3)
    hits = sum(want in [c.value for c in hits_] for want, hits_ in zip(expected, results, strict=True))
    assert hits / len(queries) >= 0.8
