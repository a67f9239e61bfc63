"""`ToolEnv.reset` rejects options it cannot honour with a clear error instead of guessing."""

import gymnasium as gym
import numpy as np
import pytest

import rapo_env  # noqa: F401  (registers the envs)


@pytest.fixture
def env():
    env = gym.make("RAPO-Math-v0", sandbox="subprocess")
    yield env
    env.close()


def test_options_that_are_not_a_mapping_are_a_type_error(env):
    with pytest.raises(TypeError, match="reset options must be a dict"):
        env.reset(options="str")


@pytest.mark.parametrize("bad", [1.9, 1.0, "1", True])
def test_a_task_index_that_is_not_an_integer_is_refused_not_truncated(env, bad):
    with pytest.raises(TypeError, match="task_index must be an integer"):
        env.reset(options={"task_index": bad})


def test_integer_task_indices_of_any_integer_type_pick_that_task(env):
    _, by_int = env.reset(options={"task_index": 1})
    _, by_numpy = env.reset(options={"task_index": np.int64(1)})
    assert by_int["task_index"] == by_numpy["task_index"] == 1
    assert by_int["task_id"] == by_numpy["task_id"]
