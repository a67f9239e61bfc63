"""``rapo train --help``'s list of settings: every key with its type, default and the first line of its docstring,
grouped by section, as ``HfArgumentParser`` lists TRL's arguments.

The docstrings are the attribute docstrings of the config dataclasses (a string right after the field), read
from their source with `ast`, so the help never drifts from the code.

Example:
    >>> from rapo_agents.config import TrainConfig
    >>> rows = {row.key: row for row in settings(TrainConfig)}
    >>> rows["rollout.rollout_n"].type, rows["rollout.rollout_n"].default
    ('int', '4')
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from typing import Any


@dataclasses.dataclass(frozen=True)
class Setting:
    """One settable key of a config."""

    section: str
    """The top-level section (``rollout``), or ``""`` for top-level keys."""
    key: str
    """The dotted key (``rollout.rollout_n``)."""
    type: str
    """The annotated type, as written in the code."""
    default: str
    """The default value, as YAML would write it."""
    doc: str
    """The first line of the field's docstring."""


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass and its bases: ``{field: docstring}``."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for statement, following in zip(body, body[1:], strict=False):
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def _first_sentence_line(doc: str) -> str:
    return " ".join(doc.split("\n\n", 1)[0].split())


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        value = list(value)
    return str(value) if not isinstance(value, str) else (value or '""')


def settings(cls: type, prefix: str = "", section: str = "", defaults: Any = None) -> list[Setting]:
    """Every leaf setting of the config dataclass ``cls``, in declaration order, with the defaults of ``cls()``
    (a section's factory may override its class's own defaults)."""
    defaults = cls() if defaults is None else defaults
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows: list[Setting] = []
    for field in dataclasses.fields(cls):
        annotation, default = hints[field.name], getattr(defaults, field.name)
        if dataclasses.is_dataclass(annotation):
            rows.extend(settings(annotation, f"{prefix}{field.name}.", section or field.name, default))
            continue
        rows.append(Setting(section, prefix + field.name, _type_name(annotation), _yaml(default),
                            _first_sentence_line(docs.get(field.name, ""))))
    return rows


def render(cls: type, width: int = 120) -> str:
    """The settings of ``cls`` as help text: a heading per section (with the section's docstring), one entry
    per key."""
    section_docs = field_docs(cls)
    lines: list[str] = []
    current = None
    for row in settings(cls):
        if row.section != current:
            current = row.section
            title = row.section or "top level"
            heading = _first_sentence_line(section_docs.get(row.section, "")) if row.section else ""
            lines += ["", f"{title}:" + (f"  {heading}" if heading else "")]
        lines.append(f"  {row.key} ({row.type}, default {row.default})")
        if row.doc:
            lines += textwrap.wrap(row.doc, width, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines).lstrip("\n")
