"""The knowledge search service (``POST /wikiSearch``, ``GET /health``) and its command-line entry points.

The flags match the reference scripts: ``build_search_index.py --corpus_path --index_path``
and ``search_server.py --corpus_path --index_path --topk``. The same functions back
``rapo search build-index`` and ``rapo search serve``.

Example:
    >>> import httpx
    >>> from rapo_tools.search.corpus import Passage
    >>> from rapo_tools.serving import serve_in_thread
    >>> wiki = WikiSearch.from_passages([Passage("0", "Oslo", "Oslo is the capital of Norway.")])
    >>> with serve_in_thread(create_wiki_search_app(wiki)) as url:
    ...     answer = httpx.post(f"{url}/wikiSearch", json={"queries": ["Norway"], "topk": 1}, timeout=60).json()
    ...     rich = httpx.post(f"{url}/wikiSearch", json={"queries": ["Norway"], "document_format": "object"}).json()
    >>> answer["result"][0][0]["document"]  # the reference's reply: the wiki-18 contents string
    '"Oslo"\\nOslo is the capital of Norway.'
    >>> rich["result"][0][0]["document"]["title"]
    'Oslo'
"""

from __future__ import annotations

import argparse
import logging
import os

from fastapi import FastAPI

from rapo_tools.search.embedding import REFERENCE_SEARCH_ENCODER, SEARCH_ENCODER, Embedder
from rapo_tools.search.faiss_index import INDEX_KINDS, IndexConfig
from rapo_tools.search.service import BatchingConfig, ServiceLimits, create_search_app
from rapo_tools.search.wiki_search import WikiSearch, build_corpus_index
from rapo_tools.serving import add_connection_arguments, connection_limits, serve

DOCUMENT_FORMATS = {"contents": lambda document: document["contents"], "object": lambda document: document}
"""``document_format`` choices of ``/wikiSearch``: ``contents`` (default) is the reference's reply, the wiki-18
``contents`` string (``"Title"\\ntext``) that the reference's ``WikiSearchTool`` splits on newlines;
``object`` is ``{id, contents, title, text}``."""
ENCODINGS = {"paper": (SEARCH_ENCODER, "title_text"), "reference": (REFERENCE_SEARCH_ENCODER, "contents")}
"""``--encoder`` choices: (encoder spec, embedded text) of the paper mode (mean pooling of title and text) and
of the reference (last-token state of the raw ``contents``, 256 tokens)."""

logger = logging.getLogger(__name__)


