"""A record query's count and page SQL rendered once per statement shape (app.db.Database.execute_shaped):
the same answers as SQLAlchemy's own execution, values re-bound on every call, one rendering per
shape and product, per-tenant values never frozen into the SQL, and the definition read of a
read-only request on the request's own connection."""

from __future__ import annotations

import pytest
from sqlalchemy import event, func, literal, select

from app.db import Database, _rebound, db
from app.entities.models import EntityRecord
from tests.functional.entities_support import BASE, FIXED_RECORDS, create_definition, create_record, org_headers
from tests.functional.test_entities_projection import bulk, indexing_app, plan_of, pointed  # noqa: F401
from tests.functional.test_entities_query_api import OPERATOR_CASES

T = EntityRecord.__table__


def _plain(self, session, shape, build, sources, named=None, values=None):
    """SQLAlchemy's own path: build and execute the statement every time (with a reused filter shape's
    values in place)."""
    return session.execute(_rebound(build(), values), named or {})


def _bodies() -> list[dict]:
    out = [{"filters": flt, "pageSize": 100} for flt, _expected in OPERATOR_CASES]
    out += [{"filters": {}, "sortBy": field, "sortOrder": order, "pageSize": 2}
            for field in ("qty", "title", "due", "status", "name", "created_at") for order in (1, -1)]
    out += [{"filters": {"qty": {"$gte": 1}}, "page": 2, "pageSize": 2},
            {"filters": {"$search": "hello"}, "pageSize": 3},
            {"filters": {"$or": [{"status": "open"}, {"qty": {"$gt": 5}}], "active": True}, "sortBy": "qty"},
            {"filters": {"$or": [{"status": "open"}, {"qty": {"$gt": 5}}], "active": False}, "sortBy": "qty"}]
    return out


def _answers(client, headers) -> list:
    answers = []
    for body in _bodies():
        page = client.post(f"{BASE}/items/records/query", json={"query": body}, headers=headers)
        answers.append((page.status_code, page.get_json()))
        cursor = page.get_json().get("nextCursor")
        if cursor:
            follow = {k: v for k, v in body.items() if k != "page"}
            answers.append(client.post(f"{BASE}/items/records/query", json={"query": {**follow, "cursor": cursor}},
                                       headers=headers).get_json())
        count = client.post(f"{BASE}/items/records/count", json={"filters": body["filters"]}, headers=headers)
        answers.append((count.status_code, count.get_json()))
    return answers


def _definition_with_records(app, projected: bool):
    client = app.test_client()
    _org, headers = org_headers()
    definition_id = create_definition(client, headers)
    if projected:
        bulk(client, headers, "items", "create", FIXED_RECORDS)
        assert pointed(app, definition_id) == plan_of(definition_id).name
    else:
        for r in FIXED_RECORDS:
            create_record(client, headers, "items", r)
    return client, headers


@pytest.mark.parametrize("projected", [True, False], ids=["projection", "entity_records"])
def test_shaped_statements_answer_exactly_as_sqlalchemy_does(indexing_app, monkeypatch, projected):  # noqa: F811
    """Every operator, sort, page, cursor and count: first call (renders), second (re-binds), and
    SQLAlchemy's own execution give the same answers."""
    client, headers = _definition_with_records(indexing_app, projected)
    first = _answers(client, headers)
    again = _answers(client, headers)
    shaped = indexing_app.extensions["db"].shaped
    uncached = [key for key, entry in shaped.items() if entry is None]
    # only `… AND false` (an empty $in): SQLAlchemy folds the other terms away, so their values are not
    # binds of the statement and it runs through SQLAlchemy every time
    assert len(shaped) > 20 and all("False_" in repr(key) for key in uncached)
    monkeypatch.setattr(Database, "execute_shaped", _plain)
    assert first == again == _answers(client, headers)


def test_values_are_rebound_per_call_and_tenants_share_a_shape_not_their_rows(app):
    """Two orgs' definitions without projection: the same filter shape is one rendering; each org's
    id and its filter values are bound per call, so each sees only its records."""
    a_client, a_headers = _definition_with_records(app, projected=False)
    b_client, b_headers = _definition_with_records(app, projected=False)
    create_record(b_client, b_headers, "items", {"name": "Only-B", "fields": {"title": "zz", "qty": 5}})
    state = app.extensions["db"]

    def names(client, headers, qty):
        resp = client.post(f"{BASE}/items/records/query", json={"query": {"filters": {"qty": qty}}}, headers=headers)
        return sorted(r["name"] for r in resp.get_json()["records"])

    # a definition's first read in this process loads it (no row token asked), later ones check the cached
    # definition's row token in the same statement (another shape): each org reads once before counting
    names(a_client, a_headers, 7), names(b_client, b_headers, 7)
    a5 = names(a_client, a_headers, 5)
    before = len(state.shaped)
    b5, a1 = names(b_client, b_headers, 5), names(a_client, a_headers, 1)
    assert len(state.shaped) == before  # no new shape: values only
    assert "Only-B" in b5 and "Only-B" not in a5 and b5 == sorted([*a5, "Only-B"])
    assert a1 != a5 and a1


