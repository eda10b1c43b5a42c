"""Geolocation from one image: IM2GPS3K and GeoBench (GeoVista), scored by distance and by place.

Release layouts read, found by their annotation file (``annotations=`` names one directly):

* IM2GPS3K: ``im2gps3k_places365.csv`` (TIBHannover/GeoEstimation, meta/) with columns IMG_ID, AUTHOR, LAT,
  LON, S3_Label, S16_Label, S365_Label, Prob_indoor, Prob_natural, Prob_urban; the 3,000 images are
  ``im2gps3ktest/{IMG_ID}`` (im2gps3ktest.zip of lugiavn/revisiting-im2gps; ``images/`` also works). An early
  version of that CSV says ``LON,LAT`` over latitude, longitude values: a latitude beyond +-90 is refused.
* GeoBench as LibraTree/GeoVistaBench on the Hugging Face hub: a Parquet file under ``data/test/`` with
  columns id, raw_image_path (``raw_image/<uid>/...``), preview, metadata (a JSON string; the location is in
  ``metadata["location"]`` or in ``metadata`` itself, with lat, lng, city, province_or_state, country, as
  ekonwang/GeoVista eval/eval_infer_geolocation.py reads it), data_type (panorama, satellite, ...). The same
  rows as ``geobench.json`` / ``geobench.jsonl`` need no pyarrow.

Prompt: GeoVista's user text "Please analyze where is the place." (eval/inference_agent_tool_mode.py) and a
request for coordinates, since both benchmarks are scored on them.

Scoring: the answer's coordinates (:func:`mmagent.eval.metrics.parse_latlon`) against the true point: haversine km
(accuracy within 1 / 3 / 25 / 200 / 750 / 2500 km: IM2GPS3K's thresholds and GeoBench's < 3 km) and
:func:`mmagent.eval.metrics.geo_match` against the GeoNames city (>= 15,000 people) nearest the true point, which
gives the country / region / city accuracy for both benchmarks alike. GeoVista's own scorer instead matches
the true city / state / country names in the answer text (and geocodes the answer with a paid API for
distances); the names are kept in the metadata. ``score`` is 1.0 within 25 km (IM2GPS3K's city scale).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from mmagent.eval.benchmarks.base import (ANNOTATIONS_HINT, DatasetError, check_media, check_unique, field, find_file,
                                          groups, number, read_rows, share)
from mmagent.eval.metrics import Place, geo_accuracy_at, geo_match, median_km, parse_latlon, reverse_geocode
from mmagent.trajectory import Task

NAME = "geo"
IM2GPS3K_FILE = "im2gps3k_places365.csv"
IM2GPS3K_IMAGE_DIRS = ("im2gps3ktest", "images")
GEOBENCH_FILES = ("data/test/data-00000-of-00001.parquet", "geobench.jsonl", "geobench.json")
QUESTION = ("Please analyze where is the place. "
            "Answer with its latitude and longitude in degrees as <answer>lat, lon</answer>.")
THRESHOLDS_KM = (1, 3, 25, 200, 750, 2500)
CITY_KM = 25.0


def load(data_dir: str | os.PathLike, limit: int | None = None, *,
         annotations: str | os.PathLike | None = None, image_dir: str | os.PathLike | None = None) -> list[Task]:
    """The IM2GPS3K or GeoBench images in ``data_dir`` (the first ``limit`` of them)."""
    root = Path(data_dir)
    path = Path(annotations) if annotations else find_file(
        root, (IM2GPS3K_FILE, *GEOBENCH_FILES), "IM2GPS3K or GeoBench annotation file",
        hint=ANNOTATIONS_HINT)
    if not path.is_file():
        raise DatasetError(f"geolocation annotation file {path} does not exist")
    rows = read_rows(path)
    if path.suffix == ".csv":
        items, base = [_im2gps3k(where, row) for where, row in rows], _im2gps3k_images(root, image_dir)
    else:
        items, base = [_geobench(where, row) for where, row in rows], Path(image_dir) if image_dir else root
    tasks, missing = [], []
    for item in items[:limit] if limit is not None else items:
        image = base / item.pop("image")
        if not image.is_file():
            missing.append(str(image.relative_to(root) if image.is_relative_to(root) else image))
            continue
        near = reverse_geocode(item["lat"], item["lon"])
        truth = {"lat": item["lat"], "lon": item["lon"], "name": near.name, "country_code": near.country_code,
                 "admin1_code": near.admin1_code, "geonameid": near.geonameid}
        # names from the dataset where it has them (GeoBench), else from GeoNames (IM2GPS3K)
        item["city"] = item.get("city") or near.name
        item["country"] = item.get("country") or near.country_code
        meta = {**item, "geonames_city": near.name, "country_code": near.country_code,
                "admin1_code": near.admin1_code}
        tasks.append(Task(question=QUESTION, image=str(image.resolve()), id=item["id"], task_type="geolocation",
                          answer=truth, metadata=meta, benchmark=NAME))
    check_media(missing, root, "images")
    check_unique(tasks, path)
    return tasks


def truth_place(task: Task) -> Place:
    """The true point as a Place named after its nearest GeoNames city."""
    a = task.answer
    return Place(name=a["name"], country_code=a["country_code"], admin1_code=a["admin1_code"],
                 latitude=float(a["lat"]), longitude=float(a["lon"]), geonameid=int(a["geonameid"]))


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """``km`` to the truth (inf without coordinates), ``city`` / ``region`` / ``country`` hits, ``score``."""
    pred = parse_latlon(answer_text or "")
    match = geo_match(pred, truth_place(task))
    return {"score": float(match["km"] <= CITY_KM), "pred": list(pred) if pred else None, **match}


def summarise(tasks: Sequence[Task], scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Overall and per ``subset`` (GeoBench's data_type): accuracy within each distance, place accuracy,
    median km and the share of answers with coordinates."""
    out = {}
    for name, items in groups(tasks, scores, ("subset",)).items():
        # None: no coordinates (how an infinite distance comes back from a run's strict-JSON predictions)
        kms = [math.inf if s["km"] is None else s["km"] for s in items]
        row: dict[str, float] = {"n": len(items)}
        row.update({f"acc@{t:g}km": v for t, v in geo_accuracy_at(kms, THRESHOLDS_KM).items()})
        row.update({k: share(s[k] for s in items) for k in ("country", "region", "city")})
        row["median_km"] = median_km(kms)
        row["parsed"] = share(s["pred"] is not None for s in items)
        out[name] = row
    return out


