"""Any registered rapo env over the OpenEnv protocol (``rapo env serve``): the server side.

`RapoEnvironment` is an OpenEnv ``Environment`` around one rapo env (``gym.make(env_id, **env_kwargs)``, optionally
inside `StepTraceRetrievalWrapper`); `create_rapo_app` serves it with OpenEnv's own ``create_app``: ``/ws``
sessions (one env each, built when the session connects and closed when it disconnects or stays idle past
``idle_timeout_s``), ``/schema``, ``/metadata``, ``/health``, the stateless ``/reset`` (a fresh env per call), and
rapo's ``/sessions`` (how many envs are open).
An exception in one session's env comes back to that session as an error message (its episode must be reset);
the server and the other sessions go on.

On the wire (`RapoAction`, `RapoObservation`): a step sends the model's whole turn as ``{"text": ...}``; reset answers
the user prompt in ``text`` with ``system_prompt`` and the env's reset ``info``; a step answers what the env appends
after the turn (`` <result>...</result>``, a hint, or nothing at the end) with ``reward``, ``terminated``,
``truncated`` (``done`` is either) and the step's ``info``. Reset takes ``seed`` and the env's reset options, as
``options={...}`` or as keywords (``task_index=3``). `rapo_env.remote.RemoteEnv` is the Gymnasium client.

openenv (the ``openenv`` extra) is imported by this module only; the rest of rapo does not need it.

Example:
    >>> from openenv.core import GenericEnvClient
    >>> from rapo_tools.serving import serve_in_thread
    >>> app = create_rapo_app("RAPO-Math-v0", {"num_tasks": 4, "sandbox": "subprocess"})
    >>> with serve_in_thread(app) as url, GenericEnvClient(base_url=url).sync() as client:
    ...     _ = client.reset(seed=0, task_index=1)
    ...     client.step({"text": "<python>print(6 * 7)</python>"}).observation["text"]
    ' <result>\\n42\\n</result>'
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, ConcurrencyConfig, EnvironmentMetadata, Observation, State
from pydantic import Field

import rapo_env  # noqa: F401  (registers the envs)
from rapo_buffers.candidates import Retriever
from rapo_buffers.client import retriever_from_url
from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

logger = logging.getLogger(__name__)

DEFAULT_MAX_SESSIONS = 64
DEFAULT_IDLE_TIMEOUT_S = 600.0
"""A session that sends nothing for this long is closed (its env too); OpenEnv checks every quarter of it."""

Retrieval = Retriever | str | Mapping[str, Any] | None
"""`create_rapo_app`'s ``retrieval``: a `Retriever`, the URL of a ``/retrieve`` service, or the keyword arguments of
`StepTraceRetrievalWrapper` (``{"retriever": ..., "retrieve_prob": 0.5, ...}``); None serves the env without it."""


class RapoAction(Action):
    """One model turn."""

    text: str = Field(description="The model's whole turn: reasoning, then one tool call in its tags "
                                  "(<python>...</python>) or the final <answer>...</answer>.")


class RapoObservation(Observation):
    """What reset or a step returns (``reward`` and ``done`` are OpenEnv's fields)."""

    text: str = Field(default="", description="reset: the user prompt; step: the text the env appends after the "
                                              "turn (a tool result in <result> tags, a hint, '' at the end).")
    system_prompt: str | None = Field(default=None, description="reset: the system prompt that explains the tags "
                                                                "and tools; None after a step.")
    terminated: bool = Field(default=False, description="The episode ended with an answer (Gymnasium's "
                                                        "terminated).")
    truncated: bool = Field(default=False, description="The episode was cut by a tool-call or turn limit "
                                                       "(Gymnasium's truncated).")
    info: dict[str, Any] = Field(default_factory=dict, description="The env's info dict of this reset or step, "
                                                                   "as JSON (tuples become lists).")


class RapoState(State):
    """The session's episode (``episode_id`` and ``step_count`` are OpenEnv's fields)."""

    env_id: str = Field(description="The registered rapo env this session plays.")
    task_id: str | None = Field(default=None, description="The question of the current episode (None before the "
                                                          "first reset).")
    episode_over: bool = Field(default=True, description="No step is possible until the next reset.")
    tools: list[str] = Field(default_factory=list, description="The tags of the env's tools.")
    max_text_length: int = Field(description="Longest observation and action, in characters (the env's text "
                                             "spaces).")


def to_json(value: Any) -> Any:
    """``value`` (an info dict) as plain JSON values: numpy scalars and arrays unpacked, tuples as lists, keys as
    text, non-finite floats as None, anything else as its ``str``.

    Example:
        >>> to_json({"span": (1, 4), "score": np.float32(0.5), 3: float("nan")})
        {'span': [1, 4], 'score': 0.5, '3': None}
    """
    if isinstance(value, np.generic | np.ndarray):
        value = value.tolist()
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json(item) for item in value]
    return str(value)


