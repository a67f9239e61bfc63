"""The scripted expert solves procedural math through the real python tool."""

import gymnasium as gym
import pytest

import rapo_env  # noqa: F401
from rapo_agents.scripted import ExpertAgent, last_result_line, run_text_episode
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
