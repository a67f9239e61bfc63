"""TrainConfig: YAML loading, key=value overrides, the seed's knob names, clear errors."""

from __future__ import annotations

import pytest

from rapo_agents.config import ConfigError, leaf_paths, load_config, parse_overrides, resolve_key


def test_defaults_are_the_embedded_job_and_the_spec_constants():
    config = load_config()
    assert config.model.path == "embedded"
    assert config.data.source == "procedural_math"
    assert config.retrieval.enabled and config.retrieval.retriever == "default"
    algorithm = config.algorithm
    assert (algorithm.clip_ratio_low, algorithm.clip_ratio_high, algorithm.clip_ratio_c) == (0.2, 0.28, 3.0)
    assert (algorithm.advantage_weight, algorithm.shaping_weight, algorithm.kl_coef) == (0.2, 0.05, 0.0)
    assert config.select_rule == "most_similar"  # paper fidelity


def test_seed_knob_names_work_bare_and_dotted():
    config = load_config(None, [
        "rollout_n=16", "no_retrieve_first_k=8", "retrieve_prob=0.25",
        "shaping_weight=0.1", "algorithm.advantage_weight=0.3",
    ])
    assert config.rollout.rollout_n == 16
    assert config.retrieval.no_retrieve_first_k == 8
    assert config.retrieval.retrieve_prob == 0.25
    assert config.algorithm.shaping_weight == 0.1
    assert config.algorithm.advantage_weight == 0.3


def test_the_retrieval_section_reaches_the_wrappers_settings():
    from rapo_agents.trainer import retrieval_settings

    settings = retrieval_settings(load_config(None, ["retrieval.final_steps=skip", "retrieve_after=first_round"]))
    assert (settings.final_steps, settings.retrieve_after) == ("skip", "first_round")
    assert retrieval_settings(load_config()).final_steps == "next_best"  # the final step dropped, the next spliced


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  lr: 1e-6\n  betas: [0.9, 0.95]\nretrieval:\n  enabled: false\nseed: 7\n")
    config = load_config(path, ["seed=8", "data.max_tasks=null", "fidelity=reference"])
    assert config.optim.lr == 1e-6 and config.optim.betas == (0.9, 0.95)
    assert config.retrieval.enabled is False
    assert config.seed == 8 and config.data.max_tasks is None
    assert config.select_rule == "max_reward" and config.algorithm.hybrid_rule == "reference"


def test_an_override_reaches_into_a_mapping_setting_and_keeps_its_other_keys(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  env_id: RAPO-QA-v0\n  source: procedural_kb\n  env_kwargs:\n    search:\n      topk: 1\n")
    config = load_config(path, ["data.env_kwargs.hops=[2]", "data.env_kwargs.search.topk=2"])
    assert config.data.env_kwargs == {"search": {"topk": 2}, "hops": [2]}
    with pytest.raises(ConfigError, match="unknown setting 'data.env_kwarg.hops'"):
        load_config(None, ["data.env_kwarg.hops=[2]"])


def test_round_trip_through_yaml(tmp_path):
    config = load_config(None, ["rollout_n=3", "lr=3e-6", "output_dir=somewhere"])
    config.to_yaml(tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rolout_n=3"], "did you mean"),
        (["lr=fast"], "optim.lr must be a number"),
        (["rollout_n=2.5"], "integer"),
        (["retrieval.enabled=maybe"], "true or false"),
        (["no_equals_sign"], "key=value"),
        (["fidelity=verl"], "fidelity"),
        (["train_batch_size=6", "ppo_mini_batch_size=4"], "multiple"),
        (["retrieve_prob=1.5"], "retrieve_prob"),
        (["clip_ratio_c=0.5"], "clip_ratio_c"),
        (["total_steps=-1"], "total_steps >= 0"),
        (["optim.total_epochs=0"], "total_epochs >= 1"),
        (["optim.lr=-1"], "lr >= 0"),
        (["optim.grad_clip=0"], "grad_clip > 0"),
        (["logging.keep_last=0"], "keep_last >= 1"),
        (["logging.save_every=-1"], "save_every >= 0"),
        (["rollout.temperature=-1"], "temperature must be >= 0"),
        (["rollout.top_p=0"], "top_p"),
    ],
)
def test_bad_settings_raise_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_bad_files(tmp_path):
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(not_mapping)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("optim:\n  learning_rate: 1.0\n")
    with pytest.raises(ConfigError, match="optim.learning_rate"):
        load_config(unknown)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.yaml")


