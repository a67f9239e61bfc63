"""Serve a step-trace buffer at ``POST /retrieve`` (reference flags):
``python scripts/retrieve_server.py --corpus_path B --index_path I --topk 3``.

Same as ``rapo buffer serve``; see ``--help`` for host, port and batching.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapo_cli.buffer import add_serve_arguments, run_serve  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_serve_arguments(parser)
    sys.exit(run_serve(parser.parse_args()))
