"""How micro-batches add up to a mini-batch's loss: rapo's global token mean against verl's micro-batch weighting."""

import copy

import pytest
import torch

from rapo_agents.batch import TrainBatch
from rapo_agents.rapo import RAPOConfig
from rapo_agents.update import UpdateSettings, micro_batch_weight, ppo_update, recompute_logprobs

PROMPT = 2
POLICY_TOKENS = (8, 8, 2, 2)  # two long rows, two short ones: an uneven mini-batch
ADVANTAGES = (-0.2, 0.1, 0.6, 0.3)


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))


def uneven_batch(model) -> TrainBatch:
    rows, width = len(POLICY_TOKENS), PROMPT + max(POLICY_TOKENS)
    lengths = torch.tensor([PROMPT + n for n in POLICY_TOKENS])
    positions = torch.arange(width)[None, :]
    attention = (positions < lengths[:, None]).long()
    loss_mask = attention * (positions >= PROMPT)
    zeros = torch.zeros(rows)
    batch = TrainBatch(
        input_ids=torch.randint(1, 32, (rows, width), generator=torch.Generator().manual_seed(1)) * attention,
        attention_mask=attention, loss_mask=loss_mask, old_logprobs=torch.zeros(rows, width),
        advantages=torch.tensor(ADVANTAGES), f_ret=zeros, rewards=zeros, z_ret=zeros, retrievals=zeros,
        entropy_pre=zeros.clone().fill_(torch.nan), entropy_post=zeros.clone().fill_(torch.nan),
        prompt_lengths=torch.full((rows,), PROMPT))
    # logp_old = logp_new: the ratio is 1, so each policy token's loss is -A and the weighting alone decides.
    batch.old_logprobs = recompute_logprobs(model, batch, UpdateSettings(mini_batch_rows=rows, micro_batch_size=rows))
    return batch


def update(model, batch, weighting: str, micro_batch_size: int):
    clone = copy.deepcopy(model)
    optimizer = torch.optim.SGD(clone.parameters(), lr=0.1)
    settings = UpdateSettings(mini_batch_rows=len(POLICY_TOKENS), micro_batch_size=micro_batch_size)
    stats = ppo_update(clone, optimizer, batch, RAPOConfig(loss_weighting=weighting), settings)
    return stats, torch.nn.utils.parameters_to_vector(clone.parameters()).detach()


def test_token_mean_and_verl_micro_batch_weighting_differ_on_an_uneven_mini_batch():
    model = tiny_model()
    batch = uneven_batch(model)
    token_mean, _ = update(model, batch, "token_mean", micro_batch_size=2)
    verl, _ = update(model, batch, "micro_batch_mean", micro_batch_size=2)
    # rapo: -(sum_i A_i n_i) / sum_i n_i = -(-1.6 + 0.8 + 1.2 + 0.6) / 20
    assert token_mean["loss/policy_loss"] == pytest.approx(-0.05, abs=1e-6)
    # verl: micro-batches {long rows} and {short rows}, each its own token mean, weighted 2/4 each:
    # 0.5 * -(-1.6 + 0.8) / 16 + 0.5 * -(1.2 + 0.6) / 4
    assert verl["loss/policy_loss"] == pytest.approx(-0.2, abs=1e-6)


def test_the_weightings_agree_when_the_mini_batch_is_one_micro_batch():
    model = tiny_model()
    batch = uneven_batch(model)
    token_stats, token_params = update(model, batch, "token_mean", micro_batch_size=4)
    verl_stats, verl_params = update(model, batch, "micro_batch_mean", micro_batch_size=4)
    assert token_stats["loss/policy_loss"] == pytest.approx(verl_stats["loss/policy_loss"], abs=1e-7)
    torch.testing.assert_close(token_params, verl_params)


def test_only_verl_weighting_depends_on_the_micro_batch_split():
    model = tiny_model()
    batch = uneven_batch(model)
    _, token_whole = update(model, batch, "token_mean", micro_batch_size=4)
    _, token_split = update(model, batch, "token_mean", micro_batch_size=2)
    _, verl_split = update(model, batch, "micro_batch_mean", micro_batch_size=2)
    torch.testing.assert_close(token_split, token_whole, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(verl_split, token_whole, atol=1e-4)


def test_micro_batch_weight_is_a_token_share_or_a_row_share():
    mini = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]])
    assert micro_batch_weight("token_mean", mini[2:], mini) == pytest.approx(0.2)
    assert micro_batch_weight("micro_batch_mean", mini[2:], mini) == pytest.approx(0.5)


def test_loss_weighting_rejects_unknown_values():
    with pytest.raises(ValueError, match="loss_weighting"):
        RAPOConfig(loss_weighting="seq-mean")
