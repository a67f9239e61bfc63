"""Index a step-trace buffer (reference flags):
``python scripts/build_retrieve_index.py --corpus_path B --index_path I``.

Same as ``rapo buffer index``; see ``--help`` for the index kind and encoder options.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapo_cli.buffer import add_index_arguments, run_index  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_index_arguments(parser)
    sys.exit(run_index(parser.parse_args()))
