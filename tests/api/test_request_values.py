"""One rule per kind of value a request carries (api/values.py), against a real server on SQLite and on
PostgreSQL (issue 28, item 1: every example of the issue below is here verbatim):

- every datetime the API takes is in range once normalised to UTC, else 422 naming the field;
- every text is free of NUL and lone surrogates, else 422 naming the field, on both databases alike
  (PostgreSQL cannot store NUL; nothing can encode a lone surrogate), and nothing is stored;
- every number is bounded before it is converted: JSON literals, /v2 tensor values, header counts.

Each answer is a 4xx in the one error shape, never a 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from api.app import create_app
from api.config import Settings
from api.guarded_route import GuardedRoute
from api.values import ascii_count, datetime_problem, json_safe, numbers_within, text_problem
from tests.support.api_helpers import image_bytes, open_test_catalog
from tests.support.live_server import LiveServer

KEY = "values-key"
AUTH = {"X-API-Key": KEY}
JSON = {"content-type": "application/json"}
PNG = image_bytes((10, 120, 30))
LOW, HIGH = "0001-01-01T00:00:30+23:59", "9999-12-31T23:59:59-23:59"  # out of range once in UTC
SURROGATE = "\ud800"
# What a client writes in JSON to send a lone surrogate (json.dumps writes exactly this).
SURROGATE_JSON = json.dumps(["\ud800"])


def _upload(**data: Any) -> dict[str, Any]:
    return {"files": {"file": ("x.png", PNG, "image/png")}, "data": data, "headers": AUTH}


INFER_TEXT = "/v2/models/cnclip_text/infer"
INFER_IMAGE = "/v2/models/cnclip_image/infer"
IMAGE_VALUES = 3 * 224 * 224


def _tokens(*values: Any) -> dict[str, Any]:
    data = list(values) + [0] * (52 - len(values))
    return {"json": {"inputs": [{"name": "text", "shape": [1, 52], "datatype": "INT64", "data": data}]}}


def _pixels(first: bytes) -> dict[str, Any]:
    """A JSON FP32 image tensor whose first value is the literal `first` (the rest 0)."""
    head = b'{"inputs": [{"name": "image", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": ['
    return {"content": head + first + b",0" * (IMAGE_VALUES - 1) + b"]}]}", "headers": JSON}


# --- the issue's examples, verbatim -----------------------------------------------------------------------

# (kind, method, path, httpx kwargs, what the message must name). {item} is an image item's id.
ISSUE_EXAMPLES: list[tuple[str, str, str, dict[str, Any], str]] = [
    (
        "date_to that overflows with its offset",
        "post",
        "/v1/search/text",
        {"json": {"query": "猫", "filters": {"date_to": "0001-01-01T00:00:30+23:59"}}},
        "filters.date_to",
    ),
    (
        "similar taken_from that overflows with its offset",
        "get",
        "/v1/items/{item}/similar?taken_from=9999-12-31T23:59:59-23:59",
        {},
        "taken_from",
    ),
    (
        "lone surrogate in filters.mime",
        "post",
        "/v1/search/text",
        {"content": b'{"query": "\\u732b", "filters": {"mime": ["\\ud800"]}}', "headers": JSON},
        "filters.mime",
    ),
    (
        "lone surrogate in classify labels",
        "post",
        "/v1/classify",
        {"files": {"file": ("x.png", PNG, "image/png")}, "data": {"labels": SURROGATE_JSON}},
        "labels",
    ),
    ("lone surrogate in upload tags", "post", "/v1/collections/photos/items", _upload(tags=SURROGATE_JSON), "tags"),
    (
        "v2 INT64 2^70",
        "post",
        "/v2/models/cnclip_text/infer",
        {"json": {"inputs": [{"name": "text", "shape": [1, 52], "datatype": "INT64", "data": [2**70] + [0] * 51}]}},
        "INT64",
    ),
    (
        "v2 INT64 -2^70",
        "post",
        "/v2/models/cnclip_text/infer",
        {"json": {"inputs": [{"name": "text", "shape": [1, 52], "datatype": "INT64", "data": [-(2**70)] + [0] * 51}]}},
        "INT64",
    ),
    (
        "v2 FP32 literal 1 followed by 400 zeros",
        "post",
        "/v2/models/cnclip_image/infer",
        _pixels(b"1" + b"0" * 400),
        "FP32",
    ),
    (
        "Inference-Header-Content-Length: \u00b2",
        "post",
        "/v2/models/cnclip_text/infer",
        {"content": b"{}", "headers": {"Inference-Header-Content-Length": "\u00b2".encode("latin-1")}},
        "Inference-Header-Content-Length",
    ),
    (
        "NUL in a tag filter",
        "post",
        "/v1/search/text",
        {"json": {"query": "猫", "filters": {"tags": ["a\x00"]}}},
        "tags",
    ),
    ("NUL in an upload caption", "post", "/v1/collections/photos/items", _upload(caption="a\x00b"), "caption"),
    ("NUL in an upload tag", "post", "/v1/collections/photos/items", _upload(tags="猫,a\x00b"), "tags"),
    (
        "NUL in a text",
        "post",
        "/v1/collections/notes/texts",
        {"json": {"texts": ["a\x00b"]}, "headers": AUTH},
        "texts.0",
    ),
    (
        "NUL in a text's tags",
        "post",
        "/v1/collections/notes/texts",
        {"json": {"texts": [{"text": "红色的星星", "tags": ["a\x00b"]}]}, "headers": AUTH},
        "texts.0.tags.0",
    ),
    (
        '"k": followed by 100,000 digits',
        "post",
        "/v1/search/text",
        {"content": b'{"query": "\\u732b", "k": ' + b"9" * 100_000 + b"}", "headers": JSON},
        "100000 digits",
    ),
]


# --- the classes: every field of every route that takes one -----------------------------------------------

DATE_FIELDS = ("date_from", "date_to", "taken_from", "taken_to")
DATE_CASES: list[tuple[str, str, str, dict[str, Any], str]] = []
for _moment in (LOW, HIGH):
    for _field in DATE_FIELDS:
        DATE_CASES.append(
            (
                f"search text {_field}={_moment}",
                "post",
                "/v1/search/text",
                {"json": {"query": "猫", "filters": {_field: _moment}}},
                f"filters.{_field}",
            )
        )
    for _field in ("taken_from", "taken_to"):
        DATE_CASES.append(
            (
                f"similar {_field}={_moment}",
                "get",
                "/v1/items/{item}/similar",
                {"params": {_field: _moment}},
                f"query.{_field}",
            )
        )
        DATE_CASES.append(
            (
                f"search image {_field}={_moment}",
                "post",
                "/v1/search/image",
                {"files": {"file": ("x.png", PNG, "image/png")}, "data": {_field: _moment}},
                _field,
            )
        )


def _text_cases(bad: str, label: str) -> list[tuple[str, str, str, dict[str, Any], str]]:
    """Every text field of every route with `bad` in it, sent as JSON (which can carry any code point)."""
    body = json.dumps  # writes a lone surrogate as \\ud800, NUL as \\u0000: as a client's JSON would
    as_json = json.dumps([bad])
    return [
        (
            f"{label} query",
            "post",
            "/v1/search/text",
            {"content": body({"query": f"猫{bad}"}), "headers": JSON},
            "query",
        ),
        (
            f"{label} tag filter",
            "post",
            "/v1/search/text",
            {"content": body({"query": "猫", "filters": {"tags": [bad]}}), "headers": JSON},
            "filters.tags.0",
        ),
        (
            f"{label} mime filter",
            "post",
            "/v1/search/text",
            {"content": body({"query": "猫", "filters": {"mime": ["image/png", bad]}}), "headers": JSON},
            "filters.mime.1",
        ),
        (
            f"{label} embed text",
            "post",
            "/v1/embed/text",
            {"content": body({"texts": ["猫", f"x{bad}"]}), "headers": JSON},
            "texts.1",
        ),
        (
            f"{label} added text",
            "post",
            "/v1/collections/notes/texts",
            {"content": body({"texts": [{"text": f"猫{bad}"}]}), "headers": {**JSON, **AUTH}},
            "texts.0",
        ),
        (
            f"{label} added text's tag",
            "post",
            "/v1/collections/notes/texts",
            {"content": body({"texts": [{"text": "猫", "tags": [f"t{bad}"]}]}), "headers": {**JSON, **AUTH}},
            "texts.0",
        ),
        (f"{label} upload tags (JSON)", "post", "/v1/collections/photos/items", _upload(tags=as_json), "tags.0"),
        (
            f"{label} classify labels (JSON)",
            "post",
            "/v1/classify",
            {"files": {"file": ("x.png", PNG, "image/png")}, "data": {"labels": json.dumps(["猫", bad])}},
            "labels.1",
        ),
        (
            f"{label} classify templates",
            "post",
            "/v1/classify",
            {
                "files": {"file": ("x.png", PNG, "image/png")},
                "data": {"labels": "猫,狗", "templates": json.dumps([f"一张{{}}{bad}"])},
            },
            "templates.0",
        ),
        (
            f"{label} label set labels",
            "put",
            "/v1/label-sets/values",
            {"content": body({"labels": [f"猫{bad}"]}), "headers": {**JSON, **AUTH}},
            "labels.0",
        ),
        (
            f"{label} label set templates",
            "put",
            "/v1/label-sets/values",
            {"content": body({"labels": ["猫"], "templates": [f"{{}}{bad}"]}), "headers": {**JSON, **AUTH}},
            "templates.0",
        ),
        (
            f"{label} JSON key",
            "post",
            "/v1/search/text",
            {"content": body({"query": "猫", f"k{bad}": 1}), "headers": JSON},
            "",
        ),
    ]


def _raw_upload(filename: bytes) -> dict[str, Any]:
    """A multipart upload whose file name is these bytes (httpx would percent-encode control characters)."""
    head = b'--B\r\nContent-Disposition: form-data; name="file"; filename="' + filename + b'"\r\n'
    body = head + b"Content-Type: image/png\r\n\r\n" + PNG + b"\r\n--B--\r\n"
    return {"content": body, "headers": {**AUTH, "content-type": "multipart/form-data; boundary=B"}}


NUL_FORM_CASES: list[tuple[str, str, str, dict[str, Any], str]] = [
    ("NUL caption", "post", "/v1/collections/photos/items", _upload(caption="猫\x00"), "caption"),
    ("NUL comma tags", "post", "/v1/collections/photos/items", _upload(tags="猫，a\x00"), "tags"),
    (
        "NUL comma labels",
        "post",
        "/v1/classify",
        {"files": {"file": ("x.png", PNG, "image/png")}, "data": {"labels": "猫,\x00狗"}},
        "labels",
    ),
    ("NUL upload file name", "post", "/v1/collections/photos/items", _raw_upload(b"x\x00.png"), "file.filename"),
    ("NUL query parameter", "get", "/v1/items/{item}/similar", {"params": {"sort": "taken\x00"}}, "sort"),
    ("NUL collection name", "get", "/v1/collections/photos%00", {}, "name"),
    (
        "NUL form collection",
        "post",
        "/v1/search/image",
        {"files": {"file": ("x.png", PNG, "image/png")}, "data": {"collection": "photos\x00"}},
        "collection",
    ),
]

NUMBER_CASES: list[tuple[str, str, str, dict[str, Any], str]] = [
    *[
        (f"v2 INT64 {v}", "post", INFER_TEXT, _tokens(v), "INT64")
        for v in (2**63, 2**64, -(2**63) - 1, 10**400, 1e20, -1, 21128)
    ],
    ("v2 INT64 string", "post", INFER_TEXT, _tokens("1"), "INT64"),
    ("v2 INT64 null", "post", INFER_TEXT, _tokens(None), "INT64"),
    ("v2 INT64 float NaN", "post", INFER_TEXT, {"content": json.dumps(_tokens(float("nan"))["json"])}, ""),
    *[
        (f"v2 FP32 {lit.decode()[:12]}", "post", INFER_IMAGE, _pixels(lit), "")
        for lit in (
            b"-1" + b"0" * 400,
            b"1" + b"0" * 400 + b".0",
            b"1" + b"0" * 5000,
            b"1e400",
            b"-1e400",
            b"1e39",
            b"NaN",
            b"Infinity",
            b"-Infinity",
            b'"1"',
            b"null",
            b"[[]]",
        )
    ],
    *[
        (
            f"v2 header length {value!r}",
            "post",
            INFER_TEXT,
            {"content": b"{}", "headers": {"Inference-Header-Content-Length": value}},
            "Inference-Header-Content-Length",
        )
        for value in ("\u00b3".encode("latin-1"), "1\u00b9".encode("latin-1"), b"1e3", b"-1", b"9" * 40, b"0x10")
    ],
    *[
        (f"search {field} {lit[:12]!r}", "post", "/v1/search/text", {"content": body, "headers": JSON}, "")
        for field, lit in (
            ("k", b"1" + b"0" * 5000),
            ("k", b"1e400"),
            ("offset", b"-" + b"9" * 200),
            ("min_score", b"NaN"),
            ("min_score", b"Infinity"),
            ("min_score", b"-Infinity"),
            ("min_score", b"1" + b"0" * 400 + b".5"),
        )
        for body in [b'{"query": "\\u732b", "' + field.encode() + b'": ' + lit + b"}"]
    ],
    *[
        (f"similar {field}={value[:12]}", "get", "/v1/items/{item}/similar", {"params": {field: value}}, field)
        for field, value in (
            ("k", "9" * 5000),
            ("k", "\u00b2"),
            ("k", "\u0663"),
            ("min_score", "nan"),
            ("min_score", "inf"),
            ("min_score", "-inf"),
            ("offset", "1e400"),
        )
    ],
    (
        "v2 BYTES base64 not ASCII",
        "post",
        "/v2/models/cnclip_image_bytes/infer",
        {"json": {"inputs": [{"name": "image_bytes", "shape": [1, 1], "datatype": "BYTES", "data": ["\u00e9=="]}]}},
        "base64",
    ),
    ("v2 OPTIONS", "options", "/v2", {}, "Method Not Allowed"),
    ("v2 OPTIONS infer", "options", INFER_TEXT, {}, "Method Not Allowed"),
    ("duplicates limit 5000 digits", "get", "/v1/collections/photos/duplicates", {"params": {"limit": "9" * 5000}}, ""),
    ("v2 repository index 1e400", "post", "/v2/repository/index", {"content": b'{"ready": 1e400}'}, ""),
    (
        "v2 repository index 100000 digits",
        "post",
        "/v2/repository/index",
        {"content": b'{"ready": ' + b"1" * 100_000 + b"}"},
        "",
    ),
]

CASES = [
    *ISSUE_EXAMPLES,
    *DATE_CASES,
    *_text_cases("\x00", "NUL"),
    *_text_cases(SURROGATE, "surrogate"),
    *_text_cases("\udfff", "low surrogate"),
    *NUL_FORM_CASES,
    *NUMBER_CASES,
]


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path
) -> Iterator[Any]:
    """The real app and encoder (the toy model) on each database, with an image collection holding one
    image and a text collection holding one text."""
    data = tmp_path_factory.mktemp(f"values-{request.param}")
    with ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{data / 'catalog.db'}"
        else:
            from tests.support.postgres import fresh_schema

            url = stack.enter_context(fresh_schema())
        settings = Settings(
            _env_file=None,
            model_dir=toy_model_dir,
            data_dir=data,
            provider="cpu",
            api_key=SecretStr(KEY),
            database_url=url,
        )
        catalog = open_test_catalog(settings)
        stack.callback(catalog.close)
        live = stack.enter_context(LiveServer(create_app(settings, catalog=catalog)))
        with httpx.Client(base_url=live.base_url, timeout=30) as c:
            for name, kind in (("photos", "images"), ("notes", "texts")):
                assert c.post("/v1/collections", json={"name": name, "kind": kind}, headers=AUTH).status_code == 201
            r = c.post("/v1/collections/photos/items", **_upload(caption="一只猫", tags="猫,室内"))
            assert r.status_code == 201, r.text
            live.item = r.json()["id"]
            assert (
                c.post("/v1/collections/notes/texts", json={"texts": ["红色的星星"]}, headers=AUTH).status_code == 201
            )
        yield live


def _items(c: httpx.Client) -> dict[str, int]:
    return {row["name"]: row["items"] for row in c.get("/v1/collections").json()}


@pytest.mark.parametrize(("kind", "method", "path", "kwargs", "named"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_value_is_a_4xx_naming_it_and_stores_nothing(
    server: Any, kind: str, method: str, path: str, kwargs: dict[str, Any], named: str
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        before = _items(c)
        r = c.request(method.upper(), path.format(item=server.item), **kwargs)
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
        body = r.json()
        if path.startswith("/v2"):
            assert set(body) == {"error"} and isinstance(body["error"], str), body
            message = body["error"]
        else:
            assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
            assert r.status_code == 422, body
            message = body["error"]["message"]
        assert named in message, message
        assert _items(c) == before  # refused: nothing stored, on either database
        assert c.get("/healthz").status_code == 200


def test_the_same_values_without_the_flaw_are_taken(server: Any) -> None:
    """The rules refuse only what they name: offsets that stay in range, text with any other character
    (controls, astral code points, a surrogate pair written in JSON), the largest legal numbers."""
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        before = _items(c)["notes"]
        for moment in ("0001-01-01T23:59:59+23:59", "9999-12-31T00:00:00-23:59", "0001-01-01T00:00:00", "2024-05-01"):
            r = c.post("/v1/search/text", json={"query": "猫", "filters": {"date_from": moment, "date_to": moment}})
            assert r.status_code == 200, (moment, r.text)
            r = c.get(f"/v1/items/{server.item}/similar", params={"taken_from": moment})
            assert r.status_code == 200, (moment, r.text)
        text = "猫\x01\x1b\u200b😺\U0010fffd"
        r = c.post(
            "/v1/collections/notes/texts",
            content=b'{"texts": [{"text": "\\ud83d\\ude3a'
            + json.dumps(text)[1:].encode()
            + b', "tags": ["\\ud83d\\ude3a"]}]}',
            headers={**JSON, **AUTH},
        )
        assert r.status_code == 201, r.text
        item = c.get(f"/v1/items/{r.json()['items'][0]['id']}").json()
        assert item["caption"] == "😺" + text and item["tags"] == ["😺"]  # stored faithfully
        assert _items(c)["notes"] == before + 1
        r = c.post("/v1/search/text", json={"query": "猫", "filters": {"tags": ["😺"], "mime": ["image/png"]}})
        assert r.status_code == 200, r.text
        tokens = _tokens(21127, 0, 1)
        assert c.post(INFER_TEXT, **tokens).status_code == 200
        assert c.post(INFER_IMAGE, **_pixels(b"3.4028234663852886e38")).status_code == 200
        assert c.post(INFER_IMAGE, **_pixels(b"-1" + b"0" * 38)).status_code == 200  # -1e38: within FP32
        r = c.post("/v1/search/text", content=b'{"query": "\\u732b", "k": 200, "min_score": -1.0e0}', headers=JSON)
        assert r.status_code == 200, r.text


def test_huge_byte_ranges_are_answered_not_converted(server: Any) -> None:
    """Range counts of any length: past the end is 416, digits of another script are ignored (200)."""
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        image = f"/v1/items/{server.item}/image"
        for header, status in (
            ("bytes=" + "9" * 5000 + "-", 416),
            ("bytes=0-" + "9" * 5000, 206),
            ("bytes=-" + "9" * 5000, 206),
            ("bytes=\u0661-", 200),
        ):
            r = c.get(image, headers={"Range": header.encode("utf-8")})
            assert r.status_code == status, (header[:20], r.status_code, r.text[:200])
            if status == 416:  # a 4xx like any other: the one error shape
                assert set(r.json()["error"]) == {"code", "message"}, r.text


def _every_route(routes: list[Any]) -> Iterator[Any]:
    """The app's routes, those of included routers too (FastAPI keeps a router as one entry)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from _every_route(inner.routes) if inner is not None else [route]


