"""The learning benchmark's plumbing (not its results): one shared start per (task, setting, seed) that every
method resumes from, runs that are skipped once finished, and the tables read back from the run folders."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def learning():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling _report
    spec = importlib.util.spec_from_file_location("learning_benchmark", BENCHMARKS / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, policy_tokenizer_dir) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template, saved like a checkpoint."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny_policy")
    tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_every_method_of_a_seed_resumes_from_one_shared_warm_up(learning, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("RAPO_CACHE_DIR", str(tmp_path / "cache"))
    overrides = [f"model.path={tiny_model_dir}", "model.trainable_layers=null", "data.num_tasks=8",
                 "warmup.sft_steps=1", "warmup.sft_batch_size=2", "warmup.num_expert_episodes=2",
                 "warmup.sft_lr=1e-2", "evaluation.heldout_tasks=3", "total_steps=1", "rollout_n=2",
                 "optim.train_batch_size=1", "optim.ppo_mini_batch_size=1"]
    root = tmp_path / "runs"
    folders = {method: learning.train_method("math-multistep", "warm-up", 0, method, overrides, root)
               for method in ("GRPO", "RAPO")}
    shared = learning.run_folder(root, "math-multistep", "warm-up", 0, "shared-start")

    def records(folder: Path, name: str) -> list[dict]:
        return [json.loads(line) for line in (folder / name).read_text().splitlines()]

    start = records(shared, "eval/metrics.jsonl")
    assert [record["step"] for record in start] == [0]
    for folder in folders.values():
        evaluations = records(folder, "eval/metrics.jsonl")
        assert [record["step"] for record in evaluations] == [0, 1]
        assert evaluations[0] == start[0]  # the same step-0 evaluation, run once
        assert [record["step"] for record in records(folder, "metrics.jsonl")] == [0, 1]  # one warm-up, not two
    assert records(folders["RAPO"], "metrics.jsonl")[0] == records(shared, "metrics.jsonl")[0]

    finished = (folders["RAPO"] / learning.DONE).stat().st_mtime_ns
    learning.train_method("math-multistep", "warm-up", 0, "RAPO", overrides, root)  # a rerun skips it
    assert (folders["RAPO"] / learning.DONE).stat().st_mtime_ns == finished

    runs = [learning.summarize("math-multistep", "warm-up", 0, method, folder) for method, folder in folders.items()]
    assert {"spliced_reward", "within_group_spliced_minus_unspliced_reward", "onpolicy_accuracy",
            "hybrid_unspliced_accuracy"} <= set(runs[1]["mechanism"])
    assert runs[0]["heldout"][0] == runs[1]["heldout"][0]
    import torch

    from rapo_agents.policies.llama_decoder import default_weight_format

    # What decoded the rollouts (the CPU's fastest, by default) and the evaluation (fp32, by default), recorded.
    assert runs[0]["decoded"] == {"rollout": default_weight_format(torch.device("cpu")), "evaluation": "fp32"}
    (comparison,) = learning.against(runs, "RAPO", "GRPO")
    assert comparison["seeds"] == 1 and comparison["pairs"] == 3


def test_the_groups_that_carry_a_gradient_are_counted_with_those_only_a_splice_gave_one(learning):
    def rollout(task: str, index: int, reward: float, spliced: bool = False) -> dict:
        steps = [{"retrieval": {"text": "<search>x</search>"} if spliced else None}]
        return {"task_id": task, "rollout_index": index, "reward": reward, "steps": steps, "end_reason": "answer"}

    trajectories = [rollout("a", 0, 0.0), rollout("a", 1, 0.0), rollout("a", 2, 1.0, spliced=True),  # by a splice
                    rollout("b", 0, 0.0), rollout("b", 1, 1.0), rollout("b", 2, 1.0, spliced=True),  # its own
                    rollout("c", 0, 1.0), rollout("c", 1, 1.0), rollout("c", 2, 1.0, spliced=True),  # none
                    rollout("a", 0, 0.0), rollout("a", 1, 0.0)]  # the same question at the next step: none
    effect = learning.within_group_splice_effect(trajectories)
    assert effect["groups_with_reward_spread"] == pytest.approx(2 / 4)
    assert effect["groups_spread_only_by_a_splice"] == pytest.approx(1 / 4)
    assert effect["within_group_spliced_minus_unspliced_reward"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)


def test_a_run_stopped_by_a_signal_stops_the_benchmark_and_stays_unfinished(learning, tmp_path, monkeypatch):
    # The trainer's own signal handling (tests/rapo_agents/test_trainer.py) reports a stopped run as
    # interrupted; the benchmark must not mark it finished, nor go on to the next run (it did both).
    import types

    import rapo_agents.trainer

    class StoppedTrainer:
        def __init__(self, config):
            self.config = config

        def train(self):
            return types.SimpleNamespace(interrupted=True)

    monkeypatch.setattr(rapo_agents.trainer, "RAPOTrainer", StoppedTrainer)
    root = tmp_path / "runs"
    with pytest.raises(SystemExit, match="run the same command again to resume"):
        learning.train_method("math-multistep", "warm-up", 0, "GRPO", [], root)
    shared = learning.run_folder(root, "math-multistep", "warm-up", 0, "shared-start")
    assert not (shared / learning.DONE).exists()
    assert not learning.run_folder(root, "math-multistep", "warm-up", 0, "GRPO").exists()


def flat(config) -> dict:
    return {f"{section}.{key}": value for section, values in config.to_dict().items()
            if isinstance(values, dict) for key, value in values.items()}


@pytest.mark.parametrize(("control", "method", "difference"), [
    # RAPO's fewer own rollouts per group: everything else must be GRPO's.
    ("GRPO", "GRPO two rollouts per question", {"rollout.rollout_n": (4, 2)}),
    # The selection of RAPO's unspliced rollouts: everything else must be RAPO's.
    ("RAPO", "RAPO first round only", {"retrieval.retrieve_after": ("any_round", "first_round")}),
    # The share of hybrid rollouts: three of four (the old CPU default) instead of the paper's half.
    ("RAPO", "RAPO three of four hybrid", {"retrieval.no_retrieve_first_k": (2, 1)}),
    # No stand-in for a final-answer step: nothing is spliced where the expert answered.
    ("RAPO", "RAPO no stand-in for final steps", {"retrieval.final_steps": ("next_best", "skip")}),
])
def test_a_control_differs_from_its_method_only_in_what_it_controls(learning, tmp_path, control, method, difference):
    base, changed = (flat(learning.make_config("math-multistep", "warm-up", 1, [], tmp_path, name))
                     for name in (control, method))
    assert {key: (base[key], changed[key]) for key in base if base[key] != changed[key]} == difference


def test_the_two_hop_task_is_the_qa_config_with_only_its_two_hop_questions(learning, tmp_path):
    qa, two_hop = (flat(learning.make_config(task, "warm-up", 1, [], tmp_path, "RAPO")) for task in ("qa", "qa-2hop"))
    assert {key: (qa.get(key), two_hop[key]) for key in two_hop if qa.get(key) != two_hop[key]} == {
        "data.env_kwargs": (qa["data.env_kwargs"], {**qa["data.env_kwargs"], "hops": [2]})}


def test_which_methods_retrieve(learning):
    assert not learning.retrieves("GRPO two rollouts per question") and not learning.retrieves("GRPO")
    assert learning.retrieves("RAPO first round only")
    assert learning.retrieves("RAPO own rollouts only")


def test_the_interval_over_seeds_is_students_t_and_undefined_for_one_seed(learning):
    mean, half = learning.mean_and_interval([0.0, 0.1])
    assert mean == pytest.approx(0.05) and half == pytest.approx(12.706 * 0.1 / 2)  # sd 0.0707, n 2
    mean, half = learning.mean_and_interval([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    assert half == pytest.approx(2.447 * 0.216025 / 7**0.5, rel=1e-4)  # 6 degrees of freedom
    assert learning.mean_and_interval([0.3])[0] == 0.3
    assert learning.mean_and_interval([0.3])[1] != learning.mean_and_interval([0.3])[1]  # nan: no spread


def finished_run(seed: int, method: str, correct: list[float], source: str = "this run") -> dict:
    return {"task": "qa", "setting": "warm-up", "seed": seed, "method": method, "source": source,
            "heldout": [{"step": 0, "correct": [0.0] * len(correct)}, {"step": 10, "correct": correct}]}


def test_rapo_against_grpo_is_given_over_question_pairs_and_over_seeds(learning, tmp_path):
    runs = [finished_run(0, "GRPO", [0, 0, 1, 1]), finished_run(0, "RAPO", [1, 0, 1, 1]),   # +0.25
            finished_run(1, "GRPO", [1, 0, 0, 0]), finished_run(1, "RAPO", [1, 0, 0, 0]),   # 0
            finished_run(2, "GRPO", [0, 0, 0, 0]), finished_run(2, "RAPO", [1, 1, 0, 0])]   # +0.5
    (row,) = learning.against(runs, "RAPO", "GRPO")
    assert row["seeds"] == 3 and row["pairs"] == 12
    assert row["pooled"] == pytest.approx(0.25) and row["over seeds"] == pytest.approx(0.25)
    half = 4.303 * 0.25 / 3**0.5  # the per-seed differences 0.25, 0, 0.5 have sd 0.25
    assert (row["seeds CI low"], row["seeds CI high"]) == pytest.approx((0.25 - half, 0.25 + half))
    assert row["CI low"] > row["seeds CI low"]  # the bootstrap over questions leaves out the noise of training
    forest = learning.plot_differences([row], tmp_path / "differences.png")
    assert forest.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_on_multi_hop_qa_the_difference_is_also_given_by_hop_count(learning):
    hops = [1, 2, 3, 1, 2, 3]
    runs = [{**finished_run(seed, "GRPO", [1, 0, 0, 1, 0, 0]), "heldout_hops": hops} for seed in (0, 1)]
    runs += [{**finished_run(0, "RAPO", [1, 1, 0, 1, 1, 0]), "heldout_hops": hops},   # +1 on both 2-hop questions
             {**finished_run(1, "RAPO", [1, 1, 0, 1, 0, 0]), "heldout_hops": hops}]   # +1 on one
    (row,) = learning.against(runs, "RAPO", "GRPO")
    assert {count: difference["mean"] for count, difference in row["by_hops"].items()} == {1: 0.0, 2: 0.75, 3: 0.0}
    assert row["by hops"].startswith("1: +0.000")
    runs[-1].pop("heldout_hops")  # a run that does not know its questions' hop counts: no split
    (row,) = learning.against(runs, "RAPO", "GRPO")
    assert row["by_hops"] == {} and row["by hops"] == ""


def test_seeds_of_an_earlier_report_pool_with_this_runs_and_split_only_from_the_same_step_0(learning, tmp_path):
    report = tmp_path / "learning_qa_earlier.json"
    report.write_text(json.dumps({"runs": [finished_run(0, "GRPO", [0, 1]), finished_run(0, "RAPO", [1, 1])]}))
    mine = [finished_run(1, method, correct, "runs/learning/full") for method, correct in (("GRPO", [0, 0]),
                                                                                             ("RAPO", [1, 0]))]

    combined = learning.with_earlier_runs(mine, [str(report)])
    assert [(run["seed"], run["source"]) for run in combined] == [
        (1, "runs/learning/full"), (1, "runs/learning/full"), (0, "this run"), (0, "this run")]
    (row,) = learning.against(combined, "RAPO", "GRPO")
    assert row["seeds"] == 2 and row["pooled"] == pytest.approx(0.5)

    split = [finished_run(0, "RAPO no shaping", [1, 0], "runs/learning/full")]  # seed 0's GRPO and RAPO: report
    combined = learning.with_earlier_runs(split, [str(report)])  # the same step-0 answers: one start, pairs
    (row,) = learning.against(combined, "RAPO no shaping", "RAPO")
    assert row["pairs"] == 2 and row["pooled"] == pytest.approx(-0.5)
    split[0]["heldout"][0]["correct"] = [1.0, 0.0]  # another start (another commit or CPU): never paired
    with pytest.raises(ValueError, match="seed 0: runs come from both .* step-0 evaluations differ on 1 of 2"):
        learning.with_earlier_runs(split, [str(report)])
    with pytest.raises(ValueError, match="seed 0: GRPO is there twice"):
        learning.with_earlier_runs(mine, [str(report), str(report)])
    report.write_text("{not json")
    with pytest.raises(ValueError, match="not a report of this benchmark"):
        learning.with_earlier_runs(mine, [str(report)])


def test_runs_evaluated_by_different_decoders_are_never_pooled(learning, tmp_path):
    report = tmp_path / "learning_qa_int8.json"  # an earlier report: its runs do not say, and were int8
    report.write_text(json.dumps({"runs": [finished_run(0, "GRPO", [0, 1]), finished_run(0, "RAPO", [1, 1])]}))
    mine = [{**finished_run(1, method, [1, 0], "runs/learning/full"),
             "decoded": {"rollout": "int8", "evaluation": "fp32"}} for method in ("GRPO", "RAPO")]
    with pytest.raises(ValueError, match="was evaluated fp32 and .* int8.*evaluation.weight_format=fp32"):
        learning.with_earlier_runs(mine, [str(report)])
    for run in mine:
        run["decoded"]["evaluation"] = "int8"
    assert len(learning.with_earlier_runs(mine, [str(report)])) == 4


def test_a_report_of_nothing_finished_says_what_to_run(learning, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["learning.py", "--report-only", "--output", str(tmp_path), "--tasks", "qa",
                                      "--methods", "GRPO", "--settings", "warm-up", "--seeds", "0"])
    with pytest.raises(SystemExit) as stopped:
        learning.main()
    assert stopped.value.code == 2
    assert "no finished run of this plan" in capsys.readouterr().err