# --------------------------------------------------------------------------- reading the annotations

def _latlon(lat: float, lon: float, where: str, hint: str = "") -> tuple[float, float]:
    if abs(lat) > 90:
        raise DatasetError(f"{where}: latitude {lat} is beyond +-90{hint}")
    if abs(lon) > 180:
        raise DatasetError(f"{where}: longitude {lon} is beyond +-180")
    return lat, lon


def _im2gps3k(where: str, row: dict[str, Any]) -> dict[str, Any]:
    name = field(row, "IMG_ID", where)
    keys = list(row)
    swapped = "LON" in keys and "LAT" in keys and keys.index("LON") < keys.index("LAT")
    hint = (" (this looks like the early im2gps3k_places365.csv whose header says LON,LAT over latitude, "
            "longitude values: use the corrected file, header IMG_ID,AUTHOR,LAT,LON,...)") if swapped else ""
    lat, lon = _latlon(number(row, "LAT", where), number(row, "LON", where), where, hint)
    meta = {"id": Path(name).stem, "image": name, "lat": lat, "lon": lon, "dataset": "im2gps3k", "subset": None,
            "author": row.get("AUTHOR")}
    meta.update({k.lower(): row[k] for k in ("S3_Label", "S16_Label", "S365_Label") if row.get(k) not in (None, "")})
    return meta


def _im2gps3k_images(root: Path, image_dir: str | os.PathLike | None) -> Path:
    if image_dir:
        return Path(image_dir)
    for name in IM2GPS3K_IMAGE_DIRS:
        if (root / name).is_dir():
            return root / name
    raise DatasetError(f"{root}: no IM2GPS3K image folder found; looked for: {', '.join(IM2GPS3K_IMAGE_DIRS)} "
                       "(or pass image_dir=PATH)")


def _geobench(where: str, row: dict[str, Any]) -> dict[str, Any]:
    raw = row.get("metadata")
    try:
        meta = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: field 'metadata' is not valid JSON ({exc.msg})") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{where}: field 'metadata' is {raw!r}, expected a JSON object")
    loc = meta.get("location") if isinstance(meta.get("location"), dict) else meta
    lat = number(loc, ("lat", "latitude"), f"{where}: metadata.location")
    lon = number(loc, ("lng", "lon", "long", "longitude"), f"{where}: metadata.location")
    lat, lon = _latlon(lat, lon, where)
    if row.get("raw_image_path") is None and row.get("image") is not None:
        raise DatasetError(f"{where}: this packaging embeds the images (LibraTree/GeoBench); use "
                           "LibraTree/GeoVistaBench, whose rows name their raw_image_path")
    uid = str(row.get("id") or meta.get("uid") or field(row, "raw_image_path", where))
    names = {k: _text(loc, keys) for k, keys in (("city", ("city", "city_name", "town", "locality")),
                                                  ("region", ("province_or_state", "state", "admin1")),
                                                  ("country", ("country", "country_name")))}
    subset = row.get("data_type") or meta.get("data_type") or "panorama"  # GeoBench README: default panorama
    return {"id": uid, "image": field(row, "raw_image_path", where), "lat": lat, "lon": lon,
            "dataset": "geobench", "subset": str(subset), **names}


def _text(d: dict[str, Any], keys: Sequence[str]) -> str | None:
    for k in keys:
        if isinstance(d.get(k), str) and d[k].strip():
            return d[k].strip()
    return None

