"""The scripted experts: procedural math through the real python tool, knowledge-base questions through the real
search tool."""

import gymnasium as gym
import pytest

import rapo_env  # noqa: F401
from rapo_agents.scripted import ExpertAgent, SearchExpert, last_result_line, run_text_episode, scripted_expert
from rapo_env.tasks.base import Task, TaskList


@pytest.mark.parametrize("max_tool_calls", [1, 3])
def test_the_expert_solves_every_problem_within_the_tool_budget(max_tool_calls):
    env = gym.make("RAPO-Math-v0", num_tasks=6, sandbox="subprocess", max_tool_calls=max_tool_calls)
    agent = ExpertAgent(env.unwrapped.tasks, max_tool_calls=max_tool_calls)
    for index in range(6):
        trajectory = run_text_episode(env, agent, task_index=index)
        assert trajectory.reward == 1.0, trajectory.response
        assert trajectory.num_tool_calls in range(1, max_tool_calls + 1)
        assert trajectory.steps[-1].observation == ""
    env.close()


def test_the_expert_reads_numbers_from_the_tool_not_from_the_task():
    env = gym.make("RAPO-Math-v0", num_tasks=2, sandbox="subprocess")
    agent = ExpertAgent(env.unwrapped.tasks)
    prompt, info = env.reset(seed=0, options={"task_index": 0})
    agent.reset(prompt, info)
    agent.act(prompt)
    final = agent.act(" <result>\n31337\n</result>")
    while "<answer>" not in final:
        final = agent.act(" <result>\n31337\n</result>")
    assert "\\boxed{31337}" in final
    env.close()


def test_tasks_without_a_program_are_refused_clearly():
    agent = ExpertAgent(TaskList("toy", [Task(id="x", question="?", answers=("1",), source="toy")]))
    with pytest.raises(ValueError, match="no solution program"):
        agent.reset("?", {"task_id": "x"})


def test_last_result_line():
    assert last_result_line(" <result>\nwarning\n42\n\n</result>") == "42"


# ----- the search expert over the generated knowledge base ---------------------------------------------------


@pytest.fixture(scope="module")
def kb_env(embedder, rapo_cache_dir):
    """The QA env over the default-size knowledge base (about 200 passages), indexed once into the session cache."""
    env = gym.make("RAPO-QA-v0", split="train", embedder=embedder, cache_dir=rapo_cache_dir)
    yield env
    env.close()


def test_the_search_expert_solves_at_least_95_percent_of_its_generators_questions(kb_env):
    tasks = kb_env.unwrapped.tasks
    agent = SearchExpert(tasks)
    solved: dict[int, list[float]] = {}
    for index in range(0, len(tasks), 4):  # a quarter of the split, every hop count
        trajectory = run_text_episode(kb_env, agent, task_index=index)
        solved.setdefault(tasks[index].metadata["hops"], []).append(trajectory.reward)
    assert sorted(solved) == [1, 2, 3]
    for hops, rewards in solved.items():
        assert sum(reward == 1.0 for reward in rewards) / len(rewards) >= 0.95, (hops, rewards.count(0.0))


def test_each_search_step_names_the_entity_the_previous_result_gave(kb_env):
    tasks = kb_env.unwrapped.tasks
    index = next(i for i, task in enumerate(tasks) if task.metadata["hops"] == 3)
    trajectory = run_text_episode(kb_env, SearchExpert(tasks), task_index=index)
    queries = tasks[index].metadata["search_queries"]
    assert trajectory.num_tool_calls == 3 and trajectory.reward == 1.0
    for hop, (step, query) in enumerate(zip(trajectory.steps, queries, strict=False)):
        assert step.action.endswith(f"<search>{query}</search>")
        if hop:
            assert query in trajectory.steps[hop - 1].observation  # read from the result, not from the task
            assert f"is {query}." in step.action  # the thought states the relation it followed


def test_the_search_expert_answers_unknown_when_the_results_lack_the_answer():
    task = Task(id="q", question="Who founded Talo Press?", answers=("Mira Vell",), source="kb",
                metadata={"search_queries": ["Talo Press"], "relations": ["founder"]})
    agent = SearchExpert(TaskList("toy", [task]))
    agent.reset(task.question, {"task_id": "q"})
    assert agent.act(task.question).endswith("<search>Talo Press</search>")
    assert "\\boxed{unknown}" in agent.act(" <result>\nDoc 1 (Title: Talo Press)\nA press.\n</result>")


def test_scripted_expert_picks_the_expert_of_the_task_family(kb_env):
    math_env = gym.make("RAPO-Math-v0", num_tasks=2, sandbox="subprocess")
    assert isinstance(scripted_expert(math_env.unwrapped.tasks), ExpertAgent)
    math_env.close()
    assert isinstance(scripted_expert(kb_env.unwrapped.tasks), SearchExpert)
    with pytest.raises(ValueError, match="no scripted expert"):
        scripted_expert(TaskList("toy", [Task(id="x", question="?", answers=("1",), source="toy")]))
