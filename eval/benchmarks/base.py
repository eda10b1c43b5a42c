"""What every benchmark module shares: the error it raises, reading annotation tables, media checks, groups.

Each benchmark module (``videomme``, ``charades_sta``, ``geo``, ``vstar``) has the same face:

* ``NAME``;
* ``REFERENCE``: the public scorer its default ``score`` reproduces (repo, file, commit; see
  :mod:`mmagent.eval.scorers`), written into each run's run.json and summary.json;
* ``load(data_dir, limit=None, **options) -> list[Task]`` reads the official release layout from a local
  folder (each task's ``benchmark`` set to ``NAME``, so RL rewards score it with this module's ``score``)
  and raises :class:`DatasetError` saying exactly what is missing. A malformed annotation row does not sink
  the file: it is logged and listed by file and line in the returned :class:`TaskList`'s ``skipped`` (the
  eval runner counts it in the summary); only a file with no usable row at all is an error;
* ``score(task, answer_text) -> dict`` scores one answer (always with a float ``"score"``);
* ``summarise(tasks, scores) -> dict[str, dict[str, float]]``: row name (``"overall"``, ``"duration/short"``,
  ...) -> metrics, each row with its ``n``. Shares are fractions in [0, 1], not percentages.

Annotation tables are read with the standard library (JSON, JSON Lines, CSV); Parquet needs pyarrow,
imported only when a Parquet file is read.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import string
from pathlib import Path
from typing import Any, Iterable, Sequence

from mmagent.trajectory import Task

#: how many missing media files an error message lists by name
SHOW_MISSING = 5

log = logging.getLogger("mmagent.eval")


class DatasetError(ValueError):
    """A benchmark folder that cannot be used: missing files, malformed rows, missing media."""


class TaskList(list):
    """The tasks a loader read, plus ``skipped``: one ``"file:line: what is wrong"`` per annotation row that
    could not be used (a plain list otherwise)."""

    def __init__(self, tasks: Iterable[Task] = (), skipped: Iterable[str] = ()) -> None:
        super().__init__(tasks)
        self.skipped: list[str] = list(skipped)


def skipped_rows(tasks: Sequence[Task]) -> list[str]:
    """The malformed rows a loader skipped (``tasks.skipped`` of a :class:`TaskList`; [] for any other list)."""
    return list(getattr(tasks, "skipped", []))


def skip_row(skipped: list[str], error: DatasetError) -> None:
    """Record (and log) one malformed annotation row; its message already starts with ``file:line:``."""
    skipped.append(str(error))
    log.warning("skipped a malformed annotation row: %s", error)


def task_list(tasks: Sequence[Task], skipped: Sequence[str], where: str | os.PathLike) -> TaskList:
    """``tasks`` with their ``skipped`` rows; a DatasetError if rows were skipped and none was usable."""
    if skipped and not tasks:
        shown = "; ".join(skipped[:SHOW_MISSING])
        raise DatasetError(f"{where}: none of its rows could be used ({len(skipped)} malformed): {shown}")
    return TaskList(tasks, skipped)


#: what to do when a release's annotation file is not where it should be
ANNOTATIONS_HINT = ("Put the release's files there as the README's benchmark table shows (from Python, "
                    "load(..., annotations=PATH) takes a file elsewhere)")


def find_file(root: str | os.PathLike, names: Sequence[str], what: str, hint: str = "") -> Path:
    """The first of ``names`` (relative to ``root``) that exists, or a DatasetError listing them all."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"no {what} folder at {root}")
    for name in names:
        if (root / name).is_file():
            return root / name
    looked = ", ".join(names)
    raise DatasetError(f"{root}: no {what} found; looked for: {looked}" + (f". {hint}" if hint else ""))


