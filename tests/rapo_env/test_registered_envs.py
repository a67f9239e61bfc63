"""Every registered rapo env passes Gymnasium's env checker with its embedded defaults."""

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rapo_env


@pytest.mark.parametrize("env_id", rapo_env.RAPO_ENV_IDS)
def test_check_env_passes(env_id):
    env = gym.make(env_id)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()
