"""Token-id wrappers on a plain Gymnasium text env and on a text env from another PyPI package (GEM).

The tokenizer is SmolLM2's (byte-level BPE, exact round trips) from rapo's model cache; every
wrapper loads it by path, as a spec rebuild or an unpickle would.
"""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

from rapo_buffers.candidates import Candidate, StaticRetriever
from rapo_env.wrappers import StepTraceRetrievalWrapper, TokenIdsAction, TokenIdsObservation

TEXT = gym.spaces.Text(4096, charset=[chr(c) for c in range(32, 127)] + ["\n"])
STEP_TRACE = "<python>\nprint(6 * 7)\n</python> <result>\n42\n</result>"


class CalculatorEnv(gym.Env):
    """A text env that is not a rapo env: it answers ``<python>a*b</python>`` and ends on ``<answer>``."""

    metadata = {"render_modes": []}
    observation_space = TEXT
    action_space = TEXT

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.a, self.b = (int(x) for x in self.np_random.integers(2, 99, size=2))
        return f"What is {self.a} times {self.b}? Literal <|im_end|> stays text.", {"tool": None}

    def step(self, action):
        if "<answer>" in action:
            correct = str(self.a * self.b) in action.split("<answer>")[-1]
            return "", float(correct), True, False, {"tool": None}
        if "<python>" in action and "</python>" in action:
            code = action.split("<python>")[-1].split("</python>")[0]
            left, _, right = code.partition("*")
            try:
                result = str(int(left) * int(right))
            except ValueError:
                result = "error: expected a*b"
            return f" <result>\n{result}\n</result>", 0.0, False, False, {"tool": "python"}
        return " <result>\nno tool call found\n</result>", 0.0, False, False, {"tool": None}


@pytest.fixture(scope="module")
def tokenizer_dir(policy_tokenizer_dir) -> str:
    """SmolLM2's tokenizer (byte-level BPE: exact round trips), loaded by path as a spec rebuild would."""
    return policy_tokenizer_dir


@pytest.fixture(scope="module")
def registered_env_id() -> str:
    env_id = "RapoTestCalculator-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=CalculatorEnv)
    return env_id


def wrap(env: gym.Env, tokenizer_dir: str, obs_tokens: int = 64, action_tokens: int = 32) -> gym.Env:
    return TokenIdsAction(TokenIdsObservation(env, tokenizer_dir, max_tokens=obs_tokens), tokenizer_dir, action_tokens)


def test_observations_follow_the_padding_convention(tokenizer_dir):
    env = wrap(CalculatorEnv(), tokenizer_dir)
    ids, info = env.reset(seed=3)
    text, _ = CalculatorEnv().reset(seed=3)
    assert env.observation_space.contains(ids)
    assert ids.dtype == np.int64 and ids.shape == (64,)
    pad_id = env.get_wrapper_attr("codec").pad_id
    length = info["observation_length"]
    # The literal special-token string is split into ordinary tokens: pad ids only pad the tail.
    assert np.all(ids[:length] != pad_id) and np.all(ids[length:] == pad_id)
    assert env.get_wrapper_attr("decode")(ids) == text
    assert info["observation_truncated"] is False


def test_actions_are_decoded_for_the_env_and_the_episode_scores(tokenizer_dir):
    env = wrap(CalculatorEnv(), tokenizer_dir)
    env.reset(seed=3)
    inner = env.unwrapped
    ids, reward, terminated, _, info = env.step(env.encode_action(f"<python>{inner.a}*{inner.b}</python>"))
    assert env.get_wrapper_attr("decode")(ids) == f" <result>\n{inner.a * inner.b}\n</result>"
    assert info["tool"] == "python" and not terminated and reward == 0.0
    _, reward, terminated, _, _ = env.step(env.encode_action(f"<answer>{inner.a * inner.b}</answer>"))
    assert terminated and reward == 1.0


def test_long_observations_are_cut_and_flagged(tokenizer_dir):
    env = TokenIdsObservation(CalculatorEnv(), tokenizer_dir, max_tokens=5)
    ids, info = env.reset(seed=0)
    assert info["observation_truncated"] is True and info["observation_length"] == 5
    assert env.decode(ids).startswith("What is")


