"""Paging of the entity definition and view lists (`limit` + `cursor` → `nextCursor`, as the agent
registry's lists), through HTTP against the real PostgreSQL."""

from __future__ import annotations

import pytest

from tests.functional.entities_support import BASE, create_definition
from tests.support import assert_error

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}}


@pytest.fixture()
def headers(auth):
    return auth("read", "write")


def walk(client, headers, url: str, key: str, **params) -> tuple[list[dict], int]:
    """Every item of the list, page by page; and how many pages it took."""
    items, pages, cursor = [], 0, None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = client.get(url, query_string=query, headers=headers)
        assert page.status_code == 200, page.get_json()
        body = page.get_json()
        items += body[key]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            return items, pages


def test_a_small_definition_list_is_one_page_as_before(client, headers):
    for name in ("bravo", "alpha"):
        create_definition(client, headers, name, SCHEMA)
    answer = client.get(f"{BASE}/definitions", headers=headers).get_json()
    assert [d["name"] for d in answer["definitions"]] == ["alpha", "bravo"] and answer["nextCursor"] is None


def test_definitions_page_by_limit_and_cursor(app, client, headers):
    names = [f"d{n:02d}" for n in range(7)]
    for name in reversed(names):
        create_definition(client, headers, name, SCHEMA, module="crm" if name < "d04" else "ops")
    items, pages = walk(client, headers, f"{BASE}/definitions", "definitions", limit=3)
    assert [d["name"] for d in items] == names and pages == 3
    # filters hold on every page, and a cursor belongs to its filters
    crm, pages = walk(client, headers, f"{BASE}/definitions", "definitions", limit=2, module="crm")
    assert [d["name"] for d in crm] == names[:4] and pages == 2
    first = client.get(f"{BASE}/definitions?limit=2&module=crm", headers=headers).get_json()
    other = client.get(f"{BASE}/definitions?module=ops&cursor={first['nextCursor']}", headers=headers)
    assert_error(other, 400)
    # the default page size comes from ENTITY_LIST_DEFAULT_LIMIT
    saved = app.config["ENTITY_LIST_DEFAULT_LIMIT"]
    app.config["ENTITY_LIST_DEFAULT_LIMIT"] = 5
    try:
        page = client.get(f"{BASE}/definitions", headers=headers).get_json()
        assert len(page["definitions"]) == 5 and page["nextCursor"]
    finally:
        app.config["ENTITY_LIST_DEFAULT_LIMIT"] = saved


def test_a_definition_walk_neither_repeats_nor_skips_while_others_are_created(client, headers):
    for name in ("b", "d", "f"):
        create_definition(client, headers, name, SCHEMA)
    first = client.get(f"{BASE}/definitions?limit=2", headers=headers).get_json()
    assert [d["name"] for d in first["definitions"]] == ["b", "d"]
    create_definition(client, headers, "a", SCHEMA)  # before the cursor: not on the next page
    create_definition(client, headers, "e", SCHEMA)  # after it: on the next page
    rest = client.get(f"{BASE}/definitions?limit=2&cursor={first['nextCursor']}", headers=headers).get_json()
    assert [d["name"] for d in rest["definitions"]] == ["e", "f"] and rest["nextCursor"] is None


def test_a_soft_deleted_definition_and_its_successor_of_the_same_name_are_both_walked(client, headers):
    create_definition(client, headers, "same", SCHEMA)
    assert client.delete(f"{BASE}/definitions/same", headers=headers).status_code == 200
    create_definition(client, headers, "same", SCHEMA)
    items, pages = walk(client, headers, f"{BASE}/definitions", "definitions", limit=1)
    assert [(d["name"], d["isActive"]) for d in items] == [("same", False), ("same", True)] and pages == 2


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=x", "cursor=forged.cursor", "cursor="])
def test_bad_paging_of_definitions_is_400(client, headers, query):
    assert_error(client.get(f"{BASE}/definitions?{query}", headers=headers), 400)