def test_every_v1_route_checks_the_values_of_its_request(toy_model_dir: Path, tmp_path: Path) -> None:
    """The rule is one place: every route under /v1 is a GuardedRoute, whose endpoint checks its
    arguments (a route added later is covered without a line of its own)."""
    app = create_app(Settings(_env_file=None, model_dir=toy_model_dir, data_dir=tmp_path, provider="cpu"))
    routes = [r for r in _every_route(app.routes) if getattr(r, "path", "").startswith("/v1")]
    assert len(routes) >= 15
    for route in routes:
        assert isinstance(route, GuardedRoute), route.path
        assert hasattr(route.endpoint, "__checked_endpoint__"), route.path


def test_the_rules_themselves() -> None:
    assert text_problem("猫😺\x01") is None and text_problem("") is None
    assert "NUL" in (text_problem("a\x00") or "") and "U+D800" in (text_problem("a\ud800") or "")
    assert "U+DFFF" in (text_problem("\udfff") or "")
    from datetime import datetime

    assert datetime_problem(datetime.fromisoformat(LOW)) and datetime_problem(datetime.fromisoformat(HIGH))
    assert datetime_problem(datetime.fromisoformat("0001-01-01T00:00:00")) is None  # naive: UTC
    assert ascii_count("\u00b2") is None and ascii_count("\u0663") is None and ascii_count("12") == 12
    assert ascii_count("9" * 100_000) == 10**18  # not converted digit by digit
    assert numbers_within([0, 5, 2**0], 0, 9) and not numbers_within([2**70], 0, 9)
    assert not numbers_within([10**400], -3.4e38, 3.4e38) and not numbers_within(["1"], 0, 9)
    assert not numbers_within([None, 1], 0, 9) and not numbers_within([{}], 0, 9)
    assert json_safe("a\ud800b") == "a\\ud800b" and json_safe("猫") == "猫"


