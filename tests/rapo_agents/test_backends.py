"""The local backend's rollout policy: the fast CPU decoder over the trained module, in ``rollout.weight_format``."""

from __future__ import annotations

import pytest

from rapo_agents.backends import LocalBackend
from rapo_agents.config import ConfigError, load_config


@pytest.mark.parametrize("weight_format", ["fp32", "int8"])
def test_rollouts_decode_the_trained_module_in_the_configured_weight_format(tiny_policy, weight_format):
    config = load_config(None, [f"rollout.weight_format={weight_format}"])
    policy = LocalBackend(config, tiny_policy.model, tiny_policy.tokenizer).make_policy()
    assert policy.decoder.weight_format == weight_format
    assert policy.model is tiny_policy.model  # the same module: an update reaches the rollouts by a repack


def test_unset_weight_format_is_the_fastest_this_cpu_has(tiny_policy):
    from rapo_agents.policies.llama_decoder import default_weight_format

    policy = LocalBackend(load_config(None, []), tiny_policy.model, tiny_policy.tokenizer).make_policy()
    assert policy.decoder.weight_format == default_weight_format(policy.device)


def test_an_unknown_weight_format_is_refused_at_load():
    with pytest.raises(ConfigError, match="rollout.weight_format must be one of"):
        load_config(None, ["rollout.weight_format=int4"])
