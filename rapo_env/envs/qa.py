"""``RAPO-QA-v0``: knowledge questions answered with ``<search>`` over a local passage index.

With no arguments the env is fully offline: it generates the procedural multi-hop
knowledge base (fictional entities, encyclopedia passages, 1-3 hop questions), indexes
it with the embedded MiniLM on first use and caches both under ``$RAPO_CACHE_DIR``.
Point ``dataset`` at the reference's evaluation files (ARPO JSONL, DeepResearcher
parquet) together with a corpus (``index_path``/``corpus_path``) or a running search
service (``search_url``); HotpotQA files with context bring their own corpus.
``tools=("search", "python")`` adds the interpreter, as in the reference's mixed prompt.

A search service that is down or slow never ends an episode: the observation says that
the search failed, ``info["tool_error"]`` names the failure and ``info["search_errors"]``
counts them over the episode.

Example:
    >>> import gymnasium as gym, rapo_env
    >>> env = gym.make("RAPO-QA-v0", knowledge_base={"num_people": 10, "num_works": 6})
    >>> prompt, info = env.reset(seed=0, options={"task_index": 0})
    >>> info["tools"]
    ['search']
    >>> obs, reward, terminated, truncated, info = env.step("<search>" + prompt + "</search>")
    >>> obs.startswith(" <result>\\nDoc 1 (Title: "), info["tool_ok"]
    (True, True)
    >>> env.close()
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, SupportsFloat

from rapo_env.core import ToolEnv
from rapo_env.envs.reward_spec import RewardSpec, resolve_reward
from rapo_env.envs.shared import shared_knowledge_base, shared_wiki_search
from rapo_env.prompts import SHORT_QA_PROMPT, TOOL_DESCRIPTIONS, build_system_prompt
from rapo_env.rewards.qa import QA_REWARD_KINDS
from rapo_env.tasks import Task, TaskList, resolve_tasks
from rapo_env.tasks.hotpotqa import hotpotqa_passages, is_hotpotqa_file, load_hotpotqa
from rapo_env.tasks.knowledge_base import KnowledgeBase, KnowledgeBaseConfig
from rapo_tools.base import Tool
from rapo_tools.python_tool import PythonTool
from rapo_tools.cache import rapo_cache_dir
from rapo_tools.jsonl import write_jsonl
from rapo_tools.search.cache import cached_corpus_index
from rapo_tools.search.embedding import Embedder
from rapo_tools.search.tool import SearchTool, SearchToolConfig
from rapo_tools.search.wiki_search import WikiSearch

QA_TOOLS = ("search", "python")


class QADatasetError(ValueError):
    """The dataset has no corpus to search (give ``index_path``, ``corpus_path`` or ``search_url``)."""


def _hotpotqa_corpus(path: Path, cache_root: Path) -> Path:
    """The context paragraphs of a HotpotQA file as a ``{title, text}`` JSONL corpus in the cache."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    corpus = cache_root / "corpora" / f"{path.stem}-{key}.jsonl"
    if not corpus.is_file():
        write_jsonl(corpus, (dataclasses.asdict(passage) for passage in hotpotqa_passages(path)))
    return corpus


@dataclasses.dataclass(frozen=True)
class QASource:
    """Where a QA env's questions and passages come from: `QAEnv`'s source arguments, as `resolve_qa_source`
    takes them (see `QAEnv` for each)."""

    dataset: str | Path | Sequence[Task] = "procedural"
    split: str = "train"
    search_url: str | None = None
    index_path: str | os.PathLike | None = None
    corpus_path: str | os.PathLike | None = None
    seed: int = 0
    knowledge_base: KnowledgeBaseConfig | dict[str, Any] | None = None
    ability: str | None = None
    limit: int | None = None
    hops: Sequence[int] | None = None
    cache_root: Path | None = None
    """Where generated bases and indexes are kept (None: ``$RAPO_CACHE_DIR`` or ``~/.cache/rapo``)."""
    embedder: Embedder | None = None


