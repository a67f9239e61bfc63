"""Settings as typed dataclasses: each field's annotation says what a value from YAML may be.

`settings_from_dict` turns a nested mapping (a YAML file, a checkpoint's config) into a dataclass, converting each
value to its field's type or raising a `ConfigError` that names the setting; `check_choices` lets a settings class
check its `Literal` fields when it is built in code. `rapo_agents.config` holds the schema.

Example:
    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Sampling:
    ...     temperature: float = 1.0
    ...     mode: Switch = "auto"
    >>> settings_from_dict(Sampling, {"temperature": "1e-1", "mode": True})
    Sampling(temperature=0.1, mode='true')
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A config file or override that does not fit the settings."""


Switch = Literal["auto", "true", "false"]
"""A setting that is on, off, or ``auto`` (decided by the machine: on GPU only). YAML's bare ``true``/``false``
are read as these strings."""


def check_choices(settings: Any) -> None:
    """Raise `ValueError` for a `Literal` field of the dataclass ``settings`` that holds none of its values."""
    for name, annotation in field_types(type(settings)).items():
        allowed = typing.get_args(annotation) if typing.get_origin(annotation) is Literal else None
        if allowed and getattr(settings, name) not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {getattr(settings, name)!r}")


def plain(value: Any) -> Any:
    """``value`` with tuples as lists, all the way down (what YAML and JSON write)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def field_types(cls: type) -> dict[str, Any]:
    """The annotation of each field of the dataclass ``cls``, resolved."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls)}


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Convert a YAML value to a field's annotated type, or raise a `ConfigError` saying where."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError("; ".join(errors))
    if origin is typing.Literal:
        if isinstance(value, bool) and str(value).lower() in typing.get_args(annotation):
            value = str(value).lower()  # a `Switch` written as YAML's bare true/false
        if value not in typing.get_args(annotation):
            raise ConfigError(f"{where} must be one of {typing.get_args(annotation)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} is a section; give a mapping, got {value!r}")
        return settings_from_dict(annotation, value, where + ".")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        item_types = typing.get_args(annotation)
        if len(item_types) != len(value):
            raise ConfigError(f"{where} must have {len(item_types)} items, got {len(value)}")
        return tuple(_coerce(item, item_type, where) for item, item_type in zip(value, item_types, strict=True))
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return str(value).lower() if isinstance(value, bool) else str(value)
    return value


def settings_from_dict(cls: type, data: dict[str, Any], prefix: str = "", defaults: Any = None) -> Any:
    """``cls`` with ``data`` over ``defaults`` (default ``cls()``); a nested section starts from its default in
    the parent, since a parent may set one apart from its class (``TrainConfig.rollout``)."""
    types_by_name = field_types(cls)
    unknown = [key for key in data if key not in types_by_name]
    if unknown:
        hints = {key: difflib.get_close_matches(key, list(types_by_name), n=1) for key in unknown}
        described = ", ".join(
            f"{prefix}{key}" + (f" (did you mean {prefix}{hints[key][0]}?)" if hints[key] else "") for key in unknown)
        raise ConfigError(f"unknown setting(s): {described}")
    defaults = cls() if defaults is None else defaults
    values = {}
    for name, value in data.items():
        annotation = types_by_name[name]
        if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
            values[name] = settings_from_dict(annotation, value, f"{prefix}{name}.", getattr(defaults, name))
        else:
            values[name] = _coerce(value, annotation, prefix + name)
    try:
        return dataclasses.replace(defaults, **values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {error}") from error
