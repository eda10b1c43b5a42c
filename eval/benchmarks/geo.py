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
request for the place's names (GeoBench matches them) and its coordinates (both benchmarks measure distances).

Scoring, each benchmark by its own reference (``REFERENCE`` names both; run.json records them):

* GeoBench: :mod:`mmagent.eval.scorers.geobench` (ekonwang/GeoVista ``eval/eval_infer_geolocation.py`` and
  ``eval/utils_level_wise_eval.py`` at df320371): ``country`` / ``state`` / ``city`` by the true names found
  in the answer text (its rule-based match, exactly), over the items with a non-empty answer
  (``n_evaluated``); ``lt_3km`` and ``median_km`` (its lower median) over their distances. GeoVista
  geocodes an LLM-extracted address with a paid API; here the distance is from the answer's own coordinates,
  and an answer without coordinates sits at its geocoder's fallback point, as an unplaceable address does.
* IM2GPS3K: :mod:`mmagent.eval.scorers.geoestimation` (TIBHannover/GeoEstimation
  ``classification/utils_global.py`` at 10bde085): accuracy within 1 / 25 / 200 / 750 / 2500 km (d <= t,
  R = 6371 km) over all images, an answer without coordinates beyond every threshold.

Neither reference reads coordinates from text; :func:`mmagent.eval.parsing.coords.parse_latlon` does (labelled
orders, hemispheres before or after, DMS, numbers in prose). Extra columns, never in the references' place:
``country_geonames`` / ``region_geonames`` / ``city_geonames`` (the predicted point reverse-geocoded against
the GeoNames city nearest the truth, :func:`mmagent.eval.metrics.geo_match`), for GeoBench the distance
accuracies, for IM2GPS3K the plain median km (answers without coordinates count as infinitely far).

Per item, ``score`` is 1.0 within 25 km (IM2GPS3K's city scale); ``km`` is the reference's distance;
``city`` / ``region`` / ``country`` are the reference's tiers where it has them (GeoBench's names) and the
GeoNames ones otherwise (IM2GPS3K), which RL rewards use for their place term.

