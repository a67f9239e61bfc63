"""A rapo env served over the OpenEnv protocol, on loopback with a real server: OpenEnv's own client, the Gymnasium
client (`RemoteEnv`, through ``check_env``), failing sessions, 64 sessions at once, closing and idle sessions."""

from __future__ import annotations

import asyncio
import time

import gymnasium as gym
import httpx
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("openenv")

from openenv.core import GenericEnvClient  # noqa: E402

import rapo_env  # noqa: E402, F401  (registers the envs)
from rapo_buffers.candidates import Candidate, StaticRetriever  # noqa: E402
from rapo_env.openenv_server import create_rapo_app  # noqa: E402
from rapo_env.remote import RapoEnvClient, RemoteEnv, RemoteEnvError  # noqa: E402
from rapo_env.spaces import UnicodeText  # noqa: E402
from rapo_tools.serving import ConnectionLimits, serve_in_thread  # noqa: E402

ENV_KWARGS = {"num_tasks": 8, "sandbox": "subprocess"}
MAX_SESSIONS = 64
PYTHON_TURN = "<python>print(6 * 7)</python>"


class CrashingEnv(gym.Env):
    """A text env whose step raises on ``<crash/>`` and whose construction fails while ``fail_init`` is set."""

    observation_space = action_space = UnicodeText(256)
    fail_init = False

    def __init__(self):
        if CrashingEnv.fail_init:
            raise OSError("no resources left for another env")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "say something", {}

    def step(self, action):
        if "<crash/>" in action:
            raise RuntimeError("boom")
        return f" <result>{action}</result>", 0.0, False, False, {"tool": None}


gym.register("RapoTest-Crashing-v0", entry_point=CrashingEnv)


@pytest.fixture(scope="session")
def math_server():
    """RAPO-Math-v0 served with 64 sessions; a request head must come within 0.5 s, which a session outlives."""
    app = create_rapo_app("RAPO-Math-v0", ENV_KWARGS, max_sessions=MAX_SESSIONS)
    with serve_in_thread(app, connection_limits=ConnectionLimits(header_timeout_s=0.5)) as url:
        yield url


@pytest.fixture(scope="module")
def crashing_server():
    with serve_in_thread(create_rapo_app("RapoTest-Crashing-v0", max_sessions=4)) as url:
        yield url


@pytest.fixture(scope="module")
def local_env():
    env = gym.make("RAPO-Math-v0", **ENV_KWARGS)
    yield env
    env.close()


def open_envs(url: str) -> int:
    return httpx.get(f"{url}/sessions").json()["open_envs"]


def wait_for_open_envs(url: str, count: int, deadline_s: float = 60.0) -> None:
    """Poll ``/sessions`` until ``count`` envs are open (a closed session's env is closed by the server after the
    client has gone); fail past the deadline."""
    deadline = time.monotonic() + deadline_s
    while open_envs(url) != count:
        assert time.monotonic() < deadline, f"{open_envs(url)} envs open, expected {count}"
        time.sleep(0.05)


def correct_answer(local_env, task_index: int) -> str:
    return f"<answer>\\boxed{{{local_env.unwrapped.tasks[task_index].answers[0]}}}</answer>"


def test_openenv_client_resets_and_steps(math_server, local_env):
    local_prompt, local_info = local_env.reset(seed=0, options={"task_index": 3})
    with GenericEnvClient(base_url=math_server).sync() as client:
        reset = client.reset(seed=0, task_index=3)
        assert reset.observation["text"] == local_prompt
        assert reset.observation["system_prompt"] == local_info["system_prompt"]
        assert reset.observation["info"]["task_id"] == local_info["task_id"] and not reset.done
        tool = client.step({"text": PYTHON_TURN})
        assert tool.observation["text"] == " <result>\n42\n</result>"
        assert (tool.reward, tool.done, tool.observation["info"]["tool"]) == (0.0, False, "python")
        answer = client.step({"text": correct_answer(local_env, 3)})
        assert answer.done and answer.observation["terminated"] and not answer.observation["truncated"]
        assert answer.reward == 1.0
        assert client.state()["episode_over"] is True


