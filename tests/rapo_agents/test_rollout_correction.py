"""Sampler-mismatch correction (`algorithm.rollout_correction`): truncated (TIS) and masked (MIS) importance
sampling of the trainer's recomputed ``logp_old`` against the sampler's log-probs, as TRL and verl define them."""

import copy
import math

import pytest
import torch

from rapo_agents.batch import TrainBatch
from rapo_agents.config import ConfigError, load_config
from rapo_agents.rapo import RAPOConfig, rapo_policy_loss, rollout_correction_weights
from rapo_agents.update import UpdateSettings, ppo_update, recompute_logprobs

# Ratios w = exp(logp_old - logp_sampler) on four loss tokens and one token off the mask.
RATIOS = (3.0, 1.5, 1.0, 0.4, 7.0)
MASK = (1, 1, 1, 1, 0)


def crafted(ratios=RATIOS, mask=MASK):
    sampler = torch.full((1, len(ratios)), -1.0)
    trainer = sampler + torch.log(torch.tensor([ratios]))
    return trainer, sampler, torch.tensor([mask])


# ---- the maths --------------------------------------------------------------------------------


def test_tis_truncates_the_ratio_at_the_cap_and_keeps_it_below():
    trainer, sampler, mask = crafted()
    out = rollout_correction_weights(trainer, sampler, mask, "tis", cap=2.0)
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 1.5, 1.0, 0.4, 0.0]]))
    assert out.truncated_fraction.item() == pytest.approx(1 / 4)  # only w = 3 (w = 7 is off the mask)
    assert out.weight_mean.item() == pytest.approx((2.0 + 1.5 + 1.0 + 0.4) / 4)


def test_mis_drops_tokens_outside_one_over_cap_to_cap_and_keeps_the_ratio_inside():
    trainer, sampler, mask = crafted()
    out = rollout_correction_weights(trainer, sampler, mask, "mis", cap=2.0)
    # w = 3 is above 2 and w = 0.4 below 1/2: masked; 1.5 and 1.0 keep their ratio.
    torch.testing.assert_close(out.weights, torch.tensor([[0.0, 1.5, 1.0, 0.0, 0.0]]))
    assert out.masked_fraction.item() == pytest.approx(2 / 4)
    assert out.truncated_fraction.item() == pytest.approx(1 / 4)


def test_the_bounds_themselves_are_kept():
    trainer, sampler, mask = crafted(ratios=(2.0, 0.5), mask=(1, 1))
    mis = rollout_correction_weights(trainer, sampler, mask, "mis", cap=2.0)
    torch.testing.assert_close(mis.weights, torch.tensor([[2.0, 0.5]]))
    assert mis.masked_fraction.item() == 0.0


def test_none_weighs_every_loss_token_one_and_still_reports_the_mismatch():
    trainer, sampler, mask = crafted()
    out = rollout_correction_weights(trainer, sampler, mask, "none", cap=2.0)
    torch.testing.assert_close(out.weights, torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]]))
    assert out.masked_fraction.item() == pytest.approx(0.5)


def test_the_kl_estimates_by_hand():
    trainer, sampler, mask = crafted()
    out = rollout_correction_weights(trainer, sampler, mask, "tis", cap=2.0)
    on_mask = RATIOS[:4]
    # k1: mean of logp_sampler - logp_trainer = -mean(log w); k3: mean of w - 1 - log w (KL(sampler || trainer)).
    assert out.kl_k1.item() == pytest.approx(-sum(math.log(w) for w in on_mask) / 4, abs=1e-6)
    assert out.kl_k3.item() == pytest.approx(sum(w - 1 - math.log(w) for w in on_mask) / 4, abs=1e-6)
    assert out.kl_k3.item() >= 0


def test_equal_log_probs_give_weight_one_and_zero_kl():
    logp = torch.tensor([[-0.3, -2.0, -5.0]])
    out = rollout_correction_weights(logp, logp.clone(), torch.ones(1, 3), "mis", cap=2.0)
    torch.testing.assert_close(out.weights, torch.ones(1, 3))
    assert out.kl_k1.item() == 0.0 and out.kl_k3.item() == 0.0 and out.masked_fraction.item() == 0.0


def test_an_extreme_log_ratio_stays_finite():
    trainer, sampler, mask = torch.tensor([[0.0, -200.0]]), torch.tensor([[-200.0, 0.0]]), torch.ones(1, 2)
    out = rollout_correction_weights(trainer, sampler, mask, "tis", cap=2.0)
    assert torch.isfinite(out.weights).all() and torch.isfinite(out.kl_k3)
    assert out.weights[0, 0].item() == 2.0


