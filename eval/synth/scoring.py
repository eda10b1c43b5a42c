"""Scoring toy-world answers: one number in [0, 1] per item, plus the parts each family reports.

* ``video_qa`` / ``image_qa``: 1 if the option letter (the benchmark's parser, non-official prefix
  handling) is the right one;
* ``grounding``: the IoU of the first [start, end] pair with the true segment (R@0.3/0.5/0.7 and mIoU
  in the summary);
* ``geolocation``: 1 within 25 km of the city (city level); the summary adds accuracy within
  1/25/200/750/2500 km, country and region accuracy (reverse geocoded) and the median error.

Every summary row carries ``se``, the standard error of its mean (``overall``: of the mean of the family
means). ``chance`` is what guessing scores on each family: 1/4 for the multiple-choice ones; for grounding and
geolocation there is no letter to guess, so the no-tool oracle's score is compared instead.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from mmagent.eval.metrics import (Place, extract_option_letter, geo_accuracy_at, geo_match, mean_iou, median_km,
                          parse_interval, parse_latlon, recall_at_iou, temporal_iou)
from mmagent.trajectory import Task

CHANCE = {"video_qa": 0.25, "image_qa": 0.25}
CITY_KM = 25.0


def truth_place(task: Task) -> Place:
    a = task.answer
    return Place(name=a["name"], country_code=a["country_code"], admin1_code=a["admin1_code"],
                 latitude=a["lat"], longitude=a["lon"], geonameid=a["geonameid"])


def score_answer(task: Task, answer: str | None) -> dict[str, Any]:
    """``{"score": float, ...family parts}`` for one answer (None = no answer: score 0)."""
    family = task.task_type
    text = answer or ""
    if family in ("video_qa", "image_qa"):
        letter = extract_option_letter(text, official=False) if answer is not None else ""
        return {"score": float(letter == task.answer), "pred": letter}
    if family == "grounding":
        pred = parse_interval(text) if answer is not None else None
        return {"score": temporal_iou(pred, tuple(task.answer)), "pred": list(pred) if pred else None}
    if family == "geolocation":
        pred = parse_latlon(text) if answer is not None else None
        match = geo_match(pred, truth_place(task))
        return {"score": float(match["km"] <= CITY_KM), "pred": list(pred) if pred else None, **match}
    raise ValueError(f"not a toy-world task type: {family!r}")


def summarise(tasks: Sequence[Task], scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per family (and ``overall``: the mean of the family means): n, score and the family's own metrics."""
    by_family: dict[str, list[tuple[Task, dict]]] = {}
    for t, s in zip(tasks, scores):
        by_family.setdefault(t.task_type, []).append((t, s))
    out: dict[str, dict[str, float]] = {}
    for family, rows in by_family.items():
        vals = [s["score"] for _, s in rows]
        row: dict[str, float] = {"n": len(rows), "score": sum(vals) / len(vals), "se": standard_error(vals)}
        for level in ("easy", "medium", "hard"):
            lv = [s["score"] for t, s in rows if t.metadata.get("difficulty") == level]
            if lv:
                row[f"score_{level}"] = sum(lv) / len(lv)
        if family == "grounding":
            row["miou"] = mean_iou(vals)
            row.update({f"r@{k}": v for k, v in recall_at_iou(vals).items()})
        elif family == "geolocation":
            kms = [s["km"] for _, s in rows]
            row.update({f"acc@{k:g}km": v for k, v in geo_accuracy_at(kms).items()})
            row["country"] = _share(s["country"] for _, s in rows)
            row["region"] = _share(s["region"] for _, s in rows)
            row["median_km"] = median_km(kms)
        out[family] = row
    if out:
        k = len(out)
        out["overall"] = {"n": len(scores), "score": sum(r["score"] for r in out.values()) / k,
                          "se": math.sqrt(sum(r["se"] ** 2 for r in out.values())) / k}
    return out


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of ``values`` (sample standard deviation / sqrt(n); 0 for n < 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _share(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return sum(bool(f) for f in flags) / len(flags) if flags else math.nan


def _cell(row: dict[str, float]) -> str:
    return f"{row['score']:.3f} ± {row['se']:.3f}" if "se" in row else f"{row['score']:.3f}"


def format_table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """A Markdown table: one row per family, one column per run (e.g. oracle, no-tool oracle, a model); each
    score with its standard error."""
    runs = list(results)
    families = [f for f in ("video_qa", "grounding", "image_qa", "geolocation", "overall")
                if any(f in results[r] for r in runs)]
    lines = ["| family | n | " + " | ".join(runs) + " |", "|---|---|" + "---|" * len(runs)]
    for f in families:
        n = next(int(results[r][f]["n"]) for r in runs if f in results[r])
        cells = [_cell(results[r][f]) if f in results[r] else "-" for r in runs]
        lines.append(f"| {f} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
