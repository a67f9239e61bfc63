"""A served rapo env (``rapo env serve``) as a Gymnasium env again, over OpenEnv's own client.

`RemoteEnv` holds one OpenEnv ``/ws`` session (one env on the server) for its whole life: ``reset`` and ``step``
take and return what the local env does (text, reward, terminated, truncated, info), and its text spaces are
those of the served env, so Gymnasium's ``check_env`` passes on it. `RapoEnvClient` is the typed OpenEnv
``EnvClient`` underneath, for code that speaks OpenEnv itself (``async with RapoEnvClient(url) as client``).

Example:
    >>> env = RemoteEnv("http://127.0.0.1:8010")  # doctest: +SKIP
    >>> prompt, info = env.reset(seed=0, options={"task_index": 1})  # doctest: +SKIP
    >>> env.step("<python>print(6 * 7)</python>")[0]  # doctest: +SKIP
    ' <result>\\n42\\n</result>'
    >>> env.close()  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from rapo_env.openenv_server import RapoAction, RapoObservation, RapoState
from rapo_env.spaces import UnicodeText


class RemoteEnvError(RuntimeError):
    """The served env answered an error (its message says what failed; the session itself goes on)."""


class RapoEnvClient(EnvClient[RapoAction, RapoObservation, RapoState]):
    """OpenEnv's ``EnvClient`` for `rapo_env.openenv_server`'s wire types (``.sync()`` for blocking use)."""

    def _step_payload(self, action: RapoAction | str) -> dict[str, Any]:
        return {"text": action} if isinstance(action, str) else action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[RapoObservation]:
        observation = RapoObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                                      done=payload.get("done", False))
        return StepResult(observation=observation, reward=observation.reward, done=observation.done,
                          metadata=payload.get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> RapoState:
        return RapoState(**payload)


class RemoteEnv(gym.Env[str, str]):
    """The env served at ``url`` (``http://host:port``) as a ``gym.Env``: one server session, opened here.

    Args:
        url: The server's base URL (``rapo env serve`` prints it).
        connect_timeout_s: How long opening the session may take.
        message_timeout_s: How long one reset or step may take (a tool call included).

    Raises:
        ConnectionError: when no server answers at ``url``.
        RemoteEnvError: when the server refuses the session (at capacity, or its env could not be built).
    """

    metadata = {"render_modes": []}

    def __init__(self, url: str, connect_timeout_s: float = 10.0, message_timeout_s: float = 300.0):
        self.url = url
        self.client = RapoEnvClient(base_url=url, connect_timeout_s=connect_timeout_s,
                                    message_timeout_s=message_timeout_s).sync()
        self.client.connect()
        try:
            state = self._call(self.client.state)
        except BaseException:
            self.client.close()
            raise
        self.env_id = state.env_id
        self.tool_tags = tuple(state.tools)
        self.observation_space = UnicodeText(state.max_text_length)
        self.action_space = UnicodeText(state.max_text_length)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on the server (the same ``seed`` and ``options`` as the local env's reset)."""
        super().reset(seed=seed)
        observation = self._call(self.client.reset, seed=seed, options=dict(options or {})).observation
        return observation.text, observation.info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Send one model turn; the server runs its tool call."""
        if isinstance(action, bytes):
            action = action.decode("utf-8", "replace")
        if not isinstance(action, str):
            raise TypeError(f"the action must be text, not {type(action).__name__}")
        result = self._call(self.client.step, RapoAction(text=action))
        observation = result.observation
        return observation.text, float(result.reward or 0.0), observation.terminated, observation.truncated, \
            observation.info

    def state(self) -> RapoState:
        """The server session's episode (`RapoState`)."""
        return self._call(self.client.state)

    def close(self) -> None:
        """Close the session: the server closes its env. Closing twice is allowed."""
        self.client.close()
        super().close()

    @staticmethod
    def _call(method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except RuntimeError as error:
            if str(error).startswith("Server error:"):  # how OpenEnv's client reports an error reply
                raise RemoteEnvError(str(error).removeprefix("Server error: ")) from None
            raise