def read_rows(path: str | os.PathLike, skipped: list[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The rows of an annotation table as ``("file:row", row)`` pairs, row numbers as an editor shows them.

    ``.jsonl``: one object a line (line number); with ``skipped`` given, a line that is not a JSON object is
    recorded there (:func:`skip_row`) instead of raising. ``.json``: a list of objects, or ``{"data": [...]}``
    (1-based item number). ``.csv``: a header line then rows (the row's last line number, so the first row is 2).
    ``.parquet``: via pyarrow (1-based row number).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            out = []
            with open(path, encoding="utf-8") as fh:
                for k, line in enumerate(fh, start=1):
                    if line.strip():
                        try:
                            try:
                                value = json.loads(line)
                            except json.JSONDecodeError as exc:
                                raise DatasetError(f"{path}:{k}: not valid JSON ({exc.msg})") from None
                            out.append((f"{path}:{k}", _as_row(value, f"{path}:{k}")))
                        except DatasetError as exc:
                            if skipped is None:
                                raise
                            skip_row(skipped, exc)
            return out
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            if not isinstance(data, list):
                raise DatasetError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
            return [(f"{path}:{k}", _as_row(r, f"{path}:{k}")) for k, r in enumerate(data, start=1)]
        if suffix == ".csv":
            with open(path, encoding="utf-8", newline="") as fh:
                reader = csv.DictReader(fh)
                return [(f"{path}:{reader.line_num}", dict(r)) for r in reader]
        if suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise DatasetError(f"{path}: reading Parquet needs pyarrow, which is not installed "
                                   "(pip install pyarrow), or give the same rows as a .json/.jsonl file") from None
            try:
                rows = pq.read_table(path).to_pylist()
            except Exception as exc:  # pyarrow's errors (ArrowInvalid, OSError) share no narrower base
                raise DatasetError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
            return [(f"{path}:{k}", r) for k, r in enumerate(rows, start=1)]
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from None
    raise DatasetError(f"{path}: unknown table format {suffix!r} (use .json, .jsonl, .csv or .parquet)")


def _as_row(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DatasetError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _pick(row: dict[str, Any], names: str | Sequence[str], where: str) -> tuple[str, Any]:
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        if row.get(name) is not None:
            return name, row[name]
    raise DatasetError(f"{where}: field {' / '.join(repr(n) for n in names)} is missing")


def field(row: dict[str, Any], names: str | Sequence[str], where: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[name]`` for the first of ``names`` present, checked to be ``kind`` (and non-empty if a string)."""
    name, value = _pick(row, names, where)
    if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        raise DatasetError(f"{where}: field {name!r} is {value!r}, expected a non-empty {_kind_name(kind)}")
    return value


def number(row: dict[str, Any], names: str | Sequence[str], where: str) -> float:
    """A finite float from a number or numeric-string field."""
    name, raw = _pick(row, names, where)
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise DatasetError(f"{where}: field {name!r} is {raw!r}, expected a finite number")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def check_media(missing: Sequence[str], root: str | os.PathLike, what: str = "media files") -> None:
    """Raise one DatasetError naming the first few missing files and how many there are in all."""
    if missing:
        shown = "; ".join(missing[:SHOW_MISSING])
        more = f" (and {len(missing) - SHOW_MISSING} more)" if len(missing) > SHOW_MISSING else ""
        raise DatasetError(f"{root}: {len(missing)} {what} missing: {shown}{more}")


def check_unique(tasks: Sequence[Task], where: str | os.PathLike, what: str = "id") -> None:
    """Raise a DatasetError if two tasks share an id."""
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise DatasetError(f"{where}: {what} {t.id!r} appears more than once")
        seen.add(t.id)


def option_letters(n: int) -> str:
    """The first ``n`` option letters: ``option_letters(4) == "ABCD"``."""
    if not 1 <= n <= 26:
        raise ValueError(f"cannot letter {n} options")
    return string.ascii_uppercase[:n]


def groups(tasks: Sequence[Task], scores: Sequence[dict[str, Any]], keys: Iterable[str],
           order: dict[str, Sequence[str]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """``"overall"`` and ``"key/value"`` for each metadata key -> the score dicts of the items in that group.

    Values listed in ``order[key]`` come first, in that order; others follow as first seen. Items without
    the key (or with None) are left out of that key's groups.
    """
    if len(tasks) != len(scores):
        raise ValueError(f"{len(tasks)} tasks but {len(scores)} scores")
    out: dict[str, list[dict[str, Any]]] = {"overall": list(scores)} if scores else {}
    order = order or {}
    for key in keys:
        found: dict[str, list[dict[str, Any]]] = {str(v): [] for v in order.get(key, ())}
        for task, s in zip(tasks, scores):
            value = task.metadata.get(key)
            if value is not None:
                found.setdefault(str(value), []).append(s)
        out.update({f"{key}/{value}": rows for value, rows in found.items() if rows})
    return out


def share(values: Iterable[Any]) -> float:
    """The fraction of truthy values (0.0 if there are none)."""
    values = list(values)
    return sum(bool(v) for v in values) / len(values) if values else 0.0
