"""GeoBench's scorer (GeoVista): country / state / city by place names in the answer, < 3 km and median km.

Source: ekonwang/GeoVista at commit df32037178778ce7d442a276e910db7e631f3c74 (the eval files last changed in
b737d814): ``eval/eval_infer_geolocation.py`` (``_extract_final_response``, ``_eval_single``,
``_finalize_and_write``), ``eval/utils_level_wise_eval.py`` (``eval_geolocation_response`` without the model
verifier, i.e. its rule-based match) and ``eval/utils_geocode.py`` (``haversine_km``, ``geocode_address``).

Tiers (reproduced exactly): the response is cut to its first 4,000 characters; it and each true name are
normalised (NFKD, non-ASCII dropped, lower case, every character other than a-z, 0-9 and whitespace -> a
space, spaces collapsed); a name is hit when it occurs as a whole term (no word character on either side).
The true names are the ``city``, ``province_or_state`` (else ``state``) and ``country`` of the item's
``multi_level_loc_dict``. city = city hit; state = state or city hit; country = any hit. An empty response
is not evaluated at all (it is left out of every denominator, as the source's failed items are).

Distances: GeoVista asks an LLM for an address in the response and geocodes it with a paid API, which
cannot be reproduced offline; here the point is the answer's own coordinates
(:func:`mmagent.eval.parsing.coords.parse_latlon`). As its geocoder does for an address it cannot place
("unknown"), an answer without coordinates is put at the geocoder's fallback point (Honiara, Solomon
Islands). Items of data_type "planetary" get no distance. Haversine with R = 6371.0088 km (atan2 form);
lt_3km = share of distances < 3.0; median = the lower median, sorted[ceil(n / 2) - 1].
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any, Mapping, Sequence

SOURCE = {
    "benchmark": "GeoBench",
    "repo": "ekonwang/GeoVista",
    "file": "eval/eval_infer_geolocation.py, eval/utils_level_wise_eval.py, eval/utils_geocode.py",
    "commit": "df32037178778ce7d442a276e910db7e631f3c74",
    "functions": ["eval_geolocation_response (rule-based)", "_finalize_and_write", "haversine_km"],
    "note": "distances use the answer's own coordinates instead of LLM address extraction + paid geocoding",
}

EARTH_RADIUS_KM = 6371.0088
MAX_CHARS = 4000
#: where GeoVista's geocode_address puts an address it cannot place
FALLBACK_POINT = (-9.4306698, 159.9526758)
NO_DISTANCE_TYPES = ("planetary",)


def normalise(text: str | None) -> str:
    """GeoVista's ``_normalize_text``."""
    if not text:
        return ""
    s = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    s = re.sub(r"[^a-z0-9\s]", " ", s)
    return re.sub(r"\s+", " ", s).strip()


def contains_term(text_norm: str, term_norm: str) -> bool:
    """``_contains_whole_term``: ``term_norm`` in ``text_norm`` with no word character on either side."""
    return bool(term_norm) and re.search(r"(?<!\w)" + re.escape(term_norm) + r"(?!\w)", text_norm) is not None


def true_names(location: Mapping[str, Any]) -> dict[str, str | None]:
    """The names GeoBench matches: city, state (province_or_state, else state) and country."""
    loc = location.get("multi_level_loc_dict") if isinstance(location.get("multi_level_loc_dict"), dict) else location
    return {"city": loc.get("city"), "state": loc.get("province_or_state") or loc.get("state"),
            "country": loc.get("country")}


def tiers(response: str, names: Mapping[str, str | None]) -> dict[str, bool]:
    """GeoBench's rule-based city / state / country correctness of one response."""
    text = normalise(response[:MAX_CHARS])
    city = contains_term(text, normalise(names.get("city")))
    state = contains_term(text, normalise(names.get("state"))) or city
    country = contains_term(text, normalise(names.get("country"))) or state
    return {"city": city, "state": state, "country": country}


def evaluated(response: str | None) -> bool:
    """Whether GeoBench evaluates the item at all (its response text is not empty)."""
    return bool(response)


def haversine_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    """GeoVista's ``haversine_km`` (R = 6371.0088 km)."""
    phi1, phi2 = math.radians(a[0]), math.radians(b[0])
    dphi, dlam = math.radians(b[0] - a[0]), math.radians(b[1] - a[1])
    h = math.sin(dphi / 2.0) ** 2 + math.cos(phi1) * math.cos(phi2) * math.sin(dlam / 2.0) ** 2
    return EARTH_RADIUS_KM * 2.0 * math.atan2(math.sqrt(h), math.sqrt(1.0 - h))


def distance_km(pred: tuple[float, float] | None, truth: tuple[float, float], data_type: str | None) -> float | None:
    """The distance GeoBench's summary uses (None for a data type it gives no distance)."""
    if data_type in NO_DISTANCE_TYPES:
        return None
    return haversine_km(pred if pred is not None else FALLBACK_POINT, truth)


def lower_median(values: Sequence[float]) -> float:
    """sorted(values)[ceil(n / 2) - 1]; nan for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * 0.50) - 1)]


def share_below(values: Sequence[float], km: float = 3.0) -> float:
    """The share of distances strictly below ``km`` (0.0 for none)."""
    return sum(1 for v in values if v < km) / len(values) if values else 0.0
