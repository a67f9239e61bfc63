"""``rapo search``: build a knowledge-search index and serve it at ``POST /wikiSearch``.

    rapo search build-index --corpus_path wiki-18.jsonl --index_path wiki.faiss [--index_type hnsw]
    rapo search serve --index_path wiki.faiss [--corpus_path wiki-18.jsonl] --topk 3 --port 8002

The flags are those of the reference scripts (``scripts/build_search_index.py``,
``scripts/search_server.py``), which call the same functions. ``rapo search serve`` listens on port 8002 by
default (`SEARCH_PORT`, or ``$RAPO_SEARCH_PORT``): 8000 is vLLM's and the OpenAI-compatible server's, 8001 the
step-trace retrieval service's (``rapo buffer serve``), so the pipeline's services run side by side.
"""

from __future__ import annotations

import argparse
import logging
import os

from rapo_cli import checks
from rapo_tools.search.server import add_build_arguments, add_serve_arguments, run_build, run_serve

HELP = "Build a knowledge-search index (build-index) and serve it at POST /wikiSearch (serve)."

_ACTIONS = {"build-index": run_build, "serve": run_serve}
SEARCH_PORT = 8002
"""Default port of ``rapo search serve``: not vLLM's 8000, not the retrieval service's 8001."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add_build_arguments(
        actions.add_parser("build-index", help="encode a corpus and save a FAISS index with its sidecar")
    )
    serve = actions.add_parser("serve", help="serve an index at POST /wikiSearch with micro-batching")
    add_serve_arguments(serve)
    serve.set_defaults(port=int(os.environ.get("RAPO_SEARCH_PORT", SEARCH_PORT)))


def check_arguments(args: argparse.Namespace) -> None:
    """The files each action reads exist, and the index can be written."""
    if args.action == "build-index":
        checks.existing_file(args.corpus_path, "--corpus_path", "give a wiki-18 JSONL or a {title, text} JSONL/JSON")
        checks.output_file(args.index_path, "--index_path")
    else:
        checks.existing_file(args.index_path, "--index_path", "build one with `rapo search build-index`")
        if args.corpus_path is not None:
            checks.existing_file(args.corpus_path, "--corpus_path", "give the corpus the index was built from")
    checks.model(args.model, "--model")


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return _ACTIONS[args.action](args)
