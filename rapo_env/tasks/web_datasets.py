"""The web-agent benchmarks by name: SimpleQA, GAIA (text-only validation), WebWalkerQA, and the
reference's deep-search RL parquet, read from their reference files; and `generate_site`, the
fictional encyclopedia (pages + questions) behind the offline default of ``RAPO-Web-v0``.

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
import random
from pathlib import Path

from rapo_env.tasks.base import Task, TaskList
from rapo_env.tasks.files import TaskFileError, load_tasks
from rapo_tools.web.website import SitePage, slugify

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
    """Where the web benchmark files are: ``$RAPO_WEB_DATA``, else ``$RAPO_SHARED_DATA/web``, else ``../shared/data/web``."""
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


_SYLLABLES = ("ka", "lo", "mir", "ven", "tar", "bel", "os", "ri", "dun", "sha", "el", "gro", "va", "nim", "zor", "phe")
_COUNTRIES = ("Aldoria", "Brenmark", "Castavia", "Duvelland", "Estrovia")
_PROFESSIONS = ("painter", "astronomer", "architect", "composer", "botanist", "engineer", "novelist", "chemist")


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _unique_names(rng: random.Random, count: int, parts: int, taken: set[str]) -> list[str]:
    names = []
    while len(names) < count:
        name = _name(rng, parts)
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


def generate_site(seed: int = 0, num_people: int = 24):
    """A fictional encyclopedia (towns, people, organisations) and 1-2 hop questions answered by its pages.

    Returns:
        (pages, tasks): the `SitePage`s and a `TaskList` named ``rapopedia``; each task's metadata lists
        ``evidence`` (the slugs of the pages that hold the answer) and ``hops``.
    """
    if num_people < 1:
        raise ValueError(f"num_people must be >= 1, got {num_people}")
    rng = random.Random(seed)
    taken: set[str] = set()
    num_towns, num_orgs = max(2, num_people // 2), max(1, num_people // 3)
    towns = [
        {"name": name, "country": rng.choice(_COUNTRIES), "river": _name(rng, 2) + " River", "founded": rng.randint(900, 1700)}
        for name in _unique_names(rng, num_towns, 3, taken)
    ]
    people = [
        {"name": f"{first} {last}", "born": rng.randint(1800, 1990), "town": rng.choice(towns), "job": rng.choice(_PROFESSIONS)}
        for first, last in zip(_unique_names(rng, num_people, 2, taken), _unique_names(rng, num_people, 3, taken))
    ]
    orgs = [
        {"name": f"{name} Society", "founded": rng.randint(1850, 2010), "town": rng.choice(towns), "founder": rng.choice(people)}
        for name in _unique_names(rng, num_orgs, 2, taken)
    ]
    for person in people:
        person["employer"] = rng.choice(orgs)

    pages = []
    for town in towns:
        pages.append(SitePage(
            slugify(town["name"]), town["name"],
            (f"{town['name']} is a town in {town['country']}. It was founded in {town['founded']}.",
             f"The {town['river']} flows through {town['name']}, and the town's old market lies on its banks."),
        ))
    for person in people:
        town, org = person["town"], person["employer"]
        pages.append(SitePage(
            slugify(person["name"]), person["name"],
            (f"{person['name']} (born {person['born']}) is a {person['job']} from {town['name']}.",
             f"{person['name']} was born in {town['name']} in {person['born']} and later worked for the {org['name']}."),
            ((town["name"], slugify(town["name"])), (org["name"], slugify(org["name"]))),
        ))
    for org in orgs:
        pages.append(SitePage(
            slugify(org["name"]), org["name"],
            (f"The {org['name']} is a learned society founded in {org['founded']} by {org['founder']['name']}.",
             f"Its headquarters are in {org['town']['name']}."),
            ((org["founder"]["name"], slugify(org["founder"]["name"])), (org["town"]["name"], slugify(org["town"]["name"]))),
        ))

    tasks = []
    for number, person in enumerate(people):
        town, org = person["town"], person["employer"]
        person_slug = slugify(person["name"])
        questions = (
            (f"In which town was {person['name']} born?", town["name"], (person_slug,), 1),
            (f"In which country was the {person['job']} {person['name']} born?", town["country"], (person_slug, slugify(town["name"])), 2),
            (f"Who founded the society that {person['name']} worked for?", org["founder"]["name"], (person_slug, slugify(org["name"])), 2),
        )
        question, answer, evidence, hops = questions[number % len(questions)]
        tasks.append(Task(id=f"rapopedia-{seed}-{number}", question=question, answers=(answer,), source="rapopedia",
                          metadata={"evidence": list(evidence), "hops": hops}))
    return pages, TaskList("rapopedia", tasks)
