"""The web-agent benchmarks by name: SimpleQA, GAIA (text-only validation), WebWalkerQA, and the
reference's deep-search RL parquet, read from their reference files; and `knowledge_base_site`, the
procedural knowledge base as web pages, the offline default of ``RAPO-Web-v0``.

`rapo_env.tasks.files.load_tasks` reads the formats; this module knows the file names
and the few dataset-specific fields (GAIA's ``task_id`` and ``Level``, WebWalkerQA's
language and difficulty).

Example (needs the data folder, e.g. ``RAPO_SHARED_DATA=../shared/data``)::

    tasks = load_web_dataset("gaia", level=1)
    tasks = load_web_dataset("webwalkerqa", lang="en", limit=50)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from rapo_env.tasks.base import Task, TaskList
from rapo_env.tasks.files import TaskFileError, load_tasks
from rapo_env.tasks.knowledge_base import KnowledgeBase
from rapo_tools.web.website import SitePage

WEB_DATASET_FILES: dict[str, str] = {
    "simpleqa": "arpo_simpleqa_test.jsonl",
    "gaia": "arpo_gaia_text_validation.jsonl",
    "webwalker": "arpo_webwalker_test.jsonl",
    "webwalkerqa": "webthinker_webwalkerqa_test.json",
    "deepsearch": "arpo_hard_search_1k.parquet",
}
"""Dataset name -> file name in the web data folder (the reference repositories' file names, see SOURCES.md)."""

_REPO_ROOT = Path(__file__).resolve().parents[2]


def web_data_dir() -> Path:
    """Where the web benchmark files are: ``$RAPO_WEB_DATA``, else ``$RAPO_SHARED_DATA/web``, else
    ``../shared/data/web``."""
    if os.environ.get("RAPO_WEB_DATA"):
        return Path(os.environ["RAPO_WEB_DATA"]).expanduser()
    shared = Path(os.environ.get("RAPO_SHARED_DATA", _REPO_ROOT.parent / "shared" / "data")).expanduser()
    return shared / "web"


def load_web_dataset(
    name: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    level: int | None = None,
    lang: str | None = None,
    difficulty: str | None = None,
) -> TaskList:
    """Load one web benchmark.

    Args:
        name: One of `WEB_DATASET_FILES` (``simpleqa``, ``gaia``, ``webwalker``, ``webwalkerqa``, ``deepsearch``).
        data_dir: The folder holding the files (default: `web_data_dir`).
        limit: Keep at most this many tasks (after filtering).
        level: GAIA only: keep this difficulty level (1, 2 or 3).
        lang: WebWalkerQA only: keep this language (``en`` or ``zh``).
        difficulty: WebWalkerQA only: keep this difficulty (``easy``, ``medium``, ``hard``).

    Raises:
        TaskFileError: an unknown name, a missing file, or a filter for another dataset.
    """
    if name not in WEB_DATASET_FILES:
        raise TaskFileError(f"unknown web dataset {name!r}; choose one of {', '.join(WEB_DATASET_FILES)}")
    if level is not None and name != "gaia":
        raise TaskFileError("level= filters GAIA only")
    if (lang is not None or difficulty is not None) and name != "webwalkerqa":
        raise TaskFileError("lang= and difficulty= filter WebWalkerQA only (webthinker_webwalkerqa_test.json)")
    path = Path(data_dir).expanduser() if data_dir is not None else web_data_dir()
    tasks: list[Task] = list(load_tasks(path / WEB_DATASET_FILES[name], name=name))
    if name == "gaia":
        # GAIA's own identifier is task_id (a UUID); results are reported against it.
        tasks = [
            dataclasses.replace(task, id=f"gaia-{task.metadata.get('task_id', task.id)}")
            for task in tasks
            if level is None or str(task.metadata.get("Level")) == str(level)
        ]
    if lang is not None:
        tasks = [task for task in tasks if task.metadata.get("lang") == lang]
    if difficulty is not None:
        tasks = [task for task in tasks if task.metadata.get("difficulty_level") == difficulty]
    if not tasks:
        raise TaskFileError(f"no {name} task matches the filters (level={level}, lang={lang}, difficulty={difficulty})")
    return TaskList(name, tasks[:limit] if limit is not None else tasks)


def knowledge_base_site(knowledge_base: KnowledgeBase) -> list[SitePage]:
    """One page per passage of ``knowledge_base``, linking to the entities it relates to (so that an agent can
    follow a question's chain page by page, as on a real encyclopedia)."""
    pages = []
    for entity, passage in zip(knowledge_base.entities, knowledge_base.passages, strict=True):
        related = [
            knowledge_base.by_id[target].name for target in entity.relations.values() if target in knowledge_base.by_id
        ]
        pages.append(SitePage.from_passage(passage.title, passage.text, related))
    return pages
