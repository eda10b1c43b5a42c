"""Typed training configs from YAML files plus ``key=value`` overrides.

A config is a dataclass (nested dataclasses allowed); a YAML file sets any of its fields and
``overrides`` such as ``["lr=1e-5", "advantage.mode=grpo"]`` set them again from the command line
(values parsed as YAML, so ``true``, ``3``, ``[a, b]`` work). Unknown keys are errors that name the
known ones, so a typo never trains with a silent default. A path that is not a file may name a shipped
config (``sft_synth`` for ``training/configs/sft_synth.yaml``), so an installed package finds them too.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from pathlib import Path
from typing import Any, Sequence, TypeVar, get_type_hints

import yaml

T = TypeVar("T")

SHIPPED = Path(__file__).resolve().parent / "configs"


class ConfigError(ValueError):
    """A config file or override that does not fit the config's fields."""


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _build(cls: type[T], data: dict[str, Any], where: str) -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
    hints = get_type_hints(cls)
    known = _field_names(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} for {cls.__name__}; known: {', '.join(known)}")
        kind = hints.get(key)
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            value = _build(kind, value, f"{where}.{key}")
        kwargs[key] = _scalar(kind, value, f"{where}: {key}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _scalar(kind: Any, value: Any, what: str) -> Any:
    """``value`` checked against a bool / int / float field; YAML reads ``1e-5`` as a string, made a float here."""
    args = typing.get_args(kind)
    if type(None) in args:  # Optional[X]: None is fine, else X decides
        if value is None:
            return value
        rest = [a for a in args if a is not type(None)]
        kind = rest[0] if len(rest) == 1 else kind
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{what} must be true or false, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{what} must be a whole number, got {value!r}")
    if kind is float:
        try:
            number = float(value) if not isinstance(value, (bool, list, dict)) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise ConfigError(f"{what} must be a finite number, got {value!r}")
        return number
    return value


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        data = data.setdefault(p, {})
        if not isinstance(data, dict):
            raise ConfigError(f"override {dotted!r}: {p!r} is not a section")
    data[parts[-1]] = value


def shipped_configs() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def resolve_config(path: str | os.PathLike) -> Path:
    """``path`` if it is a file, else the shipped config of that name; :class:`ConfigError` if neither."""
    p = Path(path)
    if p.is_file():
        return p
    shipped = SHIPPED / (p.name if p.suffix == ".yaml" else f"{p.name}.yaml")
    if shipped.is_file():
        return shipped
    raise ConfigError(f"config file not found: {p} (shipped configs: {', '.join(shipped_configs())})")


def load_config(cls: type[T], path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> T:
    """``cls`` from the YAML file at ``path`` (optional) with ``key=value`` ``overrides`` applied."""
    data: dict[str, Any] = {}
    where = cls.__name__
    if path is not None:
        p = resolve_config(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML ({exc})") from None
        where = str(p)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value")
        key, raw = item.split("=", 1)
        _set(data, key.strip(), yaml.safe_load(raw))
    return _build(cls, data, where)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