def make_rapo_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None, retrieval: Retrieval = None) -> gym.Env:
    """``gym.make(env_id, **env_kwargs)``, inside `StepTraceRetrievalWrapper` when ``retrieval`` is given.

    Gymnasium's passive env checker is off unless ``env_kwargs`` turns it on: after a first reset that raises (a bad
    ``task_index`` from a client) its first step fails for good (gymnasium 1.4 keeps no reset data to compare), and
    a session must survive a bad request.
    """
    env = gym.make(env_id, **{"disable_env_checker": True, **(env_kwargs or {})})
    if retrieval is None:
        return env
    wrapper_kwargs = dict(retrieval) if isinstance(retrieval, Mapping) else {"retriever": retrieval}
    try:
        return StepTraceRetrievalWrapper(env, **wrapper_kwargs)
    except BaseException:
        env.close()
        raise


class RapoEnvironment(Environment[RapoAction, RapoObservation, RapoState]):
    """One session's rapo env as an OpenEnv ``Environment``.

    Args:
        env_id: A registered env id (``RAPO-Math-v0``, ``RAPO-QA-v0``, ``RAPO-Web-v0``, or any text env).
        env_kwargs: Keyword arguments of ``gym.make``.
        retrieval: Splice step traces with `StepTraceRetrievalWrapper` (see `Retrieval`).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own env; tool pools are shared and thread-safe

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None, retrieval: Retrieval = None):
        super().__init__()
        self.env_id = env_id
        self.env = make_rapo_env(env_id, env_kwargs, retrieval)
        self._state = RapoState(env_id=env_id, tools=list(getattr(self.env.unwrapped, "tool_tags", ())),
                                max_text_length=int(getattr(self.env.observation_space, "max_length", 0)))
        self._closed = False

    def reset(self, seed: int | None = None, episode_id: str | None = None, options: Mapping[str, Any] | None = None,
              **more_options: Any) -> RapoObservation:
        """Start an episode: ``options`` and keyword options (``task_index``, ``task_id``, ``rollout_index``) go to
        the env's reset."""
        self._require_open()
        options = {**(options or {}), **more_options}
        self._state.episode_over = True  # until the reset below succeeds
        prompt, info = self.env.reset(seed=seed, options=options)
        self._state.episode_id = episode_id or str(uuid.uuid4())
        self._state.step_count = 0
        self._state.task_id = None if info.get("task_id") is None else str(info["task_id"])
        self._state.episode_over = False
        return RapoObservation(text=prompt, system_prompt=info.get("system_prompt"), info=to_json(info))

    def step(self, action: RapoAction, timeout_s: float | None = None, **kwargs: Any) -> RapoObservation:
        """Take one model turn (``timeout_s`` is not used: the env's tools have their own timeouts)."""
        self._require_open()
        if self._state.episode_over:
            raise RuntimeError("the episode has ended or never started: send a reset before a step")
        try:
            observation, reward, terminated, truncated, info = self.env.step(action.text)
        except Exception as error:
            self._state.episode_over = True  # the env's state after a failed step is unknown
            logger.warning("%s step failed in episode %s", self.env_id, self._state.episode_id, exc_info=True)
            raise RuntimeError(f"{self.env_id} step failed: {type(error).__name__}: {error}; send a reset to start "
                               "a new episode") from error
        self._state.step_count += 1
        self._state.episode_over = bool(terminated or truncated)
        return RapoObservation(text=observation, reward=float(reward), done=self._state.episode_over,
                               terminated=bool(terminated), truncated=bool(truncated), info=to_json(info))

    @property
    def state(self) -> RapoState:
        """The session's episode: env id, task, step count, whether it is over, tools and text length."""
        return self._state.model_copy()

    def get_metadata(self) -> EnvironmentMetadata:
        """The env id and the first line of the env class's docstring."""
        doc = (type(self.env.unwrapped).__doc__ or "").strip().splitlines()
        return EnvironmentMetadata(name=self.env_id, description=doc[0] if doc else f"the rapo env {self.env_id}",
                                   version="0.1.0")

    @property
    def closed(self) -> bool:
        """The env was closed (the session ended, or went idle past the timeout)."""
        return self._closed

    def close(self) -> None:
        """Close the env (and its tools); later calls get a clear error. Closing twice is allowed."""
        if not self._closed:
            self._closed = True
            self.env.close()

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this session's {self.env_id} env was closed (it was idle past the server's timeout, "
                               "or the server is stopping): connect again for a new session")


