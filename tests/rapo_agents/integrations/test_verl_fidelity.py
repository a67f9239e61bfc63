"""``fidelity=reference`` holds under verl, or is refused where verl cannot give it (never silently ignored).

The agent loop hands the retrieval wrapper the reference's hybrid split, candidate rule and fallback
splice, and records its fidelity in every rollout; the trainer refuses records of another fidelity,
and refuses the reference's step entropy, which needs rollout statistics verl's servers do not return.
The real verl run needs CUDA; the plumbing and the term selection are checked here on CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed")

from rapo_agents.integrations.verl.protocol import (  # noqa: E402
    episode_fields,
    retrieval_settings,
    retrieval_terms_from_fields,
)
from rapo_agents.integrations.verl.trainer import rapo_fidelity  # noqa: E402
from rapo_env.wrappers.retrieval import REFERENCE_FALLBACK_TEXT  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[3]


def make_loop(**arguments):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer  # noqa: F401  (verl's base class expects one; None is enough here)
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from rapo_agents.integrations.verl.agent_loop import RapoEnvAgentLoop

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 512, "prompt_length": 1024}},
                               "data": {}})
    return RapoEnvAgentLoop(trainer_config=DictConfigWrap(config), server_manager=None, tokenizer=None,
                            processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
                            name="rapo_env_agent", **arguments)


def retrieval_wrapper(env):
    from rapo_env.wrappers import StepTraceRetrievalWrapper

    while not isinstance(env, StepTraceRetrievalWrapper):
        env = env.env
    return env


def test_the_reference_agent_loop_gives_the_wrapper_the_references_rules():
    from rapo_buffers.candidates import Candidate, StaticRetriever

    retriever = StaticRetriever([Candidate("<python>1</python>", 1.0, 0.9)])
    loop = make_loop(fidelity="reference", env_kwargs={"num_tasks": 2, "sandbox": "subprocess"},
                     retrieval={"retriever": retriever, "group_size": 16, "no_retrieve_first_k": 8})
    env = loop.make_env()
    try:
        wrapper = retrieval_wrapper(env)
        assert (wrapper.settings.select, wrapper.settings.hybrid_rule) == ("max_reward", "reference")
        assert REFERENCE_FALLBACK_TEXT in wrapper.settings.fallback
    finally:
        env.close()


def test_the_paper_agent_loop_keeps_the_papers_rules():
    from rapo_buffers.candidates import StaticRetriever

    loop = make_loop(env_kwargs={"num_tasks": 2, "sandbox": "subprocess"},
                     retrieval={"retriever": StaticRetriever([]), "select": "auto"})
    env = loop.make_env()
    try:
        settings = retrieval_wrapper(env).settings
        assert (settings.select, settings.hybrid_rule) == ("most_similar", "paper")
    finally:
        env.close()


def test_an_unknown_fidelity_is_refused_with_its_name():
    with pytest.raises(ValueError, match="fidelity must be 'paper' or 'reference', got 'papr'"):
        make_loop(fidelity="papr")
    with pytest.raises(ValueError, match="got 'papr'"):
        retrieval_settings({}, "papr")


def test_an_explicit_rule_is_kept():
    assert retrieval_settings({"select": "most_similar"}, "reference")["select"] == "most_similar"


def test_the_trainer_refuses_rollouts_of_another_fidelity():
    entropy = torch.ones(1, 4)
    fields = [episode_fields([(0, 2), (2, 4)], [1, 0], 1, 4, fidelity="paper")]
    expected = "agent loop ran with fidelity='paper' but the trainer has rapo.fidelity='reference'"
    with pytest.raises(ValueError, match=expected):
        retrieval_terms_from_fields(entropy, fields, fidelity="reference")
    reference_fields = [episode_fields([(0, 2), (2, 4)], [1, 0], 1, 4, fidelity="reference")]
    z_ret, _ = retrieval_terms_from_fields(entropy, reference_fields, fidelity="reference")
    assert z_ret.shape == (1,)


def test_the_references_step_entropy_is_refused_under_verl_unless_the_papers_is_chosen():
    assert rapo_fidelity({}) == "paper"
    with pytest.raises(ValueError, match="cannot be computed under verl"):
        rapo_fidelity({"rapo": {"fidelity": "reference"}})
    with pytest.raises(ValueError, match="cannot be computed under verl"):
        rapo_fidelity({"rapo": {"step_entropy": "reference"}})
    assert rapo_fidelity({"rapo": {"fidelity": "reference", "step_entropy": "paper"}}) == "reference"


def test_the_verl_reference_overlay_composes_with_the_references_script_settings():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        config = compose(config_name="verl_rapo_7b", overrides=["+verl_fidelity=reference",
                                                                "+ray_kwargs.ray_init.runtime_env.env_vars.X=1"])
    assert rapo_fidelity(config) == "reference"
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu == 2 * (1536 + 4096)
    assert (rollout.n, rollout.tensor_model_parallel_size, rollout.gpu_memory_utilization) == (16, 1, 0.7)
    assert (config.data.train_batch_size, actor.ppo_mini_batch_size) == (32, 16)
    assert rollout.agent.agent_loop_config_path.endswith("configs/verl_agent_loops_reference.yaml")
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))

    [entry] = OmegaConf.load(REPO_ROOT / "configs" / "verl_agent_loops_reference.yaml")
    assert entry.fidelity == "reference" and entry.retrieval.select == "auto"
    assert entry.env_kwargs.reward == "reference" and entry.env_kwargs.sandbox.output == "reference"
    assert (entry.retrieval.no_retrieve_first_k, entry.retrieval.retrieve_prob) == (8, 0.5)


def test_the_default_agent_loop_config_states_its_fidelity():
    from omegaconf import OmegaConf

    [entry] = OmegaConf.load(REPO_ROOT / "configs" / "verl_agent_loops.yaml")
    assert entry.fidelity == "paper" and entry.retrieval.select == "auto"
