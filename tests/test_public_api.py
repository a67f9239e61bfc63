"""The public API: the main names import from the packages themselves, and ``import rapo_agents`` stays cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rapo_agents
import rapo_env

AGENT_NAMES = ["HFPolicy", "VLLMPolicy", "OpenAIPolicy", "RAPOTrainer", "TrainConfig", "RolloutEngine",
               "RolloutConfig", "rapo_advantages", "rapo_policy_loss", "retrieval_reward", "retrieval_entropy_pairs",
               "step_entropy_paper", "step_entropy_reference", "group_normalize", "fused_advantage", "RAPOConfig"]


@pytest.mark.parametrize("name", AGENT_NAMES)
def test_main_names_import_from_rapo_agents(name):
    value = getattr(rapo_agents, name)
    assert name in rapo_agents.__all__ and name in dir(rapo_agents)
    assert value.__name__ == name and value.__module__.startswith("rapo_agents.")


def test_every_exported_name_resolves():
    for package in (rapo_agents, rapo_env):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)


def test_env_names_import_from_rapo_env():
    import gymnasium as gym

    from rapo_env import StepTraceRetrievalWrapper, ToolEnv
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper as defined

    assert StepTraceRetrievalWrapper is defined and issubclass(ToolEnv, gym.Env)


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchThing"):
        rapo_agents.NoSuchThing  # noqa: B018
    with pytest.raises(AttributeError, match="NoSuchThing"):
        rapo_env.NoSuchThing  # noqa: B018


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(result.stdout.split())


def test_import_rapo_agents_imports_no_heavy_backend():
    """A fresh interpreter: importing the package (and naming its policies) loads neither vLLM nor Ray nor torch."""
    loaded = _modules_after("import rapo_agents")
    assert not {"vllm", "ray", "torch", "transformers"} & loaded
    loaded = _modules_after("from rapo_agents import VLLMPolicy, OpenAIPolicy, HFPolicy")
    assert not {"vllm", "ray"} & loaded


def test_every_package_init_says_what_it_holds():
    import rapo_buffers
    import rapo_cli
    import rapo_tools

    for package in (rapo_tools, rapo_buffers, rapo_env, rapo_agents, rapo_cli):
        assert package.__doc__ and len(package.__doc__.strip()) > 40, package.__name__