def create_rapo_app(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    retrieval: Retrieval = None,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
) -> FastAPI:
    """The OpenEnv FastAPI app of ``env_id``: each ``/ws`` session gets its own env.

    One env is built (and closed) first, so that a bad env id, bad kwargs or a bad retrieval setting fail here,
    not in every session. A retriever URL is resolved once into one shared client.

    Args:
        env_id: A registered env id.
        env_kwargs: Keyword arguments of ``gym.make`` for every session's env.
        retrieval: `StepTraceRetrievalWrapper` around every env (see `Retrieval`); None: no retrieval.
        max_sessions: Sessions at once (OpenEnv's ``max_concurrent_envs``); one more is refused with an error.
        idle_timeout_s: Close a session's env after this long without a message; None: never.

    Raises:
        gymnasium.error.Error: for an unregistered env id.
        ValueError, TypeError: for env kwargs or retrieval settings the env or the wrapper rejects.
    """
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    if idle_timeout_s is not None and idle_timeout_s <= 0:
        raise ValueError(f"idle_timeout_s must be positive or None, got {idle_timeout_s}")
    retrieval = _shared_retriever(retrieval)
    env_kwargs = dict(env_kwargs or {})
    RapoEnvironment(env_id, env_kwargs, retrieval).close()
    envs: weakref.WeakSet[RapoEnvironment] = weakref.WeakSet()  # OpenEnv drops a session's env when it ends
    envs_lock = threading.Lock()  # sessions' envs are built on their own threads

    def session_env() -> RapoEnvironment:
        try:
            env = RapoEnvironment(env_id, env_kwargs, retrieval)
        except Exception:  # OpenEnv tells the client only that the factory failed: the cause goes to the log
            logger.exception("could not build a %s env for a new session", env_id)
            raise
        with envs_lock:
            envs.add(env)
        return env

    session_env.__name__ = env_id  # OpenEnv names the factory in its error reply
    app = create_app(
        session_env, RapoAction, RapoObservation, env_name=env_id, state_cls=RapoState,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout_s),
    )

    @app.get("/sessions", tags=["Environment Info"])
    def sessions() -> dict[str, Any]:
        """The envs open now (one per session, plus any a stateless /reset is using) and the limits."""
        with envs_lock:
            live = list(envs)
        return {"env_id": env_id, "open_envs": sum(not env.closed for env in live),
                "max_sessions": max_sessions, "idle_timeout_s": idle_timeout_s}

    return app


def _shared_retriever(retrieval: Retrieval) -> Retrieval:
    """``retrieval`` with a retriever URL replaced by one client that every session shares (one connection pool)."""
    if isinstance(retrieval, str):
        return retriever_from_url(retrieval)
    if isinstance(retrieval, Mapping) and isinstance(retrieval.get("retriever"), str):
        return {**retrieval, "retriever": retriever_from_url(retrieval["retriever"])}
    return retrieval
