"""``rapo train``'s settings are discoverable (``--help`` lists them all) and close misses are forgiven or explained."""

import subprocess
import sys

import pytest

from rapo_agents.config import ALIASES, ConfigError, TrainConfig, leaf_paths, load_config
from rapo_cli.settings_help import render, settings


def test_help_lists_every_setting_with_type_default_and_doc():
    result = subprocess.run([sys.executable, "-m", "rapo_cli", "train", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    for key in leaf_paths():
        assert f"  {key} (" in result.stdout, key
    for seed_name in ("rollout_n", "no_retrieve_first_k", "retrieve_prob", "shaping_weight", "advantage_weight"):
        assert seed_name in result.stdout
    assert f"  rollout.rollout_n (int, default {TrainConfig().rollout.rollout_n})" in result.stdout
    assert "retrieval:" in result.stdout and "optim:" in result.stdout


def test_every_setting_has_a_docstring_line():
    undocumented = [row.key for row in settings(TrainConfig) if not row.doc]
    assert undocumented == []
    assert render(TrainConfig).count("\n  ") >= len(leaf_paths())


@pytest.mark.parametrize("alias, key, value", [
    ("learning_rate=1e-6", ("optim", "lr"), 1e-6),
    ("actor_rollout_ref.rollout.n=8", ("rollout", "rollout_n"), 8),
    ("per_device_train_batch_size=2", ("optim", "micro_batch_size"), 2),
    ("num_generations=8", ("rollout", "rollout_n"), 8),
])
def test_trl_and_verl_names_set_the_same_knob(alias, key, value):
    config = load_config(None, [alias])
    assert getattr(getattr(config, key[0]), key[1]) == value


def test_every_alias_names_a_real_setting():
    assert set(ALIASES.values()) <= set(leaf_paths())


def test_a_known_name_under_a_guessed_section_suggests_the_real_key():
    with pytest.raises(ConfigError, match="did you mean optim.lr"):
        load_config(None, ["optim.learning_rate=1e-6"])