def test_one_rendering_per_shape_and_product_and_literals_are_shape(app):
    """Unit: equal structure, other values → one entry; `= true` vs `= false` (SQLAlchemy renders
    them, not binds) → two; another product → its own SQL with its schema; a statement with a value
    no source carries is not cached (and answers right)."""
    with app.app_context():
        state = app.extensions["db"]
        state.shaped.clear()
        results = {}
        for product in ("default", "other"):
            from sqlalchemy.orm import Session

            session = Session(bind=db.engine_for(product, autocommit=True))
            try:
                for org in ("org-x", "org-y"):
                    for active in (True, False):
                        where = [T.c.org_id == org, T.c.is_active.is_(active)]
                        got = db.execute_shaped(session, ("count", "t"),
                                                lambda where=where: select(func.count()).select_from(T).where(*where),
                                                where).scalar()
                        results[(product, org, active)] = got
                frozen = db.execute_shaped(session, ("literal",), lambda: select(literal(7) + 1), []).scalar()
                assert frozen == 8
            finally:
                session.close()
        entries = {key: value for key, value in state.shaped.items() if key[0] == ("count", "t")}
        assert len(entries) == 4  # (true, false) x (default, other)
        sqls = sorted(value.sql for value in entries.values())
        assert sum("product_other." in s for s in sqls) == 2 and sum("product_default." in s for s in sqls) == 2
        assert all("org-x" not in s for s in sqls)
        assert [v for k, v in state.shaped.items() if k[0] == ("literal",)] == [None, None]  # per product
        assert all(v == 0 for v in results.values())  # no such orgs


def test_read_only_request_reads_its_definition_on_its_own_connection(app):
    """db.read_first in a request that declared reads_only takes the session's connection: one pool
    checkout per query request, not two."""
    client, headers = _definition_with_records(app, projected=False)
    with app.app_context():
        engine = db.engine
    checkouts = []
    listener = lambda *_a: checkouts.append(1)  # noqa: E731
    event.listen(engine, "checkout", listener)
    try:
        resp = client.post(f"{BASE}/items/records/query", json={"query": {"filters": {"qty": 5}}}, headers=headers)
        assert resp.status_code == 200 and resp.get_json()["totalCount"] == 2
        assert len(checkouts) == 1
        missing = client.post(f"{BASE}/nothing/records/count", json={"filters": {}}, headers=headers)
        assert missing.status_code == 404
    finally:
        event.remove(engine, "checkout", listener)


def test_a_value_object_shared_by_two_sources_is_part_of_the_shape(app):
    """Each source's cache key is taken on its own, so it cannot tell that two sources hold the very
    same bound value (one parameter of the SQL) or two equal-looking ones (two parameters): the
    sharing is part of the shape. Rendered with a shared value, then called with two different ones
    (and the other way round), each call answers its own values."""
    from sqlalchemy.orm import Session

    with app.app_context():
        session = Session(bind=db.engine_for("default", autocommit=True))
        try:
            def run(a, b):
                return tuple(db.execute_shaped(session, ("shared values",),
                                               lambda: select(a.label("a"), b.label("b")), [a, b]).one())

            one = literal(1)
            assert run(one + 0, one + 0) == (1, 1)
            assert run(literal(2) + 0, literal(3) + 0) == (2, 3)
            assert run(literal(4) + 0, literal(5) + 0) == (4, 5)
            seven = literal(7)
            assert run(seven + 0, seven + 0) == (7, 7)
        finally:
            session.close()


def test_the_shapes_kept_are_bounded_by_their_size(app, monkeypatch):
    """A caller choosing filter structures at will makes a shape per structure; each entry holds the
    SQL and its key (several times the SQL's size: ~300 KB for 100 conditions). The cache is bounded
    by the characters of SQL it holds as well as by the number of shapes (uncacheable shapes count
    too: their keys are kept)."""
    from sqlalchemy import or_
    from sqlalchemy.orm import Session

    import app.db as db_module

    monkeypatch.setattr(db_module, "SHAPED_MAX_CHARS", 20_000)
    with app.app_context():
        state = app.extensions["db"]
        state.shaped.clear()
        session = Session(bind=db.engine_for("default", autocommit=True))
        try:
            for n in range(1, 60):
                where = [or_(*[T.c.name == f"n{i}" for i in range(n)])]
                if n % 2:
                    where.append(T.c.id.in_(["a", "b"]))  # expanding: not cacheable, its key is kept
                got = db.execute_shaped(session, ("bounded",),
                                        lambda where=where: select(func.count()).select_from(T).where(*where),
                                        where).scalar()
                assert got == 0
                assert len(state.shaped) >= 1
                assert state.shaped_chars <= 20_000
                assert sum(len(v.sql) for v in state.shaped.values() if v is not None) <= state.shaped_chars
        finally:
            session.close()
