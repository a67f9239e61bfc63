"""Procedural word problems: deterministic, solvable by their own programs, harder with difficulty."""

import subprocess
import sys

import pytest

from rapo_env.tasks.procedural_math import ProceduralMath, generate_problem


def test_generation_is_deterministic_per_seed_and_differs_across_seeds():
    assert ProceduralMath(seed=3, num_tasks=5)[4] == ProceduralMath(seed=3, num_tasks=5)[4]
    assert ProceduralMath(seed=3, num_tasks=5)[4].question != ProceduralMath(seed=4, num_tasks=5)[4].question


@pytest.mark.parametrize("difficulty", [1, 3, 5])
def test_the_gold_program_prints_the_gold_answer(difficulty):
    for index in range(5):
        task = generate_problem(seed=11, index=index, difficulty=difficulty)
        printed = subprocess.run([sys.executable, "-c", task.metadata["solution_program"]],
                                 capture_output=True, text=True, check=True).stdout.strip()
        assert printed == task.answers[0]
        assert len(task.metadata["steps"]) == difficulty + 1


def test_numbers_are_big_enough_to_want_a_calculator():
    answers = sorted(int(generate_problem(0, i, 3).answers[0]) for i in range(21))
    assert answers[10] > 1000  # the median needs several multi-digit operations


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="difficulty"):
        generate_problem(0, 0, 9)
    with pytest.raises(ValueError, match="num_tasks"):
        ProceduralMath(num_tasks=0)