def test_the_weights_multiply_the_clipped_token_loss():
    logp = torch.zeros(1, 3, requires_grad=True)
    mask = torch.ones(1, 3)
    weights = torch.tensor([[2.0, 0.5, 0.0]])
    out = rapo_policy_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), mask, rollout_weights=weights)
    # ratio 1, A = 1: each token's loss is -1, weighted: -(2 + 0.5 + 0) / 3.
    assert out.policy_loss.item() == pytest.approx(-2.5 / 3)
    out.loss.backward()
    torch.testing.assert_close(logp.grad, -weights / 3)


def test_no_weights_leave_the_loss_bit_identical():
    generator = torch.Generator().manual_seed(0)
    logp_new, logp_old = torch.randn(3, 5, generator=generator), torch.randn(3, 5, generator=generator)
    advantages, mask = torch.randn(3, generator=generator), (torch.rand(3, 5, generator=generator) > 0.3).float()
    plain = rapo_policy_loss(logp_new, logp_old, advantages, mask)
    ones = rapo_policy_loss(logp_new, logp_old, advantages, mask, rollout_weights=None)
    assert torch.equal(plain.loss, ones.loss)


def test_bad_arguments_are_refused_with_a_clear_message():
    trainer, sampler, mask = crafted()
    with pytest.raises(ValueError, match="mode must be 'none', 'tis' or 'mis'"):
        rollout_correction_weights(trainer, sampler, mask, "clip", cap=2.0)
    with pytest.raises(ValueError, match="cap must be a finite number > 1"):
        rollout_correction_weights(trainer, sampler, mask, "tis", cap=1.0)
    with pytest.raises(ValueError, match="one shape"):
        rollout_correction_weights(trainer, sampler[:, :2], mask, "tis", cap=2.0)


# ---- the setting ------------------------------------------------------------------------------


def test_the_defaults_are_off_with_trls_cap():
    config = RAPOConfig()
    assert (config.rollout_correction, config.rollout_correction_cap) == ("none", 2.0)
    assert (load_config().algorithm.rollout_correction, load_config().algorithm.rollout_correction_cap) == (
        "none", 2.0)


@pytest.mark.parametrize("cap", [1.0, 0.5, -2.0, math.inf])
def test_a_cap_of_at_most_one_is_a_config_error(cap):
    with pytest.raises(ValueError, match="rollout_correction_cap must be a finite number > 1"):
        RAPOConfig(rollout_correction="tis", rollout_correction_cap=cap)


def test_an_unknown_mode_is_a_config_error():
    with pytest.raises(ValueError, match="rollout_correction must be 'none', 'tis' or 'mis'"):
        RAPOConfig(rollout_correction="truncate")
    with pytest.raises(ConfigError, match="rollout_correction"):
        load_config(overrides=["algorithm.rollout_correction=token_truncate"])
    with pytest.raises(ConfigError, match="rollout_correction_cap"):
        load_config(overrides=["algorithm.rollout_correction=tis", "algorithm.rollout_correction_cap=1"])
    assert load_config(overrides=["algorithm.rollout_correction=mis"]).algorithm.rollout_correction == "mis"


# ---- the update -------------------------------------------------------------------------------

PROMPT, POLICY_TOKENS, ADVANTAGES = 2, (6, 4), (0.5, -0.25)


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))


def recomputed_batch(model, sampler_offset: torch.Tensor | None) -> TrainBatch:
    """A batch whose ``old_logprobs`` are the trainer's (ratio 1 at the first step) and whose sampler log-probs
    are those minus ``sampler_offset`` (so the correction ratio is ``exp(sampler_offset)``)."""
    from rapo_agents.batch import build_batch
    from rapo_env.trajectory import StepRecord, Trajectory

    generator = torch.Generator().manual_seed(1)
    trajectories = []
    for index, tokens in enumerate(POLICY_TOKENS):
        length = PROMPT + tokens
        step = StepRecord(action="a", observation="", token_start=PROMPT, token_end=length)
        trajectories.append(Trajectory(
            task_id=f"q{index}", rollout_index=0, question="q", system_prompt="", prompt="q", steps=[step],
            reward=0.0, metrics={}, num_tool_calls=0, end_reason="answer", source="test",
            token_ids=torch.randint(1, 32, (length,), generator=generator).tolist(),
            loss_mask=[0] * PROMPT + [1] * tokens, logprobs=[0.0] * length, prompt_length=PROMPT))
    batch = build_batch(trajectories, pad_token_id=0)
    batch.advantages, batch.sampler_logprobs = torch.tensor(ADVANTAGES), None
    rows, loss_mask = len(POLICY_TOKENS), batch.loss_mask
    batch.old_logprobs = recompute_logprobs(model, batch, UpdateSettings(mini_batch_rows=rows, micro_batch_size=rows))
    if sampler_offset is not None:
        batch.sampler_logprobs = (batch.old_logprobs - sampler_offset) * loss_mask
    return batch