@pytest.mark.parametrize(
    "bad_action",
    [np.zeros(31, dtype=np.int64), np.full(32, 0.5), np.full(32, 10**9, dtype=np.int64), np.array(["x"] * 32)],
    ids=["wrong-shape", "fractional", "out-of-vocab", "strings"],
)
def test_bad_actions_raise_before_touching_the_env(tokenizer_dir, bad_action):
    env = wrap(CalculatorEnv(), tokenizer_dir)
    env.reset(seed=1)
    with pytest.raises(ValueError):
        env.step(bad_action)


def test_wrapped_env_is_rebuilt_from_its_spec_and_pickles(tokenizer_dir, registered_env_id):
    env = wrap(gym.make(registered_env_id), tokenizer_dir, obs_tokens=48, action_tokens=24)
    names = [wrapper.name for wrapper in env.spec.additional_wrappers]
    assert names[-2:] == ["TokenIdsObservation", "TokenIdsAction"]
    rebuilt = gym.make(env.spec)
    copied = pickle.loads(pickle.dumps(env))
    for other in (rebuilt, copied):
        assert other.observation_space == env.observation_space and other.action_space == env.action_space
        first, _ = env.reset(seed=7)
        second, _ = other.reset(seed=7)
        np.testing.assert_array_equal(first, second)
        action = env.encode_action("<python>3*4</python>")
        np.testing.assert_array_equal(env.step(action)[0], other.step(action)[0])


@pytest.mark.filterwarnings("ignore:.*(different from the unwrapped|symmetric and normalized).*")
def test_env_checker_accepts_the_array_env(tokenizer_dir):
    from gymnasium.utils.env_checker import check_env

    check_env(wrap(CalculatorEnv(), tokenizer_dir), skip_render_check=True)


def test_retrieval_splices_survive_tokenization(tokenizer_dir):
    retriever = StaticRetriever([Candidate(STEP_TRACE, reward=1.0, score=0.9)])
    text_env = StepTraceRetrievalWrapper(CalculatorEnv(), retriever, retrieve_prob=1.0, seed=0)
    env = wrap(text_env, tokenizer_dir, obs_tokens=160)
    env.reset(seed=2, options={"rollout_index": 12})
    ids, _, _, _, info = env.step(env.encode_action("<python>6*7</python>"))
    observation = env.get_wrapper_attr("decode")(ids)
    start, end = info["retrieval"]["span"]
    assert observation[start:end] == info["retrieval"]["text"] and STEP_TRACE in observation
    assert observation.startswith(" <result>\n42\n</result>")


class GemTextEnv(gym.Env):
    """Gymnasium face of a GEM env (GEM's ``Env`` is its own ABC, with the same reset/step signatures)."""

    observation_space = gym.spaces.Text(8192, charset=[chr(c) for c in range(32, 127)] + ["\n"])
    action_space = observation_space

    def __init__(self, env_id: str):
        import gem

        self.gem_env = gem.make(env_id)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.gem_env.reset(seed=seed)

    def step(self, action):
        observation, reward, terminated, truncated, info = self.gem_env.step(action)
        return observation, float(reward), bool(terminated), bool(truncated), {**info, "tool": "game"}


def test_gem_env_runs_through_retrieval_and_token_id_wrappers(tokenizer_dir):
    pytest.importorskip("gem", reason="gem-llm (a PyPI text-env package) is not installed")
    hint = "<think>Halve the interval.</think> \\boxed{5}"
    retriever = StaticRetriever([Candidate(hint, reward=1.0, score=0.8)])
    env = wrap(
        StepTraceRetrievalWrapper(GemTextEnv("game:GuessTheNumber-v0-easy"), retriever, retrieve_prob=1.0, seed=0),
        tokenizer_dir,
        obs_tokens=512,
    )
    bare = GemTextEnv("game:GuessTheNumber-v0-easy")
    ids, _ = env.reset(seed=11)
    assert env.get_wrapper_attr("decode")(ids) == bare.reset(seed=11)[0]
    splices = 0
    for guess in (1, 2, 3):
        action = f"\\boxed{{{guess}}}"
        ids, reward, terminated, truncated, info = env.step(env.encode_action(action))
        expected, bare_reward, *_ = bare.step(action)
        observation = env.get_wrapper_attr("decode")(ids)
        if info["retrieval"] is not None:
            start, _ = info["retrieval"]["span"]
            splices += 1
            assert hint in observation[start:]
            observation = observation[:start]
        assert observation == expected and reward == bare_reward
        if terminated or truncated:
            break
    assert splices >= 1
