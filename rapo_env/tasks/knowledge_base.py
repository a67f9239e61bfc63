"""A procedural multi-hop knowledge base: fictional entities, encyclopedia passages, 1-3 hop questions.

The embedded default of ``RAPO-QA-v0`` on a fresh, offline machine. From one seed it
generates countries, towns, organisations, people and works with relations between
them (born in, works for, mentored by, founded by, headquartered in, created by,
published by, capital of), renders one encyclopedia-style passage per entity, and asks
questions that follow a chain of 1-3 relations. Every fact a question needs is stated
in the passage of the chain's entity (``metadata["evidence_titles"]``), so a search
agent can answer by looking up one entity per hop. The names are invented, so a model's
own memory cannot answer.

`KnowledgeBase.cached` builds the base, its dense index and its questions on first use
and keeps them under ``$RAPO_CACHE_DIR`` (default ``~/.cache/rapo``).

Example:
    >>> kb = KnowledgeBase.generate(seed=0, num_people=12, num_works=8)
    >>> task = next(t for t in kb.questions if t.metadata["hops"] == 2)
    >>> task.metadata["evidence_titles"][1] in kb.passage_by_title
    True
    >>> kb.generate(seed=0, num_people=12, num_works=8).questions[0] == kb.questions[0]
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from rapo_env.tasks.base import Task, TaskList
from rapo_tools.cache import rapo_cache_dir
from rapo_tools.jsonl import JsonlReader, write_jsonl
from rapo_tools.search.cache import cached_corpus_index
from rapo_tools.search.corpus import Passage

GENERATOR_VERSION = 1
"""Bumped whenever generation changes, so that stale caches are not reused."""
SPLITS = {"train": (0.0, 0.8), "validation": (0.8, 0.9), "test": (0.9, 1.0)}
"""Question splits as ranges of a stable hash of the question id (the passages are shared)."""
KINDS = ("country", "town", "organization", "person", "work")

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t", "th", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ai", "ia", "ou", "y")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "x")
_OCCUPATIONS = (
    "painter",
    "astronomer",
    "architect",
    "composer",
    "botanist",
    "engineer",
    "novelist",
    "chemist",
    "cartographer",
    "sculptor",
    "historian",
    "physician",
    "poet",
    "mathematician",
    "glassmaker",
)
_ORG_FORMS = (
    ("{} Institute", "research institute"),
    ("{} Press", "publishing house"),
    ("{} Works", "engineering firm"),
    ("{} Conservatory", "music school"),
    ("{} Trading Company", "trading company"),
    ("{} Observatory", "observatory"),
    ("{} Guild", "craft guild"),
    ("{} Academy", "academy"),
)
_WORK_KINDS = (
    ("novel", "wrote"),
    ("painting", "painted"),
    ("symphony", "composed"),
    ("atlas", "drew"),
    ("poem cycle", "wrote"),
    ("treatise", "wrote"),
    ("sculpture", "carved"),
    ("opera", "composed"),
)
_TITLE_ADJECTIVES = (
    "Silent",
    "Amber",
    "Northern",
    "Hollow",
    "Crimson",
    "Distant",
    "Quiet",
    "Burning",
    "Glass",
    "Winter",
    "Hidden",
    "Last",
    "Golden",
    "Sunken",
    "Seventh",
    "Wandering",
    "Pale",
    "Iron",
)
_TITLE_NOUNS = (
    "Harbor",
    "Lantern",
    "Orchard",
    "Meridian",
    "Tide",
    "Garden",
    "Bridge",
    "Compass",
    "Archive",
    "Feather",
    "Mirror",
    "Citadel",
    "River",
    "Chorus",
    "Atlas",
    "Season",
    "Voyage",
    "Clockwork",
)
_PRONOUNS = ("She", "He", "They")


class KnowledgeBaseError(ValueError):
    """Bad generation settings or an unreadable cached knowledge base."""


@dataclasses.dataclass(frozen=True)
class KnowledgeBaseConfig:
    """Sizes of a generated knowledge base (about 200 passages and 1,000 questions by default)."""

    num_countries: int = 6
    """Countries (each has a capital among the towns)."""
    num_towns: int = 30
    """Towns (on a river, in a country)."""
    num_organizations: int = 24
    """Organisations (founded by a person, headquartered in a town)."""
    num_people: int = 80
    """People (born in a town; most work for an organisation, many studied under an earlier person)."""
    num_works: int = 60
    """Works (created by a person, some published by an organisation)."""
    questions_per_hop: int = 400
    """Most questions kept for each hop count."""
    max_hops: int = 3
    """Longest relation chain a question follows (1-3)."""

    def __post_init__(self) -> None:
        sizes = (self.num_countries, self.num_towns, self.num_organizations, self.num_people, self.num_works)
        if min(sizes) < 1 or self.questions_per_hop < 1:
            raise KnowledgeBaseError(f"every count must be >= 1, got {self}")
        if self.num_towns < self.num_countries:
            raise KnowledgeBaseError("num_towns must be >= num_countries (each country needs a capital town)")
        if not 1 <= self.max_hops <= 3:
            raise KnowledgeBaseError(f"max_hops must be 1, 2 or 3, got {self.max_hops}")


@dataclasses.dataclass(frozen=True)
class Entity:
    """One fictional entity of the base."""

    id: str
    """Stable id, e.g. ``person-7``."""
    kind: str
    """One of `KINDS`."""
    name: str
    """Unique name (the title of its passage)."""
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    """Literal facts (years, river, occupation, work kind, pronoun)."""
    relations: dict[str, str] = dataclasses.field(default_factory=dict, compare=False)
    """Relation name -> id of the related entity (each relation is functional: one object)."""


# relation -> (noun phrase about its object given the subject phrase, question asking for the object)
_RELATIONS: dict[str, tuple[str, str]] = {
    "capital": ("the capital of {x}", "What is the capital of {x}?"),
    "country": ("the country where {x} lies", "In which country does {x} lie?"),
    "headquarters": ("the town where {x} is headquartered", "In which town is {x} headquartered?"),
    "founder": ("the founder of {x}", "Who founded {x}?"),
    "born_in": ("the birthplace of {x}", "In which town was {x} born?"),
    "employer": ("the employer of {x}", "Which organization does {x} work for?"),
    "mentor": ("the mentor of {x}", "Who was the mentor of {x}?"),
    "creator": ("the creator of {x}", "Who created {x}?"),
    "publisher": ("the organization that published {x}", "Which organization published {x}?"),
}
# attribute -> question asking for its value
_ATTRIBUTE_QUESTIONS: dict[tuple[str, str], str] = {
    ("town", "river"): "Which river flows through {x}?",
    ("town", "founded"): "In which year was {x} founded?",
    ("organization", "founded"): "In which year was {x} founded?",
    ("person", "born"): "In which year was {x} born?",
    ("person", "occupation"): "What was the occupation of {x}?",
    ("work", "year"): "In which year was {x} completed?",
}


def relation_phrase(relation: str, subject: str) -> str:
    """The noun phrase of ``relation`` applied to ``subject``, e.g. ``the founder of Brightwater Press``.

    Raises:
        KnowledgeBaseError: for a relation the generator does not use (attributes such as ``born`` have none).

    Example:
        >>> relation_phrase("founder", "Talo Press")
        'the founder of Talo Press'
    """
    if relation not in _RELATIONS:
        raise KnowledgeBaseError(f"unknown relation {relation!r}; relations are {sorted(_RELATIONS)}")
    return _RELATIONS[relation][0].format(x=subject)


def _unique_word(rng: random.Random, taken: set[str], syllables: tuple[int, int] = (2, 3)) -> str:
    while True:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(*syllables))) + rng.choice(
            _CODAS
        )
        word = word.capitalize()
        if word not in taken and 4 <= len(word) <= 12:
            taken.add(word)
            return word


def _split_of(question_id: str) -> str:
    digest = int(hashlib.sha256(question_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return next(name for name, (low, high) in SPLITS.items() if low <= digest < high or (high == 1.0 and digest == 1.0))


class KnowledgeBase:
    """Entities, their passages and the questions about them.

    Build one with `generate` (or `cached`, which also indexes it); read ``passages``
    (title + text, one per entity), ``questions`` (a `TaskList`) and ``entities``.
    """

    def __init__(self, seed: int, entities: Sequence[Entity], questions: Sequence[Task], config: KnowledgeBaseConfig):
        self.seed = seed
        self.entities = list(entities)
        self.by_id = {entity.id: entity for entity in self.entities}
        self.config = config
        self.passages = [Passage(entity.id, entity.name, self._render(entity)) for entity in self.entities]
        self.passage_by_title = {passage.title: passage for passage in self.passages}
        self.questions = TaskList(f"knowledge-base-{seed}", questions)

    # ----- generation -------------------------------------------------------------------------------------

    @classmethod
    def generate(cls, seed: int = 0, config: KnowledgeBaseConfig | None = None, **overrides: Any) -> KnowledgeBase:
        """Generate a base deterministically from ``seed`` (same seed and config, same base, on any machine).

        Args:
            seed: Seed of every random choice.
            config: Sizes; defaults to `KnowledgeBaseConfig()`.
            **overrides: Fields of `KnowledgeBaseConfig` to change, e.g. ``num_people=20``.
        """
        config = dataclasses.replace(config or KnowledgeBaseConfig(), **overrides)
        num_countries, num_towns, num_people = config.num_countries, config.num_towns, config.num_people
        rng = random.Random(seed)
        taken: set[str] = set()
        countries = [
            Entity(
                f"country-{i}", "country", _unique_word(rng, taken, (2, 3)) + rng.choice(("ia", "land", "mark", "ora"))
            )
            for i in range(num_countries)
        ]
        towns = []
        for i in range(num_towns):
            town = Entity(
                f"town-{i}",
                "town",
                _unique_word(rng, taken),
                {
                    "river": f"{_unique_word(rng, taken)} River",
                    "founded": rng.randint(820, 1750),
                    "population": rng.randrange(2_000, 400_000, 100),
                },
                {"country": countries[i % num_countries].id},
            )
            towns.append(town)
        for i, country in enumerate(countries):  # every country's capital is one of its towns
            country.relations["capital"] = towns[i].id
        people = []
        for i in range(num_people):
            relations = {"born_in": rng.choice(towns).id}
            if i > 0 and rng.random() < 0.7:
                relations["mentor"] = f"person-{rng.randrange(i)}"
            people.append(
                Entity(
                    f"person-{i}",
                    "person",
                    f"{_unique_word(rng, taken)} {_unique_word(rng, taken)}",
                    {
                        "born": rng.randint(1780, 1990),
                        "occupation": rng.choice(_OCCUPATIONS),
                        "pronoun": rng.choice(_PRONOUNS),
                    },
                    relations,
                )
            )
        organizations = []
        for i in range(config.num_organizations):
            form, kind = rng.choice(_ORG_FORMS)
            organizations.append(
                Entity(
                    f"organization-{i}",
                    "organization",
                    form.format(_unique_word(rng, taken)),
                    {
                        "founded": rng.randint(1600, 1960),
                        "kind": kind,
                    },
                    {"headquarters": rng.choice(towns).id, "founder": rng.choice(people).id},
                )
            )
        for person in people:
            if rng.random() < 0.85:
                person.relations["employer"] = rng.choice(organizations).id
        works = []
        for i in range(config.num_works):
            title = f"The {rng.choice(_TITLE_ADJECTIVES)} {rng.choice(_TITLE_NOUNS)}"
            if title in taken:  # titles repeat once the word lists run out: qualify them with a place
                title = f"{title} of {_unique_word(rng, taken)}"
            taken.add(title)
            kind, verb = rng.choice(_WORK_KINDS)
            creator = rng.choice(people)
            relations = {"creator": creator.id}
            if rng.random() < 0.6:
                relations["publisher"] = rng.choice(organizations).id
            works.append(
                Entity(
                    f"work-{i}",
                    "work",
                    title,
                    {
                        "year": creator.attributes["born"] + rng.randint(20, 60),
                        "kind": kind,
                        "verb": verb,
                    },
                    relations,
                )
            )
        entities = [*countries, *towns, *organizations, *people, *works]
        base = cls(seed, entities, [], config)
        questions = base._make_questions(random.Random(seed + 1), config.questions_per_hop, config.max_hops)
        return cls(seed, entities, questions, config)

    # ----- passages ---------------------------------------------------------------------------------------

    def _name(self, entity_id: str) -> str:
        return self.by_id[entity_id].name

    def _render(self, entity: Entity) -> str:
        a, r = entity.attributes, entity.relations
        if entity.kind == "country":
            towns = [e.name for e in self.entities if e.kind == "town" and e.relations.get("country") == entity.id]
            others = [name for name in towns if name != self._name(r["capital"])][:4]
            listed = f" Other towns of {entity.name} include {', '.join(others)}." if others else ""
            return (
                f"{entity.name} is a country whose capital is {self._name(r['capital'])}.{listed} "
                f"Its towns lie along several rivers and trade routes."
            )
        if entity.kind == "town":
            natives = [e.name for e in self.entities if e.kind == "person" and e.relations.get("born_in") == entity.id][
                :3
            ]
            born = f" Notable people born in {entity.name} include {', '.join(natives)}." if natives else ""
            return (
                f"{entity.name} is a town in {self._name(r['country'])}, on the banks of the {a['river']}. "
                f"It was founded in {a['founded']} and has a population of about {a['population']:,}.{born}"
            )
        if entity.kind == "organization":
            return (
                f"{entity.name} is a {a['kind']} founded in {a['founded']} by {self._name(r['founder'])}. "
                f"It is headquartered in {self._name(r['headquarters'])}."
            )
        if entity.kind == "person":
            pronoun = a["pronoun"]
            verb = "were" if pronoun == "They" else "was"
            article = "an" if a["occupation"][0] in "aeiou" else "a"
            text = (
                f"{entity.name} (born {a['born']}) is {article} {a['occupation']}. "
                f"{pronoun} {verb} born in {self._name(r['born_in'])}."
            )
            if "employer" in r:
                text += f" {entity.name} works for {self._name(r['employer'])}."
            if "mentor" in r:
                text += f" {pronoun} studied under {self._name(r['mentor'])}."
            created = [e.name for e in self.entities if e.kind == "work" and e.relations.get("creator") == entity.id][
                :2
            ]
            if created:
                text += f" Known works: {', '.join(created)}."
            return text
        text = f"{entity.name} is a {a['kind']} completed in {a['year']}. {self._name(r['creator'])} {a['verb']} it."
        if "publisher" in r:
            text += f" It was published by {self._name(r['publisher'])}."
        return text

    # ----- questions --------------------------------------------------------------------------------------

    def _chains(self, start: Entity, hops: int) -> Iterator[list[tuple[str, Entity]]]:
        """Relation chains of ``hops`` entity-valued relations from ``start`` (no entity visited twice)."""
        if hops == 0:
            yield []
            return
        for relation, target_id in start.relations.items():
            target = self.by_id[target_id]
            for rest in self._chains(target, hops - 1):
                if all(entity.id != start.id for _, entity in rest):
                    yield [(relation, target), *rest]

    def _make_questions(self, rng: random.Random, per_hop: int, max_hops: int) -> list[Task]:
        candidates: dict[int, list[Task]] = {hops: [] for hops in range(1, max_hops + 1)}
        for start in self.entities:
            for relation_hops in range(0, max_hops + 1):
                for chain in self._chains(start, relation_hops):
                    path = [start] + [entity for _, entity in chain]
                    # End on an attribute of the last entity (one more hop), or on the last relation itself.
                    last = path[-1]
                    for (kind, attribute), question in _ATTRIBUTE_QUESTIONS.items():
                        if kind == last.kind and 1 <= relation_hops + 1 <= max_hops:
                            candidates[relation_hops + 1].append(
                                self._task(start, chain, question, str(last.attributes[attribute]), attribute)
                            )
                    if chain:
                        relation, target = chain[-1]
                        candidates[relation_hops].append(
                            self._task(start, chain[:-1], _RELATIONS[relation][1], target.name, relation, target)
                        )
        questions = []
        for hops in sorted(candidates):
            pool = sorted({task.id: task for task in candidates[hops]}.values(), key=lambda task: task.id)
            rng.shuffle(pool)
            questions.extend(pool[:per_hop])
        return questions

    def _task(
        self,
        start: Entity,
        chain: list[tuple[str, Entity]],
        question: str,
        answer: str,
        final: str,
        answer_entity: Entity | None = None,
    ) -> Task:
        phrase = start.name
        for relation, _ in chain:
            phrase = relation_phrase(relation, phrase)
        text = question.format(x=phrase)
        text = text[0].upper() + text[1:]
        path = [start] + [entity for _, entity in chain]
        relations = [relation for relation, _ in chain] + [final]
        question_id = f"kb{self.seed}-{start.id}-" + "-".join(relations)
        return Task(
            id=question_id,
            question=text,
            answers=(answer,),
            source="knowledge_base",
            metadata={
                "hops": len(relations),
                "relations": relations,
                "entity_path": [entity.id for entity in path] + ([answer_entity.id] if answer_entity else []),
                "evidence_titles": [entity.name for entity in path],
                "search_queries": [entity.name for entity in path],
                "split": _split_of(question_id),
            },
        )

    def split(self, name: str, hops: int | Collection[int] | None = None) -> TaskList:
        """The questions of one split (``train``, ``validation`` or ``test``), hop counts interleaved; with
        ``hops``, only the questions of those hop counts, in the same order.

        The order is 1-hop, 2-hop, 3-hop, 1-hop, ... (while each lasts), so that the first N questions of a
        split, which a warm-up clones and a held-out evaluation scores, mix every hop count.

        Raises:
            KnowledgeBaseError: an unknown split, or hop counts outside 1-``max_hops``.
        """
        if name not in SPLITS:
            raise KnowledgeBaseError(f"split must be one of {sorted(SPLITS)}, got {name!r}")
        counts = set(range(1, self.config.max_hops + 1))
        kept = counts if hops is None else {hops} if isinstance(hops, int) else set(hops)
        if not kept or not kept <= counts:
            raise KnowledgeBaseError(f"hops must name hop counts among 1-{self.config.max_hops}, got {hops!r}")
        rank: dict[int, int] = {}
        keyed = []
        for task in self.questions:
            count = task.metadata["hops"]
            if task.metadata["split"] == name and count in kept:
                rank[count] = rank.get(count, -1) + 1
                keyed.append(((rank[count], count), task))
        return TaskList(f"{self.questions.name}-{name}", [task for _, task in sorted(keyed, key=lambda kt: kt[0])])

    # ----- persistence ------------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``passages.jsonl`` ({id, title, text}), ``entities.jsonl``, ``questions.jsonl`` and ``meta.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        counts = {
            "passages.jsonl": write_jsonl(directory / "passages.jsonl", (dataclasses.asdict(p) for p in self.passages)),
            "entities.jsonl": write_jsonl(directory / "entities.jsonl", (dataclasses.asdict(e) for e in self.entities)),
            "questions.jsonl": write_jsonl(
                directory / "questions.jsonl",
                (
                    {"id": t.id, "question": t.question, "answers": list(t.answers), "metadata": t.metadata}
                    for t in self.questions
                ),
            ),
        }
        # Written last, with each file's record count: `load` tells a whole base from one cut short at a line end.
        meta = {"seed": self.seed, "config": dataclasses.asdict(self.config), "generator_version": GENERATOR_VERSION,
                "counts": counts}
        (directory / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> KnowledgeBase:
        """Read a base written by `save`.

        Raises:
            KnowledgeBaseError: when a file is missing, holds a bad line, or holds fewer records than `save` wrote.
        """
        directory = Path(directory)
        try:
            meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))

            def whole(name: str) -> list[Any]:
                reader = JsonlReader(directory / name)
                records = list(reader)
                if reader.skipped or len(records) != meta["counts"][name]:
                    raise ValueError(f"{name} holds {len(records)} good records of the {meta['counts'][name]} written")
                return records

            entities = [Entity(**record) for record in whole("entities.jsonl")]
            questions = [
                Task(
                    id=r["id"],
                    question=r["question"],
                    answers=tuple(r["answers"]),
                    source="knowledge_base",
                    metadata=r["metadata"],
                )
                for r in whole("questions.jsonl")
            ]
            whole("passages.jsonl")  # what the search index is built from
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise KnowledgeBaseError(f"cannot read the knowledge base in {directory}: {error}") from error
        return cls(int(meta["seed"]), entities, questions, KnowledgeBaseConfig(**meta["config"]))

    @classmethod
    def cached(
        cls,
        seed: int = 0,
        cache_dir: str | os.PathLike | None = None,
        embedder: Any = None,
        config: KnowledgeBaseConfig | None = None,
        **overrides: Any,
    ) -> tuple[KnowledgeBase, Path]:
        """The base for ``seed`` and the path of its dense index, generated and indexed on first use.

        Args:
            seed: Generation seed.
            cache_dir: Where to keep it (default ``$RAPO_CACHE_DIR`` or ``~/.cache/rapo``).
            embedder: A `rapo_tools.search.embedding.Embedder` for indexing (default: embedded MiniLM).
            config: Sizes (part of the cache key); defaults to `KnowledgeBaseConfig()`.
            **overrides: Fields of `KnowledgeBaseConfig` to change.

        Returns:
            ``(knowledge_base, index_path)``; open the index with ``WikiSearch.load(index_path)``.
        """
        config = dataclasses.replace(config or KnowledgeBaseConfig(), **overrides)
        fingerprint = json.dumps([GENERATOR_VERSION, seed, dataclasses.asdict(config)], sort_keys=True)
        key = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
        root = Path(cache_dir) if cache_dir is not None else rapo_cache_dir()
        directory = root / "knowledge_base" / f"seed{seed}-{key}"
        try:
            base = cls.load(directory)
        except KnowledgeBaseError:
            base = cls.generate(seed, config)
            # Write to a temporary sibling, then rename: concurrent first uses never see half a base.
            directory.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
            base.save(staging)
            shutil.rmtree(directory, ignore_errors=True)  # a copy that did not read (cut short, edited) is replaced
            try:
                os.replace(staging, directory)
            except OSError:  # another process won the race; its copy is identical
                shutil.rmtree(staging, ignore_errors=True)
        index_path = cached_corpus_index(directory / "passages.jsonl", embedder=embedder, cache_dir=root)
        return base, index_path
