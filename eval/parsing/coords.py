"""(latitude, longitude) in degrees read from free text, the way people and VLMs write coordinates.

No geolocation reference parses text (GeoEstimation scores a classifier, GeoVista geocodes an address an LLM
extracts), so this parser is the whole story for the coordinates. It reads

* decimal degrees, signed or not: "48.8566, 2.3522", "(-33.87, 151.21)", "lat=-33.9&lon=18.4";
* hemispheres as letters or words, before or after the number: "33.87 S, 151.21 E", "S 33.87, E 151.21",
  "N48.85 E2.35", "33.87° south"; S and W make the value negative;
* degrees-minutes(-seconds), with ASCII or unicode marks (° º ˚, ' ′ ’, " ″ ” ''), with hemisphere letters or
  signed: "48°51'24\"N 2°21'08\"E", "-33°52′10″, 151°12′30″", "48° 51.4' N";
* labels, single or as an order: "lat 47.91 lon -106.88", "longitude: 18.42, latitude: -33.92",
  "Lat/Lon: 48.85, 2.35", "Latitude, Longitude: ...", "(lng, lat) = (2.35, 48.85)";
* coordinates in prose with other numbers: a number followed by a unit that is not an angle ("5 km", "2 million",
  "12%"), or out of range (a year), is skipped, and only two numbers joined by a separator (comma, semicolon,
  slash, "and", spaces) count as an unlabelled pair.

Rule: values with an axis (a hemisphere or a label) are placed by it (the first latitude and the first
longitude); one with an axis takes its neighbour as the other; otherwise the first pair of adjacent values
with decimals or degree signs, else the first adjacent pair, is (latitude, longitude). None when nothing fits or
the result is out of range (|lat| > 90, |lon| > 180). The text is first narrowed to its last ``<answer>``
block, or stripped of ``<think>`` reasoning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mmagent.eval.parsing import final_text

_NUM = r"\d+(?:\.\d+)?"
_DEG = r"(?:°|º|˚|\bdeg(?:rees?)?\b)"
_MIN = r"(?:'|′|’|‘|\bmin\b)"
_SEC = r"(?:\"|″|”|''|’’|′′|\bsec\b)"
_HEMI = r"north|south|east|west|(?<![A-Za-z])(?-i:[NSEW])(?![A-Za-z])"
_TOKEN = re.compile(
    rf"""
    (?:(?<![A-Za-z0-9])(?P<hb>north|south|east|west|(?-i:[NSEW]))\.?\s*(?=[-+\u2212]?\d))?
    (?P<sign>[-+\u2212]?)
    (?P<deg>{_NUM})
    (?P<dms>\s*{_DEG}\s*(?:(?P<min>{_NUM})\s*{_MIN}\s*(?:(?P<sec>{_NUM})\s*{_SEC})?)?)?
    (?(hb)|(?:\s*(?P<ha>{_HEMI}))?)
    """,
    re.VERBOSE | re.IGNORECASE,
)
_LABEL = re.compile(r"\b(latitude|longitude|lat|lon|lng|long(?=\s*[.:=/,)]|\s*[-+]?\d))\b", re.IGNORECASE)
_NOT_ANGLE = re.compile(r"\s*(?:km|kms|kilomet(?:er|re)s?|mi\b|miles?|m\b|meters?|metres?|ft\b|feet|years?|"
                        r"yrs?|%|percent|people|inhabitants|million|thousand|billion|hours?|minutes|seconds|"
                        r"days?|s\b|x\b|px|fps)", re.IGNORECASE)
_PAIR_GAP = re.compile(r"\s*(?:[,;/]|and|&)?\s*$", re.IGNORECASE)


@dataclass
class _Value:
    value: float
    axis: str | None  # "lat", "lon" or None
    strong: bool  # has decimals, a degree sign, a hemisphere or a label
    start: int
    end: int


def _axis_of_label(word: str) -> str:
    return "lat" if word.lower().startswith("lat") else "lon"


def _hemi_axis(letter: str) -> str:
    return "lat" if letter[:1].upper() in "NS" else "lon"


def _values(text: str) -> list[_Value]:
    out: list[_Value] = []
    header: list[str] = []  # axes still owed by an order label such as "Lat/Lon:"
    prev_end = 0
    for m in _TOKEN.finditer(text):
        start, end = m.start(), m.end()
        if not m["hb"] and start > 0 and (text[start - 1].isalnum() or text[start - 1] in "._"):
            continue  # glued to a word or another number: "video2", "1.2.3"
        minutes, seconds = float(m["min"] or 0), float(m["sec"] or 0)
        if minutes >= 60 or seconds >= 60:
            prev_end = end
            continue
        gap = text[prev_end:start]
        prev_end = end
        if not m["dms"] and not m["ha"] and not m["hb"] and _NOT_ANGLE.match(text, end):
            header = []
            continue
        labels = [_axis_of_label(w) for w in _LABEL.findall(gap)]
        if len(labels) >= 2:
            header = labels[-2:]
        elif len(labels) == 1:
            header = labels
        hemi = m["hb"] or m["ha"]
        axis = _hemi_axis(hemi) if hemi else (header.pop(0) if header else None)
        if hemi and header:
            header.pop(0)
        value = float(m["deg"]) + minutes / 60 + seconds / 3600
        if m["sign"] in ("-", "\u2212") or (hemi and hemi[:1].upper() in "SW"):
            value = -value
        strong = "." in m["deg"] or bool(m["dms"] or hemi or axis)
        out.append(_Value(value, axis, strong, start, end))
    return out


def _adjacent(text: str, a: _Value, b: _Value) -> bool:
    return _PAIR_GAP.match(text[a.end:b.start]) is not None and len(text[a.end:b.start]) <= 12


def _in_range(lat: float, lon: float) -> bool:
    return abs(lat) <= 90 and abs(lon) <= 180


def parse_latlon(text: str) -> tuple[float, float] | None:
    """(latitude, longitude) in degrees from free text (see the module docstring), or None."""
    s = final_text(text)
    values = _values(s)
    lats = [v for v in values if v.axis == "lat"]
    lons = [v for v in values if v.axis == "lon"]
    if lats and lons:
        lat, lon = lats[0].value, lons[0].value
        return (lat, lon) if _in_range(lat, lon) else None
    if lats or lons:
        known = (lats or lons)[0]
        k = values.index(known)
        for j in (k + 1, k - 1):
            if 0 <= j < len(values) and values[j].axis is None:
                first, second = sorted((known, values[j]), key=lambda v: v.start)
                if _adjacent(s, first, second):
                    lat, lon = (known.value, values[j].value) if known.axis == "lat" else (values[j].value, known.value)
                    if _in_range(lat, lon):
                        return (lat, lon)
        return None
    pairs = [(a, b) for a, b in zip(values, values[1:]) if _adjacent(s, a, b) and _in_range(a.value, b.value)]
    for want_strong in (True, False):
        for a, b in pairs:
            if not want_strong or (a.strong and b.strong):
                return (a.value, b.value)
    return None
