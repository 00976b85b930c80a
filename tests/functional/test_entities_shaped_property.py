"""Property test: a record query's shaped statements (app.db.Database.execute_shaped) answer exactly as
SQLAlchemy's own execution, across tenants that share statement shapes.

Four data sets of the same definition name and schema: two orgs in the default product (different
records), one org in product `other`, and one definition with a ready typed projection. For random
filters (the reference evaluator's strategy), sorts, page sizes, pages, a top-level `$search` and the
next page by cursor, every data set is asked first through the shaped statements (the data sets take
turns, so a shape rendered for one tenant is re-bound for the next), then through SQLAlchemy's plain
path; the answers must be equal, and every record returned must be one of that data set's own.
"""

from __future__ import annotations

import random
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.db import Database, _rebound
from tests.functional.entities_support import BASE, create_definition, org_headers
from tests.functional.test_entities_filter_property import SCHEMA, _record, filters, nesting
from tests.functional.test_entities_filter_property import projected_data as projected_data  # noqa: F401

SORTS = [None, "s", "t", "n", "i", "d", "dt", "b", "m", "j", "name", "created_at", "version"]


def _plain(self, session, shape, build, sources, named=None, values=None):
    return session.execute(_rebound(build(), values), named or {})


def _load(app, seed: int, **token):
    client = app.test_client()
    _org, headers = org_headers(**token)
    create_definition(client, headers, name="fuzz", schema=SCHEMA)
    rng = random.Random(seed)
    resp = client.post(f"{BASE}/fuzz/records/bulk/create", json={"records": [_record(rng) for _ in range(30)]},
                       headers=headers)
    assert resp.status_code == 200, resp.get_json()
    listed = client.post(f"{BASE}/fuzz/records/query", json={"query": {"pageSize": 500}}, headers=headers)
    return client, headers, "fuzz", {r["id"] for r in listed.get_json()["records"]}


@pytest.fixture(scope="module")
def tenants(app, projected_data):  # noqa: F811
    client, headers, records = projected_data
    return [_load(app, 1), _load(app, 2), _load(app, 3, product="other"),
            (client, headers, "fuzzp", {r["id"] for r in records})]


def _answers(data, body: dict) -> list:
    client, headers, entity, ids = data
    out = []
    resp = client.post(f"{BASE}/{entity}/records/query", json={"query": body}, headers=headers)
    page = resp.get_json()
    out.append((resp.status_code, page))
    if resp.status_code == 200:
        assert {r["id"] for r in page["records"]} <= ids  # never another tenant's record
        if page.get("nextCursor"):
            follow = {k: v for k, v in body.items() if k != "page"}
            nxt = client.post(f"{BASE}/{entity}/records/query",
                              json={"query": {**follow, "cursor": page["nextCursor"]}}, headers=headers)
            out.append((nxt.status_code, nxt.get_json()))
            assert nxt.status_code != 200 or {r["id"] for r in nxt.get_json()["records"]} <= ids
    count = client.post(f"{BASE}/{entity}/records/count", json={"filters": body["filters"]}, headers=headers)
    out.append((count.status_code, count.get_json()))
    return out


def _body(flt, sort_by, sort_order, page_size, page, search) -> dict:
    """A query body of the drawn values (`search` wraps the filter with a `$search`)."""
    if search is not None:
        flt = {"$and": [flt], "$search": search}
    body = {"filters": flt, "pageSize": page_size, "page": page}
    if sort_by is not None:
        body["sortBy"] = sort_by
    if sort_order is not None:
        body["sortOrder"] = sort_order
    return body


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flt=filters, sort_by=st.sampled_from(SORTS), sort_order=st.sampled_from([None, 1, -1]),
       page_size=st.sampled_from([1, 2, 3, 7]), page=st.sampled_from([1, 2, 4]),
       search=st.sampled_from([None, None, "a", "b z", "ü"]), order=st.permutations(range(4)))
def test_shaped_statements_answer_as_sqlalchemy_across_tenants(tenants, flt, sort_by, sort_order, page_size, page,
                                                                 search, order):
    from app.entities import query as engine

    assume(nesting(flt) <= 7)
    body = _body(flt, sort_by, sort_order, page_size, page, search)
    shaped = {i: _answers(tenants[i], body) for i in order}
    # SQLAlchemy's own execution of filters compiled afresh (no reuse of compiled filter shapes)
    with mock.patch.object(Database, "execute_shaped", _plain), mock.patch.object(engine, "REUSE_SHAPES", False):
        plain = {i: _answers(tenants[i], body) for i in order}
    for i in order:
        assert shaped[i] == plain[i], (i, body)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flt=filters, sort_by=st.sampled_from(SORTS), sort_order=st.sampled_from([None, 1, -1]),
       page_size=st.sampled_from([1, 2, 3, 7, 30, 31]), page=st.sampled_from([1, 2, 4, 5, 40]),
       search=st.sampled_from([None, None, "a", "b z", "ü"]), order=st.permutations(range(4)))
def test_a_page_and_its_count_in_one_statement_answer_as_two(tenants, flt, sort_by, sort_order, page_size, page,
                                                               search, order):
    """The count and the page in one statement (query._counted_page: the count's row outer-joined with
    the page) answer exactly as the count and the page in two: totalCount, the page (NULL sort keys,
    ties, pages past the end, empty results), its cursor and the cursor's page, on every data set."""
    from app.entities import query as engine

    assume(nesting(flt) <= 7)
    body = _body(flt, sort_by, sort_order, page_size, page, search)
    one = {i: _answers(tenants[i], body) for i in order}
    with mock.patch.object(engine, "COUNT_WITH_PAGE", False):
        two = {i: _answers(tenants[i], body) for i in order}
    for i in order:
        assert one[i] == two[i], (i, body)
