"""Build the knowledge-search index (reference flags).

``python scripts/build_search_index.py --corpus_path C --index_path I``.

Same as ``rapo search build-index``; see ``--help`` for the index type and encoder options.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapo_tools.search.server import add_build_arguments, run_build  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_build_arguments(parser)
    sys.exit(run_build(parser.parse_args()))