def resolve_qa_source(source: QASource) -> tuple[Sequence[Task], WikiSearch | str, KnowledgeBase | None]:
    """The tasks, the search backend (a service URL or a shared in-process index) and, for the generated
    knowledge base, the base itself, that ``source`` names.

    Raises:
        QADatasetError: a task file without a corpus to search, or ``hops`` for another dataset.
    """
    cache_root = source.cache_root if source.cache_root is not None else rapo_cache_dir()
    dataset, limit, embedder = source.dataset, source.limit, source.embedder
    knowledge_base: KnowledgeBase | None = None
    own_index: Path | None = None
    is_generated = isinstance(dataset, str) and dataset == "procedural"
    if source.hops is not None and not is_generated:
        raise QADatasetError(f"hops={source.hops!r} selects the generated knowledge base's questions; "
                             f"dataset {dataset!r} has no hop counts")
    if is_generated:
        kb_config = source.knowledge_base
        if isinstance(kb_config, dict):
            kb_config = KnowledgeBaseConfig(**kb_config)
        knowledge_base, own_index = shared_knowledge_base(source.seed, cache_root, kb_config, embedder)
        tasks: Sequence[Task] = knowledge_base.split(source.split, source.hops)
    elif isinstance(dataset, (str, Path)) and is_hotpotqa_file(dataset):
        tasks = load_hotpotqa(dataset, limit=limit)
        if not (source.search_url or source.index_path or source.corpus_path):
            own_index = cached_corpus_index(_hotpotqa_corpus(Path(dataset), cache_root), embedder,
                                            cache_dir=cache_root)
    else:
        options: dict[str, Any] = {"limit": limit}
        if source.ability is not None:
            options["ability"] = source.ability
        tasks = resolve_tasks(dataset, source.split, lambda _: TaskList("empty", []), **options)
        if not (source.search_url or source.index_path or source.corpus_path):
            raise QADatasetError(
                f"dataset {dataset!r} brings no passages to search; pass index_path= (and corpus_path=), "
                "corpus_path= (indexed on first use) or search_url= (a running `rapo search serve`)"
            )
    if limit is not None and len(tasks) > limit:
        tasks = tasks[:limit]
    if source.search_url:
        return tasks, source.search_url, knowledge_base
    if source.index_path is not None:
        corpus = Path(source.corpus_path) if source.corpus_path else None
        return tasks, shared_wiki_search(Path(source.index_path), corpus, embedder), knowledge_base
    if source.corpus_path is not None:
        own_index = cached_corpus_index(source.corpus_path, embedder, cache_dir=cache_root)
    if own_index is None:
        raise QADatasetError("no corpus to search")
    return tasks, shared_wiki_search(own_index, None, embedder), knowledge_base


