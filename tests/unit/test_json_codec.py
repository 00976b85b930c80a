"""The JSON the app reads from PostgreSQL (app.db.json_loads) and the compact answers it writes
(app.jsonbody.SafeJSONProvider.response) go through orjson: the same values as json.loads, and the same
bytes as json.dumps with the provider's settings (but a float's exponent form, the same number), for
everything orjson refuses or writes otherwise too (big integers, lone surrogates, NaN, non-ASCII...)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import math
import uuid
from collections import OrderedDict

import pytest
from flask import Flask
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import Markup

import app.jsonbody as jsonbody
from app.db import json_loads
from app.jsonbody import PreEncoded, SafeJSONProvider

# --- decoding -----------------------------------------------------------------------------------------

DECODE_CASES = [
    b"18446744073709551615", b"18446744073709551616", b"-9223372036854775808", b"-9223372036854775809",
    b"9223372036854775808", b'{"a" : [1, 123456789012345678901234567890, -123456789012345678901]}',
    b'{"id" : "x", "n" : 1234567890123456789}', b'"1234567890123456789012"', b"1e400", b"-1e400",
    b"1.7976931348623157e308", b"2.2250738585072011e-308", b"5e-324", b"0.1", b"-0", b"-0.0", b"1E5",
    b"123456789012345678901234567890.5", b'"\\ud800"', b'{"\\udfff": 1}', b'"\\ud83d\\ude00"', b"NaN",
    b"[Infinity]", b'{"a": 1, "b": 2, "a": 3}', b'"\\u0000"', b" {} ", b"\xef\xbb\xbf{}", b"[1,2]x",
    b"\xff", b"", '{"é": "ü€😀"}'.encode(), b'{"a": {"b": [true, false, null]}}', b"[" * 2000 + b"]" * 2000,
]


def _same_decoding(data: bytes) -> None:
    try:
        expected = json.loads(data)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            json_loads(data)
        return
    got = json_loads(data)
    assert got == expected or (got != got and expected != expected)
    assert repr(got) == repr(expected)  # the same types too (a big integer is not a float)


@pytest.mark.parametrize("data", DECODE_CASES, ids=[str(i) for i in range(len(DECODE_CASES))])
def test_json_loads_is_json_loads(data):
    _same_decoding(data)


BIG_INTS = st.one_of(st.integers(), st.integers(2**62, 2**66), st.integers(-(2**66), -(2**62)))
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=6)  # surrogates included
SCALARS = st.one_of(st.none(), st.booleans(), BIG_INTS, st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(TEXT, inner, max_size=4)),
                           max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.sampled_from([{}, {"separators": (", ", " : ")}, {"ensure_ascii": False}]))
def test_json_loads_is_json_loads_on_any_json_text(value, options):
    try:
        data = json.dumps(value, **options).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate written as it is: no UTF-8 text holds it
        return
    _same_decoding(data)


# --- encoding -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def provider():
    app = Flask(__name__)  # the provider holds its app weakly: the fixture keeps it
    app.json = SafeJSONProvider(app)
    with app.app_context():
        yield app.json


def _stdlib(provider, obj) -> bytes:
    """What the provider answered before orjson: json.dumps with its settings, compact, and a newline."""
    text = json.dumps(obj, default=provider.default, ensure_ascii=provider.ensure_ascii,
                      sort_keys=provider.sort_keys, separators=(",", ":"))
    return f"{text}\n".encode("utf-8", "surrogatepass")


def _answer(provider, obj) -> bytes:
    return provider.response(obj).get_data()


def _has_float(value) -> bool:
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_float(v) for v in value)
    return isinstance(value, float)


def _same_answer(provider, obj) -> None:
    try:
        expected = _stdlib(provider, obj)
    except (TypeError, ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            _answer(provider, obj)
        return
    got = _answer(provider, obj)
    if got != expected:  # only a float may be written in another form (1e-7 / 1e-07): the same number
        assert _has_float(obj), (got, expected)
        assert got.isascii() == expected.isascii()
        assert repr(json.loads(got)) == repr(json.loads(expected))


@dataclasses.dataclass
class Stamped:
    at: datetime.datetime
    ratio: float
    tags: tuple


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


ALL_CHARACTERS = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)

ENCODE_CASES = [
    None, True, 0, -1, 2**63 - 1, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, [1, 2**70, {"a": -(2**80)}],
    1.0, -0.0, 0.1, 1e-7, 1e-5, 1e-4, 1e16, 1e22, 1.5e300, 5e-324, 12345.67, [1e-7, {"x": 2.5e-10}],
    float("nan"), float("inf"), -math.inf, {"a": [1, {"b": float("nan")}], "c": None}, [None, math.inf],
    "plain", "é", "€", "😀", "\x7f", "a\x00b\x1f\"\\/\n\t", ALL_CHARACTERS, {"ключ": "значение", "k": "v"},
    {"\uffff": 1, "\U00010000": 2, "a": 3, "é": 4, "z": 5}, "\ud800", {"\udc00": 1}, ["ok", "x\ud83d"],
    {"b": 1, "a": {"d": [3, {"z": 1, "y": 2}], "c": None}}, {1: "a", 2: "b"}, {1: "a", "b": 2}, {None: 1},
    {True: 1}, {2.5: "x"}, {"b": 1, 3: 2}, OrderedDict([("b", 1), ("a", 2)]), (1, "two", None),
    datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), datetime.datetime(2026, 1, 2, 3, 4, 5),
    datetime.date(2026, 1, 2), {"at": datetime.date(2026, 1, 2), "n": None}, datetime.time(1, 2),
    decimal.Decimal("1.50"), decimal.Decimal("NaN"), decimal.Decimal("1e-7"), uuid.UUID(int=5),
    {"id": uuid.UUID(int=2**127 + 7), "v": None}, Stamped(datetime.datetime(2026, 1, 1), 0.5, (1, 2)),
    [Stamped(datetime.datetime(2026, 1, 1), float("nan"), ()), None], Markup("<b>x</b>"), Color.RED,
    {Name("k"): Name("v")}, {1, 2}, object(), {"a": [[[[[[[[[[1]]]]]]]]]]}, [[[[]]]] * 3,
]


@pytest.mark.parametrize("obj", ENCODE_CASES, ids=[f"{i}-{type(o).__name__}" for i, o in enumerate(ENCODE_CASES)])
def test_compact_answer_is_json_dumps_answer(provider, obj):
    _same_answer(provider, obj)


def test_deeply_nested_answer_past_orjson_limit(provider):
    obj: list = []
    for _ in range(400):  # orjson stops at 255 levels: json.dumps writes it, as before
        obj = [obj, None]
    assert _answer(provider, obj) == _stdlib(provider, obj)


def test_nan_and_infinity_are_written_as_json_writes_them(provider):
    assert _answer(provider, {"a": float("nan"), "b": [math.inf, -math.inf]}) == b'{"a":NaN,"b":[Infinity,-Infinity]}\n'


def test_non_ascii_is_escaped_as_json_escapes_it(provider):
    assert _answer(provider, {"é": "ü€😀\x7f"}) == b'{"\\u00e9":"\\u00fc\\u20ac\\ud83d\\ude00\\u007f"}\n'


def test_datetimes_are_http_dates(provider):
    got = _answer(provider, {"at": datetime.datetime(2026, 1, 2, 3, 4, 5)})
    assert got == b'{"at":"Fri, 02 Jan 2026 03:04:05 GMT"}\n'


def test_settings_are_honoured(provider, monkeypatch):
    obj = {"b": "é", "a": 1e-7}
    monkeypatch.setattr(provider, "ensure_ascii", False)
    monkeypatch.setattr(provider, "sort_keys", False)
    got = _answer(provider, obj)
    assert got.decode("utf-8") == '{"b":"é","a":1e-7}\n'


def test_the_debug_form_is_flasks(provider, monkeypatch):
    monkeypatch.setattr(provider, "compact", False)
    assert _answer(provider, {"b": 1, "a": [1]}) == b'{\n  "a": [\n    1\n  ],\n  "b": 1\n}\n'


def test_stdlib_switch(provider, monkeypatch):
    monkeypatch.setattr(jsonbody, "ORJSON", False)
    assert _answer(provider, {"a": 1e-7}) == b'{"a":1e-07}\n'


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), BIG_INTS, st.floats(), TEXT, st.uuids(), st.decimals(allow_nan=False),
              st.datetimes(), st.dates()),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(JSONISH)
def test_compact_answer_is_json_dumps_answer_for_any_value(provider, obj):
    _same_answer(provider, obj)


# --- pre-encoded values (a page's records as PostgreSQL wrote them) -------------------------------------

PG_RECORD = '{"id" : "r1", "name" : "Café ☕", "fields" : {"n": 123456789012345678901234567890, "f": 1e-7, "z": null}}'


def test_pre_encoded_text_is_written_as_it_is(provider):
    got = _answer(provider, {"records": [PreEncoded(PG_RECORD)], "next": None})
    assert got.isascii()  # its non-ASCII characters escaped as json escapes them
    assert json.loads(got) == {"records": [json.loads(PG_RECORD)], "next": None}
    assert b'"n": 123456789012345678901234567890' in got  # not decoded: the big integer as it was


@pytest.mark.parametrize("other", [float("nan"), 2**70, {3: "non-str key"}, "\ud800"])
def test_pre_encoded_text_is_decoded_when_json_writes_the_answer(provider, other):
    obj = {"records": [PreEncoded(PG_RECORD)], "other": other}
    assert _answer(provider, obj) == _stdlib(provider, {"records": [json.loads(PG_RECORD)], "other": other})


def test_exact_dump_schema_takes_pre_encoded_records_as_they_are():
    from app.entities.schemas import PaginatedResultSchema, RecordSchema

    record = PreEncoded(PG_RECORD)
    assert RecordSchema().dump(record) is record
    page = {"records": [record], "totalCount": 1, "currentPage": 1, "pageSize": 20, "totalPages": 1,
            "hasNextPage": False, "hasPreviousPage": False, "nextCursor": None}
    assert PaginatedResultSchema().dump(page)["records"][0] is record


def test_pre_encoded_text_in_the_debug_form(provider, monkeypatch):
    monkeypatch.setattr(provider, "compact", False)
    got = _answer(provider, [PreEncoded('{"b" : 1, "a" : 2}')])
    assert got == b'[\n  {\n    "a": 2,\n    "b": 1\n  }\n]\n'


def test_pre_encoded_text_with_raw_whitespace_and_non_ascii(provider):
    text = '{\n\t"b" : "é",\r\n "a" : [1,\t2]}'  # JSON whitespace json's escaper would escape: json writes it
    assert _answer(provider, [PreEncoded(text)]) == _stdlib(provider, [json.loads(text)])
