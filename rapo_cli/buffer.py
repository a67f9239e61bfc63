"""``rapo buffer build|index|serve``: the Step-Trace Buffer pipeline from the command line.

- ``build``: trajectories (rollout JSONL, the scripted expert, or GSM8K solutions) -> buffer JSONL;
- ``index``: buffer JSONL -> FAISS index + sidecar (the reference's ``--corpus_path``/``--index_path``);
- ``serve``: ``POST /retrieve`` over a buffer and its index (the reference's flags plus host and port).

Example:
    rapo buffer build --source gsm8k --input ../shared/data/math/gsm8k_train.jsonl --output runs/gsm8k.jsonl
    rapo buffer index --corpus_path runs/gsm8k.jsonl --index_path runs/gsm8k.index
    rapo buffer serve --corpus_path runs/gsm8k.jsonl --index_path runs/gsm8k.index --port 8001
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from rapo_cli import checks

HELP = "Build a step-trace buffer from trajectories, index it, or serve it at POST /retrieve."
SOURCES = ("trajectories", "scripted", "gsm8k")


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        choices=SOURCES,
        default="trajectories",
        help="trajectories: rollout JSONL files (--input); scripted: the procedural-math expert; "
        "gsm8k: GSM8K solutions with <<expr=result>> annotations (--input)",
    )
    parser.add_argument("--input", nargs="*", default=[], help="input files (trajectory JSONL, or one GSM8K JSONL)")
    parser.add_argument("--output", required=True, help="buffer JSONL to write (Step_Trace_Buffer.jsonl format)")
    parser.add_argument("--top-k", type=int, default=5, help="rollouts kept per question, best reward first")
    parser.add_argument("--min-reward", type=float, default=None, help="drop trajectories with a lower reward")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="Hugging Face tokenizer (local path) to count tokens; default: words and punctuation",
    )
    parser.add_argument("--split", default="train", help="scripted: procedural split")
    parser.add_argument("--num-tasks", type=int, default=1000, help="scripted: problems solved")
    parser.add_argument("--difficulty", type=int, default=None, help="scripted: operations per problem (1-5)")
    parser.add_argument("--limit", type=int, default=None, help="gsm8k: convert at most this many solutions")


def run_build(args: argparse.Namespace) -> int:
    from rapo_agents.buffer_build.builder import BuildConfig, build_buffer, build_buffer_file

    config = BuildConfig(top_k=args.top_k, min_reward=args.min_reward)
    started = time.perf_counter()
    if args.source == "trajectories":
        if not args.input:
            print("rapo buffer build: --input needs at least one trajectory JSONL file", file=sys.stderr)
            return 2
        stats = build_buffer_file(args.input, args.output, config, args.tokenizer)
    elif args.source == "scripted":
        from rapo_agents.buffer_build.sources.scripted import ScriptedSourceConfig, scripted_expert_trajectories

        source = ScriptedSourceConfig(split=args.split, num_tasks=args.num_tasks, difficulty=args.difficulty)
        stats = build_buffer(scripted_expert_trajectories(source), args.output, config, args.tokenizer)
    else:
        from rapo_agents.buffer_build.sources.gsm8k import gsm8k_trajectories

        if len(args.input) != 1:
            print("rapo buffer build --source gsm8k: give exactly one --input file", file=sys.stderr)
            return 2
        stats = build_buffer(gsm8k_trajectories(args.input[0], limit=args.limit), args.output, config, args.tokenizer)
    print(f"wrote {args.output} in {time.perf_counter() - started:.1f} s")
    for name, value in stats.as_dict().items():
        print(f"  {name:>18}: {value}")
    return 0


def add_index_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus_path", "--corpus-path", required=True, help="buffer JSONL")
    parser.add_argument("--index_path", "--index-path", required=True, help="FAISS index to write (+ .json sidecar)")
    parser.add_argument(
        "--index-kind",
        choices=("hnsw", "flat"),
        default="hnsw",
        help="hnsw: the reference's (M 32, efConstruction 200, efSearch 128); flat: exact",
    )
    parser.add_argument(
        "--model", default=None, help="sentence-transformers model (default: embedded all-MiniLM-L6-v2)"
    )
    parser.add_argument("--device", default=None, help="encoder device (default: cuda when available)")
    parser.add_argument("--batch-size", "--batch_size", type=int, default=64, help="texts per encoder forward pass")
    parser.add_argument(
        "--encoder",
        choices=("paper", "reference"),
        default="paper",
        help="paper: MiniLM mean pooling, 256 tokens; reference: the official last-token state, 512 tokens "
        "(both keep the newest tokens; recorded in the sidecar, queries are encoded the same way)",
    )


def run_index(args: argparse.Namespace) -> int:
    from rapo_buffers.index import ENCODINGS, build_step_index
    from rapo_buffers.schema import read_buffer
    from rapo_tools.search.embedding import Embedder
    from rapo_tools.search.faiss_index import IndexConfig

    traces, read_stats = read_buffer(args.corpus_path)
    if not traces:
        print(f"rapo buffer index: {args.corpus_path} holds no step records", file=sys.stderr)
        return 1
    started = time.perf_counter()
    embedder = Embedder(args.model, device=args.device, batch_size=args.batch_size)
    sidecar = build_step_index(
        traces,
        args.index_path,
        embedder,
        IndexConfig(kind=args.index_kind),
        args.corpus_path,
        encoder=ENCODINGS[args.encoder],
    )
    print(
        f"indexed {sidecar['count']} steps ({read_stats.skipped} non-step lines skipped) with {sidecar['model']} "
        f"into {args.index_path} in {time.perf_counter() - started:.1f} s"
    )
    return 0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus_path", "--corpus-path", required=True, help="buffer JSONL")
    parser.add_argument("--index_path", "--index-path", required=True, help="FAISS index built by `rapo buffer index`")
    parser.add_argument("--topk", type=int, default=3, help="topk of requests that do not send one")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 to serve other machines)")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--model", default=None, help="query encoder (default: the model named in the sidecar)")
    parser.add_argument("--device", default=None, help="encoder device (default: cuda when available)")
    parser.add_argument("--no-micro-batching", action="store_true", help="one search per request (the baseline)")
    parser.add_argument("--max-batch-size", type=int, default=128, help="most queries per batched search")
    from rapo_tools.serving import add_connection_arguments

    add_connection_arguments(parser)


def run_serve(args: argparse.Namespace) -> int:
    from rapo_buffers.retriever import InProcessRetriever
    from rapo_buffers.service import create_retrieval_app
    from rapo_tools.search.embedding import Embedder
    from rapo_tools.search.service import BatchingConfig
    from rapo_tools.serving import connection_limits, serve

    logging.basicConfig(level=logging.INFO)
    embedder = Embedder(args.model, device=args.device) if args.model or args.device else None
    retriever = InProcessRetriever.from_files(args.corpus_path, args.index_path, embedder)
    app = create_retrieval_app(
        retriever,
        batching=BatchingConfig(enabled=not args.no_micro_batching, max_batch_size=args.max_batch_size),
        health_info=lambda: {"steps": len(retriever.traces), "model": retriever.embedder.model_name},
        default_topk=args.topk,
    )
    serve(app, host=args.host, port=args.port, connection_limits=connection_limits(args))
    return 0


_COMMANDS = {
    "build": (
        add_build_arguments,
        run_build,
        "trajectories -> buffer JSONL (top-k rollouts per question, cut into steps)",
    ),
    "index": (add_index_arguments, run_index, "buffer JSONL -> FAISS index with a sidecar"),
    "serve": (add_serve_arguments, run_serve, "serve POST /retrieve and /health over a buffer and its index"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, (add, _, help_text) in _COMMANDS.items():
        add(actions.add_parser(name, help=help_text, description=help_text))


def check_arguments(args: argparse.Namespace) -> None:
    """The files each action reads exist and its outputs can be written, before any work starts."""
    if args.action == "build":
        fix = "give a GSM8K JSONL" if args.source == "gsm8k" else "give a trajectory JSONL (`rapo rollout` writes one)"
        for path in args.input:
            checks.existing_file(path, "--input", fix)
        checks.output_file(args.output, "--output")
        checks.model(args.tokenizer, "--tokenizer")
        return
    checks.existing_file(args.corpus_path, "--corpus_path", "give a buffer JSONL (`rapo buffer build` writes one)")
    if args.action == "index":
        checks.output_file(args.index_path, "--index_path")
    else:
        checks.existing_file(args.index_path, "--index_path", "build one with `rapo buffer index`")
    checks.model(args.model, "--model")


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    return _COMMANDS[args.action][1](args)
