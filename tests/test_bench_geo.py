"""mmagent.eval.benchmarks.geo on tiny IM2GPS3K and GeoBench folders, with distances known in closed form."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent.eval.benchmarks import geo
from mmagent.eval.benchmarks.base import DatasetError

HEADER = "IMG_ID,AUTHOR,LAT,LON,S3_Label,S16_Label,S365_Label,Prob_indoor,Prob_natural,Prob_urban"
ROWS = ["paris_1_1_1@N00.jpg,1@N00,48.8566,2.3522,2,11,84,0.01,0.02,0.97",
        "nyc_2_2_2@N00.jpg,2@N00,40.7128,-74.006,2,15,307,0.1,0.1,0.8",
        "sydney_3_3_3@N00.jpg,3@N00,-33.8688,151.2093,1,6,48,0.0,0.9,0.1"]
KM_PER_DEGREE = 6371.0088 * math.pi / 180  # along a meridian, haversine = R * delta-latitude (GeoBench's R)
IM2GPS_KM_PER_DEGREE = 6371.0 * 0.01745329252  # GeoEstimation's R and degree-to-radian factor


def image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((32, 48, 3), 120, np.uint8)).save(path)


def im2gps3k(root: Path, rows: list[str] = ROWS, header: str = HEADER, images: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "im2gps3k_places365.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    for r in rows if images else ():
        image(root / "im2gps3ktest" / r.split(",")[0])
    return root


def geobench(root: Path, rows: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "geobench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in rows:
        image(root / r["raw_image_path"])
    return root


def gb_row(uid: str, lat: float, lng: float, data_type: str = "panorama", **loc) -> dict:
    meta = {"uid": uid, "pano_id": "p" + uid, "location": {"lat": lat, "lng": lng, **loc}}
    return {"id": uid, "raw_image_path": f"raw_image/{uid}/panorama-{uid}.jpg",
            "preview": f"preview_image/{uid}/panorama-{uid}.jpg", "metadata": json.dumps(meta), "data_type": data_type}


def test_load_im2gps3k(tmp_path: Path) -> None:
    root = im2gps3k(tmp_path)
    tasks = geo.load(root)
    assert [t.id for t in tasks] == ["paris_1_1_1@N00", "nyc_2_2_2@N00", "sydney_3_3_3@N00"]
    t = tasks[0]
    assert t.question == geo.QUESTION and t.question.startswith("Please analyze where is the place. ")
    assert t.image == str((root / "im2gps3ktest" / "paris_1_1_1@N00.jpg").resolve())
    assert (t.task_type, t.video, t.options) == ("geolocation", None, None)
    assert (t.answer["lat"], t.answer["lon"], t.answer["country_code"], t.answer["admin1_code"]) == (
        48.8566, 2.3522, "FR", "11")
    assert (t.metadata["lat"], t.metadata["lon"], t.metadata["country"]) == (48.8566, 2.3522, "FR")
    assert t.metadata["city"] == t.metadata["geonames_city"] == t.answer["name"]
    assert (t.metadata["dataset"], t.metadata["author"], t.metadata["s365_label"]) == ("im2gps3k", "1@N00", "84")
    assert [x.metadata["country_code"] for x in tasks] == ["FR", "US", "AU"]
    assert tasks[2].metadata["city"] == "Sydney"
    assert len(geo.load(root, limit=1)) == 1


def test_load_geobench(tmp_path: Path) -> None:
    root = geobench(tmp_path, [gb_row("u1", 35.6762, 139.6503, city="Tokyo", province_or_state="Tokyo",
                                      country="Japan"),
                               gb_row("u2", -22.9519, -43.2105, "satellite", city="Rio de Janeiro",
                                      country="Brazil")])
    a, b = geo.load(root)
    assert (a.id, b.id) == ("u1", "u2")
    assert a.image == str((root / "raw_image/u1/panorama-u1.jpg").resolve())
    assert {k: a.metadata[k] for k in ("lat", "lon", "city", "region", "country", "subset", "dataset")} == {
        "lat": 35.6762, "lon": 139.6503, "city": "Tokyo", "region": "Tokyo", "country": "Japan",
        "subset": "panorama", "dataset": "geobench"}
    assert (a.metadata["country_code"], b.metadata["country_code"], b.metadata["subset"]) == ("JP", "BR", "satellite")
    assert b.metadata["region"] is None and b.answer["lat"] == -22.9519


def write_geobench_parquet(root: Path, rows: list[dict]) -> Path:
    """``rows`` as LibraTree/GeoVistaBench's data/test/data-00000-of-00001.parquet: id, prompt, raw_image_path,
    metadata (a JSON string) and data_type strings, preview an image feature (struct of bytes and path)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("id", pa.string()), ("prompt", pa.string()), ("preview", image_type),
                        ("metadata", pa.string()), ("data_type", pa.string()), ("raw_image_path", pa.string())])
    table = pa.Table.from_pylist([{**r, "prompt": "Please analyze where is the place.",
                                   "preview": {"bytes": b"\xff\xd8\xff\xe0", "path": r["preview"]}} for r in rows],
                                 schema=schema)
    path = root / "data" / "test" / "data-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def test_geobench_parquet_gives_the_same_tasks_as_json(tmp_path: Path) -> None:
    rows = [gb_row("u1", 35.6762, 139.6503, city="Tokyo", province_or_state="Tokyo", country="Japan"),
            gb_row("u2", -22.9519, -43.2105, "satellite", city="Rio de Janeiro", country="Brazil"),
            gb_row("u3", 40.7128, -74.006, "photo")]
    root = geobench(tmp_path, rows)
    parquet = write_geobench_parquet(root, rows)
    from_parquet = geo.load(root)  # the hub's file is found before geobench.jsonl
    from_json = geo.load(root, annotations=root / "geobench.jsonl")
    assert [t.id for t in from_parquet] == ["u1", "u2", "u3"]
    assert from_parquet == from_json
    assert [t.metadata["subset"] for t in from_parquet] == ["panorama", "satellite", "photo"]
    assert geo.load(root, limit=2) == from_json[:2]
    rows[1]["metadata"] = json.dumps({"location": {"lat": 95.0, "lng": 1.0}})
    write_geobench_parquet(root, rows)
    tasks = geo.load(root)  # the bad row is skipped and named by file and row
    assert [t.id for t in tasks] == ["u1", "u3"] and tasks.skipped == [f"{parquet}:2: latitude 95.0 is beyond +-90"]