@pytest.mark.parametrize(
    ("date", "offset"),
    [("0001:01:01 00:00:00", "+14:00"), ("9999:12:31 23:59:59", "-14:00"), ("0001:01:01 00:00:00", None)],
)
def test_an_exif_date_out_of_the_calendar_is_no_date(date: str, offset: str | None) -> None:
    """The datetime rule for what an image carries (an upload's or an indexed file's EXIF): a date that
    leaves the calendar once in UTC is no date, and the item falls back to its mtime or the upload time."""
    from indexer.domain.taken import parse_exif_datetime, taken_from

    assert parse_exif_datetime(date, offset) is None
    assert taken_from(None, 1e13)[1] == "upload"  # an mtime in year 318857: no date either
    assert taken_from(None, 0.0)[1] == "mtime"


@pytest.mark.parametrize("offset", ["+\u00b2\u00b2:00", "+1\u0663:00", "-\u00b9\u00b9:\u00b3\u00b3"])
def test_an_exif_offset_in_other_digits_is_no_offset(offset: str) -> None:
    """The number rule for EXIF: an offset is ASCII digits (int() refuses ², takes ٣); else it is ignored."""
    from indexer.domain.taken import parse_exif_datetime

    assert parse_exif_datetime("2020:01:01 00:00:00", offset) == parse_exif_datetime("2020:01:01 00:00:00", None)


