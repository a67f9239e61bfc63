"""``RAPO-Web-v0``: questions answered with web ``<search>`` and ``<browse>`` (and optionally ``<python>``).

With no arguments the env is fully offline: it serves the procedural knowledge base
(`rapo_env.tasks.knowledge_base`) as an encyclopedia site on loopback (real HTTP, so
``<browse>`` fetches real pages and follows their links), searches it with rapo's
dense index (the ``local`` provider) and asks its 1-3 hop questions, whose evidence is
on those pages. Point ``search`` at Bing, Brave or the reference's recorded results, and
``dataset`` at SimpleQA, GAIA, WebWalkerQA or the deep-search parquet, for the real thing.

Example:
    >>> import gymnasium as gym, rapo_env
    >>> env = gym.make("RAPO-Web-v0", knowledge_base={"num_people": 12, "num_works": 8})
    >>> prompt, info = env.reset(seed=0, options={"task_index": 0})
    >>> info["tools"]
    ['search', 'browse']
    >>> obs, *_ = env.step("<search>" + prompt + "</search>")
    >>> "URL: http://127.0.0.1:" in obs
    True
    >>> env.close()
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_env.core import ToolEnv
from rapo_env.envs.reward_spec import RewardSpec, resolve_reward
from rapo_env.envs.shared import SHARED
from rapo_env.prompts import build_system_prompt
from rapo_env.tasks import Task, resolve_tasks
from rapo_env.tasks.knowledge_base import KnowledgeBase, KnowledgeBaseConfig
from rapo_env.tasks.web_datasets import WEB_DATASET_FILES, knowledge_base_site, load_web_dataset
from rapo_env.envs.shared import shared_wiki_search
from rapo_tools.base import Tool
from rapo_tools.cache import rapo_cache_dir
from rapo_tools.search.embedding import Embedder
from rapo_tools.search.wiki_search import WikiSearch
from rapo_tools.web.browse import BrowseConfig, BrowseTool
from rapo_tools.web.chat import ChatConfig
from rapo_tools.web.providers.local import LocalProvider
from rapo_tools.web.search_tool import WebSearchConfig, WebSearchTool
from rapo_tools.web.website import serve_site

OFFLINE_DATASETS = ("offline",)
WEB_REWARDS = ("f1", "reference", "em", "judge")

WEB_TOOL_DESCRIPTIONS = {
    "search": "a web search engine: it returns the top pages for your query, each with a title, a URL and a snippet",
    "browse": "a web browser: give it one URL and it returns the readable text of that page and its links",
    "python": "a Python interpreter: it runs your code and shows what it prints",
}


class OfflineWeb:
    """The offline web: the procedural knowledge base served as a site on loopback, and its dense index.

    One per (seed, sizes, cache folder) per process (`rapo_env.envs.shared.SHARED`), shared by every env that
    uses it (vector envs load the index once and share one server); the last `release` stops the server. The
    base and its index are built once and cached on disk by `KnowledgeBase.cached`.
    """

    def __init__(self, key: tuple[Any, ...], knowledge_base: KnowledgeBase, wiki: WikiSearch):
        self.key = key
        self.knowledge_base = knowledge_base
        self.pages = knowledge_base_site(knowledge_base)
        self._stack = contextlib.ExitStack()
        site_index = LocalProvider(wiki)
        self.base_url = self._stack.enter_context(serve_site(self.pages, site_index))
        self.provider = site_index.with_url_prefix(self.base_url)

    @classmethod
    def acquire(
        cls, seed: int, config: KnowledgeBaseConfig | None, cache_dir: Path, embedder: Embedder | None
    ) -> OfflineWeb:
        """The shared offline web of this knowledge base (generated, indexed and served on first use)."""
        key = ("offline_web", seed, config, str(cache_dir), id(embedder))

        def build() -> OfflineWeb:
            knowledge_base, index_path = KnowledgeBase.cached(seed, cache_dir, embedder, config)
            return cls(key, knowledge_base, shared_wiki_search(index_path, None, embedder))

        return SHARED.acquire(key, build)

    def release(self) -> None:
        """One user fewer; the last one stops the server."""
        SHARED.release(self.key, lambda web: web._stack.close())


class _ProviderlessSearch(WebSearchTool):
    """A `WebSearchTool` that does not close a provider it shares with other envs."""

    def close(self) -> None:
        self.provider = None
        super().close()


class WebEnv(ToolEnv):
    """Web questions with ``<search>`` and ``<browse>``.

    Args:
        dataset: ``"offline"`` (default: the procedural knowledge base as a site, and its questions), a web
            benchmark name (``simpleqa``, ``gaia``, ``webwalker``, ``webwalkerqa``, ``deepsearch``), a task file,
            ``"hf:<name>"``, or a task list.
        search: The search provider config (`WebSearchConfig`, dict, or provider name). Default: the local
            index of the offline site for ``offline``; Bing (key in ``BING_SEARCH_V7_KEY``) otherwise.
        browse: `BrowseConfig` or dict; the offline site's origin is always allowed.
        python: Also offer the ``<python>`` tool.
        sandbox: Python sandbox settings when ``python`` is on.
        reward: ``"f1"`` (default, as in ``RAPO-QA-v0``: the same answer scores the same in both envs),
            ``"em"``, ``"reference"`` (spec §2: also asks for ``<think>`` and ``\\boxed{}``),
            ``"judge"`` or a callable.
        judge: OpenAI-compatible endpoint of the judge, for ``reward="judge"``.
        split: ``train``/``validation``/``test`` of the knowledge base's questions (offline only).
        seed: Seed of the generated knowledge base.
        knowledge_base: `KnowledgeBaseConfig` (or a dict of its fields): sizes of the generated base.
        cache_dir: Where the generated base and its index are kept (default ``$RAPO_CACHE_DIR`` or ``~/.cache/rapo``).
        embedder: A `rapo_tools.search.embedding.Embedder` for the offline index (default: embedded MiniLM).
        limit, level, lang, difficulty: Filters for the web benchmarks (see `load_web_dataset`).
        system_prompt: Overrides the default prompt that explains the tags.
        **kwargs: Passed to `ToolEnv` (``max_tool_calls``, ``max_turns``, ``max_text_length``, ...).
    """

    TOOLS = ("search", "browse", "python")
    DATASETS = "offline (default, the knowledge base as a site) | SimpleQA | GAIA text | WebWalkerQA | deepsearch"

    def __init__(
        self,
        dataset: str | Path | Sequence[Task] = "offline",
        search: WebSearchConfig | dict[str, Any] | str | None = None,
        browse: BrowseConfig | dict[str, Any] | None = None,
        python: bool = False,
        sandbox: Any = None,
        reward: RewardSpec = "f1",
        judge: ChatConfig | dict[str, Any] | None = None,
        split: str = "train",
        seed: int = 0,
        knowledge_base: KnowledgeBaseConfig | dict[str, Any] | None = None,
        cache_dir: str | Path | None = None,
        embedder: Embedder | None = None,
        limit: int | None = None,
        level: int | None = None,
        lang: str | None = None,
        difficulty: str | None = None,
        system_prompt: str | None = None,
        max_tool_calls: int = 3,
        **kwargs: Any,
    ):
        self.offline_web: OfflineWeb | None = None
        browse_config = BrowseConfig(**browse) if isinstance(browse, dict) else (browse or BrowseConfig())
        search_config = WebSearchConfig.from_value(search) if search is not None else None
        if isinstance(dataset, str) and dataset in OFFLINE_DATASETS:
            kb_config = KnowledgeBaseConfig(**knowledge_base) if isinstance(knowledge_base, dict) else knowledge_base
            cache_root = Path(cache_dir) if cache_dir is not None else rapo_cache_dir()
            self.offline_web = OfflineWeb.acquire(seed, kb_config, cache_root, embedder)
            tasks: Sequence[Task] = self.offline_web.knowledge_base.split(split)
            tasks = tasks[:limit] if limit is not None else tasks
            browse_config = dataclasses.replace(
                browse_config, allowed_origins=(*browse_config.allowed_origins, self.offline_web.base_url)
            )
            search_tool: WebSearchTool = (
                WebSearchTool(search_config)
                if search_config is not None
                else _ProviderlessSearch(WebSearchConfig(provider="local"), provider=self.offline_web.provider)
            )
        else:
            if isinstance(dataset, str) and dataset in WEB_DATASET_FILES:
                tasks = load_web_dataset(dataset, limit=limit, level=level, lang=lang, difficulty=difficulty)
            else:
                tasks = resolve_tasks(dataset, "test", _no_procedural, limit=limit)
            search_tool = WebSearchTool(search_config or WebSearchConfig())
        self.browse_tool = BrowseTool(browse_config)
        tools: list[Tool] = [search_tool, self.browse_tool]
        if python:
            from rapo_tools.python_tool import PythonTool

            tools.append(PythonTool(sandbox=sandbox))
        tags = tuple(tool.name for tool in tools)
        super().__init__(
            tasks=tasks,
            tools=tools,
            reward=resolve_reward(reward, tags, WEB_REWARDS, "RAPO-Web-v0", judge=judge),
            system_prompt=system_prompt
            or build_system_prompt({tag: WEB_TOOL_DESCRIPTIONS[tag] for tag in tags}, max_tool_calls),
            max_tool_calls=max_tool_calls,
            **kwargs,
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        prompt, info = super().reset(seed=seed, options=options)
        # The page summariser keeps what bears on this episode's question.
        self.browse_tool.question = self.task.question if self.task is not None else ""
        return prompt, info

    def close(self) -> None:
        super().close()
        close_reward = getattr(self.reward_fn, "close", None)
        if close_reward is not None:
            close_reward()
        web, self.offline_web = self.offline_web, None
        if web is not None:
            web.release()


def _no_procedural(split: str):
    raise ValueError("RAPO-Web-v0 has no 'procedural' dataset; use dataset='offline' for the knowledge-base site")
