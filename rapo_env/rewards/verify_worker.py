"""A long-lived math-verify process: reads ``{"gold", "prediction"}`` JSON lines, answers ``{"equivalent"}``.

math-verify's own time limit uses ``signal.alarm``, which only works in a main thread.
Envs run in threads and in vector-env worker processes, so `rapo_env.rewards.math`
runs math-verify here, in the main thread of a child process it can kill if it hangs.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys

READY_LINE = "ready\n"
"""What a worker prints once math-verify is imported, before it reads its first request."""


def _accepts(function, argument: str) -> bool:
    return argument in inspect.signature(function).parameters


def _equivalent(gold: str, prediction: str, timeout_s: int) -> bool:
    from math_verify import parse, verify

    # Older math-verify releases have fixed internal time limits and no timeout arguments.
    parse_options = {"parsing_timeout": timeout_s} if _accepts(parse, "parsing_timeout") else {}
    verify_options = {"timeout_seconds": timeout_s} if _accepts(verify, "timeout_seconds") else {}
    parsed_gold = parse(f"${gold}$", **parse_options)
    parsed_prediction = parse(f"${prediction}$", **parse_options)
    return bool(parsed_gold and parsed_prediction and verify(parsed_gold, parsed_prediction, **verify_options))


def main() -> None:
    logging.disable(logging.WARNING)  # math-verify logs deprecation chatter on every call
    import math_verify  # noqa: F401  (the slow import happens before the first check's clock starts)

    sys.stdout.write(READY_LINE)
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = {"equivalent": _equivalent(request["gold"], request["prediction"], int(request.get("timeout", 5)))}
        except Exception as error:  # one pathological expression must not stop the worker
            reply = {"equivalent": False, "error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