def _exif_jpeg(date: str, offset: str) -> bytes:
    import io

    from PIL import Image

    image, exif = Image.new("RGB", (32, 32), (9, 90, 9)), Image.Exif()
    exif_ifd = exif.get_ifd(0x8769)
    exif_ifd[0x9003], exif_ifd[0x9011] = date, offset  # DateTimeOriginal, OffsetTimeOriginal
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif)
    return out.getvalue()


def test_an_upload_whose_exif_date_leaves_the_calendar_is_taken_without_it(server: Any) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        for date, offset in (("0001:01:01 00:00:00", "+14:00"), ("9999:12:31 23:59:59", "-14:00")):
            data = _exif_jpeg(date, offset)
            r = c.post("/v1/collections/photos/items", files={"file": ("x.jpg", data, "image/jpeg")}, headers=AUTH)
            assert r.status_code == 201, r.text
            item = c.get(f"/v1/items/{r.json()['id']}").json()
            assert item["taken_at_source"] == "upload", item
            r = c.post("/v1/search/image", files={"file": ("x.jpg", data, "image/jpeg")}, data={"sort": "taken"})
            assert r.status_code == 200, r.text


@pytest.mark.parametrize("bad", ["\x00", "\ud800"])
@pytest.mark.parametrize("command", ["index", "index-texts"])
def test_the_cli_refuses_the_same_texts_naming_the_line(
    tmp_path: Path, toy_model_dir: Path, database_url: str, command: str, bad: str
) -> None:
    """The text rule is the catalog's: `cnclip index-texts` and an index manifest meet it too (one line
    naming the file's line, never psycopg's DataError or a UnicodeEncodeError traceback), on both databases."""
    from typer.testing import CliRunner

    from cli.main import build_cli
    from tests.support.indexer_helpers import cli_env, write_images

    write_images(tmp_path / "photos", 1)
    if command == "index":
        rows = [{"path": "photos/0000.jpg", "caption": "好", "tags": [f"猫{bad}"]}]
    else:
        rows = [{"text": "红色的星星"}, {"text": f"星{bad}", "tags": ["x"]}]
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    result = CliRunner().invoke(build_cli(), [command, str(source), "--collection", "c"], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert f"{source}:{len(rows)}" in result.output and ("NUL" in result.output or "surrogate" in result.output)
    assert result.exit_code in (1, 3), result.output


@pytest.mark.parametrize(
    "document",
    [
        '{"k": ' + "9" * 100_000 + "}",
        '{"k": ' + "9" * 101 + "}",
        "[1e400]",
        "[-1e400]",
        "[NaN]",
        "[Infinity]",
        "[-Infinity]",
        "[0." + "1" * 200 + "]",
    ],
)
def test_json_from_outside_bounds_its_numbers_while_parsing(document: str) -> None:
    """The number rule of every JSON document from outside (retrieval/json_text.py): a decode error, as
    the callers expect, never Python's bare ValueError past 4300 digits nor a NaN that passes comparisons."""
    from retrieval.json_text import JSONNumberRefused, loads

    with pytest.raises(JSONNumberRefused):
        loads(document)
    assert loads('{"k": ' + "9" * 100 + ', "f": -1.5e-300, "g": 3.4e38}')["g"] == 3.4e38


def test_a_client_that_hangs_up_mid_body_is_no_server_error(server: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A body cut short by the client is nobody's error: no 500 attempted, no traceback in the log
    (the hostile corpus's "content-length lies" cases logged one per request)."""
    import logging
    import socket
    import time

    with caplog.at_level(logging.INFO, logger="cnclip.api"):
        head = b"POST /v1/search/text HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        with socket.create_connection((server.host, server.port)) as sock:
            sock.sendall(head + b'{"query": ')
        deadline = time.monotonic() + 10
        while "client went away" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "client went away" in caplog.text
    assert "unhandled error" not in caplog.text and "Traceback" not in caplog.text


UI_RANGES = [
    "bytes=5-1",
    "bytes=" + "9" * 20 + "-",
    "bytes=-" + "9" * 30,
    "bytes=0-0,0-0," * 200,
    "bytes=\u0661-",
    "items=0-1",
]


@pytest.mark.parametrize("path", ["/", "/favicon.ico", "/static/app.js", "/static-docs/swagger-ui-bundle.js"])
def test_the_ui_files_are_served_whole_whatever_range_is_asked(server: Any, path: str) -> None:
    """A bad range on the UI's own files was Starlette's 400 of plain text or an empty 416 — the only
    4xx without the error shape (api/whole_files.py): they are a few KB each and served whole."""
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        whole = c.get(path)
        assert whole.status_code == 200 and whole.content, whole.status_code
        for header in UI_RANGES:
            r = c.get(path, headers={"Range": header.encode("utf-8"), "If-Range": b'"x"'})
            assert r.status_code == 200, (header[:20], r.status_code, r.text[:100])
            assert r.content == whole.content and "content-range" not in r.headers
