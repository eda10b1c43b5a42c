"""Geolocation scores equal GeoBench's and GeoEstimation's (IM2GPS3K) scorers on raw VLM-style answers.

References, written again here in this file's own code from their source:

* GeoBench: ekonwang/GeoVista eval/utils_level_wise_eval.py (rule-based ``eval_geolocation_response``),
  eval/eval_infer_geolocation.py (first 4,000 characters, empty answers not evaluated, ``lt_3km``, lower median)
  and eval/utils_geocode.py (``haversine_km``, the geocoder's fallback point) at df320371;
* IM2GPS3K: TIBHannover/GeoEstimation classification/utils_global.py at 10bde085 (``vectorized_gc_distance``,
  ``gcd_threshold_eval``), run with torch as the source does.

Neither reference reads coordinates from text, so each output carries the point a careful reader takes from
it (None if it states none): the reference is fed that point, mmagent its own parse of the text; equal
scores check the parser and the metric together.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent.eval.benchmarks import geo

S = (-33.8688, 151.2093)
P = (48.8566, 2.3522)
OUTPUTS: list[tuple[str, tuple[float, float] | None]] = [
    ("Sydney, New South Wales, Australia; -33.8688, 151.2093", S),
    ("Paris, Île-de-France, France; 48.8566, 2.3522", P),
    ("<answer>Sydney, NSW, Australia; -33.87, 151.21</answer>", (-33.87, 151.21)),
    ("-33.8688, 151.2093", S), ("(48.8566, 2.3522)", P), ("48.8566,2.3522", P),
    ("33.8688 S, 151.2093 E", S), ("33.8688°S, 151.2093°E", S), ("S 33.8688, E 151.2093", S),
    ("S33.8688 E151.2093", S), ("48.8566° N, 2.3522° E", P), ("N 48.8566 E 2.3522", P),
    ("33°52′08″S 151°12′33″E", (-(33 + 52 / 60 + 8 / 3600), 151 + 12 / 60 + 33 / 3600)),
    ("48°51'24\"N 2°21'08\"E", (48 + 51 / 60 + 24 / 3600, 2 + 21 / 60 + 8 / 3600)),
    ("-33°52'08\", 151°12'33\"", (-(33 + 52 / 60 + 8 / 3600), 151 + 12 / 60 + 33 / 3600)),
    ("48° 51.4' N, 2° 21.1' E", (48 + 51.4 / 60, 2 + 21.1 / 60)),
    ("Lat/Lon: 48.8566, 2.3522", P), ("Lon/Lat: 2.3522, 48.8566", P),
    ("Latitude, Longitude: -33.8688, 151.2093", S), ("Longitude, latitude: 151.2093, -33.8688", S),
    ("(lng, lat) = (2.3522, 48.8566)", P), ("lat 48.8566 lon 2.3522", P), ("lat=-33.8688&lon=151.2093", S),
    ("Latitude: -33.8688, Longitude: 151.2093", S), ("Longitude: 2.3522, Latitude: 48.8566", P),
    ("latitude is approximately 48.86 and longitude 2.35", (48.86, 2.35)),
    ("The coordinates are 33.87 south, 151.21 east.", (-33.87, 151.21)),
    ("151.2093 E, 33.8688 S", S), ("2.3522°E 48.8566°N", P),
    ("Taken in 2019, about 5 km from the centre of Paris, at 48.8566, 2.3522.", P),
    ("The Opera House opened in 1973; this is Sydney, Australia (-33.8568, 151.2153).", (-33.8568, 151.2153)),
    ("About 12 km north of the CBD: -33.76, 151.21", (-33.76, 151.21)),
    ("It is 3 blocks from the station, 48.87, 2.33, in the 9th arrondissement.", (48.87, 2.33)),
    ("Population 2 million. Coordinates: 48.85, 2.35", (48.85, 2.35)),
    ("<think>The signs are French, maybe Lyon at 45.76, 4.84? No, the Eiffel Tower is there.</think>"
     "<answer>Paris, France; 48.8584, 2.2945</answer>", (48.8584, 2.2945)),
    ("<think>Eucalyptus and left-hand traffic.</think> Sydney, Australia. -33.9, 151.2", (-33.9, 151.2)),
    ("Final answer: Melbourne, Victoria, Australia; -37.8136, 144.9631", (-37.8136, 144.9631)),
    ("Lyon, Auvergne-Rhône-Alpes, France; 45.764, 4.8357", (45.764, 4.8357)),
    ("Marseille, France (43.2965° N, 5.3698° E)", (43.2965, 5.3698)),
    ("London, England, United Kingdom; 51.5074, -0.1278", (51.5074, -0.1278)),
    ("New York City, New York, USA: 40.7128° N, 74.0060° W", (40.7128, -74.006)),
    ("Rio de Janeiro, Brazil, 22.9068 S 43.1729 W", (-22.9068, -43.1729)),
    ("Cape Town, South Africa; lat -33.9249, lon 18.4241", (-33.9249, 18.4241)),
    ("Tokyo, Japan 35.6762N 139.6503E", (35.6762, 139.6503)),
    ("Somewhere in New South Wales, Australia.", None), ("Australia", None), ("France, probably.", None),
    ("paris, france", None), ("PARIS", None), ("The photo is from the Sydney suburbs.", None),
    ("Newcastle, New South Wales", None), ("île-de-france", None), ("Sydneyside harbour", None),
    ("I cannot determine the location from this image.", None), ("", None), ("Unknown", None),
    ("Europe", None), ("The image shows a beach at sunset.", None), ("91.0, 10.0", None), ("10.0, 181.0", None),
    ("Somewhere around 48, 2", (48.0, 2.0)), ("-33.87,151.21 (Sydney)", (-33.87, 151.21)),
    ("Sydney " + "x" * 4000 + " Australia; -33.8688, 151.2093", S),
    ("Coordinates 48.8566 N / 2.3522 E, Paris", P), ("Location: S 33° 52.1', E 151° 12.5'", (-(33 + 52.1 / 60),
                                                                                          151 + 12.5 / 60)),
]

TRUTHS = [  # (id, point, GeoBench location names)
    ("syd", S, {"city": "Sydney", "province_or_state": "New South Wales", "country": "Australia"}),
    ("par", P, {"city": "Paris", "province_or_state": "Île-de-France", "country": "France"}),
]


# --------------------------------------------------------------------------- GeoBench, written again

def _norm(s):
    if not s:
        return ""
    s = unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode("ascii").lower()
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9\s]", " ", s)).strip()


def _whole(text, term):
    return bool(term) and re.search(r"(?<!\w)" + re.escape(term) + r"(?!\w)", text) is not None


def reference_tiers(response: str, loc: dict) -> dict[str, bool]:
    text = _norm(response[:4000])
    city = _whole(text, _norm(loc.get("city")))
    state = _whole(text, _norm(loc.get("province_or_state") or loc.get("state")))
    country = _whole(text, _norm(loc.get("country")))
    out = {"country_correct": country or state or city, "state_correct": state or city, "city_correct": city}
    if out["city_correct"]:
        out["state_correct"] = out["country_correct"] = True
    elif out["state_correct"]:
        out["country_correct"] = True
    return out


def reference_haversine(p1, p2) -> float:
    phi1, phi2 = math.radians(p1[0]), math.radians(p2[0])
    dphi, dl = math.radians(p2[0] - p1[0]), math.radians(p2[1] - p1[1])
    a = math.sin(dphi / 2.0) ** 2 + math.cos(phi1) * math.cos(phi2) * math.sin(dl / 2.0) ** 2
    return 6371.0088 * 2.0 * math.atan2(math.sqrt(a), math.sqrt(1.0 - a))


def reference_geobench_summary(rows: list[tuple[str, tuple | None]], truth, loc) -> dict[str, float]:
    cnt = country = state = city = 0
    dists = []
    for response, point in rows:
        if response == "":
            continue  # "expect response": the item fails and is not evaluated
        r = reference_tiers(response, loc)
        cnt += 1
        country, state, city = country + r["country_correct"], state + r["state_correct"], city + r["city_correct"]
        dists.append(reference_haversine(point if point else (-9.4306698, 159.9526758), truth))
    ordered = sorted(dists)
    return {"n_evaluated": cnt, "country": country / cnt, "state": state / cnt, "city": city / cnt,
            "lt_3km": sum(1 for x in ordered if x < 3.0) / len(ordered),
            "median_km": ordered[max(0, math.ceil(len(ordered) * 0.50) - 1)]}


# --------------------------------------------------------------------------- IM2GPS3K, written again

def reference_gcd(points, truth):
    torch = pytest.importorskip("torch")
    lat = torch.tensor([p[0] for p in points], dtype=torch.float64)
    lon = torch.tensor([p[1] for p in points], dtype=torch.float64)
    lat_gt = torch.full_like(lat, truth[0])
    lon_gt = torch.full_like(lon, truth[1])
    f = 0.01745329252
    lat, lon, lat_gt, lon_gt = f * lat, f * lon, f * lat_gt, f * lon_gt
    a = torch.sin((lat_gt - lat) / 2) ** 2 + torch.cos(lat) * torch.cos(lat_gt) * torch.sin((lon_gt - lon) / 2) ** 2
    return 6371 * (2 * torch.asin(torch.sqrt(a)))


def reference_thresholds(gc_dists) -> dict[float, float]:
    torch = pytest.importorskip("torch")
    return {float(t): torch.true_divide(torch.sum(gc_dists <= t), len(gc_dists)).item()
            for t in [1, 25, 200, 750, 2500]}


# --------------------------------------------------------------------------- fixtures

def _image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(path)


@pytest.fixture(scope="module")
def geobench_tasks(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("geobench")
    rows = []
    for uid, (lat, lng), names in TRUTHS:
        loc = {"lat": lat, "lng": lng, **names, "multi_level_loc_dict": dict(names)}
        rows.append({"id": uid, "raw_image_path": f"raw_image/{uid}/p.jpg", "data_type": "panorama",
                     "metadata": json.dumps({"uid": uid, "location": loc})})
        _image(root / rows[-1]["raw_image_path"])
    (root / "geobench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {t.id: t for t in geo.load(root)}


@pytest.fixture(scope="module")
def im2gps_tasks(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("im2gps3k")
    lines = ["IMG_ID,AUTHOR,LAT,LON,S3_Label,S16_Label,S365_Label,Prob_indoor,Prob_natural,Prob_urban"]
    for uid, (lat, lon), _ in TRUTHS:
        lines.append(f"{uid}.jpg,a,{lat},{lon},0,0,0,0,0,0")
        _image(root / "im2gps3ktest" / f"{uid}.jpg")
    (root / "im2gps3k_places365.csv").write_text("\n".join(lines) + "\n")
    return {t.id: t for t in geo.load(root)}


# --------------------------------------------------------------------------- the checks

def test_there_are_enough_varied_outputs() -> None:
    texts = [t for t, _ in OUTPUTS]
    assert len(OUTPUTS) >= 60 and len(set(texts)) == len(texts)


@pytest.mark.parametrize(("raw", "point"), OUTPUTS, ids=[f"out{k}" for k in range(len(OUTPUTS))])
def test_the_parser_reads_the_stated_point(raw: str, point) -> None:
    got = geo.parse_latlon(raw)
    assert (got is None) == (point is None) and (got is None or got == pytest.approx(point, abs=1e-9))


@pytest.mark.parametrize(("raw", "point"), OUTPUTS, ids=[f"out{k}" for k in range(len(OUTPUTS))])
def test_geobench_item_tiers_equal_the_reference(geobench_tasks: dict, raw: str, point) -> None:
    for uid, truth, names in TRUTHS:
        got = geo.score(geobench_tasks[uid], raw)
        want = reference_tiers(raw, names)
        assert (got["city"], got["region"], got["country"]) == (
            want["city_correct"], want["state_correct"], want["country_correct"])
        assert got["evaluated"] == (raw != "")


@pytest.mark.parametrize("uid", [u for u, _, _ in TRUTHS])
def test_geobench_summary_equals_the_reference(geobench_tasks: dict, uid: str) -> None:
    task = geobench_tasks[uid]
    truth, names = next((p, n) for u, p, n in TRUTHS if u == uid)
    row = geo.summarise([task] * len(OUTPUTS), [geo.score(task, raw) for raw, _ in OUTPUTS])["overall"]
    want = reference_geobench_summary(OUTPUTS, truth, names)
    assert {k: row[k] for k in want} == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("uid", [u for u, _, _ in TRUTHS])
def test_im2gps3k_accuracies_equal_the_reference(im2gps_tasks: dict, uid: str) -> None:
    task = im2gps_tasks[uid]
    truth = next(p for u, p, _ in TRUTHS if u == uid)
    scores = [geo.score(task, raw) for raw, _ in OUTPUTS]
    row = geo.summarise([task] * len(OUTPUTS), scores)["overall"]
    # an answer without coordinates is beyond every threshold: the reference gets a point on the far side
    points = [p if p else (-truth[0], truth[1] + 180 if truth[1] <= 0 else truth[1] - 180) for _, p in OUTPUTS]
    gcd = reference_gcd(points, truth)
    want = reference_thresholds(gcd)
    assert {t: row[f"acc@{t:g}km"] * len(OUTPUTS) for t in want} == pytest.approx(  # the same counts of items:
        {t: v * len(OUTPUTS) for t, v in want.items()}, abs=1e-5)  # true_divide gives float32 there
    kms = [s["km"] for s, (_, p) in zip(scores, OUTPUTS) if p]
    assert kms == pytest.approx([float(d) for d, (_, p) in zip(gcd, OUTPUTS) if p], rel=1e-12, abs=1e-9)
