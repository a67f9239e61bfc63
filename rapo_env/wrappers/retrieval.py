"""`StepTraceRetrievalWrapper`: splice retrieved step traces of an off-policy agent into hybrid rollouts (spec §4).

The wrapper works on any Gymnasium env whose observations and actions are text. It keeps the
episode's context (the reset observation, then each action and each returned observation) and,
in a *hybrid* rollout, after a retrieval round (below) and with probability ``retrieve_prob``, queries a
`rapo_buffers.candidates.Retriever` with that context, picks one of the top ``topk`` step traces
and appends it to the observation inside ``template``.

When a hybrid rollout may retrieve (``retrieve_after``): never before the first step and never on the step
that ends the episode; otherwise

- ``"any_round"`` (the default, the reference's rule): after every policy round the episode goes on from:
  a tool round, a round that ended without a tool call (rapo's envs answer it with a hint), and a turn the
  policy's per-turn token limit cut off, which resumes on the next step. A model that never calls a tool
  (no warm-up) is still shown expert steps;
- ``"tool_round"`` (spec §4's wording): only after a round that ran a tool (``info["tool"]`` is not None;
  an env that does not say which tool ran counts every round as one);
- ``"first_round"`` (not the paper's): only after the first round the episode goes on from, so a hybrid rollout
  draws once. Under the other rules a rollout stays unspliced only if every one of its rounds draws no splice, so
  the unspliced rollouts lean to the short episodes; here whether a rollout is spliced depends on its first action
  alone.

What it spliced is reported in ``info["retrieval"]`` so that a rollout engine can mask those tokens out of the loss:

    {"text": the spliced text, "span": (start, end) of it inside the returned observation,
     "candidates": [values], "scores": [...], "rewards": [...], "chosen": index, or None for the fallback,
     "fallback": bool}

``info["retrieval"]`` is None on steps without a splice. A retriever failure means no splice on
that step, counted in ``info["retrieval_errors"]`` (per episode); the episode goes on.

Which rollouts are hybrid: ``reset(options={"rollout_index": i})`` (or ``info["rollout_index"]``)
gives the rollout's index in its group of ``group_size``; with ``hybrid_rule="paper"`` rollouts with
``i >= no_retrieve_first_k`` are hybrid (8 of 16), with ``"reference"`` those with ``i > k`` (7 of 16,
what the reference code does). Without an index every rollout is hybrid.

Example:
    >>> import gymnasium as gym
    >>> from rapo_buffers.candidates import Candidate, StaticRetriever
    >>> class Calculator(gym.Env):  # any text env: the observation answers the action
    ...     observation_space = action_space = gym.spaces.Text(256, charset=[chr(c) for c in range(32, 127)] + ["\\n"])
    ...     def reset(self, *, seed=None, options=None):
    ...         return "What is 6*7?", {}
    ...     def step(self, action):
    ...         return " <result>\\n42\\n</result>", 0.0, False, False, {}
    >>> retriever = StaticRetriever([Candidate("<python>6*7</python> <result>\\n42\\n</result>", 1.0, 0.9)])
    >>> env = StepTraceRetrievalWrapper(Calculator(), retriever, retrieve_prob=1.0, seed=0)
    >>> observation, info = env.reset(options={"rollout_index": 12})
    >>> observation, reward, terminated, truncated, info = env.step("<python>6*7</python>")
    >>> start, end = info["retrieval"]["span"]
    >>> observation[start:end] == info["retrieval"]["text"]
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from rapo_buffers.candidates import Candidate, Retriever
from rapo_buffers.client import retriever_from_url
from rapo_buffers.schema import is_final_step_text
from rapo_buffers.text import normalize_context
from rapo_env.prompts import REFERENCE_FALLBACK_TEXT

REFERENCE_TEMPLATE = (
    " Additional context is enclosed in <retrieve> </retrieve> tags. Use it if helpful. "
    "<retrieve>\n{value}\n</retrieve>"
)
"""The reference's splice format; ``{value}`` is replaced by the chosen step trace."""

FALLBACK_TEXT = (
    "No reliable reference step was found for this point. Solve the problem carefully with your own reasoning."
)
"""Spliced instead of a step trace whose trajectory reward is <= 0 (rapo's wording; the reference's is
`rapo_env.prompts.REFERENCE_FALLBACK_TEXT`)."""

SELECT_RULES = ("max_reward", "most_similar")
HYBRID_RULES = ("paper", "reference")
RETRIEVE_AFTER = ("any_round", "tool_round", "first_round")
FINAL_STEPS = ("next_best", "skip", "splice")


