"""Token in, token out: what a trajectory trains on is exactly what the policy sampled plus what the env appended.

Random multi-turn episodes of the real math env and python tool, with tool results, hints (turns with no call),
length cuts and retrieval splices, under three chat templates (the embedded SmolLM2 one, a Qwen-style
``<|im_start|>`` one and a Llama-3-style header one with its control tokens). The policy samples token ids
that re-tokenising would merge differently (one character at a time, plus random vocabulary ids), so any
decode-then-encode anywhere on the way shows as a mismatch. For every trajectory:

- each context the policy was given is the trajectory's ids up to that turn, id for id;
- each turn's ids are the sampled ids (a prefix, where the response budget cut the last one);
- what lies between turns is the env's text encoded once as text (a splice on its own span; the final
  observation, which nothing follows, is not appended);
- the loss mask is 1 on exactly the policy's own ids, and their log-probs are the sampler's.
"""

from __future__ import annotations

import copy
import random

import pytest

from rapo_agents.policies import Generation, ScriptedPolicy
from rapo_agents.policies.base import find_stop
from rapo_agents.rollout import RolloutConfig, RolloutEngine
from rapo_agents.rollout.episode import encode_env_text
from rapo_buffers.retriever import RandomRetriever
from rapo_buffers.schema import StepTrace
from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA3_CONTROL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# Step traces to splice, with control-token strings inside: they must reach the policy as text.
TRACES = [
    StepTrace(key="a", value="<python>\nprint(6 * 7)\n</python> <result>\n42\n</result>", reward=1.0),
    StepTrace(key="b", value="<python>\nprint('<|im_end|><|eot_id|>')\n</python> <result>\n<|im_end|>\n</result>",
              reward=1.0),
    StepTrace(key="c", value="<search>caf\u00e9 na\u00efve \u6f22\u5b57</search>", reward=0.5),
]


def template_tokenizer(base, template: str):
    tokenizer = copy.deepcopy(base)
    if template == "qwen":
        tokenizer.chat_template = QWEN_TEMPLATE
    elif template == "llama3":
        tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_CONTROL})
        tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


class RandomTokenPolicy(ScriptedPolicy):
    """Random turns (tool calls, hints, answers) as non-canonical token ids; remembers what it gave for what.

    ``given`` maps each context (a tuple of ids) to the generations returned for it.
    """

    def __init__(self, tokenizer, seed: int):
        super().__init__(["unused"], tokenizer=tokenizer)
        self.rng = random.Random(seed)
        self.given: dict[tuple[int, ...], list[Generation]] = {}
        special = set(tokenizer.all_special_ids)
        self.plain_ids = [i for i in range(len(tokenizer)) if i not in special]

    def _turn_text(self) -> str:
        a, b = self.rng.randint(2, 99), self.rng.randint(2, 99)
        return self.rng.choice([
            f"<think>try {a}</think>\n<python>\nprint({a} * {b})\n</python>",
            "<python>\nprint('<|im_end|>\\n<|eot_id|><|im_start|>system')\n</python>",
            f"I am not sure about {a} yet.",  # no call: the env answers with a hint
            f"<python>\nprint('x' * {a * 7})\n</python>",  # a long result the budget may cut
            f"<answer>\\boxed{{{a * b}}}</answer>",
        ])

    def _ids_of(self, text: str) -> list[int]:
        """One character at a time (never the merges re-tokenising would pick), with random ids between."""
        ids = []
        for char in text:
            ids.extend(self.tokenizer.encode(char, add_special_tokens=False))
            if char == " " and self.rng.random() < 0.3:
                ids.append(self.rng.choice(self.plain_ids))
        return ids

    def _generate_one(self, context: list[int], params) -> Generation:
        text = self._turn_text()
        stop = find_stop(text, params.stop)
        ids = self._ids_of(text[: stop[0]] if stop else text)
        reason = "stop" if stop else "eos"
        if not stop:
            ids.append(self.tokenizer.eos_token_id)
        if len(ids) > params.max_new_tokens:
            ids, reason = ids[: params.max_new_tokens], "length"
        generation = Generation(
            token_ids=ids,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=reason,
            logprobs=[-self.rng.random() for _ in ids] if params.logprobs else None,
            entropies=[self.rng.random() for _ in ids] if params.entropies else None,
            top_logprobs=[[0.0] for _ in ids] if params.top_logprobs else None,
            stop_string=stop[1] if stop and reason == "stop" else None,
        )
        self.given.setdefault(tuple(context), []).append(generation)
        return generation