def test_views_page_by_limit_and_cursor(client, headers):
    create_definition(client, headers, "items", SCHEMA)
    create_definition(client, headers, "other", SCHEMA)
    url = f"{BASE}/definitions/items/views"
    made = []
    for n in range(5):
        answer = client.post(url, json={"name": f"v{n}", "columns": ["title"]}, headers=headers)
        assert answer.status_code == 201, answer.get_json()
        made.append(answer.get_json()["id"])
    whole = client.get(url, headers=headers).get_json()
    assert [v["id"] for v in whole["views"]] == made and whole["nextCursor"] is None  # as before: one page
    items, pages = walk(client, headers, url, "views", limit=2)
    assert [v["id"] for v in items] == made and pages == 3
    first = client.get(f"{url}?limit=2", headers=headers).get_json()
    # a cursor of one definition's views is refused by another's
    assert_error(client.get(f"{BASE}/definitions/other/views?cursor={first['nextCursor']}", headers=headers), 400)
    assert_error(client.get(f"{url}?limit=0", headers=headers), 400)


@pytest.fixture()
def small_budget(app):
    """ENTITY_LIST_MAX_BYTES low enough for a few items of ~3 KB to fill a page."""
    saved = app.config["ENTITY_LIST_MAX_BYTES"]
    app.config["ENTITY_LIST_MAX_BYTES"] = 8000
    yield 8000
    app.config["ENTITY_LIST_MAX_BYTES"] = saved


def _padded(size: int) -> dict:
    return {"type": "object", "properties": {"title": {"type": "string", "description": "x" * size}}}


def test_a_definition_page_ends_within_the_byte_budget_and_the_walk_goes_on(client, headers, small_budget):
    """A page ends before the definition that would take it past ENTITY_LIST_MAX_BYTES (limit aside),
    `nextCursor` goes on, and the walk yields every definition once; a definition larger than the whole
    budget comes alone on its page."""
    names = [f"b{n:02d}" for n in range(6)]
    for name in names:
        create_definition(client, headers, name, _padded(2500))
    create_definition(client, headers, "zz-big", _padded(12000))
    first = client.get(f"{BASE}/definitions?limit=100", headers=headers).get_json()
    assert 1 < len(first["definitions"]) < len(names) and first["nextCursor"]
    items, pages = walk(client, headers, f"{BASE}/definitions", "definitions", limit=100)
    assert [d["name"] for d in items] == [*names, "zz-big"]
    assert pages >= 3
    last = client.get(f"{BASE}/definitions?module=none", headers=headers).get_json()
    assert last == {"definitions": [], "nextCursor": None}
    alone = [d["name"] for d in walk(client, headers, f"{BASE}/definitions", "definitions", limit=100)[0]
             if d["name"] == "zz-big"]
    assert alone == ["zz-big"]


def test_a_view_page_ends_within_the_byte_budget(client, headers, small_budget):
    create_definition(client, headers, "items", SCHEMA)
    url = f"{BASE}/definitions/items/views"
    made = []
    for n in range(5):
        answer = client.post(url, json={"name": f"v{n}", "columns": ["title"], "description": "y" * 2500},
                             headers=headers)
        assert answer.status_code == 201, answer.get_json()
        made.append(answer.get_json()["id"])
    first = client.get(url, headers=headers).get_json()
    assert 1 < len(first["views"]) < 5 and first["nextCursor"]
    items, pages = walk(client, headers, url, "views")
    assert [v["id"] for v in items] == made and pages >= 2
    # the limit still counts: a page is the smaller of the two
    assert len(client.get(f"{url}?limit=1", headers=headers).get_json()["views"]) == 1


def test_the_openapi_document_states_the_paging(client):
    paths = client.get("/api/v1/openapi.json").get_json()["paths"]
    for path in ("/api/v1/entities/definitions", "/api/v1/entities/definitions/{entityName}/views"):
        names = {p["name"] for p in paths[path]["get"]["parameters"] if p["in"] == "query"}
        assert {"limit", "cursor"} <= names, path