def test_missing_annotation_file_names_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        geo.load(tmp_path)
    msg = str(err.value)
    assert "im2gps3k_places365.csv" in msg and "geobench.jsonl" in msg and "data/test/" in msg


@pytest.mark.parametrize(("row", "needle"), [
    ("x.jpg,a,north,2.0,0,0,0,0,0,0", "im2gps3k_places365.csv:3: field 'LAT' is 'north', expected a finite number"),
    ("x.jpg,a,95.0,2.0,0,0,0,0,0,0", "im2gps3k_places365.csv:3: latitude 95.0 is beyond +-90"),
    ("x.jpg,a,45.0,-190,0,0,0,0,0,0", "im2gps3k_places365.csv:3: longitude -190.0 is beyond +-180"),
    (",a,45.0,10.0,0,0,0,0,0,0", "im2gps3k_places365.csv:3: field 'IMG_ID' is ''"),
])
def test_bad_im2gps3k_row_names_file_row_and_field(tmp_path: Path, row: str, needle: str) -> None:
    im2gps3k(tmp_path, [ROWS[0], row], images=False)
    image(tmp_path / "im2gps3ktest" / ROWS[0].split(",")[0])
    tasks = geo.load(tmp_path)  # skipped and named by file and row, not fatal to the file
    assert [t.id for t in tasks] == ["paris_1_1_1@N00"] and len(tasks.skipped) == 1 and needle in tasks.skipped[0]


def test_swapped_header_of_the_early_csv(tmp_path: Path) -> None:
    """An early im2gps3k_places365.csv says LON,LAT over latitude, longitude values."""
    im2gps3k(tmp_path, ROWS, header=HEADER.replace("LAT,LON", "LON,LAT"))
    with pytest.raises(DatasetError) as err:
        geo.load(tmp_path)
    msg = str(err.value)  # the whole file is refused: its in-range rows would load with the axes swapped
    assert "im2gps3k_places365.csv: its header says LON,LAT" in msg and "IMG_ID,AUTHOR,LAT,LON" in msg


