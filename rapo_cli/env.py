"""``rapo env serve``: serve any registered rapo env over the OpenEnv protocol (``/ws`` sessions, one env each).

    rapo env serve RAPO-Math-v0 --port 8010 --max-sessions 64 --env-kwargs '{"num_tasks": 100}'
    rapo env serve RAPO-Math-v0 --retriever default                # splice step traces of the default buffer
    rapo env serve RAPO-QA-v0 --retriever http://127.0.0.1:8001 --retrieval-kwargs '{"retrieve_prob": 1.0}'

Clients: OpenEnv's own (``GenericEnvClient(base_url="http://127.0.0.1:8010")``, or `rapo_env.remote.RapoEnvClient`
with typed observations) and `rapo_env.remote.RemoteEnv`, a ``gym.Env`` over one session. The default port is 8010
(`ENV_PORT`, or ``$RAPO_ENV_PORT``), beside vLLM's 8000, ``rapo buffer serve``'s 8001 and ``rapo search serve``'s
8002. Needs the ``openenv`` extra.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os

from rapo_cli import checks
from rapo_cli.errors import UsageError

HELP = "Serve a registered rapo env over the OpenEnv protocol (serve)."

ENV_PORT = 8010
"""Default port of ``rapo env serve``: not vLLM's 8000, the retrieval service's 8001 or the search service's 8002."""


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from rapo_tools.serving import add_connection_arguments

    parser.add_argument("env", metavar="ENV_ID", help="a registered env id (`rapo envs` lists them)")
    parser.add_argument("--env-kwargs", default="{}", help="JSON dict of gym.make keyword arguments")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 to serve other machines)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("RAPO_ENV_PORT", ENV_PORT)),
                        help=f"port to listen on (default {ENV_PORT}, or $RAPO_ENV_PORT)")
    parser.add_argument("--max-sessions", type=int, default=64, help="sessions (envs) at once; more are refused")
    parser.add_argument("--idle-timeout", type=float, default=600.0,
                        help="seconds a session may send nothing before its env is closed (0: never)")
    parser.add_argument("--retriever", default=None, metavar="URL|default",
                        help="splice retrieved step traces (StepTraceRetrievalWrapper): the URL of a /retrieve "
                             "service (`rapo buffer serve`) or `default` (the default buffer, built in-process)")
    parser.add_argument("--retrieval-kwargs", default="{}",
                        help="JSON dict of StepTraceRetrievalWrapper arguments (retrieve_prob, topk, ...)")
    add_connection_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    help_text = "serve an env at /ws (OpenEnv sessions), /schema, /metadata and /health"
    add_serve_arguments(actions.add_parser("serve", help=help_text, description=help_text))


def retrieval_kwargs(text: str) -> dict:
    """``--retrieval-kwargs`` as a dict whose keys are `StepTraceRetrievalWrapper` arguments."""
    from rapo_env.wrappers.retrieval import StepTraceRetrievalWrapper

    value = checks.json_object(text, "--retrieval-kwargs", '{"retrieve_prob": 1.0}')
    accepted = set(inspect.signature(StepTraceRetrievalWrapper).parameters) - {"env", "retriever"}
    unknown = sorted(set(value) - accepted)
    if unknown:
        raise UsageError(f"--retrieval-kwargs: StepTraceRetrievalWrapper takes no argument {unknown[0]!r}; it takes "
                         f"{', '.join(sorted(accepted))}")
    return value


def check_arguments(args: argparse.Namespace) -> tuple[dict, dict]:
    """Every option checked before the first env is built; returns the env kwargs and the retrieval kwargs."""
    checks.env_id(args.env, "ENV_ID")
    env_kwargs = checks.env_kwargs(args.env_kwargs, env=args.env)
    wrapper_kwargs = retrieval_kwargs(args.retrieval_kwargs)
    if wrapper_kwargs and args.retriever is None:
        raise UsageError("--retrieval-kwargs needs --retriever (a /retrieve URL or `default`)")
    if args.retriever is not None and args.retriever != "default" and \
            not args.retriever.startswith(("http://", "https://")):
        raise UsageError(f"--retriever {args.retriever!r}: give the http(s) URL of a /retrieve service "
                         "(`rapo buffer serve`) or `default`")
    if args.max_sessions < 1:
        raise UsageError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    if args.idle_timeout < 0:
        raise UsageError(f"--idle-timeout must be >= 0 (0: never), got {args.idle_timeout}")
    return env_kwargs, wrapper_kwargs


def run_serve(args: argparse.Namespace) -> int:
    env_kwargs, wrapper_kwargs = check_arguments(args)
    from rapo_env.openenv_server import create_rapo_app
    from rapo_tools.serving import connection_limits, serve

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    retrieval = None
    if args.retriever is not None:
        from rapo_agents.buffer_build.defaults import resolve_retriever

        retrieval = {**wrapper_kwargs, "retriever": resolve_retriever(args.retriever)}
    try:
        app = create_rapo_app(args.env, env_kwargs, retrieval, max_sessions=args.max_sessions,
                              idle_timeout_s=args.idle_timeout or None)
    except (TypeError, ValueError, KeyError, IndexError) as error:  # the env or the wrapper rejected a setting
        raise UsageError(f"{args.env} could not be built with --env-kwargs {json.dumps(env_kwargs)}"
                         f"{' and --retrieval-kwargs ' + args.retrieval_kwargs if wrapper_kwargs else ''}: "
                         f"{type(error).__name__}: {' '.join(str(error).split())}") from None
    print(f"serving {args.env} over OpenEnv at http://{args.host}:{args.port} (WebSocket /ws, up to "
          f"{args.max_sessions} sessions)", flush=True)
    serve(app, host=args.host, port=args.port, connection_limits=connection_limits(args))
    return 0


def run(args: argparse.Namespace) -> int:
    return run_serve(args)
