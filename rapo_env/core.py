"""`ToolEnv`: the Gymnasium base class of rapo's tool-using tasks (the contract of DESIGN.md).

One ``step`` is one model turn. The env runs the *last* complete tool call of the turn
and returns `` <result>\\n...\\n</result>`` to append to the context. An ``<answer>``
ends the episode with the task's reward over the whole transcript; the tool-call or
turn limit truncates it, and so does an empty call to a reference-mode python tool
(``episode_end="empty_call"``). Bad model output never raises: it gets an observation that
says what was wrong and, at the end, the format penalty.

Example:
    >>> from rapo_env.core import ToolEnv
    >>> from rapo_env.rewards.equivalence import MathVerifyReward
    >>> from rapo_env.tasks.procedural_math import ProceduralMath
    >>> from rapo_tools.python_tool import PythonTool
    >>> env = ToolEnv(ProceduralMath(num_tasks=2), [PythonTool("subprocess")], MathVerifyReward(), "Use tools.")
    >>> prompt, info = env.reset(seed=0, options={"task_index": 0})
    >>> obs, reward, terminated, truncated, info = env.step("<python>print(6 * 7)</python>")
    >>> obs
    ' <result>\\n42\\n</result>'
    >>> env.close()

`copy_episode` branches an episode in progress into another env of the same construction (ARPO-style
rollouts): the target is reset on the same task, then takes over the source's transcript and counters.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium.error import ResetNeeded

from rapo_env.protocol import (
    count_tool_calls,
    find_last_tool_call,
    find_unclosed_tag,
    format_result,
    has_answer,
)
from rapo_env.rewards import Score
from rapo_env.spaces import UnicodeText
from rapo_env.tasks.base import Task
from rapo_tools.base import Tool
from rapo_tools.python_tool import EMPTY_CALL

DEFAULT_MAX_TEXT_LENGTH = 65_536


class ToolEnv(gym.Env[str, str]):
    """A question-answering episode in which the agent calls tools by tags.

    Args:
        tasks: The questions (any sequence of `Task`).
        tools: The tools the agent may call; each tool's ``name`` is its tag.
        reward: Scores the finished transcript against the task.
        system_prompt: Explains the tags and tools; given in ``info["system_prompt"]`` on reset.
        max_tool_calls: Tool calls allowed per episode; one more truncates it.
        max_turns: Turns allowed per episode (default: ``max_tool_calls + 2``).
        max_text_length: Longest observation and action, in characters.
        prompt_template: Format of the user turn, with ``{question}``.
        render_mode: ``"ansi"`` renders the transcript as text.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        tasks: Sequence[Task],
        tools: Sequence[Tool],
        reward: Callable[[str, Task], Score],
        system_prompt: str,
        max_tool_calls: int = 3,
        max_turns: int | None = None,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
        prompt_template: str = "{question}",
        render_mode: str | None = None,
    ):
        if len(tasks) == 0:
            raise ValueError("ToolEnv needs at least one task")
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None")
        self.tasks = tasks
        self.tools = {tool.name: tool for tool in tools}
        self.reward_fn = reward
        self.system_prompt = system_prompt
        self.max_tool_calls = max_tool_calls
        self.max_turns = max_turns if max_turns is not None else max_tool_calls + 2
        self.max_text_length = max_text_length
        self.prompt_template = prompt_template
        self.render_mode = render_mode
        self.observation_space = UnicodeText(max_text_length)
        self.action_space = UnicodeText(max_text_length)
        self.task: Task | None = None
        self.transcript = ""
        self.tool_calls = 0
        self.turn = 0
        self._done = True

    @property
    def tool_tags(self) -> tuple[str, ...]:
        """The tags of this env's tools."""
        return tuple(self.tools)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode. ``options``: ``task_index`` or ``task_id`` picks the question (else a
        random one); ``rollout_index`` is passed through to ``info`` for group-aware wrappers."""
        super().reset(seed=seed)
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise TypeError(f"reset options must be a dict such as {{'task_index': 0}}, got {type(options).__name__} "
                            f"{options!r}")
        if "task_id" in options:
            index_of = getattr(self.tasks, "index_of", None)
            if index_of is None:
                raise ValueError("these tasks have no id lookup; pass options={'task_index': ...}")
            task_index = index_of(options["task_id"])
        elif "task_index" in options:
            task_index = options["task_index"]
            # int() would silently truncate 1.9 to 1 and pick another question than the caller meant.
            if isinstance(task_index, bool) or not isinstance(task_index, numbers.Integral):
                raise TypeError(f"task_index must be an integer, got {type(task_index).__name__} {task_index!r}")
            task_index = int(task_index)
            if not 0 <= task_index < len(self.tasks):
                raise IndexError(f"task_index {task_index} is outside 0..{len(self.tasks) - 1}")
        else:
            task_index = int(self.np_random.integers(len(self.tasks)))
        self.task = self.tasks[task_index]
        self.transcript, self.tool_calls, self.turn, self._done = "", 0, 0, False
        prompt = self.prompt_template.format(question=self.task.question)[: self.max_text_length]
        return prompt, {
            "system_prompt": self.system_prompt,
            "task_id": self.task.id,
            "task_index": task_index,
            "rollout_index": options.get("rollout_index"),
            "tools": list(self.tool_tags),
        }

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take one model turn; see the class docstring for what happens."""
        if self._done or self.task is None:
            raise ResetNeeded("the episode has ended (or never started): call reset() before step()")
        if isinstance(action, bytes):
            action = action.decode("utf-8", "replace")
        info: dict[str, Any] = {"tool": None, "tool_ok": None, "tool_latency_s": 0.0, "tool_error": None,
                                "format_error": None}
        self.turn += 1
        terminated = truncated = False
        if not isinstance(action, str):
            info["format_error"] = f"the action must be text, not {type(action).__name__}"
            observation = format_result("Your turn was not text.")
            action = ""
        elif has_answer(action):
            terminated, observation = True, ""
            info["episode_end"] = "answer"
        else:
            observation, truncated = self._run_tool_turn(action, info)
        self.transcript += action + observation
        if not (terminated or truncated) and self.turn >= self.max_turns:
            truncated, info["episode_end"] = True, "turn_limit"
        reward = 0.0
        if terminated or truncated:
            score = self.reward_fn(self.transcript, self.task)
            reward, info["metrics"] = float(score.reward), dict(score.metrics)
            info["format_error"] = info["format_error"] or score.format_error  # why a format penalty was given
            self._done = True
        info.update(tool_calls=self.tool_calls, turn=self.turn)
        return observation[: self.max_text_length], reward, terminated, truncated, info

    def _run_tool_turn(self, action: str, info: dict[str, Any]) -> tuple[str, bool]:
        call = find_last_tool_call(action, self.tool_tags)
        if call is None:
            unclosed = find_unclosed_tag(action, self.tool_tags)
            info["format_error"] = f"unclosed <{unclosed}> tag" if unclosed else "no tool call and no answer"
            message = (
                f"Your <{unclosed}> call was not closed; end it with </{unclosed}>."
                if unclosed
                else "No tool call or answer was found. Call a tool as "
                + " or ".join(f"<{tag}>...</{tag}>" for tag in self.tool_tags)
                + ", or give the final answer as <answer>\\boxed{...}</answer>."
            )
            return format_result(message), False
        if count_tool_calls(action, self.tool_tags) > 1:
            info["format_error"] = "several tool calls in one turn; only the last one was run"
        info["tool"] = call.tag
        if self.tool_calls >= self.max_tool_calls:
            info["episode_end"] = "tool_limit"
            info["tool_ok"], info["tool_error"] = False, "tool_limit"
            return format_result(f"The limit of {self.max_tool_calls} tool calls is reached."), True
        tool = self.tools[call.tag]
        result = tool.call(call.argument)
        self.tool_calls += 1
        info.update(tool_ok=result.ok, tool_latency_s=result.latency_s, tool_error=result.error,
                    tool_truncated=result.truncated)
        if result.error == EMPTY_CALL:  # a reference-mode tool: the official rollout stops at an empty call
            info["episode_end"] = "empty_call"
            return "", True
        return format_result(result.text, defuse_tags=not tool.reference_output), False

    def copy_episode_from(self, source: ToolEnv) -> None:
        """Take over ``source``'s episode in progress: its transcript, tool-call and turn counters.

        Call it right after resetting this env on the same task (see `copy_episode`). Copying the text
        state is enough because the tools keep nothing between calls (every python call runs in a fresh
        sandbox process, searches and page fetches are single requests), and this env keeps its own tools.

        Raises:
            ValueError: when the two envs are not on the same question.
        """
        if self.task is None or source.task is None or self.task.id != source.task.id:
            raise ValueError("copy_episode_from needs this env reset on the source's task")
        self.transcript, self.tool_calls, self.turn, self._done = (
            source.transcript, source.tool_calls, source.turn, source._done)

    def render(self) -> str | None:
        """The transcript so far, for ``render_mode="ansi"``."""
        return self.transcript if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Release the tools."""
        for tool in self.tools.values():
            tool.close()
        super().close()


def copy_episode(source: gym.Env, target: gym.Env) -> None:
    """Continue ``source``'s episode in ``target``: layer by layer, each that defines ``copy_episode_from``
    takes over the source layer's per-episode state.

    ``target`` must be built like ``source`` (the same wrappers around the same env class) and reset on
    the same task; what its reset set up for itself (e.g. a wrapper's random generator) stays its own.
    Layers without ``copy_episode_from`` (``OrderEnforcing``, the token-id wrappers) keep no per-step
    state; a wrapper that does (a step counter, a history) needs the method to be branched correctly.

    Example:
        >>> import gymnasium as gym, rapo_env
        >>> make = lambda: gym.make("RAPO-Math-v0", num_tasks=2, sandbox="subprocess")
        >>> source, target = make(), make()
        >>> _ = source.reset(options={"task_index": 1})
        >>> _ = source.step("<python>print(1)</python>")
        >>> _ = target.reset(options={"task_index": 1})
        >>> copy_episode(source, target)
        >>> target.unwrapped.transcript == source.unwrapped.transcript, target.unwrapped.tool_calls
        (True, 1)
        >>> source.close(); target.close()

    Raises:
        TypeError: when the two wrapper stacks differ.
    """
    while True:
        if type(source) is not type(target):
            raise TypeError(f"cannot copy an episode of {type(source).__name__} into {type(target).__name__}: "
                            "the envs must be built the same way")
        copy_from = getattr(type(target), "copy_episode_from", None)
        if copy_from is not None:
            copy_from(target, source)
        if not isinstance(target, gym.Wrapper):
            return
        source, target = source.env, target.env
