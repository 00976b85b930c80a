"""Property test: a bulk create (one JSON dump per record for the storable/size checks, the fields COPYed
as that JSON text) accepts exactly the records a single create accepts, and stores the same bytes.

For random records (every platform field type given values of its own kind and of every other JSON
kind: bool vs int, 1.0 for an integer, huge integers, -0.0, big floats; strings with backslashes, tabs,
newlines, CR, `\\.` lines, quotes, the NUL character and the six characters `\\u0000`, non-ASCII; keys
with NUL; nested metadata), the record is sent to `POST /records` and, alone, to
`/records/bulk/create`: both accept it or both refuse it, and when accepted the stored name, fields,
tags and metadata are the same text in PostgreSQL, and equal (bool kept apart from int) to what was sent.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from tests.functional.entities_support import ALL_TYPES_SCHEMA, BASE, create_definition, org_headers

SCHEMA = "product_default"
TRICKY = ["\\", "\t", "\n", "\r", "\r\n", "\\.", "\n\\.\n", "\x00", "\\u0000", '"', "'", "é", "\u2028", "\x7f",
          "\x1b", "😀", "\\N", "|", ",", "{", "}", " ", "a", "Z", "0", "@", ":", "/", "-"]
strings = st.lists(st.sampled_from(TRICKY) | st.characters(blacklist_categories=("Cs",)), max_size=8).map("".join)
numbers = (st.integers(min_value=-(10**30), max_value=10**30) | st.sampled_from([0, 1, -1, 2**63, 10**40])
           | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([-0.0, 0.0, 1.0, 2.5, 1e308, 1e-300]))
scalars = st.none() | st.booleans() | numbers | strings
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(strings, inner, max_size=3), max_leaves=8)
FIELD_VALUES = {
    "title": strings, "qty": st.integers() | st.sampled_from([1.0, True, 10**40]), "price": numbers,
    "active": st.booleans() | st.sampled_from([0, 1]), "due": st.sampled_from(["2026-01-31", "2026-02-30", "x"]),
    "at": st.sampled_from(["2026-01-01T10:00:00Z", "2026-01-01T10:00:00", "2026-01-01 10:00:00+01:00"]),
    "email": st.sampled_from(["a@b.co", "a b@c.co", "x"]), "site": st.sampled_from(["https://x.y/p", "x y", ""]),
    "labels": st.lists(st.sampled_from(["red", "green", "blue", "pink"]), max_size=3),
    "score": st.integers(min_value=-3, max_value=3) | st.sampled_from([1.0, -0.0, True]), "meta": values,
}
fields = st.dictionaries(st.sampled_from([*ALL_TYPES_SCHEMA["properties"], "extra", "k\x00"]), values, max_size=4) | \
    st.fixed_dictionaries({"title": strings}, optional={k: v for k, v in FIELD_VALUES.items() if k != "title"}) | \
    st.fixed_dictionaries({"title": strings}, optional={"notes": strings, "body": strings, "meta": values,
                                                        "price": numbers, "qty": st.integers(), "attachment": values})
records = st.fixed_dictionaries({"fields": fields}, optional={
    "name": strings, "tags": st.lists(strings, max_size=3),
    "metadata": st.dictionaries(strings, values, max_size=3)})


@pytest.fixture(scope="module")
def data(app):
    from app.ratelimit import parse_policy

    limiter = app.extensions["ratelimit"]
    kept = limiter.policies["bulk"]
    limiter.policies["bulk"] = parse_policy("100000/60")  # two calls per example, hundreds of examples
    client = app.test_client()
    _org, headers = org_headers()
    entity_id = create_definition(client, headers, "bulkprop", ALL_TYPES_SCHEMA)
    yield client, headers, entity_id, set()
    limiter.policies["bulk"] = kept


def _rows(app, entity_id: str, seen: set) -> dict:
    from app.db import db

    with app.app_context():
        rows = db.session.execute(text(f"SELECT id, name, fields::text, tags, metadata::text FROM "
                                       f"{SCHEMA}.entity_records WHERE entity_id = :e"), {"e": entity_id}).all()
        db.session.rollback()
    # no metadata: a single create stores JSON null, a bulk create SQL NULL (both answer `null`)
    new = {row[0]: (*row[1:4], None if row[4] in (None, "null") else row[4]) for row in rows if row[0] not in seen}
    seen.update(new)
    return new


def _same(sent, stored) -> bool:
    """JSON equality that keeps bool apart from numbers (jsonb's numeric normalises 1e308, -0.0)."""
    if isinstance(sent, bool) or isinstance(stored, bool) or sent is None or isinstance(sent, str):
        return type(sent) is type(stored) and sent == stored
    if isinstance(sent, int | float):
        # jsonb keeps the decimal text: 3.015050861791261e+16 reads back as the integer 30150508617912610
        return (isinstance(stored, int | float) and not isinstance(stored, bool)
                and (sent == stored if isinstance(sent, int) else sent == float(stored)))
    if isinstance(sent, list):
        return isinstance(stored, list) and len(sent) == len(stored) and all(map(_same, sent, stored))
    return (isinstance(stored, dict) and set(sent) == set(stored)
            and all(_same(sent[k], stored[k]) for k in sent))


TRICKY_RECORD = {"name": "a\\.\n\\.\r\t\\\\u0000\\N", "tags": ["\t", "\\."],
                 "fields": {"title": "\\u0000\\", "qty": 1.0, "score": 0,
                            "meta": {"\\u0000": "\\.", "k": [-0.0, 1e308, 10**40, True, 1]}},
                 "metadata": {"\n": "\r\n", "q": '"\\"'}}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(record=records)
@example(record=TRICKY_RECORD)
@example(record={"fields": {"title": "x", "meta": {"a\x00": 1}}})
@example(record={"fields": {"title": "x"}, "metadata": {"a": "\x00"}})
@example(record={"fields": {"title": "x", "qty": True}})
@example(record={"fields": {"title": "x", "active": 1}})
def test_bulk_create_accepts_and_stores_as_single_create(app, data, record):
    client, headers, entity_id, seen = data
    body = json.dumps(record)
    single = client.post(f"{BASE}/bulkprop/records", data=body, content_type="application/json", headers=headers)
    stored_single = _rows(app, entity_id, seen)
    bulk = client.post(f"{BASE}/bulkprop/records/bulk/create", data=json.dumps({"records": [record]}),
                       content_type="application/json", headers=headers)
    stored_bulk = _rows(app, entity_id, seen)
    assert single.status_code in (201, 400) and bulk.status_code in (200, 400), (single.get_json(), bulk.get_json())
    assert (single.status_code == 201) == (bulk.status_code == 200), (single.get_json(), bulk.get_json())
    event(f"single {single.status_code}")
    if single.status_code != 201:
        assert not stored_single and not stored_bulk
        return
    assert len(stored_single) == len(stored_bulk) == 1
    (one,), (other,) = stored_single.values(), stored_bulk.values()
    assert one == other
    name, fields_text, tags, metadata_text = one
    assert _same(record["fields"], json.loads(fields_text))
    assert tags == record.get("tags", [])
    assert _same(record.get("metadata"), None if metadata_text is None else json.loads(metadata_text))
    if "name" in record:
        assert name == record["name"]


def test_the_tricky_record_is_accepted_by_both(app, data):
    """The COPY escaping case above is a stored record (not a refusal both sides agree on)."""
    client, headers, _entity_id, _seen = data
    assert client.post(f"{BASE}/bulkprop/records", json=TRICKY_RECORD, headers=headers).status_code == 201
    resp = client.post(f"{BASE}/bulkprop/records/bulk/create", json={"records": [TRICKY_RECORD]}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
