"""IM2GPS3K's distance metric as TIBHannover/GeoEstimation computes it: accuracy within 1/25/200/750/2500 km.

Source: TIBHannover/GeoEstimation, ``classification/utils_global.py`` at commit
10bde0855e7a9aff19dcf94550e4e737ce385639: ``vectorized_gc_distance`` (haversine with R = 6371 km and the
degree-to-radian factor 0.01745329252) and ``gcd_threshold_eval`` (share of distances d <= t over all images).
That code scores a classifier's cell centres, so it has no text parser: the point read from an answer is ours
(:func:`mmagent.eval.parsing.coords.parse_latlon`), and an answer without coordinates is beyond every
threshold.
"""

from __future__ import annotations

import math
from typing import Sequence

SOURCE = {
    "benchmark": "IM2GPS3K",
    "repo": "TIBHannover/GeoEstimation",
    "file": "classification/utils_global.py",
    "commit": "10bde0855e7a9aff19dcf94550e4e737ce385639",
    "functions": ["vectorized_gc_distance", "gcd_threshold_eval"],
    "note": "the answer's coordinates are read by mmagent's own parser (the reference scores a classifier)",
}

EARTH_RADIUS_KM = 6371.0
RADIANS_PER_DEGREE = 0.01745329252
THRESHOLDS_KM = (1, 25, 200, 750, 2500)


def gc_distance_km(pred: tuple[float, float], truth: tuple[float, float]) -> float:
    """``vectorized_gc_distance`` for one pair of (lat, lon) points."""
    lat, lon = pred[0] * RADIANS_PER_DEGREE, pred[1] * RADIANS_PER_DEGREE
    lat_gt, lon_gt = truth[0] * RADIANS_PER_DEGREE, truth[1] * RADIANS_PER_DEGREE
    h = math.sin((lat_gt - lat) / 2) ** 2 + math.cos(lat) * math.cos(lat_gt) * math.sin((lon_gt - lon) / 2) ** 2
    return EARTH_RADIUS_KM * 2 * math.asin(math.sqrt(h))


def accuracy_at(kms: Sequence[float], thresholds: Sequence[float] = THRESHOLDS_KM) -> dict[float, float]:
    """``gcd_threshold_eval``: the share of distances <= each threshold (0.0 for none)."""
    return {float(t): (sum(1 for d in kms if d <= t) / len(kms) if kms else 0.0) for t in thresholds}