def select_candidate(candidates: list[Candidate], rule: str) -> int:
    """Index of the candidate to splice (candidates are sorted by decreasing score).

    ``max_reward`` (reference): the highest reward, ties broken by similarity.
    ``most_similar`` (paper): the highest score.

    Raises:
        ValueError: for an empty list or an unknown rule.
    """
    if not candidates:
        raise ValueError("no candidates to select from")
    if rule == "max_reward":
        return max(range(len(candidates)), key=lambda i: (candidates[i].reward, candidates[i].score, -i))
    if rule == "most_similar":
        return max(range(len(candidates)), key=lambda i: (candidates[i].score, -i))
    raise ValueError(f"unknown select rule {rule!r}; expected one of {SELECT_RULES}")


def is_final(candidate: Candidate) -> bool:
    """Whether a candidate is a final-answer step (as its buffer says, or as its text shows)."""
    return bool(candidate.is_final) or is_final_step_text(candidate.value)


REFERENCE_ERROR_PREFIX = "Retrieve error: "
"""With ``hybrid_rule="reference"``, a failed retrieval splices this and the error, as the reference's tool does."""
REFERENCE_EMPTY_TEXT = "Error processing retrieve results: max() arg is an empty sequence"
"""With ``hybrid_rule="reference"``, what a retrieval without candidates splices: the reference's tool
takes the ``max`` of the empty hit list and splices the error it catches."""