def test_typed_client_and_schema_carry_the_field_docs(math_server):
    async def episode():
        async with RapoEnvClient(base_url=math_server) as client:
            reset = await client.reset(task_index=0)
            step = await client.step(PYTHON_TURN)
            return reset.observation, step.observation, await client.state()

    reset, step, state = asyncio.run(episode())
    assert reset.system_prompt and step.text == " <result>\n42\n</result>"
    assert (state.env_id, state.step_count, state.tools) == ("RAPO-Math-v0", 1, ["python"])
    schema = httpx.get(f"{math_server}/schema").json()
    for part, field in (("action", "text"), ("observation", "terminated"), ("state", "max_text_length")):
        assert schema[part]["properties"][field]["description"], (part, field)
    assert httpx.get(f"{math_server}/metadata").json()["name"] == "RAPO-Math-v0"


def test_remote_env_passes_check_env(math_server):
    env = RemoteEnv(math_server)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_remote_env_plays_like_the_local_env(math_server, local_env):
    env = RemoteEnv(math_server)
    try:
        assert env.observation_space == local_env.observation_space and env.tool_tags == ("python",)
        assert env.reset(seed=5, options={"task_index": 2}) == local_env.reset(seed=5, options={"task_index": 2})
        for action in ("no tool call here", PYTHON_TURN, correct_answer(local_env, 2)):
            remote, local = env.step(action), local_env.step(action)
            for step in (remote, local):
                step[4].pop("tool_latency_s")
            assert remote == local
        with pytest.raises(RemoteEnvError, match="send a reset"):
            env.step(PYTHON_TURN)
    finally:
        env.close()


def test_a_session_outlives_the_servers_request_head_timeout(math_server):
    env = RemoteEnv(math_server)
    try:
        env.reset(options={"task_index": 0})
        time.sleep(1.0)  # twice the fixture's header timeout, which closes idle plain HTTP connections
        assert env.step(PYTHON_TURN)[0] == " <result>\n42\n</result>"
    finally:
        env.close()


def test_hostile_actions_get_error_replies_and_the_session_goes_on(math_server):
    with GenericEnvClient(base_url=math_server).sync() as client:
        with pytest.raises(RuntimeError, match="send a reset before a step"):
            client.step({"text": PYTHON_TURN})
        with pytest.raises(RuntimeError, match="task_index 99 is outside 0..7"):
            client.reset(task_index=99)
        client.reset(task_index=1)
        for bad in ({}, {"text": 7}, {"text": "x", "extra": 1}):
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                client.step(bad)
        # Code that kills its own interpreter is a failed tool call, not a failed session.
        died = client.step({"text": "<python>import os; os._exit(3)</python>"})
        assert died.observation["info"]["tool_ok"] is False and not died.done
        assert client.step({"text": PYTHON_TURN}).observation["text"] == " <result>\n42\n</result>"


def test_a_crashing_step_gets_a_clear_error_and_other_sessions_go_on(crashing_server):
    crashing, healthy = RemoteEnv(crashing_server), RemoteEnv(crashing_server)
    try:
        crashing.reset()
        healthy.reset()
        with pytest.raises(RemoteEnvError, match="RapoTest-Crashing-v0 step failed: RuntimeError: boom; send a reset"):
            crashing.step("<crash/>")
        with pytest.raises(RemoteEnvError, match="send a reset"):
            crashing.step("hello")  # the failed episode is over
        assert healthy.step("hello")[0] == " <result>hello</result>"
        crashing.reset()
        assert crashing.step("again")[0] == " <result>again</result>"
        assert httpx.get(f"{crashing_server}/health").json()["status"] == "healthy"
    finally:
        crashing.close()
        healthy.close()