def create_wiki_search_app(
    wiki: WikiSearch,
    default_topk: int = 3,
    limits: ServiceLimits | None = None,
    batching: BatchingConfig | None = None,
) -> FastAPI:
    """The ``/wikiSearch`` app over a loaded `WikiSearch` (closed when the server stops).

    Documents go out as the reference's ``contents`` strings unless a request asks for
    ``"document_format": "object"`` (see `DOCUMENT_FORMATS`).
    """
    return create_search_app(
        wiki.search_results,
        route="/wikiSearch",
        limits=limits,
        batching=batching,
        health_info=wiki.info,
        title="rapo wikiSearch",
        on_shutdown=wiki.close,
        default_topk=default_topk,
        document_formats=DOCUMENT_FORMATS,
    )


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``build_search_index.py`` / ``rapo search build-index``."""
    parser.add_argument(
        "--corpus_path",
        required=True,
        help="corpus file: wiki-18 JSONL, {title,text} JSON/JSONL, or HotpotQA title->sentences JSON",
    )
    parser.add_argument(
        "--index_path", required=True, help="where to write the FAISS index (a .json sidecar is written next to it)"
    )
    parser.add_argument(
        "--index_type",
        choices=INDEX_KINDS,
        default="hnsw",
        help="flat (exact), hnsw (reference: M=32, efC 200, efS 128) or ivfpq (huge corpora)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="sentence-transformers model name or path (default: the embedded all-MiniLM-L6-v2)",
    )
    parser.add_argument(
        "--encoder",
        choices=tuple(ENCODINGS),
        default="paper",
        help="paper: mean pooling of title and text; reference: the official code's last-token state of the raw "
        "contents (256 tokens). Recorded in the sidecar; queries are encoded the same way",
    )
    parser.add_argument("--batch_size", type=int, default=64, help="texts per encoder forward pass")
    parser.add_argument("--chunk_size", type=int, default=4096, help="passages read and encoded per chunk")
    parser.add_argument("--device", default=None, help="encoder device (default: cuda when available)")
    parser.add_argument("--hnsw_m", type=int, default=32, help="HNSW neighbours per node")
    parser.add_argument("--ef_construction", type=int, default=200, help="HNSW build-time candidate list")
    parser.add_argument("--ef_search", type=int, default=128, help="HNSW search-time candidate list")
    parser.add_argument("--ivf_nlist", type=int, default=4096, help="IVF-PQ coarse clusters")
    parser.add_argument("--pq_m", type=int, default=48, help="IVF-PQ sub-quantizers (must divide the dimension)")


def run_build(args: argparse.Namespace) -> int:
    """Build and save the index; prints the sidecar summary."""
    config = IndexConfig(
        kind=args.index_type,
        hnsw_m=args.hnsw_m,
        ef_construction=args.ef_construction,
        ef_search=args.ef_search,
        ivf_nlist=args.ivf_nlist,
        pq_m=args.pq_m,
    )
    encoder, embed = ENCODINGS[args.encoder]
    embedder = Embedder(args.model, device=args.device, batch_size=args.batch_size)
    sidecar = build_corpus_index(
        args.corpus_path, args.index_path, embedder, config, chunk_size=args.chunk_size, encoder=encoder, embed=embed
    )
    print(
        f"indexed {sidecar['count']} passages ({sidecar['dimension']}-d, {config.kind}, {args.encoder} encoder) "
        f"into {args.index_path}"
    )
    return 0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``search_server.py`` / ``rapo search serve``."""
    parser.add_argument("--index_path", required=True, help="index written by build_search_index.py")
    parser.add_argument(
        "--corpus_path", default=None, help="the indexed corpus (default: the path recorded in the index sidecar)"
    )
    parser.add_argument(
        "--topk", type=int, default=3, help="passages per query of requests that send no topk, null or 0"
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 to serve other machines)")
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("RAPO_SEARCH_PORT", "8000")), help="port to bind"
    )
    parser.add_argument("--model", default=None, help="query encoder (default: the model recorded in the sidecar)")
    parser.add_argument("--device", default=None, help="encoder device (default: cuda when available)")
    parser.add_argument("--gpu_index", action="store_true", help="search on GPU with faiss-gpu (Flat and IVF-PQ)")
    parser.add_argument(
        "--no_mmap", action="store_true", help="read the index into memory instead of memory-mapping it"
    )
    parser.add_argument("--max_batch_size", type=int, default=128, help="most queries per micro-batch")
    parser.add_argument("--max_wait_ms", type=float, default=2.0, help="micro-batch wait for more queries, in ms")
    parser.add_argument("--no_batching", action="store_true", help="one encode per request (for comparison)")
    parser.add_argument(
        "--intra_op_threads",
        type=int,
        default=1,
        help="torch threads of the encoding thread: 1 is robust when other jobs share the cores; on a machine of "
        "its own, one per core makes large batches about 1.7x faster (see benchmarks/search.py)",
    )
    parser.add_argument("--max_queries", type=int, default=256, help="most queries per request (413 beyond)")
    parser.add_argument("--max_query_chars", type=int, default=8192, help="longest query (413 beyond)")
    add_connection_arguments(parser)


def run_serve(args: argparse.Namespace) -> int:
    """Load the index and serve it until interrupted."""
    embedder = Embedder(args.model, device=args.device) if args.model or args.device else None
    wiki = WikiSearch.load(args.index_path, args.corpus_path, embedder, mmap=not args.no_mmap, use_gpu=args.gpu_index)
    app = create_wiki_search_app(
        wiki,
        default_topk=args.topk,
        limits=ServiceLimits(max_queries=args.max_queries, max_query_chars=args.max_query_chars),
        batching=BatchingConfig(
            enabled=not args.no_batching,
            max_batch_size=args.max_batch_size,
            max_wait_s=args.max_wait_ms / 1000,
            intra_op_threads=args.intra_op_threads,
        ),
    )
    logger.info("serving %d passages on http://%s:%d/wikiSearch", len(wiki), args.host, args.port)
    serve(app, args.host, args.port, connection_limits=connection_limits(args))
    return 0