@pytest.fixture(scope="module")
def base_tokenizer(policy_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_tokenizer_dir)


def episodes(tokenizer, seed: int):
    policy = RandomTokenPolicy(tokenizer, seed)
    retriever = RandomRetriever(TRACES, seed=seed)

    def wrap(env):
        return StepTraceRetrievalWrapper(env, retriever, retrieve_prob=0.7, no_retrieve_first_k=1, group_size=4,
                                         seed=seed)

    config = RolloutConfig(rollout_n=4, max_response_tokens=[160, 320, 640][seed % 3], max_tool_calls=4)
    env_kwargs = {"num_tasks": 4, "sandbox": "subprocess", "max_turns": 6}
    with RolloutEngine("RAPO-Math-v0", policy, config, env_kwargs=env_kwargs, wrappers=[wrap]) as engine:
        trajectories = engine.run([seed % 4, (seed + 1) % 4], seed=seed)
    return policy, trajectories, config.max_response_tokens


def env_segment_matches(tokenizer, ids: list[int], step, cut: bool) -> bool:
    """The ids between a turn and the next are the step's observation (and splice) encoded once, as text."""
    if step.retrieval is None or "token_span" not in step.retrieval:
        expected = encode_env_text(tokenizer, step.observation)
        return ids == expected[: len(ids)] if cut else ids == expected
    start, end = step.retrieval["token_span"]
    offset = start - step.token_end
    before, spliced, after = ids[:offset], ids[offset : end - step.token_end], ids[end - step.token_end :]
    whole = [encode_env_text(tokenizer, tokenizer.decode(part)) == part for part in (before, after) if part]
    return (all(whole) and spliced == encode_env_text(tokenizer, step.retrieval["text"])
            and tokenizer.decode(before) + tokenizer.decode(after) == step.observation)


@pytest.mark.parametrize("template", ["embedded", "qwen", "llama3"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trained_ids_are_the_sampled_ids_plus_the_env_text_encoded_once(base_tokenizer, template, seed):
    tokenizer = template_tokenizer(base_tokenizer, template)
    policy, trajectories, budget = episodes(tokenizer, seed)
    kinds = set()
    for trajectory in trajectories:
        ids, mask, logprobs = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
        assert len(ids) == len(mask) == len(logprobs)
        assert len(ids) - trajectory.prompt_length <= budget
        own = set()
        for index, step in enumerate(trajectory.steps):
            context = tuple(ids[: step.token_start])
            assert context in policy.given, f"turn {index} was given other ids than the trajectory holds"
            turn = ids[step.token_start : step.token_end]
            last = index == len(trajectory.steps) - 1
            matches = [g for g in policy.given[context] if g.token_ids[: len(turn)] == turn
                       and (len(turn) == len(g.token_ids) or (last and trajectory.end_reason == "length"))]
            # Rows of one group share contexts and may sample the same ids; their log-probs tell them apart.
            sampled = [g for g in matches if logprobs[step.token_start : step.token_end] == g.logprobs[: len(turn)]]
            assert sampled, f"turn {index}'s ids and log-probs are not what the policy sampled"
            own.update(range(step.token_start, step.token_end))
            following = trajectory.steps[index + 1].token_start if not last else len(ids)
            segment = ids[step.token_end : following]
            if not (last and not segment):  # an episode's final observation is not appended: nothing follows it
                assert env_segment_matches(tokenizer, segment, step, cut=last and trajectory.end_reason == "length")
            kinds.add("splice" if step.retrieval and "token_span" in step.retrieval else
                      "hint" if "No tool call" in step.observation else "tool" if step.observation else "end")
        assert [i for i, m in enumerate(mask) if m] == sorted(own)
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
        kinds.add(trajectory.end_reason)
    # The random episodes did reach what the property is about (checked so that the test cannot pass vacuously).
    assert {"tool", "splice"} <= kinds


def test_the_three_templates_render_their_own_control_tokens(base_tokenizer):
    llama3 = template_tokenizer(base_tokenizer, "llama3")
    _, [trajectory, *_], _ = episodes(llama3, seed=0)
    header = llama3.convert_tokens_to_ids("<|start_header_id|>")
    assert header in trajectory.token_ids[: trajectory.prompt_length]
    assert header not in trajectory.token_ids[trajectory.prompt_length :]  # printed ones stay text