def test_every_leaf_is_reachable_and_documented():
    import inspect

    paths = leaf_paths()
    assert "rollout.rollout_n" in paths and "algorithm.fidelity" in paths
    for path in paths:
        assert resolve_key(path) == path
    # Every field of every section has a docstring right under it.
    from rapo_agents import config as config_module

    from rapo_agents import heldout as heldout_module
    from rapo_agents import lora as lora_module
    from rapo_agents.rollout import config as rollout_config_module

    source = "".join(inspect.getsource(module) for module in (config_module, rollout_config_module, heldout_module,
                                                              lora_module))
    for path in paths:
        if path.startswith(("algorithm.", "arpo.")):
            continue  # documented in rapo_agents.rapo.RAPOConfig and rapo_agents.rollout.branching.ARPOConfig
        name = path.rsplit(".", 1)[-1]
        assert f"    {name}:" in source
    assert parse_overrides(["seed=3"]) == {"seed": 3}


def test_shipped_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs"
    default = load_config(root / "default.yaml")
    assert default == load_config()
    reference = load_config(root / "rapo_7b_reasoning.yaml")
    assert reference.rollout.rollout_n == 16 and reference.retrieval.no_retrieve_first_k == 8
    assert reference.optim.lr == 1e-6 and reference.optim.train_batch_size == 32
    assert reference.optim.ppo_mini_batch_size == 16 and reference.rollout.policy == "vllm"
    assert reference.rollout.backend == "local"
    grpo = load_config(root / "grpo.yaml")
    assert not grpo.retrieval.enabled and grpo.arpo.initial_rollouts is None
    arpo = load_config(root / "arpo.yaml")
    assert not arpo.retrieval.enabled and arpo.arpo.enabled(arpo.rollout.rollout_n)
    assert (arpo.arpo.initial_rollouts, arpo.arpo.beam_size, arpo.arpo.branch_probability,
            arpo.arpo.entropy_weight) == (2, 2, 0.5, 0.2)
    on_policy = load_config(root / "on_policy.yaml")
    assert on_policy.optim.ppo_mini_batch_size == on_policy.optim.train_batch_size and on_policy.optim.ppo_epochs == 1


def test_rollout_backend_and_policy_knobs():
    config = load_config(None, ["rollout.backend=ray", "policy=vllm", "num_workers=3", "initial_rollouts=2"])
    assert (config.rollout.backend, config.rollout.policy, config.ray.num_workers) == ("ray", "vllm", 3)
    assert config.arpo.initial_rollouts == 2
    # rollout.backend used to name the model backend: the old values say what to write now.
    with pytest.raises(ConfigError, match="write rollout.policy=vllm"):
        load_config(None, ["rollout.backend=vllm"])
    with pytest.raises(ConfigError, match="local or ray"):
        load_config(None, ["rollout.backend=spark"])
    with pytest.raises(ConfigError, match="exceeds the group size"):
        load_config(None, ["rollout_n=4", "initial_rollouts=5"])


def test_rapo_train_command_prints_config_and_rejects_bad_keys(capsys):
    import yaml

    from rapo_cli import main

    assert main(["train", "--print-config", "rollout_n=8", "retrieval.enabled=false"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rollout"]["rollout_n"] == 8 and printed["retrieval"]["enabled"] is False
    assert main(["train", "rolout_n=8"]) == 2
    assert "did you mean" in capsys.readouterr().err  # errors go to stderr