class QAEnv(ToolEnv):
    """Knowledge questions with the ``<search>`` tool (and optionally ``<python>``).

    Args:
        dataset: ``"procedural"`` (default: the generated knowledge base), a task file (ARPO evaluation
            JSONL, DeepResearcher / Search-R1 parquet, FlashRAG JSONL, HotpotQA JSON with context),
            ``"hf:<name>"``, or a task list.
        split: ``train``/``validation``/``test`` of the knowledge base's questions (or of an ``hf:`` dataset).
        reward: ``"f1"`` (default), ``"em"``, ``"substring"``, ``"reference"`` (spec §2) or a callable.
        tools: Tool tags to offer: ``("search",)`` or ``("search", "python")``.
        search_url: A running ``/wikiSearch`` service (``rapo search serve``) to query instead of an in-process index.
        index_path: An index built by ``rapo search build-index``, searched in-process.
        corpus_path: The corpus of ``index_path``; alone, it is indexed on first use and cached.
        search: `SearchToolConfig` (or a dict of its fields): top-k, observation format, timeouts, retries.
        sandbox: Python sandbox settings when ``"python"`` is among ``tools``.
        seed: Seed of the generated knowledge base.
        knowledge_base: `KnowledgeBaseConfig` (or a dict of its fields): sizes of the generated base.
        data_source: Keep only tasks whose ``data_source`` is this (DeepResearcher mixes nq, hotpotqa, ...).
        ability: Keep only rows of this ``ability`` (the reference's RL parquet mixes ``math`` and ``qa``).
        limit: Keep at most this many tasks.
        hops: Keep only the generated knowledge base's questions of these hop counts (default: every count).
        cache_dir: Where generated bases and indexes are kept (default ``$RAPO_CACHE_DIR`` or ``~/.cache/rapo``).
        embedder: A `rapo_tools.search.embedding.Embedder` to share (default: the embedded MiniLM).
        system_prompt: Overrides the default prompt that explains the tags; ``"short"`` is
            `rapo_env.prompts.SHORT_QA_PROMPT` (about 60 tokens instead of about 150).
        **kwargs: Passed to `ToolEnv` (``max_tool_calls``, ``max_turns``, ``max_text_length``, ...).

    Raises:
        QADatasetError: a task file without a corpus to search.
    """

    TOOLS = QA_TOOLS
    DATASETS = "procedural (default) | ARPO JSONL | DeepResearcher parquet | HotpotQA JSON with context | hf:<name>"

    def __init__(
        self,
        dataset: str | Path | Sequence[Task] = "procedural",
        split: str = "train",
        reward: RewardSpec = "f1",
        tools: Sequence[str] = ("search",),
        search_url: str | None = None,
        index_path: str | os.PathLike | None = None,
        corpus_path: str | os.PathLike | None = None,
        search: SearchToolConfig | dict[str, Any] | None = None,
        sandbox: Any = None,
        seed: int = 0,
        knowledge_base: KnowledgeBaseConfig | dict[str, Any] | None = None,
        data_source: str | None = None,
        ability: str | None = None,
        limit: int | None = None,
        hops: Sequence[int] | None = None,
        cache_dir: str | os.PathLike | None = None,
        embedder: Embedder | None = None,
        system_prompt: str | None = None,
        max_tool_calls: int = 3,
        **kwargs: Any,
    ):
        unknown = [tag for tag in tools if tag not in QA_TOOLS]
        if "search" not in tools or unknown:
            raise ValueError(f"tools must include 'search' and only use {QA_TOOLS}, got {tuple(tools)}")
        source = QASource(dataset=dataset, split=split, search_url=search_url, index_path=index_path,
                          corpus_path=corpus_path, seed=seed, knowledge_base=knowledge_base, ability=ability,
                          limit=limit, hops=hops, embedder=embedder,
                          cache_root=Path(cache_dir) if cache_dir is not None else rapo_cache_dir())
        tasks, backend, self.knowledge_base = resolve_qa_source(source)
        if data_source is not None:
            tasks = TaskList(
                f"{getattr(tasks, 'name', 'qa')}-{data_source}",
                [task for task in tasks if task.metadata.get("data_source") == data_source],
            )
            if not tasks:
                raise QADatasetError(f"no task has data_source={data_source!r}")
        search_config = SearchToolConfig(**search) if isinstance(search, dict) else (search or SearchToolConfig())
        tool_list: list[Tool] = [SearchTool(backend, search_config)]
        if "python" in tools:
            tool_list.append(PythonTool(sandbox=sandbox))
        tags = tuple(tool.name for tool in tool_list)
        self.search_errors = 0
        super().__init__(
            tasks=tasks,
            tools=tool_list,
            reward=resolve_reward(reward, tags, QA_REWARD_KINDS, "RAPO-QA-v0"),
            system_prompt=(SHORT_QA_PROMPT if system_prompt == "short" else system_prompt)
            or build_system_prompt({tag: TOOL_DESCRIPTIONS[tag] for tag in tags}, max_tool_calls),
            max_tool_calls=max_tool_calls,
            **kwargs,
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.search_errors = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = super().step(action)
        if info.get("tool") == "search" and info.get("tool_ok") is False and info.get("tool_error") != "tool_limit":
            self.search_errors += 1
        info["search_errors"] = self.search_errors
        return observation, reward, terminated, truncated, info
