"""RAPO's functions against hand-computed cases, the spec's conventions, and gradcheck."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rapo_agents.rapo import (
    RAPOConfig,
    fused_advantage,
    group_normalize,
    k3_kl,
    rapo_advantages,
    rapo_policy_loss,
    retrieval_entropy_pairs,
    retrieval_fraction,
    retrieval_reward,
    step_entropy_paper,
    step_entropy_reference,
    token_entropy_from_logits,
)


# ---------------------------------------------------------------- config


def test_config_fidelity_switches_documented_differences():
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

    paper, reference = RAPOConfig(), RAPOConfig(fidelity="reference")
    assert (paper.entropy_estimator, paper.selection, paper.hybrid_rule) == ("paper", "most_similar", "paper")
    assert (reference.entropy_estimator, reference.selection, reference.hybrid_rule) == (
        "reference",
        "max_reward",
        "reference",
    )
    # 16 rollouts, k = 8: the paper makes 8 hybrid, the reference code 7 (the wrapper applies the rule).
    import gymnasium as gym

    from rapo_buffers.candidates import StaticRetriever

    class Echo(gym.Env):
        observation_space = action_space = gym.spaces.Text(64)

        def reset(self, *, seed=None, options=None):
            return "question", {}

        def step(self, action):
            return "result", 0.0, False, False, {}

    for config, hybrid in ((paper, 8), (reference, 7)):
        wrapper = StepTraceRetrievalWrapper(Echo(), StaticRetriever([]), no_retrieve_first_k=8, group_size=16,
                                            select=config.selection, hybrid_rule=config.hybrid_rule)
        hybrid_flags = [wrapper.reset(options={"rollout_index": i})[1]["hybrid"] for i in range(16)]
        assert sum(hybrid_flags) == hybrid and not any(hybrid_flags[:8])


@pytest.mark.parametrize("bad", [{"fidelity": "verl"}, {"clip_ratio_low": -0.1}, {"clip_ratio_c": 1.0}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        RAPOConfig(**bad)


# ---------------------------------------------------------------- §5 entropies


def test_token_entropy_from_logits_matches_definition():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    p = torch.softmax(logits, -1)
    expected = -(p * p.log()).sum(-1)
    torch.testing.assert_close(token_entropy_from_logits(logits), expected)
    # A one-hot-like distribution does not produce NaN.
    assert torch.isfinite(token_entropy_from_logits(torch.tensor([[1e4, -1e4]]))).all()


def test_step_entropy_paper_is_masked_mean():
    entropies = torch.tensor([[[0.3, 0.9, 7.0], [2.0, 0.0, 0.0]]])
    mask = torch.tensor([[[1, 1, 0], [1, 0, 0]]])
    torch.testing.assert_close(step_entropy_paper(entropies, mask), torch.tensor([[0.6, 2.0]]))
    assert step_entropy_paper(torch.ones(1, 2), torch.zeros(1, 2)).item() == 0.0


def test_step_entropy_reference_sums_first_tokens_of_topk_entropy():
    # 25 tokens, each with top candidates (0.5, 0.25, 0.25, then tiny) -> entropy 1.5 ln 2 of the first 3.
    probs = torch.tensor([0.5, 0.25, 0.25] + [1e-30] * 9)
    topk = probs.log().expand(1, 25, 12)
    mask = torch.ones(1, 25)
    per_token = -(probs[:10] * probs[:10].log()).sum().item()
    value = step_entropy_reference(topk, mask, vocab_size=100, max_tokens=20, topk=10).item()
    assert value == pytest.approx(20 * per_token / math.log(100), rel=1e-5)
    # Only real (masked) tokens count, and a short step sums all of them.
    short_mask = torch.zeros(1, 25)
    short_mask[0, :4] = 1
    assert step_entropy_reference(topk, short_mask, vocab_size=100).item() == pytest.approx(
        4 * per_token / math.log(100), rel=1e-5
    )
    with pytest.raises(ValueError):
        step_entropy_reference(topk, mask, vocab_size=1)


# ---------------------------------------------------------------- §5 retrieval reward


def test_retrieval_reward_hand_computed():
    # Rollout 0: one retrieval after step 0, entropy 2.0 -> 1.0. Rollout 1: none.
    step_h = torch.tensor([[2.0, 1.0, 0.7], [1.0, 1.0, 0.0]])
    step_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    marks = torch.tensor([[1, 0, 0], [0, 0, 0]])
    pre, post, valid = retrieval_entropy_pairs(step_h, step_mask, marks)
    z = retrieval_reward(pre, post, valid)
    d_h = -(1.0 - 2.0) / (2.0 + 1e-6)
    assert z[0].item() == pytest.approx(math.tanh(2 * d_h) * 2.0, rel=1e-6)
    assert z[1].item() == 0.0


def test_retrieval_reward_averages_over_retrievals_and_drops_unfollowed_ones():
    step_h = torch.tensor([[1.0, 0.5, 1.5, 0.2]])
    marks = torch.tensor([[1, 1, 0, 1]])  # the last retrieval has no policy step after it
    pre, post, valid = retrieval_entropy_pairs(step_h, torch.ones(1, 4), marks)
    z = retrieval_reward(pre, post, valid)
    z1 = math.tanh(2 * 0.5 / (1 + 1e-6)) * 1.0
    z2 = math.tanh(2 * -(1.5 - 0.5) / (0.5 + 1e-6)) * 0.5
    assert valid.tolist() == [[True, True, False, False]]
    assert z.item() == pytest.approx((z1 + z2) / 2, rel=1e-6)


def test_retrieval_reward_sign_conventions_of_the_paper():
    """Spec §5 ablation: an entropy drop is rewarded, a rise penalised, and more so when H_pre is high."""
    valid = torch.ones(4, 1, dtype=torch.bool)
    h_pre = torch.tensor([[1.0], [1.0], [2.0], [0.5]])
    h_post = torch.tensor([[0.5], [1.5], [1.0], [0.25]])  # drop, rise, drop (uncertain), drop (confident)
    z = retrieval_reward(h_pre, h_post, valid)
    assert z[0] > 0 and z[1] < 0
    # Same relative drop (50%): the retrieval made at higher entropy earns more (timing term H_pre, not 1/H_pre).
    assert z[2] > z[0] > z[3] > 0
    # The quality term is bounded by tanh: |Z| < H_pre.
    assert (z.abs() < h_pre.squeeze(-1)).all()


def test_retrieval_entropy_pairs_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        retrieval_entropy_pairs(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2))


# ---------------------------------------------------------------- §6 advantages


def test_group_normalize_unbiased_std_and_singletons():
    values = torch.tensor([1.0, 5.0, 2.0, 3.0, 0.0, 7.0], dtype=torch.float64)
    groups = torch.tensor([10, 3, 10, 10, 3, 42])  # non-contiguous ids, a group of one
    out = group_normalize(values, groups)
    g10 = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    expected_g10 = (g10 - 2.0) / (g10.std(unbiased=True) + 1e-6)
    torch.testing.assert_close(out[[0, 2, 3]], expected_g10)
    std3 = torch.tensor([5.0, 0.0], dtype=torch.float64).std()
    torch.testing.assert_close(out[[1, 4]], torch.tensor([2.5, -2.5], dtype=torch.float64) / (std3 + 1e-6))
    assert out[5].item() == pytest.approx(7.0 / (1.0 + 1e-6))  # mean 0, std 1


def test_group_normalize_constant_group_gives_zero():
    assert group_normalize(torch.full((4,), 0.7), torch.zeros(4, dtype=torch.long)).abs().max() == 0


def test_group_normalize_rejects_bad_shapes():
    with pytest.raises(ValueError):
        group_normalize(torch.zeros(3), torch.zeros(2, dtype=torch.long))


def test_rapo_reduces_to_grpo_without_retrievals():
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, -1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    grpo = group_normalize(rewards, groups)
    for weight in (0.0, 0.2, 5.0):
        torch.testing.assert_close(rapo_advantages(rewards, torch.zeros(8), groups, weight), grpo)


def test_rapo_advantage_hand_computed_and_weight_is_honoured():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    z_ret = torch.tensor([0.0, 0.0, 0.4, -0.2], dtype=torch.float64)
    groups = torch.zeros(4, dtype=torch.long)
    a_acc = (rewards - 0.5) / (rewards.std() + 1e-6)
    a_ret = (z_ret - z_ret.mean()) / (z_ret.std() + 1e-6)
    for weight in (0.2, 0.7):
        torch.testing.assert_close(rapo_advantages(rewards, z_ret, groups, weight), a_acc * (1 + weight * a_ret))
    low, high = rapo_advantages(rewards, z_ret, groups, 0.2), rapo_advantages(rewards, z_ret, groups, 0.7)
    assert not torch.allclose(low, high)
    torch.testing.assert_close(fused_advantage(a_acc, a_ret, 0.0), a_acc)


def test_dr_grpo_only_centres_both_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0], dtype=torch.float64)
    z_ret = torch.tensor([0.0, 0.3, 0.0, 0.5], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1])  # a group of one keeps mean 0, as in verl
    advantages = rapo_advantages(rewards, z_ret, groups, 0.2, norm_by_std=False)
    # group 0: A_acc = R - 1/3, A_ret = Z - 0.1; group 1: A_acc = 2, A_ret = 0.5
    expected = [2 / 3 * (1 - 0.02), -1 / 3 * (1 + 0.04), -1 / 3 * (1 - 0.02), 2.0 * 1.1]
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64))
    assert not torch.allclose(advantages, rapo_advantages(rewards, z_ret, groups, 0.2))


def test_the_batch_builder_follows_norm_adv_by_std_in_grpo():
    from rapo_agents.batch import build_batch
    from rapo_env.trajectory import StepRecord, Trajectory

    def rollout(index: int, reward: float) -> Trajectory:
        step = StepRecord(action="a", observation="", token_start=2, token_end=4, entropy_paper=1.0,
                          entropy_reference=0.5)
        return Trajectory(task_id="q", rollout_index=index, question="q", system_prompt="", prompt="q", steps=[step],
                          reward=reward, metrics={}, num_tool_calls=0, end_reason="answer", source="test",
                          token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -1.0, -1.0],
                          prompt_length=2, extra={"group_index": 0})

    rollouts = [rollout(0, 1.0), rollout(1, 0.0)]
    grpo = build_batch(rollouts, pad_token_id=0).advantages
    dr_grpo = build_batch(rollouts, pad_token_id=0, config=RAPOConfig(norm_adv_by_std_in_grpo=False)).advantages
    assert grpo.tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
    assert dr_grpo.tolist() == pytest.approx([0.5, -0.5])


def test_an_on_policy_baseline_takes_the_group_mean_from_unspliced_rollouts_and_the_std_from_all():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 3.0, 5.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 0, 0, 1, 1])
    unspliced = torch.tensor([False, False, True, True, True, True, False])
    a_acc = group_normalize(rewards, groups, scale_by_std=False, reference=unspliced)
    # group 0: mean over the three unspliced rollouts (1/3), not over all five (3/5); group 1 has one
    # unspliced rollout, too few for a baseline, so it keeps the whole group's mean (4)
    expected = [2 / 3, 2 / 3, -1 / 3, 2 / 3, -1 / 3, -1.0, 1.0]
    torch.testing.assert_close(a_acc, torch.tensor(expected, dtype=torch.float64))
    scaled = group_normalize(rewards, groups, reference=unspliced)
    std = rewards[:5].std()  # the unbiased std of all of group 0's rewards
    torch.testing.assert_close(scaled[:5], a_acc[:5] / (std + 1e-6))
    # Every unspliced rollout failed (their std is 0): the spliced ones' advantage stays bounded.
    failed_alone = group_normalize(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.zeros(4),
                                   reference=torch.tensor([False, False, True, True]))
    assert failed_alone.tolist() == pytest.approx([1 / 0.57735, 1 / 0.57735, 0.0, 0.0], rel=1e-4)
    assert torch.equal(group_normalize(rewards, groups, reference=torch.ones(7, dtype=torch.bool)),
                       group_normalize(rewards, groups))
    with pytest.raises(ValueError, match="reference"):
        group_normalize(rewards, groups, reference=unspliced[:3])


def test_the_batch_builder_takes_the_baseline_of_the_config():
    from rapo_agents.batch import build_batch
    from rapo_env.trajectory import StepRecord, Trajectory

    def rollout(index: int, reward: float, spliced: bool) -> Trajectory:
        steps = [StepRecord(action="a", observation="", token_start=2, token_end=3, entropy_paper=1.0,
                            entropy_reference=0.5, retrieval={"key": "k"} if spliced else None),
                 StepRecord(action="b", observation="", token_start=3, token_end=4, entropy_paper=1.0,
                            entropy_reference=0.5)]
        return Trajectory(task_id="q", rollout_index=index, question="q", system_prompt="", prompt="q", steps=steps,
                          reward=reward, metrics={}, num_tool_calls=0, end_reason="answer", source="test",
                          token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -1.0, -1.0],
                          prompt_length=2, extra={"group_index": 0})

    rollouts = [rollout(0, 0.0, False), rollout(1, 1.0, False), rollout(2, 1.0, True), rollout(3, 1.0, True)]
    config = RAPOConfig(advantage_weight=0.0, norm_adv_by_std_in_grpo=False)
    group = build_batch(rollouts, pad_token_id=0, config=config).advantages
    on_policy = build_batch(rollouts, pad_token_id=0,
                            config=dataclasses.replace(config, baseline="on_policy")).advantages
    assert group.tolist() == pytest.approx([-0.75, 0.25, 0.25, 0.25])
    assert on_policy.tolist() == pytest.approx([-0.5, 0.5, 0.5, 0.5])  # the mean of the first two: 0.5
    with pytest.raises(ValueError, match="baseline"):
        RAPOConfig(baseline="spliced")

    # Spliced rollouts out of the loss: they still set the group's baseline, but none of their tokens trains.
    trained = build_batch(rollouts, pad_token_id=0, config=config)
    untrained = build_batch(rollouts, pad_token_id=0, config=dataclasses.replace(config, spliced_loss=False))
    assert untrained.advantages.tolist() == trained.advantages.tolist()
    assert untrained.loss_mask.sum(-1).tolist() == [2, 2, 0, 0]
    assert torch.equal(untrained.loss_mask[:2], trained.loss_mask[:2])


def test_norm_adv_by_std_in_grpo_is_a_setting_with_verls_name():
    from rapo_agents.config import load_config

    assert RAPOConfig().norm_adv_by_std_in_grpo is True
    assert load_config(None, ["norm_adv_by_std_in_grpo=false"]).algorithm.norm_adv_by_std_in_grpo is False
    assert load_config(None, ["loss_weighting=micro_batch_mean"]).algorithm.loss_weighting == "micro_batch_mean"


# ---------------------------------------------------------------- §7 loss


def test_retrieval_fraction():
    retrieval = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    response = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    torch.testing.assert_close(retrieval_fraction(retrieval, response), torch.tensor([0.5, 0.0]))


def _per_token_reference(r_hat: float, a: float, low=0.2, high=0.28, c=3.0) -> float:
    loss = max(-r_hat * a, -min(max(r_hat, 1 - low), 1 + high) * a)
    return min(loss, -a * c) if a < 0 else loss


@pytest.mark.parametrize(
    "log_ratio, advantage, f_ret",
    [(0.0, 1.0, 0.0), (0.5, 1.0, 0.0), (-0.5, 1.0, 0.0), (0.5, -1.0, 0.0), (-0.5, -1.0, 0.0),
     (2.0, -1.0, 0.0), (0.2, 1.0, 0.5), (0.25, 2.0, 1.0), (0.0, -0.5, 0.9)],
)
def test_policy_loss_matches_scalar_formula(log_ratio, advantage, f_ret):
    config = RAPOConfig(shaping_weight=0.05)
    logp_old = torch.tensor([[-1.0]], dtype=torch.float64)
    logp_new = logp_old + log_ratio
    out = rapo_policy_loss(
        logp_new, logp_old, torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 1),
        f_ret=torch.tensor([f_ret], dtype=torch.float64), config=config,
    )
    r_hat = (1 + 0.05 * f_ret) * math.exp(log_ratio)
    assert out.loss.item() == pytest.approx(_per_token_reference(r_hat, advantage), rel=1e-9)


def test_dual_clip_caps_negative_advantage_loss():
    out = rapo_policy_loss(torch.tensor([[3.0]]), torch.tensor([[0.0]]), torch.tensor([-2.0]), torch.ones(1, 1))
    assert out.loss.item() == pytest.approx(6.0)  # -A * c = 2 * 3, not r * |A| = e^3 * 2
    assert out.dual_clip_fraction.item() == 1.0


def test_loss_is_token_mean_over_mask_and_masked_tokens_get_zero_gradient():
    logp_old = torch.log(torch.tensor([[0.5, 0.4, 0.3, 0.2], [0.6, 0.1, 0.9, 0.5]]))
    logp_new = (logp_old + torch.tensor([[0.1, -0.1, 0.0, 5.0], [0.0, 0.3, 0.0, -3.0]])).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    advantages = torch.tensor([1.0, -0.5])
    out = rapo_policy_loss(logp_new, logp_old, advantages, mask, f_ret=torch.tensor([0.3, 0.0]))
    out.loss.backward()
    assert (logp_new.grad[mask == 0] == 0).all()
    assert (logp_new.grad[mask == 1] != 0).any()
    # Token mean: 5 policy tokens.
    per_token = [
        _per_token_reference((1 + 0.05 * f) * math.exp(d), a)
        for (d, a, f) in [(0.1, 1.0, 0.3), (-0.1, 1.0, 0.3), (0.0, -0.5, 0.0), (0.3, -0.5, 0.0), (0.0, -0.5, 0.0)]
    ]
    assert out.loss.item() == pytest.approx(sum(per_token) / 5, rel=1e-5)


def test_token_normalizer_makes_accumulation_equal_to_full_batch():
    torch.manual_seed(0)
    logp_old = -torch.rand(4, 6, dtype=torch.float64)
    logp_new = logp_old + 0.1 * torch.randn(4, 6, dtype=torch.float64)
    mask = (torch.rand(4, 6) > 0.3).long()
    advantages = torch.randn(4, dtype=torch.float64)
    full = rapo_policy_loss(logp_new, logp_old, advantages, mask).loss
    total_tokens = mask.sum()
    halves = sum(
        rapo_policy_loss(logp_new[s], logp_old[s], advantages[s], mask[s], token_normalizer=total_tokens).loss
        for s in (slice(0, 2), slice(2, 4))
    )
    torch.testing.assert_close(halves, full)


def test_kl_and_entropy_terms_are_off_by_default_and_added_when_set():
    logp_old = torch.tensor([[-1.0, -2.0]])
    logp_new = torch.tensor([[-0.5, -2.5]])
    ref = torch.tensor([[-1.5, -1.5]])
    entropies = torch.tensor([[2.0, 4.0]])
    mask, adv = torch.ones(1, 2), torch.tensor([1.0])
    base = rapo_policy_loss(logp_new, logp_old, adv, mask, ref_logp=ref, entropies=entropies)
    assert base.loss.item() == pytest.approx(base.policy_loss.item())
    config = RAPOConfig(kl_coef=0.1, entropy_coef=0.01)
    with_terms = rapo_policy_loss(logp_new, logp_old, adv, mask, config=config, ref_logp=ref, entropies=entropies)
    kl = k3_kl(logp_new, ref).mean().item()
    assert with_terms.kl.item() == pytest.approx(kl)
    assert with_terms.loss.item() == pytest.approx(base.policy_loss.item() + 0.1 * kl - 0.01 * 3.0)
    with pytest.raises(ValueError):
        rapo_policy_loss(logp_new, logp_old, adv, mask, config=RAPOConfig(kl_coef=0.1))


def test_loss_statistics():
    logp_old = torch.zeros(1, 3)
    logp_new = torch.tensor([[0.5, 0.0, -0.5]])
    out = rapo_policy_loss(logp_new, logp_old, torch.tensor([1.0]), torch.ones(1, 3))
    # A > 0: clipping binds only when r > 1.28 (token 0); token 2 (r = 0.61) keeps the unclipped smaller value.
    assert out.clip_fraction.item() == pytest.approx(1 / 3)
    assert out.approx_kl.item() == pytest.approx(0.0, abs=1e-7)


def test_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        rapo_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 4))


# ---------------------------------------------------------------- gradients


def test_gradcheck_policy_loss_with_kl_and_entropy():
    torch.manual_seed(1)
    config = RAPOConfig(kl_coef=0.05, entropy_coef=0.01, shaping_weight=0.05)
    logp_old = -torch.rand(3, 5, dtype=torch.float64)
    # Keep ratios away from the clip boundaries, where the loss is not differentiable.
    logp_new = (logp_old + 0.05 * torch.randn(3, 5, dtype=torch.float64)).requires_grad_(True)
    ref = -torch.rand(3, 5, dtype=torch.float64)
    entropies = torch.rand(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 1, 1, 1]])
    advantages = torch.tensor([0.8, -1.2, 0.3], dtype=torch.float64)
    f_ret = torch.tensor([0.0, 0.4, 0.1], dtype=torch.float64)

    def loss_fn(new, ent):
        return rapo_policy_loss(new, logp_old, advantages, mask, f_ret, config, ref_logp=ref, entropies=ent).loss

    assert torch.autograd.gradcheck(loss_fn, (logp_new, entropies))


def test_gradcheck_advantages_retrieval_reward_and_entropies():
    torch.manual_seed(2)
    rewards = torch.rand(6, dtype=torch.float64, requires_grad=True)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    h_pre = (torch.rand(6, 2, dtype=torch.float64) + 0.5).requires_grad_(True)
    h_post = (torch.rand(6, 2, dtype=torch.float64) + 0.5).requires_grad_(True)
    valid = torch.tensor([[1, 0], [0, 0], [1, 1], [0, 0], [1, 0], [0, 1]], dtype=torch.bool)

    def advantages(r, pre, post):
        return rapo_advantages(r, retrieval_reward(pre, post, valid), groups, advantage_weight=0.2)

    assert torch.autograd.gradcheck(advantages, (rewards, h_pre, h_post))
    logits = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    step_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.autograd.gradcheck(lambda z: step_entropy_paper(token_entropy_from_logits(z), step_mask), (logits,))


def test_functions_are_device_and_dtype_agnostic():
    for dtype, loss_dtype in ((torch.float32, torch.float32), (torch.float64, torch.float64),
                              (torch.bfloat16, torch.float32), (torch.float16, torch.float32)):
        logp = torch.zeros(2, 3, dtype=dtype)
        out = rapo_policy_loss(logp, logp, torch.ones(2, dtype=dtype), torch.ones(2, 3), torch.zeros(2, dtype=dtype))
        assert out.loss.dtype == loss_dtype


def test_bf16_inputs_give_the_loss_of_the_same_values_in_float32():
    # 192,064 policy tokens: a bf16 mask sum says 192,512 and the loss comes out 0.23% too small.
    generator = torch.Generator().manual_seed(0)
    rows, width = 8, 24_008
    logp_old = (-2.0 * torch.rand(rows, width, generator=generator)).bfloat16()
    logp_new = (logp_old.float() + 0.1 * torch.randn(rows, width, generator=generator)).bfloat16().requires_grad_()
    advantages = torch.randn(rows, generator=generator).bfloat16()
    f_ret = torch.rand(rows, generator=generator).bfloat16()
    mask = torch.ones(rows, width, dtype=torch.bfloat16)
    out16 = rapo_policy_loss(logp_new, logp_old, advantages, mask, f_ret)
    logp32 = logp_new.detach().float().requires_grad_()
    out32 = rapo_policy_loss(logp32, logp_old.float(), advantages.float(), mask.float(), f_ret.float())
    assert out16.loss.item() == pytest.approx(out32.loss.item(), rel=1e-6)
    for name in ("clip_fraction", "dual_clip_fraction", "approx_kl"):
        assert getattr(out16, name).item() == pytest.approx(getattr(out32, name).item(), rel=1e-5, abs=1e-7)
    out16.loss.backward()
    out32.loss.backward()
    assert logp_new.grad.dtype == torch.bfloat16
    assert torch.allclose(logp_new.grad.float(), logp32.grad.bfloat16().float())