@pytest.mark.parametrize(("row", "needle"), [
    ({"id": "u9", "raw_image_path": "raw_image/u9/a.jpg", "metadata": "{oops"}, "field 'metadata' is not valid JSON"),
    ({"id": "u9", "raw_image_path": "raw_image/u9/a.jpg", "metadata": json.dumps({"location": {"lat": 1.0}})},
     "metadata.location: field 'lng' / 'lon' / 'long' / 'longitude' is missing"),
    ({"id": "u9", "metadata": json.dumps({"lat": 1.0, "lng": 2.0})}, "field 'raw_image_path' is missing"),
    ({"id": "u9", "image": {"bytes": "..."}, "metadata": json.dumps({"lat": 1.0, "lng": 2.0})},
     "embeds the images"),
])
def test_bad_geobench_row(tmp_path: Path, row: dict, needle: str) -> None:
    geobench(tmp_path, [gb_row("u1", 35.0, 139.0)])
    with open(tmp_path / "geobench.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    tasks = geo.load(tmp_path)
    assert [t.id for t in tasks] == ["u1"] and len(tasks.skipped) == 1
    assert "geobench.jsonl:2" in tasks.skipped[0] and needle in tasks.skipped[0]


def test_missing_images_listed_and_counted(tmp_path: Path) -> None:
    rows = ROWS + [f"gone{k}.jpg,a,10.0,10.0,0,0,0,0,0,0" for k in range(5)]
    im2gps3k(tmp_path, rows, images=False)
    image(tmp_path / "im2gps3ktest" / "gone0.jpg")
    with pytest.raises(DatasetError) as err:
        geo.load(tmp_path)
    msg = str(err.value)
    assert "7 images missing: im2gps3ktest/paris_1_1_1@N00.jpg; im2gps3ktest/nyc_2_2_2@N00.jpg" in msg
    assert "im2gps3ktest/gone2.jpg (and 2 more)" in msg and "gone3" not in msg
    (tmp_path / "im2gps3ktest" / "gone0.jpg").unlink()
    (tmp_path / "im2gps3ktest").rmdir()
    with pytest.raises(DatasetError, match="no IM2GPS3K image folder found; looked for: im2gps3ktest, images"):
        geo.load(tmp_path)


def test_score_and_summary_with_known_distances(tmp_path: Path) -> None:
    (paris,) = geo.load(im2gps3k(tmp_path, ROWS[:1]))
    offsets = [0.0, 0.1, 1.0, -5.0, -20.0]  # degrees of latitude along the Paris meridian
    answers = [f"<answer>{48.8566 + d:.4f}, 2.3522</answer>" for d in offsets] + ["somewhere in Europe"]
    scores = [geo.score(paris, a) for a in answers]
    kms = [abs(d) * IM2GPS_KM_PER_DEGREE for d in offsets] + [math.inf]  # IM2GPS3K: GeoEstimation's distance
    assert [s["km"] for s in scores] == pytest.approx(kms, abs=1e-6)
    assert kms[1:5] == pytest.approx([11.1195, 111.1949, 555.9746, 2223.8985], abs=1e-3)
    # GeoNames: Paris -> Pierrefitte-sur-Seine (Ile-de-France), Amiens (Hauts-de-France), Albi (Occitanie), Algeria
    assert [s["country"] for s in scores] == [True, True, True, True, False, False]
    assert [s["region"] for s in scores] == [True, True, False, False, False, False]
    assert [s["city"] for s in scores] == [True, True, False, False, False, False]
    assert all(s[k] == s[f"{k}_geonames"] for s in scores for k in ("city", "region", "country"))
    assert [s["score"] for s in scores] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert scores[-1]["pred"] is None and scores[2]["pred"] == pytest.approx([49.8566, 2.3522])
    out = geo.summarise([paris] * 6, scores)
    assert list(out) == ["overall"]
    row = out["overall"]
    assert row == {"n": 6, "acc@1km": 1 / 6, "acc@25km": 2 / 6, "acc@200km": 3 / 6, "acc@750km": 4 / 6,
                   "acc@2500km": 5 / 6, "median_km": pytest.approx((1.0 + 5.0) / 2 * IM2GPS_KM_PER_DEGREE),
                   "country_geonames": 4 / 6, "region_geonames": 2 / 6, "city_geonames": 2 / 6, "parsed": 5 / 6}


def test_summary_per_geobench_subset(tmp_path: Path) -> None:
    # GeoBench's own columns: tiers by the true names in the answer, over the items with a non-empty answer;
    # lt_3km and the lower median over their distances.
    root = geobench(tmp_path, [gb_row("u1", 35.6762, 139.6503, city="Tokyo", province_or_state="Tokyo",
                                      country="Japan"),
                               gb_row("u2", -22.9519, -43.2105, "satellite", city="Rio de Janeiro", country="Brazil"),
                               gb_row("u3", 40.7128, -74.006, "satellite", city="New York", country="United States")])
    tasks = geo.load(root)
    scores = [geo.score(tasks[0], "Shinjuku, Tokyo, Japan; 35.6762, 139.6503"),
              geo.score(tasks[1], "São Paulo, Brazil; 0, 0"), geo.score(tasks[2], "")]
    assert [(s["city"], s["region"], s["country"], s["evaluated"]) for s in scores] == [
        (True, True, True, True), (False, False, True, True), (False, False, False, False)]
    out = geo.summarise(tasks, scores)
    assert list(out) == ["overall", "subset/panorama", "subset/satellite"]
    far = geo.gb_ref.haversine_km((0.0, 0.0), (-22.9519, -43.2105))
    assert scores[1]["km_geobench"] == pytest.approx(far)
    head = {k: out["overall"][k] for k in ("n", "n_evaluated", "country", "state", "city", "lt_3km", "median_km")}
    assert head == {"n": 3, "n_evaluated": 2, "country": 1.0, "state": 0.5, "city": 0.5, "lt_3km": 0.5,
                    "median_km": 0.0}
    assert list(out["overall"])[:8] == ["n", "n_evaluated", "country", "state", "city", "lt_3km", "median_km",
                                        "acc@1km"]
    assert out["subset/panorama"]["n"] == 1 and out["subset/panorama"]["city"] == 1.0
    sat = out["subset/satellite"]
    assert (sat["n"], sat["n_evaluated"], sat["city"], sat["country"]) == (2, 1, 0.0, 1.0)
    assert sat["median_km"] == pytest.approx(far)
    assert sat["acc@2500km"] == 0.0 and out["subset/panorama"]["acc@1km"] == 1.0
    assert isinstance(tasks[0].answer, dict) and tasks[0].benchmark == "geo"
