"""The trainer: batching, the PPO-style update, and the full loop on a tiny random model with real envs."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from rapo_agents.batch import build_batch
from rapo_agents.rapo import RAPOConfig, group_normalize
from rapo_agents.update import UpdateSettings, ppo_update, recompute_logprobs, sequence_logprobs
from rapo_env.trajectory import StepRecord, Trajectory


def tiny_model(vocab_size: int = 64, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return LlamaForCausalLM(config)


def make_trajectory(index, reward, length=10, prompt=4, retrieval_after=None, entropies=(1.0, 0.5), retrieved=0):
    """Two policy turns (3 tokens, then the rest) around a 2-token observation that may hold a splice."""
    generator = torch.Generator().manual_seed(index)
    token_ids = torch.randint(3, 60, (length,), generator=generator).tolist()
    loss_mask = [0] * prompt + [1] * 3 + [0] * 2 + [1] * (length - prompt - 5)
    spans = [(prompt + 3, prompt + 3 + retrieved)] if retrieved else []
    steps = [
        StepRecord(action="a", observation="o", token_start=prompt, token_end=prompt + 3, entropy_paper=entropies[0],
                   entropy_reference=entropies[0] / 2,
                   retrieval={"text": "r", "span": (0, 1)} if retrieval_after == 0 else None),
        StepRecord(action="b", observation="", token_start=prompt + 5, token_end=length, entropy_paper=entropies[1],
                   entropy_reference=entropies[1] / 2),
    ]
    return Trajectory(task_id=f"q{index // 4}", rollout_index=index % 4, question="q", system_prompt="", prompt="q",
                      steps=steps, reward=reward, metrics={}, num_tool_calls=1, end_reason="answer", source="test",
                      token_ids=token_ids, loss_mask=loss_mask, logprobs=[-1.0 * m for m in loss_mask],
                      prompt_length=prompt, extra={"group_index": index // 4, "retrieval_token_spans": spans})


def test_build_batch_computes_retrieval_reward_fraction_and_advantages():
    trajectories = [
        make_trajectory(0, 1.0),
        make_trajectory(1, 0.0),
        make_trajectory(2, 1.0, length=12, retrieval_after=0, entropies=(2.0, 1.0), retrieved=2),
        make_trajectory(3, 0.0, retrieval_after=0, entropies=(1.0, 1.5), retrieved=1),
    ]
    batch = build_batch(trajectories, pad_token_id=0)
    assert batch.retrievals.tolist() == [0, 0, 1, 1]
    assert batch.z_ret[:2].tolist() == [0.0, 0.0]
    assert batch.z_ret[2] > 0 > batch.z_ret[3]  # entropy drop vs rise
    assert batch.z_ret[2].item() == pytest.approx(math.tanh(2 * 1.0 / (2 + 1e-6)) * 2.0, rel=1e-5)
    assert batch.f_ret.tolist() == pytest.approx([0.0, 0.0, 2 / 8, 1 / 6])
    reference = build_batch(trajectories, pad_token_id=0, config=RAPOConfig(fidelity="reference"))
    assert reference.z_ret[2].item() == pytest.approx(batch.z_ret[2].item() / 2, rel=1e-4)  # Z scales with H

    assert batch.input_ids.shape == (4, 12)
    assert batch.attention_mask.sum(-1).tolist() == [10, 10, 12, 10]
    assert batch.loss_mask[0].tolist()[:10] == trajectories[0].loss_mask
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    a_acc = group_normalize(rewards, torch.zeros(4, dtype=torch.long))
    a_ret = group_normalize(batch.z_ret, torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(batch.advantages, a_acc * (1 + 0.2 * a_ret))
    # Without retrievals the batch's advantages are GRPO's.
    plain = build_batch(trajectories[:2], pad_token_id=0)
    torch.testing.assert_close(plain.advantages, group_normalize(rewards[:2], torch.zeros(2, dtype=torch.long)))


def test_retrieval_without_a_following_entropy_is_not_rewarded():
    trajectory = make_trajectory(2, 1.0, retrieval_after=0, retrieved=1)
    trajectory.steps[1].entropy_paper = None
    assert build_batch([trajectory], pad_token_id=0).z_ret.tolist() == [0.0]


def test_build_batch_rejects_incomplete_trajectories():
    broken = make_trajectory(0, 1.0)
    broken.logprobs = broken.logprobs[:-1]
    with pytest.raises(ValueError, match="lengths"):
        build_batch([broken], pad_token_id=0)
    missing = make_trajectory(0, 1.0)
    missing.token_ids = None
    with pytest.raises(ValueError, match="token-level"):
        build_batch([missing], pad_token_id=0)


def test_sequence_logprobs_match_a_plain_forward_pass_at_the_marked_tokens_and_are_0_elsewhere():
    model = tiny_model()
    ids = torch.randint(3, 60, (2, 9))
    attention = torch.ones_like(ids)
    attention[1, 7:] = 0
    marked = torch.zeros_like(ids)
    marked[:, 3:] = 1  # padding (row 1 from 7 on) is never scored, marked or not
    marked[0, 5] = 0  # a tool result inside a response
    out = sequence_logprobs(model, ids, attention, marked, with_entropy=True)
    logits = model(input_ids=ids, attention_mask=attention).logits.float()
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    probs = torch.softmax(logits[:, :-1], -1)
    entropy = -(probs * probs.log()).sum(-1)
    scored = (marked.bool() & attention.bool())[:, 1:]
    torch.testing.assert_close(out.logprobs[:, 1:][scored], expected[scored], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.entropies[:, 1:][scored], entropy[scored], atol=1e-5, rtol=1e-5)
    assert (out.logprobs[:, 1:][~scored] == 0).all() and (out.logprobs[:, 0] == 0).all()
    assert (out.entropies[:, 1:][~scored] == 0).all()


def test_sequence_logprobs_of_a_soft_capped_model_come_from_its_own_forward():
    model = tiny_model()
    model.config.final_logit_softcapping = 30.0  # read by _logits_at; the tiny Llama itself ignores it
    ids = torch.randint(3, 60, (1, 6))
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    out = sequence_logprobs(model, ids, torch.ones_like(ids), torch.ones_like(ids))
    assert calls == [1]
    logits = model(input_ids=ids).logits.float()
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(out.logprobs[:, 1:], expected, atol=1e-5, rtol=1e-5)


def _batch(model):
    trajectories = [make_trajectory(i, float(i % 2), length=10 + i % 3, retrieval_after=0 if i % 4 == 3 else None,
                                    retrieved=2 if i % 4 == 3 else 0) for i in range(8)]
    batch = build_batch(trajectories, pad_token_id=0)
    settings = UpdateSettings(mini_batch_rows=8, micro_batch_size=8)
    batch.old_logprobs = recompute_logprobs(model, batch, settings)
    return batch


def test_gradient_accumulation_equals_one_big_batch():
    model = tiny_model()
    batch = _batch(model)
    results = []
    for micro in (8, 3, 1):
        clone = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(clone.parameters(), lr=1e-2)
        settings = UpdateSettings(mini_batch_rows=8, micro_batch_size=micro)
        stats = ppo_update(clone, optimizer, batch, RAPOConfig(), settings)
        results.append((torch.nn.utils.parameters_to_vector(clone.parameters()).detach(), stats))
    base_vector, base_stats = results[0]
    assert not torch.allclose(base_vector, torch.nn.utils.parameters_to_vector(model.parameters()))
    for vector, stats in results[1:]:
        torch.testing.assert_close(vector, base_vector, atol=1e-5, rtol=1e-4)
        assert stats["loss/policy_loss"] == pytest.approx(base_stats["loss/policy_loss"], abs=1e-5)
        assert stats["optim/grad_norm"] == pytest.approx(base_stats["optim/grad_norm"], rel=1e-4)
    # At the first step the ratio is 1: nothing is clipped and the k1 KL is 0.
    assert base_stats["loss/clip_fraction"] == 0.0
    assert base_stats["loss/approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_a_one_step_update_takes_logp_old_from_its_own_forward_pass_exactly_as_a_recompute_would():
    model = tiny_model()
    batch = _batch(model)
    batch.old_logprobs = batch.old_logprobs + 0.3  # an inexact rollout engine's log-probs
    recomputed, shortcut = copy.deepcopy(model), copy.deepcopy(model)
    settings = UpdateSettings(mini_batch_rows=8, micro_batch_size=3)
    corrected = dataclasses.replace(batch, old_logprobs=recompute_logprobs(recomputed, batch, settings))
    ppo_update(recomputed, torch.optim.AdamW(recomputed.parameters(), lr=1e-2), corrected, RAPOConfig(), settings)
    ppo_update(shortcut, torch.optim.AdamW(shortcut.parameters(), lr=1e-2), batch, RAPOConfig(),
               dataclasses.replace(settings, old_logprobs_from_current=True))
    torch.testing.assert_close(torch.nn.utils.parameters_to_vector(shortcut.parameters()),
                               torch.nn.utils.parameters_to_vector(recomputed.parameters()), atol=1e-6, rtol=1e-5)


def test_mini_batches_and_epochs_take_several_optimizer_steps():
    model = tiny_model()
    batch = _batch(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = ppo_update(model, optimizer, batch, RAPOConfig(kl_coef=0.1),
                       UpdateSettings(mini_batch_rows=4, micro_batch_size=2, ppo_epochs=2),
                       reference_model=copy.deepcopy(model))
    assert stats["optim/steps"] == 4
    assert stats["loss/approx_kl"] != 0.0  # later mini-batches see a moved policy
    assert stats["loss/kl"] > 0.0


# ---------------------------------------------------------------- the full loop


class SeededAnswerPolicy:
    """A test policy over real math envs: one python call, then the right answer for odd sampling seeds, a wrong
    one for even seeds, so that groups have reward variance. It reports deterministic per-token entropies."""

    def __init__(self, tasks, always_right: bool = False):
        from rapo_agents.policies import ByteTokenizer

        self.always_right = always_right

        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self.answers = {task.question: task.answers[0] for task in tasks}
        self.name = "seeded-answer"

    def generate(self, contexts, sampling):
        from rapo_agents.policies import Generation
        from rapo_agents.policies.base import per_context_sampling

        generations = []
        for context, params in zip(contexts, per_context_sampling(contexts, sampling), strict=True):
            text = self.tokenizer.decode(context)
            if "<result>" not in text.split("<|im_start|>assistant", 1)[-1]:
                turn = "<python>print(1)</python>"
            else:
                answer = next(a for q, a in self.answers.items() if q in text)
                turn = f"<answer>\\boxed{{{answer if params.seed % 2 or self.always_right else answer + '1'}}}</answer>"
            ids = self.tokenizer.encode(turn)[: params.max_new_tokens]
            entropy = 0.5 + (params.seed % 7) / 7
            generations.append(Generation(
                token_ids=ids, text=self.tokenizer.decode(ids), finish_reason="stop",
                logprobs=[-1.0] * len(ids), entropies=[entropy] * len(ids),
                top_logprobs=[[-0.5, -1.5]] * len(ids), stop_string=turn[-9:],
            ))
        return generations


@pytest.fixture(scope="module")
def loop_parts():
    from rapo_buffers.candidates import Candidate, StaticRetriever
    from rapo_env.tasks.procedural_math import ProceduralMath

    tasks = ProceduralMath(seed=0, num_tasks=4, difficulty=1)
    retriever = StaticRetriever([
        Candidate(value="<python>print(2 * 3)</python> <result>\n6\n</result>", reward=1.0, score=0.9),
        Candidate(value="<python>print(7)</python> <result>\n7\n</result>", reward=0.0, score=0.5),
    ])
    return tasks, retriever


def make_trainer(tmp_path, loop_parts, *overrides, always_right=False):
    from rapo_agents.config import load_config
    from rapo_agents.trainer import RAPOTrainer

    tasks, retriever = loop_parts
    config = load_config(None, [
        "num_tasks=4", "data.difficulty=1", "train_batch_size=2", "ppo_mini_batch_size=1", "micro_batch_size=3",
        "rollout_n=4", "no_retrieve_first_k=2", "retrieve_prob=1.0", "max_prompt_tokens=512", "max_response_tokens=256",
        "lr=1e-3", "env_kwargs={sandbox: subprocess, system_prompt: Use python.}", "logging.progress=false",
        "logging.tensorboard=true",
        "recompute_old_logprobs=true", "sft_steps=0", "evaluation.enabled=false", f"logging.output_dir={tmp_path}",
        *overrides,
    ])
    return RAPOTrainer(config, model=tiny_model(vocab_size=259), tokenizer=SeededAnswerPolicy(tasks).tokenizer,
                       policy=SeededAnswerPolicy(tasks, always_right), retriever=retriever)


def parameters(model):
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def test_rapo_loop_trains_logs_and_resumes_exactly(tmp_path, loop_parts):
    import json

    straight = make_trainer(tmp_path / "straight", loop_parts, "total_steps=2")
    initial = parameters(straight.model)
    result = straight.train()
    assert result.steps == 2 and not result.interrupted
    assert not torch.equal(parameters(straight.model), initial)
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    first = records[0]
    assert 0.0 < first["accuracy"] < 1.0 and first["reward/mean"] == pytest.approx(first["accuracy"])
    assert first["format_rate"] == 1.0 and first["tool_calls/mean"] == 1.0
    # Rollouts 2 and 3 of each group are hybrid and retrieve after their tool round (retrieve_prob = 1).
    assert first["retrieval/rollouts_with_retrieval"] == pytest.approx(0.5)
    assert first["retrieval/f_ret_mean"] > 0 and first["retrieval/z_ret_mean"] != 0.0
    assert first["optim/steps"] == 2 and first["optim/grad_norm"] > 0
    assert result.plot is not None and result.plot.stat().st_size > 0
    assert list((tmp_path / "straight" / "tensorboard").iterdir())
    trajectory_lines = (tmp_path / "straight" / "trajectories.jsonl").read_text().splitlines()
    assert len(trajectory_lines) == 2 * 2 * 4

    # One step, stop, then a fresh trainer (fresh model init) resumes from the checkpoint: identical weights.
    first_half = make_trainer(tmp_path / "resumed", loop_parts, "total_steps=1")
    first_half.train()
    resumed = make_trainer(tmp_path / "resumed", loop_parts, "total_steps=2")
    result = resumed.train()
    assert result.steps == 2
    assert torch.equal(parameters(resumed.model), parameters(straight.model))
    for key, value in straight.optimizer.state_dict()["state"][0].items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(resumed.optimizer.state_dict()["state"][0][key]))
    assert [p.name for p in resumed.checkpoints.checkpoints()] == ["step_000001", "step_000002"]


def test_grpo_is_the_same_loop_without_retrieval(tmp_path, loop_parts):
    trainer = make_trainer(tmp_path, loop_parts, "total_steps=1", "retrieval.enabled=false", "logging.plot=false")
    assert trainer.retriever is None
    history = trainer.train().history
    assert history[0]["retrieval/count_mean"] == 0.0 and history[0]["retrieval/z_ret_mean"] == 0.0
    assert history[0]["advantage/abs_mean"] > 0


def test_sigterm_saves_a_checkpoint_and_stops_cleanly(tmp_path, loop_parts):
    import os
    import signal

    trainer = make_trainer(tmp_path, loop_parts, "total_steps=5", "logging.plot=false")
    real_step = trainer.train_step

    def step_then_signal():
        metrics = real_step()
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill <pid>` would, between two steps
        return metrics

    trainer.train_step = step_then_signal
    handler_before = signal.getsignal(signal.SIGTERM)
    result = trainer.train()
    assert result.interrupted and result.steps == 1
    assert result.checkpoint is not None and result.checkpoint.name == "step_000001"
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the trainer's handler is removed again


def test_batches_without_reward_variance_skip_the_update(tmp_path, loop_parts):
    trainer = make_trainer(tmp_path, loop_parts, "total_steps=1", "logging.plot=false", always_right=True)
    before = parameters(trainer.model)
    metrics = trainer.train_step()
    trainer.close()
    assert metrics["reward/mean"] == 1.0 and metrics["advantage/abs_mean"] == 0.0
    assert metrics["optim/skipped_zero_advantage"] == 1.0
    assert torch.equal(parameters(trainer.model), before)


def test_warm_up_runs_once_before_rl_and_is_skipped_on_resume(tmp_path, loop_parts):
    import json

    warm = ("sft_steps=3", "sft_batch_size=2", "num_expert_episodes=4", "sft_lr=1e-2", "max_response_tokens=1024",
            "max_turn_tokens=512", "logging.plot=false")
    trainer = make_trainer(tmp_path, loop_parts, "total_steps=1", *warm)
    assert [record["step"] for record in trainer.train().history] == [1]  # the history holds training steps
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["warmup/loss"] < records[0]["warmup/loss_before"]
    assert trainer.checkpoints.load_latest()[1]["trainer"]["warmup_done"] is True
    resumed = make_trainer(tmp_path, loop_parts, "total_steps=2", *warm)
    resumed.train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]  # no second warm-up


def test_a_warm_up_stopped_part_way_is_done_again_from_the_start_on_resume(tmp_path, loop_parts, monkeypatch):
    # Continuing it with a new AdamW (its moments are not saved) gave another warm-up: the action NLL rose from
    # 0.066 to 0.254 in two continued steps. A run of total_steps 0 (a benchmark's shared start) was also taken as
    # complete, warm-up unfinished.
    import os
    import signal

    import rapo_agents.warmup

    warm = ("sft_steps=3", "sft_batch_size=2", "num_expert_episodes=4", "sft_lr=1e-2", "max_response_tokens=1024",
            "max_turn_tokens=512", "logging.plot=false", "total_steps=0")
    straight = make_trainer(tmp_path / "straight", loop_parts, *warm)
    straight.train()

    real = rapo_agents.warmup.behaviour_cloning

    def signal_after_each_step(*args, should_stop, **kwargs):
        def stop():
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill <pid>` would, during the first optimiser step
            return should_stop()
        return real(*args, should_stop=stop, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(rapo_agents.warmup, "behaviour_cloning", signal_after_each_step)
        stopped = make_trainer(tmp_path / "stopped", loop_parts, *warm).train()
    assert stopped.interrupted
    assert stopped.checkpoint is not None
    resumed = make_trainer(tmp_path / "stopped", loop_parts, *warm)
    result = resumed.train()
    assert not result.already_complete and not result.interrupted
    assert torch.equal(parameters(resumed.model), parameters(straight.model))
    assert resumed.checkpoints.load_latest()[1]["trainer"]["warmup_done"] is True


def test_a_run_stopped_in_its_last_evaluation_evaluates_on_resume(tmp_path, loop_parts):
    import os
    import signal

    trainer = heldout_trainer(tmp_path, loop_parts, "total_steps=0", "logging.plot=false")
    real = trainer.heldout.evaluate

    def signal_then_evaluate(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    trainer.heldout.evaluate = signal_then_evaluate
    stopped = trainer.train()
    assert stopped.interrupted and stopped.heldout == []
    result = heldout_trainer(tmp_path, loop_parts, "total_steps=0", "logging.plot=false").train()
    assert not result.already_complete and [evaluation.step for evaluation in result.heldout] == [0]
    again = heldout_trainer(tmp_path, loop_parts, "total_steps=0", "logging.plot=false").train()
    assert again.already_complete


def test_arpo_config_trains_with_full_branched_groups(tmp_path, loop_parts):
    import json
    from pathlib import Path

    from rapo_agents.config import load_config

    arpo = load_config(Path(__file__).resolve().parents[2] / "configs" / "arpo.yaml")
    trainer = make_trainer(tmp_path, loop_parts, "total_steps=1", "logging.plot=false", "retrieval.enabled=false",
                           *(f"arpo.{key}={value}" for key, value in dataclasses.asdict(arpo.arpo).items()))
    assert trainer.method == "ARPO" and trainer.retriever is None
    before = parameters(trainer.model)
    metrics = trainer.train().history[0]
    lines = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    # Two questions x rollout_n = 4, whatever the mix of branches and fresh rollouts.
    assert sorted((t["extra"]["group_index"], t["rollout_index"]) for t in lines) == [
        (g, i) for g in range(2) for i in range(4)]
    assert metrics["rollout/branches"] + metrics["rollout/refills"] == 2 * 2
    assert metrics["rollout/branches"] == sum("branch_parent" in t["extra"] for t in lines) > 0
    assert metrics["optim/steps"] == 2 and not torch.equal(parameters(trainer.model), before)


def test_rollout_parts_pickle_for_ray_workers(tmp_path, loop_parts):
    """What a Ray worker needs to build its envs (an env id, its keyword arguments, the retrieval wrapper) pickles
    with the standard library, without dragging the trainer (model, optimizer) along."""
    import pickle

    from rapo_agents.rollout import make_env_factory
    from rapo_agents.trainer import retrieval_wrapper
    from rapo_env.wrappers import StepTraceRetrievalWrapper

    trainer = make_trainer(tmp_path, loop_parts, "logging.plot=false")
    shipped = pickle.dumps((trainer._env, trainer._env_kwargs, retrieval_wrapper(trainer.config, trainer.retriever)))
    assert len(shipped) < 10_000
    env_id, env_kwargs, wrapper = pickle.loads(shipped)
    env = wrapper(make_env_factory(env_id, env_kwargs)())
    assert isinstance(env, StepTraceRetrievalWrapper)
    assert (env.settings.no_retrieve_first_k, env.settings.group_size) == (2, 4)
    assert len(env.unwrapped.tasks) == 4
    env.close()


def heldout_trainer(tmp_path, loop_parts, *overrides):
    """A trainer of the loop above with one warm-up step and held-out evaluation on 6 test questions (its policy
    knows the answers of the training and held-out questions alike)."""
    from rapo_agents.config import load_config
    from rapo_agents.trainer import RAPOTrainer
    from rapo_env.tasks.procedural_math import SPLIT_SEEDS, ProceduralMath

    train_tasks, retriever = loop_parts
    heldout_tasks = ProceduralMath(seed=SPLIT_SEEDS["test"], num_tasks=6, difficulty=1)
    knows_all = list(train_tasks) + list(heldout_tasks)
    config = load_config(None, [
        "num_tasks=4", "data.difficulty=1", "train_batch_size=2", "ppo_mini_batch_size=1", "rollout_n=4",
        "lr=1e-3", "env_kwargs={sandbox: subprocess, system_prompt: Use python.}", "logging.progress=false",
        "sft_steps=1", "sft_batch_size=2", "num_expert_episodes=4", "max_response_tokens=1024", "max_turn_tokens=512",
        "evaluation.heldout_tasks=6", "total_steps=2", "logging.plot=true", f"logging.output_dir={tmp_path}",
        *overrides,
    ])
    return RAPOTrainer(config, model=tiny_model(vocab_size=259), tokenizer=SeededAnswerPolicy(knows_all).tokenizer,
                       policy=SeededAnswerPolicy(knows_all), retriever=retriever)


def test_heldout_evaluation_runs_before_rl_and_at_the_end_on_questions_never_trained_on(tmp_path, loop_parts):
    import json

    trainer = heldout_trainer(tmp_path, loop_parts)
    questions = set(trainer.heldout.questions)
    assert len(questions) == 6
    assert questions.isdisjoint(task.question for task in trainer._env_factory().unwrapped.tasks)
    result = trainer.train()
    assert [evaluation.step for evaluation in result.heldout] == [0, 2]
    records = [json.loads(line) for line in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [0, 2]
    for record in records:
        # Greedy decoding is seed 0 for this policy: a wrong answer on every question, in the format.
        assert record["eval/accuracy"] == 0.0 and record["eval/format_rate"] == 1.0
        assert record["eval/accuracy_ci_low"] <= record["eval/accuracy"] <= record["eval/accuracy_ci_high"]
        assert record["eval/tool_calls"] == 1.0 and len(record["correct"]) == 6
    assert result.heldout_difference.mean == 0.0
    assert {"prepare", "warmup", "eval", "rollout", "update", "checkpoint"} <= set(result.profile)
    assert json.loads((tmp_path / "profile.json").read_text())["eval"] > 0
    assert list((tmp_path / "eval" / "tensorboard").iterdir())

    again = heldout_trainer(tmp_path, loop_parts)
    lines_before = (tmp_path / "metrics.jsonl").read_text()
    repeat = again.train()
    assert repeat.already_complete and repeat.steps == 2 and [e.step for e in repeat.heldout] == [0, 2]
    assert (tmp_path / "metrics.jsonl").read_text() == lines_before  # nothing trained or logged again


def test_trainable_layers_leave_only_the_last_layers_and_the_final_norm_to_the_optimizer():
    from rapo_agents.model import freeze_all_but_last_layers

    model = tiny_model()
    freeze_all_but_last_layers(model, 1)
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all(name.startswith(("model.layers.1.", "model.norm.")) for name in trainable)
    assert "model.embed_tokens.weight" not in trainable
    whole = tiny_model()
    freeze_all_but_last_layers(whole, 3)  # more layers than the model has: all of it
    assert all(parameter.requires_grad for parameter in whole.parameters())
    with pytest.raises(ValueError, match=">= 1"):
        freeze_all_but_last_layers(tiny_model(), 0)
