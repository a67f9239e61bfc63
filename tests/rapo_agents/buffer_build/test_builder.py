"""Buffer builder: top-K rollouts per question, steps as spec §3 defines them, counts, `rapo buffer build`."""

from __future__ import annotations

from rapo_cli import main
from rapo_agents.buffer_build.builder import BuildConfig, approximate_token_count, build_buffer_file, build_step_traces
from rapo_buffers.schema import read_buffer
from rapo_env.trajectory import StepRecord, Trajectory, write_jsonl


def rollout(task_id: str, index: int, reward: float, turns: int = 2) -> Trajectory:
    steps = [
        StepRecord(action=f"<python>{task_id}-{index}-{turn}</python>", observation=f" <result>\n{turn}\n</result>")
        for turn in range(turns)
    ]
    steps.append(StepRecord(action=f"<answer>\\boxed{{{index}}}</answer>", observation=""))
    return Trajectory(
        task_id=task_id,
        rollout_index=index,
        question=f"question {task_id}",
        system_prompt="SYSTEM",
        prompt=f"question {task_id}",
        steps=steps,
        reward=reward,
        metrics={},
        num_tool_calls=turns,
        end_reason="answer",
        source="test",
    )


def test_keeps_the_top_k_rollouts_of_each_question_by_reward():
    rollouts = [rollout("a", i, reward) for i, reward in enumerate([0.0, 1.0, 0.5, 1.0, -1.0, 0.2])]
    rollouts += [rollout("b", i, 1.0) for i in range(3)]
    traces, stats = build_step_traces(rollouts, BuildConfig(top_k=2))
    kept = {(trace.question_id, trace.value.split("-")[1]) for trace in traces if trace.step_index == 0}
    assert kept == {("a", "1"), ("a", "3"), ("b", "0"), ("b", "1")}
    assert (stats.trajectories_read, stats.questions, stats.trajectories_kept, stats.steps) == (9, 2, 4, 12)
    assert stats.tokens == sum(approximate_token_count(trace.value) for trace in traces)
    _, filtered = build_step_traces(rollouts, BuildConfig(top_k=5, min_reward=0.5))
    assert filtered.trajectories_kept == 3 + 3


def test_steps_are_context_before_and_turn_plus_result():
    trajectory = rollout("q", 0, 1.0, turns=2)
    traces, _ = build_step_traces([trajectory])
    assert [trace.step_index for trace in traces] == [0, 1, 2]
    assert traces[0].key == "question q"  # the prompt, without the system prompt
    assert traces[1].key == "question q" + traces[0].value
    assert traces[2].key == traces[1].key + traces[1].value
    assert traces[0].value == "<python>q-0-0</python> <result>\n0\n</result>"
    assert [trace.is_final for trace in traces] == [False, False, True]
    assert {trace.answer for trace in traces} == {"0"} and {trace.reward for trace in traces} == {1.0}
    assert "".join(trace.value for trace in traces) == trajectory.response


def test_build_from_rollout_jsonl_skips_bad_lines(tmp_path):
    rollouts_path = tmp_path / "rollouts.jsonl"
    write_jsonl(rollouts_path, [rollout("a", i, float(i)) for i in range(7)])
    with rollouts_path.open("a") as handle:
        handle.write('{"not": "a trajectory"}\n[1, 2]\n')
    stats = build_buffer_file([rollouts_path], tmp_path / "buffer.jsonl")
    assert (stats.trajectories_read, stats.trajectories_kept, stats.skipped_lines) == (7, 5, 2)
    traces, read_stats = read_buffer(tmp_path / "buffer.jsonl")
    assert len(traces) == stats.steps == 15 and read_stats.skipped == 0
    assert min(trace.reward for trace in traces) == 2.0


def test_cli_build_from_trajectories_and_gsm8k(tmp_path, shared_data, capsys):
    rollouts_path = tmp_path / "rollouts.jsonl"
    write_jsonl(rollouts_path, [rollout("a", i, 1.0) for i in range(3)])
    assert (
        main(["buffer", "build", "--input", str(rollouts_path), "--output", str(tmp_path / "b.jsonl"), "--top-k", "1"])
        == 0
    )
    assert "steps: 3" in capsys.readouterr().out.replace("  ", "")
    gsm8k = str(shared_data / "math" / "gsm8k_train.jsonl")
    assert (
        main(
            [
                "buffer",
                "build",
                "--source",
                "gsm8k",
                "--input",
                gsm8k,
                "--limit",
                "20",
                "--output",
                str(tmp_path / "g.jsonl"),
            ]
        )
        == 0
    )
    traces, _ = read_buffer(tmp_path / "g.jsonl")
    assert len({trace.question_id for trace in traces}) == 20
    assert main(["buffer", "build", "--output", str(tmp_path / "x.jsonl")]) == 2  # no input: a clear error


def test_scripted_expert_source(scripted_trajectories):
    traces, stats = build_step_traces(scripted_trajectories)
    assert stats.questions == stats.trajectories_kept == len(scripted_trajectories)
    assert all(trajectory.reward == 1.0 for trajectory in scripted_trajectories)
    tool_steps = [trace for trace in traces if not trace.final]
    assert tool_steps and all("<python>" in trace.value and "</result>" in trace.value for trace in tool_steps)
    assert all("<think>" in trace.value for trace in traces)
    assert sum(trace.final for trace in traces) == len(scripted_trajectories)


def test_cli_index_with_the_reference_flags(tmp_path, capsys):
    from rapo_tools.search.faiss_index import load_sidecar

    rollouts_path, corpus = tmp_path / "rollouts.jsonl", tmp_path / "Step_Trace_Buffer.jsonl"
    write_jsonl(rollouts_path, [rollout("a", 0, 1.0), rollout("b", 0, 1.0)])
    assert main(["buffer", "build", "--input", str(rollouts_path), "--output", str(corpus)]) == 0
    with corpus.open("a") as handle:
        handle.write("[1.0, 0.0]\n")  # a reference-style reward line: skipped, counted
    index = tmp_path / "Step_Trace_Buffer.index"
    arguments = ["--corpus_path", str(corpus), "--index_path", str(index), "--index-kind", "flat"]
    assert main(["buffer", "index", *arguments]) == 0
    assert "indexed 6 steps (1 non-step lines skipped)" in capsys.readouterr().out
    assert load_sidecar(index)["count"] == 6