def test_an_env_that_cannot_be_built_refuses_only_its_session(crashing_server):
    healthy = RemoteEnv(crashing_server)
    CrashingEnv.fail_init = True
    try:
        with GenericEnvClient(base_url=crashing_server).sync() as client:
            with pytest.raises(RuntimeError, match="factory 'RapoTest-Crashing-v0' failed.*FACTORY_ERROR"):
                client.reset()
        with pytest.raises(RemoteEnvError, match="FACTORY_ERROR"):
            RemoteEnv(crashing_server)
    finally:
        CrashingEnv.fail_init = False
    try:
        healthy.reset()
        assert healthy.step("still here")[0] == " <result>still here</result>"
        later = RemoteEnv(crashing_server)
        later.close()
    finally:
        healthy.close()


def test_64_concurrent_sessions_each_finish_an_episode(math_server, local_env):
    wait_for_open_envs(math_server, 0)
    answers = {index: correct_answer(local_env, index) for index in range(ENV_KWARGS["num_tasks"])}

    async def episode(index: int, all_open: asyncio.Event) -> tuple[float, str]:
        async with RapoEnvClient(base_url=math_server, message_timeout_s=300.0) as client:
            await all_open.wait()  # every episode plays while all 64 sessions are open
            await client.reset(seed=index, task_index=index % 8)
            tool = await client.step(PYTHON_TURN)
            answer = await client.step(answers[index % 8])
            return answer.reward, tool.observation.text

    async def all_episodes():
        all_open = asyncio.Event()
        tasks = [asyncio.ensure_future(episode(index, all_open)) for index in range(MAX_SESSIONS)]
        await asyncio.get_running_loop().run_in_executor(None, wait_for_open_envs, math_server, MAX_SESSIONS)
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            async with GenericEnvClient(base_url=math_server) as extra:
                await extra.reset()
        all_open.set()
        return await asyncio.gather(*tasks)

    results = asyncio.run(all_episodes())
    assert results == [(1.0, " <result>\n42\n</result>")] * MAX_SESSIONS
    wait_for_open_envs(math_server, 0)


def test_a_session_closed_by_its_client_frees_its_env(math_server):
    wait_for_open_envs(math_server, 0)
    env = RemoteEnv(math_server)
    env.reset(options={"task_index": 0})
    assert open_envs(math_server) == 1
    env.close()
    wait_for_open_envs(math_server, 0)


def test_retrieval_splices_step_traces_into_served_episodes(math_server):
    retriever = StaticRetriever([Candidate("<python>print(2 + 2)</python> <result>\n4\n</result>", 1.0, 0.9)])
    app = create_rapo_app("RAPO-Math-v0", ENV_KWARGS, {"retriever": retriever, "retrieve_prob": 1.0}, max_sessions=2)
    with serve_in_thread(app) as url:
        env = RemoteEnv(url)
        try:
            _, info = env.reset(options={"task_index": 0, "rollout_index": 12})
            assert info["hybrid"] is True
            observation, _, _, _, info = env.step(PYTHON_TURN)
            start, end = info["retrieval"]["span"]
            assert observation[start:end] == info["retrieval"]["text"] and "print(2 + 2)" in observation
        finally:
            env.close()
    assert retriever.queries


@pytest.mark.slow
def test_an_idle_session_is_closed_and_told_so():
    """OpenEnv's reaper checks every 5 s at the least; the idle session's next step says what happened."""
    app = create_rapo_app("RAPO-Math-v0", ENV_KWARGS, max_sessions=2, idle_timeout_s=0.5)
    with serve_in_thread(app) as url:
        env = RemoteEnv(url)
        try:
            env.reset(options={"task_index": 0})
            wait_for_open_envs(url, 0)
            with pytest.raises(RemoteEnvError, match="was closed .*idle.*connect again"):
                env.step(PYTHON_TURN)
        finally:
            env.close()


def test_bad_settings_fail_when_the_app_is_made():
    with pytest.raises(gym.error.Error, match="NoSuchEnv"):
        create_rapo_app("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="procedural split"):
        create_rapo_app("RAPO-Math-v0", {"split": "bogus"})
    with pytest.raises(ValueError, match="unknown retriever"):
        create_rapo_app("RAPO-Math-v0", ENV_KWARGS, "not-a-url")
    with pytest.raises(ValueError, match="max_sessions"):
        create_rapo_app("RAPO-Math-v0", ENV_KWARGS, max_sessions=0)