def run_update(model, batch, config, micro_batch_size=2, from_current=False):
    clone = copy.deepcopy(model)
    optimizer = torch.optim.SGD(clone.parameters(), lr=0.1)
    settings = UpdateSettings(mini_batch_rows=len(POLICY_TOKENS), micro_batch_size=micro_batch_size,
                              old_logprobs_from_current=from_current)
    stats = ppo_update(clone, optimizer, batch, config, settings)
    return stats, torch.nn.utils.parameters_to_vector(clone.parameters()).detach()


def crafted_offset() -> torch.Tensor:
    """log w per token: row 0 has w = 3 (truncated / masked) on its first token, row 1 w = 0.25 on its first."""
    offset = torch.zeros(len(POLICY_TOKENS), PROMPT + max(POLICY_TOKENS))
    offset[0, PROMPT], offset[1, PROMPT] = math.log(3.0), math.log(0.25)
    return offset


def test_none_leaves_the_update_bit_identical_to_an_uncorrected_one():
    model = tiny_model()
    without = recomputed_batch(model, sampler_offset=None)  # no sampler log-probs: the update as it was
    with_sampler = recomputed_batch(model, crafted_offset())
    base_stats, base_params = run_update(model, without, RAPOConfig())
    none_stats, none_params = run_update(model, with_sampler, RAPOConfig(rollout_correction="none"))
    assert torch.equal(base_params, none_params)
    assert base_stats["loss/policy_loss"] == none_stats["loss/policy_loss"]
    assert "rollout_correction/kl_k3" not in base_stats and none_stats["rollout_correction/kl_k3"] > 0


@pytest.mark.parametrize("mode, first_weights", [("tis", (2.0, 0.25)), ("mis", (0.0, 0.0))])
def test_the_update_weighs_each_token_loss_by_the_corrected_ratio(mode, first_weights):
    model = tiny_model()
    batch = recomputed_batch(model, crafted_offset())
    stats, _ = run_update(model, batch, RAPOConfig(rollout_correction=mode))
    # PPO ratio 1, so a token's loss is -A * w: row 0 has 6 tokens (first weighted), row 1 has 4.
    (n0, n1), (a0, a1), (w0, w1) = POLICY_TOKENS, ADVANTAGES, first_weights
    expected = -(a0 * (w0 + n0 - 1) + a1 * (w1 + n1 - 1)) / (n0 + n1)
    assert stats["loss/policy_loss"] == pytest.approx(expected, abs=1e-6)
    assert stats["rollout_correction/truncated_fraction"] == pytest.approx(1 / 10)
    assert stats["rollout_correction/masked_fraction"] == pytest.approx(2 / 10)
    expected_k1 = -(math.log(3.0) + math.log(0.25)) / 10
    assert stats["rollout_correction/kl_k1"] == pytest.approx(expected_k1, abs=1e-6)


def test_the_one_step_schedule_takes_logp_old_from_its_own_forward_pass_and_corrects_alike():
    model = tiny_model()
    batch = recomputed_batch(model, crafted_offset())
    separate, separate_params = run_update(model, batch, RAPOConfig(rollout_correction="tis"))
    fused, fused_params = run_update(model, batch, RAPOConfig(rollout_correction="tis"), from_current=True)
    assert fused["loss/policy_loss"] == pytest.approx(separate["loss/policy_loss"], abs=1e-6)
    assert fused["rollout_correction/truncated_fraction"] == pytest.approx(1 / 10)
    torch.testing.assert_close(fused_params, separate_params, atol=1e-6, rtol=1e-5)


def test_a_correction_without_the_samplers_log_probs_is_refused():
    model = tiny_model()
    batch = recomputed_batch(model, sampler_offset=None)
    with pytest.raises(ValueError, match="needs the batch's sampler_logprobs"):
        run_update(model, batch, RAPOConfig(rollout_correction="tis"))


def test_build_batch_keeps_the_samplers_log_probs_apart_from_logp_old():
    from rapo_agents.batch import build_batch
    from rapo_env.trajectory import StepRecord, Trajectory

    def rollout(index, reward):
        step = StepRecord(action="a", observation="", token_start=2, token_end=4, entropy_paper=1.0)
        return Trajectory(task_id="q", rollout_index=index, question="q", system_prompt="", prompt="q",
                          steps=[step], reward=reward, metrics={}, num_tool_calls=0, end_reason="answer",
                          source="test", token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1],
                          logprobs=[0.0, 0.0, -0.5, -0.7], prompt_length=2)

    batch = build_batch([rollout(0, 1.0), rollout(1, 0.0)], pad_token_id=0)
    torch.testing.assert_close(batch.sampler_logprobs, batch.old_logprobs)
    batch.old_logprobs = torch.zeros_like(batch.old_logprobs)  # what the trainer's recomputation does
    assert batch.sampler_logprobs[0, 2].item() == pytest.approx(-0.5)
    assert batch.select([1]).sampler_logprobs.shape == (1, 4)
