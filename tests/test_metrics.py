"""Answer parsers and metrics in eval.metrics, on hand-computed cases."""

from __future__ import annotations

import math
import time

import pytest

from mmagent.eval.metrics import (
    EARTH_RADIUS_KM,
    Place,
    extract_option_letter,
    geo_accuracy_at,
    geo_match,
    haversine_km,
    mean_iou,
    median_km,
    parse_interval,
    parse_latlon,
    recall_at_iou,
    reverse_geocode,
    temporal_iou,
)

# (raw answer, letter under the official Video-MME / lmms-eval rule)
OPTION_CASES = [
    ("A", "A"),
    ("C.", "C"),
    ("(B) The man is cooking.", "B"),
    ("The best answer is: D", "D"),
    ("The correct answer is (C)", "C"),
    ("The answer is B", "B"),
    ("The answer: A", "A"),
    ("The best option is C", "C"),
    ("The correct option is D", "D"),
    ("Best answer: C", "B"),  # prefix not stripped in the source (missing comma): "B" of "Best"
    ("Best option: D", "B"),
    ("the answer is c", ""),  # case-sensitive
    ("d", ""),
    ("A man is walking his dog.", "A"),  # the first capital option letter anywhere
    ("After watching the clip closely I am sure that option C is right", "A"),
    ("I think it is the third one, because the man is walking a dog outside.", ""),  # > 10 words
    ("<answer>B</answer>", "B"),
    ("<think>Not A, maybe C.</think><answer>D</answer>", "D"),
    ("<answer>A</answer> no, wait: <answer>C</answer>", "C"),
    ("", ""),
]


@pytest.mark.parametrize(("raw", "letter"), OPTION_CASES)
def test_extract_option_letter_official(raw: str, letter: str) -> None:
    assert extract_option_letter(raw) == letter


def test_extract_option_letter_options() -> None:
    assert extract_option_letter("Best answer: C", official=False) == "C"
    assert extract_option_letter("The answer is E", letters="ABCDE") == "E"
    assert extract_option_letter("The answer is E") == ""


@pytest.mark.parametrize(
    ("raw", "interval"),
    [
        ("[12.5, 20]", (12.5, 20.0)),
        ("from 12.5 to 20 seconds", (12.5, 20.0)),
        ("12.5s - 20s", (12.5, 20.0)),
        ("12.5-20", (12.5, 20.0)),
        ("The event ends at 30 and starts at 4.", (4.0, 30.0)),
        ("0:05 - 1:10", (5.0, 70.0)),
        ("<think>maybe 1 to 2</think><answer>3 - 7.5</answer>", (3.0, 7.5)),
        ("around 12 seconds", None),
        ("no numbers", None),
    ],
)
def test_parse_interval(raw: str, interval: tuple[float, float] | None) -> None:
    assert parse_interval(raw) == interval


def test_temporal_iou_and_recall() -> None:
    assert temporal_iou((0, 10), (5, 15)) == pytest.approx(1 / 3)
    assert temporal_iou((0, 10), (0, 10)) == 1.0
    assert temporal_iou((2, 4), (0, 10)) == pytest.approx(0.2)
    assert temporal_iou((0, 1), (2, 3)) == 0.0
    assert temporal_iou(None, (2, 3)) == 0.0
    assert temporal_iou((5, 5), (5, 5)) == 0.0
    ious = [0.2, 0.3, 0.5, 0.69, 0.7, 1.0]
    assert recall_at_iou(ious) == {0.3: 5 / 6, 0.5: 4 / 6, 0.7: 2 / 6}
    assert recall_at_iou([]) == {0.3: 0.0, 0.5: 0.0, 0.7: 0.0}
    assert mean_iou([0.0, 0.5, 1.0]) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("raw", "latlon"),
    [
        ("47.91, 106.88", (47.91, 106.88)),
        ("(47.91, 106.88)", (47.91, 106.88)),
        ("47.91 N 106.88 E", (47.91, 106.88)),
        ("47.91°N, 106.88°E", (47.91, 106.88)),
        ("lat 47.91 lon -106.88", (47.91, -106.88)),
        ("Longitude: 18.42, latitude: -33.92", (-33.92, 18.42)),
        ("33.86°S 151.21°W", (-33.86, -151.21)),
        ("106.88 E, 47.91 N", (47.91, 106.88)),
        ("48°51'36\"N 2°21'E", (48.86, 2.35)),
        ("<answer>-22.9, -43.2</answer>", (-22.9, -43.2)),
        ("91.0, 10.0", None),
        ("10.0, 181.0", None),
        ("somewhere in Mongolia", None),
    ],
)
def test_parse_latlon(raw: str, latlon: tuple[float, float] | None) -> None:
    got = parse_latlon(raw)
    assert got == latlon if latlon is None else got == pytest.approx(latlon)


def test_haversine() -> None:
    assert haversine_km((48.8566, 2.3522), (51.5074, -0.1278)) == pytest.approx(343.5, abs=1.0)
    assert haversine_km((0.0, 0.0), (0.0, 180.0)) == pytest.approx(math.pi * EARTH_RADIUS_KM)
    assert haversine_km((90.0, 0.0), (-90.0, 0.0)) == pytest.approx(math.pi * EARTH_RADIUS_KM)
    assert haversine_km((10.0, 20.0), (10.0, 20.0)) == 0.0


def test_reverse_geocode_lyon_and_speed() -> None:
    lyon = reverse_geocode(45.75, 4.85)
    assert (lyon.name, lyon.country_code, lyon.geonameid) == ("Lyon", "FR", 2996944)
    start = time.perf_counter()
    for i in range(50):
        reverse_geocode(40.0 + i * 0.1, -3.0)
    assert (time.perf_counter() - start) / 50 < 0.005


PARIS = Place("Paris", "FR", "11", 48.85341, 2.3488, 2988507)


@pytest.mark.parametrize(
    ("pred", "city", "region", "country"),
    [
        ((48.8566, 2.3522), True, True, True),  # geocodes to "Paris 04", 0.4 km away
        ((48.96, 2.88), False, True, True),  # Meaux, Ile-de-France, 41 km
        ((43.2965, 5.3698), False, False, True),  # Marseille
        ((51.5074, -0.1278), False, False, False),  # London
    ],
)
def test_geo_match_tiers(pred: tuple[float, float], city: bool, region: bool, country: bool) -> None:
    got = geo_match(pred, PARIS)
    assert (got["city"], got["region"], got["country"]) == (city, region, country)
    assert got["km"] == pytest.approx(haversine_km(pred, (PARIS.latitude, PARIS.longitude)))


def test_geo_match_none_and_summaries() -> None:
    assert geo_match(None, PARIS) == {"km": math.inf, "city": False, "region": False, "country": False}
    kms = [0.5, 10.0, 150.0, 700.0, 3000.0, math.inf]
    assert geo_accuracy_at(kms) == {1.0: 1 / 6, 25.0: 2 / 6, 200.0: 3 / 6, 750.0: 4 / 6, 2500.0: 4 / 6}
    assert median_km(kms) == pytest.approx(425.0)
    assert math.isnan(median_km([]))
