"""Fixtures of the knowledge-search tests: the real MiniLM index of the HotpotQA corpus, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from rapo_tools.search.cache import cached_corpus_index
from rapo_tools.search.embedding import Embedder
from rapo_tools.search.server import create_wiki_search_app
from rapo_tools.search.service import ServiceLimits
from rapo_tools.search.wiki_search import WikiSearch
from rapo_tools.serving import serve_in_thread

HOTPOTQA_CORPUS = "corpus/hipporag_hotpotqa_train_corpus.json"
HOTPOTQA_QUESTIONS = "qa/hipporag_hotpotqa_train_100.json"


@pytest.fixture(scope="session")
def embedder(sentence_encoder) -> Embedder:
    """The session's MiniLM behind the `Embedder` interface."""
    return Embedder(sentence_encoder)


@pytest.fixture(scope="session")
def hotpotqa_corpus(shared_data) -> Path:
    return shared_data / HOTPOTQA_CORPUS


@pytest.fixture(scope="session")
def hotpotqa_index(hotpotqa_corpus, embedder, rapo_cache_dir) -> Path:
    """A real Flat index of the 994 HotpotQA paragraphs (the QA env tests reuse it through the cache)."""
    return cached_corpus_index(hotpotqa_corpus, embedder, cache_dir=rapo_cache_dir, show_progress=False)


@pytest.fixture(scope="session")
def hotpotqa_wiki(hotpotqa_index, embedder) -> WikiSearch:
    return WikiSearch.load(hotpotqa_index, embedder=embedder)


@pytest.fixture(scope="module")
def wiki_server(hotpotqa_index, embedder):
    """The real /wikiSearch server over the HotpotQA index, on loopback; yields its base URL."""
    wiki = WikiSearch.load(hotpotqa_index, embedder=embedder)
    app = create_wiki_search_app(wiki, limits=ServiceLimits(max_queries=256, max_query_chars=8192))
    with serve_in_thread(app) as url:
        yield url