A malformed annotation row is skipped and reported by file and row (``TaskList.skipped``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from mmagent.eval.benchmarks.base import (ANNOTATIONS_HINT, DatasetError, check_media, check_unique, field, find_file,
                                          groups, number, read_rows, share, skip_row, task_list)
from mmagent.eval.metrics import Place, geo_accuracy_at, geo_match, median_km, reverse_geocode
from mmagent.eval.parsing.coords import parse_latlon
from mmagent.eval.scorers import geobench as gb_ref
from mmagent.eval.scorers import geoestimation as im2gps_ref
from mmagent.trajectory import Task

NAME = "geo"
REFERENCE = {"geobench": gb_ref.SOURCE, "im2gps3k": im2gps_ref.SOURCE}
IM2GPS3K_FILE = "im2gps3k_places365.csv"
IM2GPS3K_IMAGE_DIRS = ("im2gps3ktest", "images")
GEOBENCH_FILES = ("data/test/data-00000-of-00001.parquet", "geobench.jsonl", "geobench.json")
QUESTION = ("Please analyze where is the place. Answer with its city, state or province and country, and its "
            "latitude and longitude in degrees, as <answer>city, state, country; lat, lon</answer>.")
THRESHOLDS_KM = im2gps_ref.THRESHOLDS_KM
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
    skipped: list[str] = []
    rows = read_rows(path, skipped)
    if path.suffix == ".csv" and rows:
        _check_im2gps3k_header(path, list(rows[0][1]))
    reader = _im2gps3k if path.suffix == ".csv" else _geobench
    items = []
    for where, row in rows:
        try:
            items.append(reader(where, row))
        except DatasetError as exc:
            skip_row(skipped, exc)
    if not items:
        task_list([], skipped, path)  # raises when rows were skipped
    base = _im2gps3k_images(root, image_dir) if path.suffix == ".csv" else Path(image_dir) if image_dir else root
    tasks, missing = [], []
    for item in items[:limit] if limit is not None else items:
        image = base / item.pop("image")
        if not image.is_file():
            missing.append(str(image.relative_to(root) if image.is_relative_to(root) else image))
            continue
        near = reverse_geocode(item["lat"], item["lon"])
        truth = {"lat": item["lat"], "lon": item["lon"], "name": near.name, "country_code": near.country_code,
                 "admin1_code": near.admin1_code, "geonameid": near.geonameid, "dataset": item["dataset"],
                 "data_type": item["subset"], "names": item.pop("names", None)}
        # names from the dataset where it has them (GeoBench), else from GeoNames (IM2GPS3K)
        item["city"] = item.get("city") or near.name
        item["country"] = item.get("country") or near.country_code
        meta = {**item, "geonames_city": near.name, "country_code": near.country_code,
                "admin1_code": near.admin1_code}
        tasks.append(Task(question=QUESTION, image=str(image.resolve()), id=item["id"], task_type="geolocation",
                          answer=truth, metadata=meta, benchmark=NAME))
    check_media(missing, root, "images")
    check_unique(tasks, path)
    return task_list(tasks, skipped, path)


def truth_place(task: Task) -> Place:
    """The true point as a Place named after its nearest GeoNames city."""
    a = task.answer
    return Place(name=a["name"], country_code=a["country_code"], admin1_code=a["admin1_code"],
                 latitude=float(a["lat"]), longitude=float(a["lon"]), geonameid=int(a["geonameid"]))


def score(task: Task, answer_text: str | None) -> dict[str, Any]:
    """One answer by its benchmark's reference (see the module docstring): ``km``, ``city`` / ``region`` /
    ``country``, ``score`` (within 25 km), the GeoNames tiers as ``*_geonames``, and for GeoBench
    ``evaluated`` and ``km_geobench`` (the distance its median uses)."""
    text = answer_text or ""
    a = task.answer
    truth = (float(a["lat"]), float(a["lon"]))
    pred = parse_latlon(text)
    rg = geo_match(pred, truth_place(task))
    out: dict[str, Any] = {"pred": list(pred) if pred else None,
                           **{f"{k}_geonames": rg[k] for k in ("city", "region", "country")}}
    if a.get("dataset") == "geobench":
        names = a.get("names") or {}
        tiers = gb_ref.tiers(text, names)
        km = gb_ref.haversine_km(pred, truth) if pred else math.inf
        out.update(km=km, city=tiers["city"], region=tiers["state"], country=tiers["country"],
                   evaluated=gb_ref.evaluated(answer_text),
                   km_geobench=gb_ref.distance_km(pred, truth, a.get("data_type")))
    else:
        km = im2gps_ref.gc_distance_km(pred, truth) if pred else math.inf
        out.update(km=km, city=rg["city"], region=rg["region"], country=rg["country"])
    out["score"] = float(km <= CITY_KM)
    return out


def summarise(tasks: Sequence[Task], scores: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Overall and per ``subset`` (GeoBench's data_type): the reference's columns first (GeoBench: country,
    state, city, lt_3km, median_km over the evaluated items; IM2GPS3K: accuracy within 1 / 25 / 200 / 750 /
    2500 km), then the extras (see the module docstring) and ``parsed``, the share of answers with
    coordinates."""
    out = {}
    is_geobench = bool(tasks) and tasks[0].answer.get("dataset") == "geobench"
    for name, items in groups(tasks, scores, ("subset",)).items():
        # None: no coordinates (how an infinite distance comes back from a run's strict-JSON predictions)
        kms = [math.inf if s["km"] is None else s["km"] for s in items]
        row: dict[str, float] = {"n": len(items)}
        if is_geobench:
            done = [s for s in items if s.get("evaluated", True)]
            row["n_evaluated"] = len(done)
            row.update({k: share(s[r] for s in done) for k, r in (("country", "country"), ("state", "region"),
                                                                  ("city", "city"))})
            dists = [s["km_geobench"] for s in done if s.get("km_geobench") is not None]
            row["lt_3km"] = gb_ref.share_below(dists, 3.0)
            row["median_km"] = gb_ref.lower_median(dists)
            row.update({f"acc@{t:g}km": v for t, v in geo_accuracy_at(kms, THRESHOLDS_KM).items()})
        else:
            row.update({f"acc@{t:g}km": v for t, v in im2gps_ref.accuracy_at(kms, THRESHOLDS_KM).items()})
            row["median_km"] = median_km(kms)
        row.update({f"{k}_geonames": share(s.get(f"{k}_geonames", s.get(k)) for s in items)
                    for k in ("country", "region", "city")})
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


def _check_im2gps3k_header(path: Path, keys: list[str]) -> None:
    """The early im2gps3k_places365.csv says LON,LAT over latitude, longitude values: refuse the whole file
    (its rows would load with the axes swapped)."""
    if "LON" in keys and "LAT" in keys and keys.index("LON") < keys.index("LAT"):
        raise DatasetError(f"{path}: its header says LON,LAT over latitude, longitude values (the early "
                           "im2gps3k_places365.csv): use the corrected file, header IMG_ID,AUTHOR,LAT,LON,...")


def _im2gps3k(where: str, row: dict[str, Any]) -> dict[str, Any]:
    name = field(row, "IMG_ID", where)
    lat, lon = _latlon(number(row, "LAT", where), number(row, "LON", where), where)
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
    matched = {k: (v if isinstance(v, str) else None) for k, v in gb_ref.true_names(loc).items()}
    subset = row.get("data_type") or meta.get("data_type") or "panorama"  # GeoBench README: default panorama
    return {"id": uid, "image": field(row, "raw_image_path", where), "lat": lat, "lon": lon,
            "dataset": "geobench", "subset": str(subset), **names, "names": matched}


def _text(d: dict[str, Any], keys: Sequence[str]) -> str | None:
    for k in keys:
        if isinstance(d.get(k), str) and d[k].strip():
            return d[k].strip()
    return None