@dataclasses.dataclass(frozen=True)
class RetrievalSettings:
    """How `StepTraceRetrievalWrapper` retrieves and splices (spec §4); one set of defaults, recorded whole.

    The defaults are the paper's (8 of 16 rollouts on-policy, the most similar candidate); the trainer's
    ``retrieval`` section takes ``retrieve_prob``, ``topk`` and ``retrieve_after`` from them and sets the rest for
    its run (``group_size`` = ``rollout.rollout_n``, the selection and hybrid rule from ``algorithm.fidelity``).

    Example:
        >>> RetrievalSettings(retrieve_prob=1.0, hybrid_rule="reference").fallback == REFERENCE_FALLBACK_TEXT
        True
    """

    retrieve_prob: float = 0.5
    """Probability of a retrieval after each retrieval round (``retrieve_after``) of a hybrid rollout."""
    topk: int = 3
    """Candidates considered per retrieval."""
    select: Literal["max_reward", "most_similar"] = "most_similar"
    """``most_similar`` (the paper's rule, as the default ``hybrid_rule`` is the paper's) or ``max_reward`` (the
    reference code's: highest reward, ties by similarity)."""
    no_retrieve_first_k: int = 8
    """The first k rollouts of each group stay on-policy."""
    group_size: int = 16
    """Rollouts per question (``ROLLOUT_N``); the rollout index is taken modulo it."""
    template: str = REFERENCE_TEMPLATE
    """The splice format, with a ``{value}`` placeholder."""
    fallback_text: str | None = None
    """Spliced (inside ``template``) when the chosen candidate's reward is <= 0; None: `fallback`'s default."""
    final_steps: Literal["next_best", "skip", "splice"] = "next_best"
    """What a final-answer step among the candidates does (spec §4's pitfall: its ``<answer>`` breaks the one-answer
    format, so it is never spliced as it is). ``next_best``: it is dropped and the best remaining step is spliced;
    ``skip``: when the rule picks it (the expert answered at this point), nothing is spliced this round, so that
    another question's step does not stand in for it (on multi-hop QA those stand-ins sent 1-hop rollouts
    searching on: `docs/training.md`, "what a splice carries"); ``splice``: it is spliced like any step (the
    reference code's behaviour)."""
    hybrid_rule: Literal["paper", "reference"] = "paper"
    """``paper`` (index >= k is hybrid; a failed or empty retrieval splices nothing) or ``reference`` (index > k;
    a failed or empty retrieval splices the reference's error text)."""
    retrieve_after: Literal["any_round", "tool_round", "first_round"] = "any_round"
    """``any_round`` (reference: every round the episode goes on from), ``tool_round`` (only rounds that ran
    a tool) or ``first_round`` (only the first round the episode goes on from); see the module docstring."""
    max_context_chars: int | None = None
    """Skip a splice that would make the context longer than this (None: no limit)."""
    seed: int | None = None
    """Seed of the wrapper's random generator; ``reset(seed=...)`` reseeds it."""
    vector_safe_info: bool = False
    """For Gymnasium vector envs, which merge infos into typed arrays and cannot mix None with dicts or integers:
    leave ``retrieval``/``retrieval_error`` out of ``info`` on steps without them (the vector env's
    ``_retrieval`` mask tells which sub-envs spliced) and mark the fallback with ``chosen = -1`` instead of None."""

    def __post_init__(self) -> None:
        for name, allowed in (("select", SELECT_RULES), ("hybrid_rule", HYBRID_RULES),
                              ("retrieve_after", RETRIEVE_AFTER), ("final_steps", FINAL_STEPS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.0 <= self.retrieve_prob <= 1.0:
            raise ValueError(f"retrieve_prob must be in [0, 1], got {self.retrieve_prob}")
        if self.topk < 1:
            raise ValueError(f"topk must be at least 1, got {self.topk}")
        if self.no_retrieve_first_k < 0 or self.group_size < 1:
            raise ValueError("no_retrieve_first_k must be >= 0 and group_size >= 1")
        if "{value}" not in self.template:
            raise ValueError("template must contain the placeholder {value}")
        if self.max_context_chars is not None and self.max_context_chars < 1:
            raise ValueError(f"max_context_chars must be positive or None, got {self.max_context_chars}")

    def is_hybrid(self, rollout_index: int | None) -> bool:
        """Whether the rollout with this index (within its group) may retrieve; None means yes.

        Example:
            >>> settings = RetrievalSettings(no_retrieve_first_k=1, group_size=4)
            >>> [settings.is_hybrid(i) for i in range(5)], settings.is_hybrid(None)
            ([False, True, True, True, False], True)
        """
        if rollout_index is None:
            return True
        index = int(rollout_index) % self.group_size
        if self.hybrid_rule == "paper":
            return index >= self.no_retrieve_first_k
        return index > self.no_retrieve_first_k

    @property
    def fallback(self) -> str:
        """``fallback_text``, or by default the reference's sentence in its ``<think>`` wrapper with
        ``hybrid_rule="reference"``, else `FALLBACK_TEXT`."""
        if self.fallback_text is not None:
            return self.fallback_text
        return REFERENCE_FALLBACK_TEXT if self.hybrid_rule == "reference" else FALLBACK_TEXT


class StepTraceRetrievalWrapper(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Splice retrieved step traces into the observations of hybrid rollouts (spec §4).

    Args:
        env: any env with ``str`` observations and actions.
        retriever: a `Retriever`, or the URL of a ``/retrieve`` service (``http://host:port``). Whoever owns
            the training data builds a default buffer (`rapo_agents.buffer_build.default_retriever`).
        settings: how it retrieves and splices (`RetrievalSettings`; default its defaults).
        **overrides: fields of `RetrievalSettings` to set on top of ``settings`` (``retrieve_prob=1.0``).
    """

    def __init__(self, env: gym.Env, retriever: Retriever | str, settings: RetrievalSettings | None = None,
                 **overrides: Any):
        settings = dataclasses.replace(settings or RetrievalSettings(), **overrides)
        # No deep copy: a retriever is a shared service (model, index, connection pool); the rest is immutable.
        gym.utils.RecordConstructorArgs.__init__(self, _disable_deepcopy=True, retriever=retriever, settings=settings)
        gym.Wrapper.__init__(self, env)
        if isinstance(retriever, str):
            retriever = retriever_from_url(retriever)
        if not isinstance(retriever, Retriever):
            raise TypeError(f"retriever must implement retrieve(queries, topk), got {type(retriever).__name__}")
        self.retriever, self.settings = retriever, settings
        self._rng = np.random.default_rng(settings.seed)
        self._context, self._last_splice = "", None
        self._hybrid = True
        self._errors = 0
        self._retrievals = 0
        self._rounds = 0

    def may_retrieve(self, terminated: bool, truncated: bool, info: dict[str, Any]) -> bool:
        """Whether the step just taken is a retrieval round under ``retrieve_after`` (module docstring)."""
        if terminated or truncated:
            return False
        if self.settings.retrieve_after == "first_round":
            return self._rounds == 1
        # rapo envs say which tool ran (None: none ran); an env that does not say counts as a tool round.
        return self.settings.retrieve_after == "any_round" or info.get("tool", True) is not None

    @property
    def context(self) -> str:
        """The episode's text so far: the reset observation, then every action and returned observation."""
        return self._context

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            # Mixing in the constructor seed keeps two differently-seeded wrappers apart under one env seed.
            self._rng = np.random.default_rng([seed, 0 if self.settings.seed is None else self.settings.seed])
        observation, info = self.env.reset(seed=seed, options=options)
        self._require_text(observation, "reset")
        rollout_index = (options or {}).get("rollout_index", info.get("rollout_index"))
        self._hybrid = self.settings.is_hybrid(rollout_index)
        self._context = observation
        self._last_splice = None
        self._errors = 0
        self._retrievals = 0
        self._rounds = 0
        info = dict(info)
        info.update(hybrid=self._hybrid, retrieval_errors=0, retrievals=0)
        if not self.settings.vector_safe_info:
            info.update(retrieval=None, retrieval_error=None)
        return observation, info

    def step(self, action: str):
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._require_text(observation, "step")
        info = dict(info)
        self._context += action
        retrieval, error = None, None
        if not (terminated or truncated):
            self._rounds += 1  # rounds the episode goes on from; ``first_round`` retrieves after the first only
        retrieves = self._hybrid and self.may_retrieve(terminated, truncated, info)
        if retrieves and self._rng.random() < self.settings.retrieve_prob:
            retrieval, error = self._retrieve(self._context + observation, observation)
        self._last_splice = None
        if retrieval is not None:
            start = len(self._context) + len(observation)
            self._last_splice = (start, start + len(retrieval["text"]))
            observation = observation + retrieval["text"]
            self._retrievals += 1
        self._context += observation
        info.update(hybrid=self._hybrid, retrieval_errors=self._errors, retrievals=self._retrievals)
        if retrieval is not None or not self.settings.vector_safe_info:
            info["retrieval"] = retrieval
        if error is not None or not self.settings.vector_safe_info:
            info["retrieval_error"] = error
        return observation, reward, terminated, truncated, info

    def copy_episode_from(self, source: StepTraceRetrievalWrapper) -> None:
        """Take over ``source``'s episode in progress (its context and counts), for `rapo_env.core.copy_episode`.

        Whether this rollout is hybrid and its random draws stay those of this wrapper's own reset, so a
        branched rollout retrieves as its own rollout index says, with draws of its own.
        """
        self._context, self._errors, self._retrievals = source._context, source._errors, source._retrievals
        self._rounds = source._rounds
        self._last_splice = None

    def forget_splice(self) -> None:
        """Take the last step's splice out of the retrieval context: its episode skipped it for the token
        budget (`rapo_agents.rollout.episode.EpisodeRecord.add_observation`), so the policy never saw it
        and later queries must not hold it either."""
        if getattr(self, "_last_splice", None) is not None:
            start, end = self._last_splice
            self._context = self._context[:start] + self._context[end:]
            self._last_splice = None

    def _retrieve(self, query: str, observation: str) -> tuple[dict[str, Any] | None, str | None]:
        """Query the retriever and build the splice; (None, error text) when the retriever failed."""
        settings = self.settings
        fetch = 2 * settings.topk if settings.final_steps == "next_best" else settings.topk  # room for dropped ones
        try:
            results = self.retriever.retrieve([normalize_context(query)], fetch)
            candidates = list(results[0])
            if not all(isinstance(candidate, Candidate) for candidate in candidates):
                raise TypeError("the retriever returned something other than Candidate objects")
        except Exception as error:  # any retriever failure: no splice on this step (paper), the episode goes on
            self._errors += 1
            message = f"{type(error).__name__}: {error}"
            if settings.hybrid_rule != "reference":
                return None, message
            candidates, failure = [], REFERENCE_ERROR_PREFIX + message  # the reference splices its error
        else:
            failure = REFERENCE_EMPTY_TEXT
            message = None
        if settings.final_steps == "next_best":
            candidates = [c for c in candidates if not is_final(c)]
        candidates = candidates[: settings.topk]
        chosen: int | None = None
        if not candidates:
            if settings.hybrid_rule != "reference":
                return None, None
            value = failure
        else:
            chosen = select_candidate(candidates, settings.select)
            if settings.final_steps == "skip" and is_final(candidates[chosen]):
                return None, None
            if candidates[chosen].reward <= 0:
                value, chosen = settings.fallback, None
            else:
                value = candidates[chosen].value
        text = settings.template.replace("{value}", value)
        if (
            settings.max_context_chars is not None
            and len(self._context) + len(observation) + len(text) > settings.max_context_chars
        ):
            return None, message
        return {
            "text": text,
            "span": (len(observation), len(observation) + len(text)),
            "candidates": [c.value for c in candidates],
            "scores": [c.score for c in candidates],
            "rewards": [c.reward for c in candidates],
            "chosen": -1 if chosen is None and settings.vector_safe_info else chosen,
            "fallback": chosen is None,
        }, message

    @staticmethod
    def _require_text(observation: Any, where: str) -> None:
        if not isinstance(observation, str):
            raise TypeError(
                f"StepTraceRetrievalWrapper needs text observations; {where} returned {type(observation).__name__}"
            )


def split_spliced_text(observation: str, info: dict[str, Any]) -> str:
    """The env's own part of an observation: without the text `StepTraceRetrievalWrapper` spliced in (the
    inverse of its splice, read from ``info["retrieval"]["span"]``).

    Example:
        >>> split_spliced_text(" <result>4</result> <retrieve>x</retrieve>", {"retrieval": {"span": (19, 42)}})
        ' <result>4</result>'
    """
    retrieval = info.get("retrieval")
    if not retrieval:
        return observation
    start, end = retrieval["span"]
    return observation[:start] + observation[end:]
