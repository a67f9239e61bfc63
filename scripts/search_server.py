"""Serve the knowledge-search index at ``POST /wikiSearch`` (reference flags):
``python scripts/search_server.py --corpus_path C --index_path I --topk 3``.

Same as ``rapo search serve``; see ``--help`` for host, port, batching and limits.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapo_tools.search.server import add_serve_arguments, run_serve  # noqa: E402

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_serve_arguments(parser)
    sys.exit(run_serve(parser.parse_args()))
