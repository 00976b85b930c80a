"""Entity store through HTTP: definitions, admin upsert, views, records CRUD and validation per field
type, relationships, bulk (sync and async with a real worker), tenant and product isolation."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.functional.entities_support import (
    ALL_TYPES_SCHEMA,
    BASE,
    create_definition,
    create_record,
    org_headers,
    query,
)
from tests.support import assert_error


def error(resp, status, code="VALIDATION_ERROR"):
    return assert_error(resp, status, code)["error"]


# --- definitions ----------------------------------------------------------------------------------

def test_definition_crud_and_versions(client, auth):
    headers = auth()
    def_id = create_definition(client, headers, name="contacts", module="crm", description="People",
                               embeddingsConfig={"enabled": False, "fields": ["title"]},
                               id="ignored", orgId="evil", version=99, createdAt="2000-01-01T00:00:00Z")
    got = client.get(f"{BASE}/definitions/contacts", headers=headers).get_json()["definition"]
    assert got["id"] == def_id and got["version"] == 1 and got["isActive"] is True
    assert got["module"] == "crm" and got["displayName"] == "Contacts" and got["orgId"] != "evil"
    assert got["schema"] == ALL_TYPES_SCHEMA and got["embeddingsConfig"]["fields"] == ["title"]
    assert got["createdAt"].endswith("Z") and got["createdAt"] != "2000-01-01T00:00:00Z"

    error(client.post(f"{BASE}/definitions", json={"name": "contacts"}, headers=headers), 409, "CONFLICT")
    assert client.put(f"{BASE}/definitions/contacts", json={"description": "x", "version": 1},
                      headers=headers).get_json() == {"success": True}
    assert client.get(f"{BASE}/definitions/contacts", headers=headers).get_json()["definition"]["version"] == 2
    stale = error(client.put(f"{BASE}/definitions/contacts", json={"description": "y", "version": 1},
                             headers=headers), 409, "CONFLICT")
    assert "version" in stale["message"]
    error(client.put(f"{BASE}/definitions/nope", json={}, headers=headers), 404, "NOT_FOUND")

    create_definition(client, headers, name="other", module="ops")
    listed = client.get(f"{BASE}/definitions?module=crm", headers=headers).get_json()["definitions"]
    assert [d["name"] for d in listed] == ["contacts"]
    error(client.get(f"{BASE}/definitions?status=maybe", headers=headers), 400)


def test_definition_delete_modes(client, auth):
    headers = auth()
    create_definition(client, headers, name="things")
    rec = create_record(client, headers, "things", {"name": "a", "fields": {"title": "t"}})
    # soft delete: hidden from records routes, listed as inactive, name reusable
    assert client.delete(f"{BASE}/definitions/things", headers=headers).status_code == 200
    error(client.get(f"{BASE}/things/records/{rec['id']}", headers=headers), 404, "NOT_FOUND")
    inactive = client.get(f"{BASE}/definitions?status=inactive", headers=headers).get_json()["definitions"]
    assert [d["name"] for d in inactive] == ["things"] and inactive[0]["isActive"] is False
    assert client.get(f"{BASE}/definitions?status=active", headers=headers).get_json()["definitions"] == []
    create_definition(client, headers, name="things")
    create_record(client, headers, "things", {"name": "b", "fields": {"title": "t"}})
    # hard delete refuses while records exist, unless deleteRecords
    error(client.delete(f"{BASE}/definitions/things?hardDelete=true", headers=headers), 409, "CONFLICT")
    assert client.delete(f"{BASE}/definitions/things?hardDelete=true&deleteRecords=true",
                         headers=headers).status_code == 200
    names = [d["name"] for d in client.get(f"{BASE}/definitions", headers=headers).get_json()["definitions"]]
    assert names == ["things"]  # only the earlier soft-deleted one is left
    # soft delete with deleteRecords soft-deletes the records
    create_definition(client, headers, name="gadgets")
    gadget = create_record(client, headers, "gadgets", {"name": "g", "fields": {"title": "t"}})
    client.delete(f"{BASE}/definitions/gadgets?deleteRecords=true", headers=headers)
    create_definition(client, headers, name="gadgets")
    assert query(client, headers, "gadgets").get_json()["totalCount"] == 0
    error(client.get(f"{BASE}/gadgets/records/{gadget['id']}", headers=headers), 404, "NOT_FOUND")


INVALID_SCHEMAS = [
    ({"type": "object", "properties": {"f": {"type": "blob"}}}, "schema.properties.f", "unknown type"),
    ({"type": "object", "properties": {"f": {"type": "string", "fieldType": "money"}}}, "schema.properties.f",
     "unknown fieldType"),
    ({"type": "object", "properties": {"f": {"type": "dropdown"}}}, "schema.properties.f", "options"),
    ({"type": "object", "properties": {"f": {"type": "multiselect", "options": []}}}, "schema.properties.f",
     "options"),
    ({"type": "object", "properties": {"Bad Name": {"type": "string"}}}, "schema.properties.Bad Name",
     "snake_case"),
    ({"type": "object", "properties": {"camelCase": {"type": "string"}}}, "schema.properties.camelCase",
     "snake_case"),
    ({"type": "object", "properties": {"f": {"type": "string", "minLength": "x"}}}, "schema.properties.f",
     "is not of type"),
    ({"type": "object", "properties": {"f": {}}}, "schema.properties.f", "needs a type"),
    ({"type": "object", "properties": {"f": {"type": "string"}}, "required": ["g"]}, "schema.required",
     "not a property"),
    ({"type": "array"}, "schema.type", "object"),
]


@pytest.mark.parametrize(("schema", "where", "fragment"), INVALID_SCHEMAS, ids=[c[1] + c[2] for c in INVALID_SCHEMAS])
def test_invalid_definition_schema_names_the_property(client, auth, schema, where, fragment):
    err = error(client.post(f"{BASE}/definitions", json={"name": "bad", "schema": schema}, headers=auth()), 400)
    messages = err["details"]["fields"]
    named = [m for key, found in messages.items() if key == where or key.startswith(where + ".") for m in found]
    assert any(fragment in m for m in named), messages


def test_definition_input_rules(client, auth):
    headers = auth()
    for body in ({"name": "Has Spaces"}, {"name": "definitions"}, {}, {"name": "ok", "schema": []},
                 {"name": "ok", "embeddingsConfig": {"enabled": True, "fields": ["nope"]}}):
        error(client.post(f"{BASE}/definitions", json=body, headers=headers), 400)
    wrapped = client.post(f"{BASE}/definitions", json={"definition": {"name": "wrapped"}}, headers=headers)
    assert wrapped.status_code == 201
    error(client.post(f"{BASE}/definitions", json={"name": "x"}, headers=auth("read")), 403, "FORBIDDEN")


def test_admin_upsert(client, auth):
    admin = auth(role="admin")
    create_definition(client, admin, name="existing")
    body = {"definitions": [
        {"name": "existing", "displayName": "Existing v2", "artifactVersion": 3, "source": "registry"},
        {"name": "fresh", "schema": {"type": "object", "properties": {"n": {"type": "int"}}}},
        {"name": "broken", "schema": {"type": "object", "properties": {"x": {"type": "nope"}}}},
        {"displayName": "no name"},
        "not an object",
    ]}
    result = client.post("/api/v1/admin/entities/update", json=body, headers=admin).get_json()
    assert result["created"] == 1 and result["updated"] == 1 and len(result["errors"]) == 3
    assert result["errors"][0].startswith("definitions[2] (broken):") and "unknown type" in result["errors"][0]
    assert result["errors"][1].startswith("definitions[3]") and "name" in result["errors"][1]
    existing = client.get(f"{BASE}/definitions/existing", headers=admin).get_json()["definition"]
    assert existing["displayName"] == "Existing v2" and existing["version"] == 2
    assert existing["artifactVersion"] == 3 and existing["source"] == "registry"
    assert client.get(f"{BASE}/definitions/fresh", headers=admin).status_code == 200
    error(client.get(f"{BASE}/definitions/broken", headers=admin), 404, "NOT_FOUND")
    error(client.post("/api/v1/admin/entities/update", json=body, headers=auth("read", "write", "admin")),
          403, "FORBIDDEN")
    error(client.post("/api/v1/admin/entities/update", json={"definitions": []}, headers=admin), 400)


# --- views ----------------------------------------------------------------------------------------

def test_view_page_size_follows_the_record_query_bound(make_app, auth):
    """A view's pageSize is bounded by ENTITY_MAX_PAGE_SIZE, as the record query it drives (it was a fixed
    500): above it is 400 VALIDATION_ERROR naming the field; the OpenAPI document states the app's value."""
    headers = auth()
    for bound in (1000, 50):
        client = make_app(ENTITY_MAX_PAGE_SIZE=bound).test_client()
        name = f"paged{bound}"
        create_definition(client, headers, name)
        views = f"{BASE}/definitions/{name}/views"
        resp = client.post(views, json={"name": "Max", "pageSize": bound}, headers=headers)
        assert resp.status_code == 201, resp.get_json()
        body = error(client.post(views, json={"name": "Over", "pageSize": bound + 1}, headers=headers), 400)
        assert "pageSize" in body["details"]["fields"] and str(bound) in str(body["details"]["fields"]["pageSize"])
        view_id = resp.get_json()["id"]
        body = error(client.put(f"{views}/{view_id}", json={"pageSize": bound + 1}, headers=headers), 400)
        assert "pageSize" in body["details"]["fields"]
        doc = client.get("/api/v1/openapi.json").get_json()
        page_size = doc["components"]["schemas"]["ViewInput"]["properties"]["pageSize"]
        assert page_size["maximum"] == bound and page_size["minimum"] == 1


def test_view_routes_answer_hostile_bodies_in_the_envelope(client, auth):
    """Wrong content type, deep JSON, numbers out of any range, lone surrogates, wrong types: a clean
    4xx in the envelope on the view routes, never a 500."""
    headers = auth()
    create_definition(client, headers, "hostile")
    views = f"{BASE}/definitions/hostile/views"
    view_id = client.post(views, json={"name": "ok"}, headers=headers).get_json()["id"]
    raw = {**headers, "Content-Type": "application/json"}
    for target, method in ((views, client.post), (f"{views}/{view_id}", client.put)):
        error(method(target, data="name=x", headers={**headers, "Content-Type": "text/plain"}), 415, "INVALID_INPUT")
        error(method(target, data="[" * 100 + "]" * 100, headers=raw), 400, "INVALID_INPUT")
        error(method(target, data='{"name": "\\ud800x"}', headers=raw), 400)
        for bad in ({"name": "x", "pageSize": 10**40}, {"name": "x", "pageSize": 1e300}, {"name": "x", "pageSize": -1},
                    {"name": "x", "pageSize": "many"}, {"name": "x", "pageSize": True},
                    {"name": "x", "columns": "title"}, {"name": "x", "filters": []}, {"name": "x", "config": "x"},
                    {"name": "x\u0000y"}, {"name": ["x"]}, {"name": "x", "sortOrder": 10**40}):
            error(method(target, json=bad, headers=headers), 400)
        error(method(target, data='{"name": "x", "pageSize": 1e400}', headers=raw), 400)
        error(method(target, data='{"name": "x", "pageSize": NaN}', headers=raw), 400, "INVALID_INPUT")
        error(method(target, data='"just a string"', headers=raw), 400)

def test_views(client, auth):
    headers = auth()
    create_definition(client, headers)
    view = {"name": "Open items", "type": "kanban", "columns": ["title", "status", "created_at"],
            "filters": {"status": "open"}, "sortBy": "due", "sortOrder": 1, "isDefault": True,
            "config": {"groupBy": "status"}}
    view_id = client.post(f"{BASE}/definitions/items/views", json=view, headers=headers).get_json()["id"]
    listed = client.get(f"{BASE}/definitions/items/views", headers=headers).get_json()["views"]
    assert len(listed) == 1 and listed[0]["id"] == view_id and listed[0]["type"] == "kanban"
    assert listed[0]["filters"] == {"status": "open"} and listed[0]["isDefault"] is True
    definition = client.get(f"{BASE}/definitions/items", headers=headers).get_json()["definition"]
    assert definition["defaultViewId"] == view_id
    second = client.post(f"{BASE}/definitions/items/views", json={"name": "All", "isDefault": True},
                         headers=headers).get_json()["id"]
    views = {v["id"]: v for v in client.get(f"{BASE}/definitions/items/views", headers=headers).get_json()["views"]}
    assert views[view_id]["isDefault"] is False and views[second]["isDefault"] is True
    assert views[second]["type"] == "table"
    assert client.put(f"{BASE}/definitions/items/views/{view_id}", json={"name": "Renamed", "sortOrder": "desc"},
                      headers=headers).get_json() == {"success": True}
    renamed = [v for v in client.get(f"{BASE}/definitions/items/views", headers=headers).get_json()["views"]
               if v["id"] == view_id][0]
    assert renamed["name"] == "Renamed" and renamed["sortOrder"] == -1
    for bad in ({"name": "x", "columns": ["nope"]}, {"name": "x", "filters": {"nope": 1}},
                {"name": "x", "type": "pie"}, {"name": "x", "sortBy": "nope"}, {"type": "table"}):
        error(client.post(f"{BASE}/definitions/items/views", json=bad, headers=headers), 400)
    assert client.put(f"{BASE}/definitions/items", json={"defaultViewId": view_id}, headers=headers).status_code == 200
    assert client.get(f"{BASE}/definitions/items", headers=headers).get_json()["definition"]["defaultViewId"] == view_id
    flags = {v["id"]: v["isDefault"] for v in client.get(f"{BASE}/definitions/items/views",
                                                           headers=headers).get_json()["views"]}
    assert flags == {view_id: True, second: False}
    error(client.put(f"{BASE}/definitions/items", json={"defaultViewId": "nope"}, headers=headers), 400)
    client.put(f"{BASE}/definitions/items", json={"defaultViewId": second}, headers=headers)
    assert client.delete(f"{BASE}/definitions/items/views/{second}", headers=headers).status_code == 200
    assert client.get(f"{BASE}/definitions/items", headers=headers).get_json()["definition"]["defaultViewId"] is None
    error(client.delete(f"{BASE}/definitions/items/views/{second}", headers=headers), 404, "NOT_FOUND")


# --- records --------------------------------------------------------------------------------------

FIELD_CASES = [
    ("title", ["x", "ünï"], [5, None, "x" * 201]),
    ("notes", ["line1\nline2"], [["a"]]),
    ("body", ["long text"], [{"a": 1}]),
    ("qty", [0, -5, 10**12], [1.5, "3", True]),
    ("price", [1.25, 3, -0.5], ["1.2", False]),
    ("active", [True, False], ["true", 1]),
    ("due", ["2026-11-22"], ["2026-13-01", "22/11/2026", "2026-11-22T10:00:00Z", "2026-W01-1"]),
    ("at", ["2026-11-22T10:00:00Z", "2026-11-22T10:00:00.5+02:00"], ["2026-11-22", "2026-11-22T10:00:00",
                                                                       "2026-11-22T25:00:00Z"]),
    ("email", ["a@b.co", "first.last+tag@sub.example.org"], ["nope", "a@b", "a b@c.de"]),
    ("phone", ["+47 22 33 44 55", "(555) 123-4567"], ["call me", "12"]),
    ("site", ["https://example.com/x?y=1", "http://localhost:8000"], ["example.com", "ftp://x.org", "https://"]),
    ("status", ["open", None], ["Open", "other"]),
    ("labels", [["red"], [], ["red", "blue"]], [["pink"], ["red", "red"], "red"]),
    ("owner", ["some-record-id"], ["", 5]),
    ("watchers", [["a", "b"]], [["a", "a"], [""], "a"]),
    ("amount", [12.5, {"amount": 3, "currency": "EUR"}], [{"amount": "3"}, {"currency": "EUR"},
                                                          {"amount": 1, "currency": "euro"}, "12"]),
    ("attachment", ["https://files.example.com/a.pdf", {"url": "https://x.io/a.pdf", "name": "a.pdf", "size": 3}],
     [{"name": "a.pdf"}, "not a url", {"url": "https://x.io/a", "size": -1}]),
    ("photo", ["https://img.example.com/p.png"], [42]),
    ("meta", [{"any": ["thing", 1]}, [1, 2], "text", 3], []),
    ("score", [0, 7], [-1]),
]


@pytest.fixture(scope="module")
def typed_entity(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    return client, headers


@pytest.mark.parametrize(("field", "valid", "invalid"), FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_validation_per_field_type(typed_entity, field, valid, invalid):
    client, headers = typed_entity
    for value in valid:
        fields = {"title": "t", field: value} if field != "title" else {"title": value}
        resp = client.post(f"{BASE}/items/records", json={"name": "ok", "fields": fields}, headers=headers)
        assert resp.status_code == 201, (field, value, resp.get_json())
        assert resp.get_json()["fields"][field] == value
    for value in invalid:
        fields = {"title": "t", field: value} if field != "title" else {"title": value}
        resp = client.post(f"{BASE}/items/records", json={"name": "bad", "fields": fields}, headers=headers)
        err = error(resp, 400)
        assert f"fields.{field}" in err["details"]["fields"] or any(
            k.startswith(f"fields.{field}") for k in err["details"]["fields"]), (field, value, err)


def test_record_crud(client, auth):
    headers = auth()
    create_definition(client, headers)
    created = create_record(client, headers, "items", {
        "name": "First", "fields": {"title": "Hello", "qty": 2}, "tags": ["a"], "metadata": {"src": "test"},
        "id": "mine", "entityId": "x", "version": 42, "createdBy": "mallory"})
    assert created["id"] != "mine" and created["version"] == 1 and created["createdBy"] == "user-1"
    assert created["tags"] == ["a"] and created["metadata"] == {"src": "test"} and created["isActive"] is True
    url = f"{BASE}/items/records/{created['id']}"
    assert client.get(url, headers=headers).get_json() == created

    assert client.put(url, json={"fields": {"qty": 3, "status": "open"}, "version": 1},
                      headers=headers).get_json() == {"success": True}
    updated = client.get(url, headers=headers).get_json()
    assert updated["fields"] == {"title": "Hello", "qty": 3, "status": "open"} and updated["version"] == 2
    client.put(url, json={"fields": {"status": None}, "name": "Renamed"}, headers=headers)
    updated = client.get(url, headers=headers).get_json()
    assert "status" not in updated["fields"] and updated["name"] == "Renamed" and updated["version"] == 3
    error(client.put(url, json={"fields": {"qty": 4}, "version": 2}, headers=headers), 409, "CONFLICT")
    err = error(client.put(url, json={"fields": {"qty": "many", "title": None}}, headers=headers), 400)
    assert set(err["details"]["fields"]) == {"fields.qty", "fields"}  # type error + required title removed
    assert client.get(url, headers=headers).get_json()["version"] == 3  # nothing stored

    assert names_of(query(client, headers, "items", filters={"$search": "renamed"})) == ["Renamed"]
    assert client.delete(url, headers=headers).get_json() == {"success": True}
    error(client.get(url, headers=headers), 404, "NOT_FOUND")
    error(client.put(url, json={"fields": {}}, headers=headers), 404, "NOT_FOUND")
    assert query(client, headers, "items").get_json()["totalCount"] == 0
    error(client.get(f"{BASE}/items/records/does-not-exist", headers=headers), 404, "NOT_FOUND")
    error(client.get(f"{BASE}/nope/records/x", headers=headers), 404, "NOT_FOUND")


def names_of(resp):
    return [r["name"] for r in resp.get_json()["records"]]


def test_record_create_lists_every_violation(client, auth):
    headers = auth()
    create_definition(client, headers)
    resp = client.post(f"{BASE}/items/records", json={"name": "x", "fields": {
        "qty": "a", "email": "bad", "status": "nope", "unknown_field": 1}}, headers=headers)
    fields = error(resp, 400)["details"]["fields"]
    assert {"fields.qty", "fields.email", "fields.status"} <= set(fields)
    assert any("title" in m for m in fields["fields"]) and any("unknown_field" in m for m in fields["fields"])
    nul = client.post(f"{BASE}/items/records", json={"name": "a\x00", "fields": {"title": "b\x00"}},
                      headers=headers)
    assert set(error(nul, 400)["details"]["fields"]) == {"name", "fields.title"}
    error(client.post(f"{BASE}/items/records", json={"fields": []}, headers=headers), 400)
    assert query(client, headers, "items").get_json()["totalCount"] == 0


def test_record_name_defaults_from_fields_and_hard_delete(client, auth):
    headers = auth()
    create_definition(client, headers, name="plain", schema={"type": "object", "properties": {
        "code": {"type": "string"}}})
    assert create_record(client, headers, "plain", {"fields": {"code": "c1"}})["name"] == ""
    create_definition(client, headers, name="named", schema={"type": "object", "properties": {
        "title": {"type": "string"}}})
    named = create_record(client, headers, "named", {"fields": {"title": "From title"}})
    assert named["name"] == "From title"
    assert client.delete(f"{BASE}/named/records/{named['id']}?hardDelete=true", headers=headers).status_code == 200
    error(client.get(f"{BASE}/named/records/{named['id']}", headers=headers), 404, "NOT_FOUND")


# --- relationships --------------------------------------------------------------------------------

def test_relationships(client, auth):
    headers = auth()
    create_definition(client, headers, name="people", schema={"type": "object", "properties": {}})
    create_definition(client, headers, name="deals", schema={"type": "object", "properties": {}})
    ann = create_record(client, headers, "people", {"name": "Ann"})
    bob = create_record(client, headers, "people", {"name": "Bob"})
    deal = create_record(client, headers, "deals", {"name": "Deal"})
    url = f"{BASE}/deals/records/{deal['id']}/relationships"
    owner = client.post(url, json={"toEntityName": "people", "toRecordId": ann["id"], "relationshipType": "owner",
                                   "fields": {"since": 2020}}, headers=headers)
    assert owner.status_code == 201, owner.get_json()
    rel = owner.get_json()
    assert {k: rel[k] for k in ("fromEntityName", "fromRecordId", "toEntityName", "toRecordId", "relationshipType",
                                "isActive")} == {
        "fromEntityName": "deals", "fromRecordId": deal["id"], "toEntityName": "people", "toRecordId": ann["id"],
        "relationshipType": "owner", "isActive": True}
    client.post(url, json={"toEntityName": "people", "toRecordId": bob["id"], "relationshipType": "watcher"},
                headers=headers)
    # bob → deal (incoming for the deal)
    client.post(f"{BASE}/people/records/{bob['id']}/relationships",
                json={"toEntityName": "deals", "toRecordId": deal["id"], "relationshipType": "referred"},
                headers=headers)
    error(client.post(url, json={"toEntityName": "people", "toRecordId": ann["id"], "relationshipType": "owner"},
                      headers=headers), 409, "CONFLICT")

    def listed(**params):
        resp = client.get(url, query_string=params, headers=headers)
        assert resp.status_code == 200, resp.get_json()
        return sorted(r["relationshipType"] for r in resp.get_json()["relationships"])

    assert listed() == ["owner", "referred", "watcher"]
    assert listed(direction="outgoing") == ["owner", "watcher"]
    assert listed(direction="incoming") == ["referred"]
    assert listed(relationshipType="owner") == ["owner"]
    assert listed(targetEntity="people") == ["owner", "referred", "watcher"]
    assert listed(targetEntity="deals") == []
    assert listed(direction="incoming", targetEntity="people") == ["referred"]
    error(client.get(url, query_string={"direction": "sideways"}, headers=headers), 400)

    for bad, status in (({"toEntityName": "people", "toRecordId": "missing", "relationshipType": "x"}, 404),
                        ({"toEntityName": "ghosts", "toRecordId": ann["id"], "relationshipType": "x"}, 404),
                        ({"toEntityName": "people", "toRecordId": ann["id"]}, 400)):
        assert client.post(url, json=bad, headers=headers).status_code == status

    # deleting Bob deactivates his relationships
    client.delete(f"{BASE}/people/records/{bob['id']}", headers=headers)
    assert listed() == ["owner"]
    assert client.delete(f"{url}/{rel['id']}", headers=headers).get_json() == {"success": True}
    assert listed() == []
    error(client.delete(f"{url}/{rel['id']}", headers=headers), 404, "NOT_FOUND")


# --- bulk -----------------------------------------------------------------------------------------

def test_bulk_all_or_nothing(client, auth):
    headers = auth()
    create_definition(client, headers)
    ok = client.post(f"{BASE}/items/records/bulk/create", headers=headers, json={"records": [
        {"name": f"r{i}", "fields": {"title": f"title {i}", "qty": i}, "tags": ["bulk"]} for i in range(5)]})
    assert ok.status_code == 200 and ok.get_json() == {"message": "Created 5 records.", "count": 5}
    bad = client.post(f"{BASE}/items/records/bulk/create", headers=headers, json={"records": [
        {"name": "fine", "fields": {"title": "t"}}, {"name": "bad", "fields": {"qty": "x"}},
        {"name": "fine2", "fields": {"title": "t"}}, "junk", {"fields": {"title": "t", "qty": "y"}}]})
    err = error(bad, 400)
    assert err["details"]["indexes"] == [1, 3, 4] and "fields.qty" in err["details"]["records"]["1"]
    # a NUL is the one rule of every body (app.jsonbody), named by its path, before any record is read
    nul = client.post(f"{BASE}/items/records/bulk/create", headers=headers, json={"records": [
        {"name": "bad", "fields": {"qty": "x"}}, {"fields": {"title": "\x00"}}]})
    assert error(nul, 400)["details"] == {"fields": {"records[1].fields.title": [
        "must not contain the NUL character (U+0000)"]}}
    assert query(client, headers, "items").get_json()["totalCount"] == 5
    created = query(client, headers, "items", filters={"$search": "title"}, pageSize=10).get_json()
    assert created["totalCount"] == 5 and created["records"][0]["createdBy"] == "user-1"
    ids = sorted(r["id"] for r in created["records"])

    upd = client.post(f"{BASE}/items/records/bulk/update", headers=headers, json={"records": [
        {"id": ids[0], "fields": {"qty": 100}}, {"id": ids[1], "name": "renamed", "version": 1}]})
    assert upd.get_json() == {"message": "Updated 2 records.", "count": 2}
    first = client.get(f"{BASE}/items/records/{ids[0]}", headers=headers).get_json()
    assert first["fields"]["qty"] == 100 and first["fields"]["title"].startswith("title") and first["version"] == 2
    assert names_of(query(client, headers, "items", filters={"$search": "renamed"})) == ["renamed"]
    bad_upd = client.post(f"{BASE}/items/records/bulk/update", headers=headers, json={"records": [
        {"id": ids[2], "fields": {"qty": 7}}, {"id": "missing"}, {"id": ids[1], "version": 1},
        {"id": ids[3], "fields": {"status": "bogus"}}, {"fields": {}}, {"id": ids[2]}]})
    err = error(bad_upd, 400)
    assert err["details"]["indexes"] == [1, 2, 3, 4, 5]
    assert "stale" in str(err["details"]["records"]["2"])
    assert client.get(f"{BASE}/items/records/{ids[2]}", headers=headers).get_json()["fields"]["qty"] != 7

    bad_del = client.post(f"{BASE}/items/records/bulk/delete", headers=headers,
                          json={"recordIds": [ids[0], "missing"]})
    assert error(bad_del, 400)["details"]["indexes"] == [1]
    assert query(client, headers, "items").get_json()["totalCount"] == 5
    deleted = client.post(f"{BASE}/items/records/bulk/delete", headers=headers, json={"recordIds": ids[:3]})
    assert deleted.get_json() == {"message": "Deleted 3 records.", "count": 3}
    assert query(client, headers, "items").get_json()["totalCount"] == 2
    error(client.post(f"{BASE}/items/records/bulk/delete", headers=headers, json={"recordIds": []}), 400)
    error(client.post(f"{BASE}/items/records/bulk/create", headers=headers, json={"records": {}}), 400)


def test_bulk_batch_limit(client, auth):
    headers = auth()
    create_definition(client, headers)
    resp = client.post(f"{BASE}/items/records/bulk/create", headers=headers,
                       json={"records": [{"fields": {"title": "t"}}] * 5001})
    assert "5000" in error(resp, 400)["message"]
    resp = client.post(f"{BASE}/items/records/bulk/create", headers={**headers, "Prefer": "respond-async"},
                       json={"records": [{"fields": {"title": "t"}}] * 5001})
    error(resp, 400)
    assert query(client, headers, "items").get_json()["totalCount"] == 0


def test_async_bulk_jobs_on_a_real_worker(client, auth, celery_worker):
    headers = auth()
    async_headers = {**headers, "Prefer": "respond-async"}
    create_definition(client, headers)
    resp = client.post(f"{BASE}/items/records/bulk/create", headers=async_headers, json={"records": [
        {"name": f"job{i}", "fields": {"title": "from a job", "qty": i}} for i in range(50)]})
    assert resp.status_code == 202 and resp.headers["Preference-Applied"] == "respond-async"
    job_id = resp.get_json()["jobId"]
    assert resp.headers["Location"] == f"/api/v1/jobs/{job_id}"

    def finished(jid):
        body = client.get(f"/api/v1/jobs/{jid}", headers=headers).get_json()
        return body if body["status"] in ("succeeded", "failed") else None

    done = wait_for(lambda: finished(job_id), timeout=60)
    assert done["status"] == "succeeded" and done["result"] == {"message": "Created 50 records.", "count": 50}
    assert done["operation"] == "create" and done["entityName"] == "items" and done["finishedAt"]
    assert query(client, headers, "items").get_json()["totalCount"] == 50
    # a redelivered task finds the job finished and writes nothing again
    from app.entities import bulk
    from app.entities.tasks import run_bulk_job

    with client.application.app_context():
        assert bulk.claim_job(job_id, "default") is False
        assert bulk.execute_job(job_id, "default") == "succeeded"
        assert run_bulk_job.apply(args=[job_id, "default"]).get() == "skipped"
    assert query(client, headers, "items").get_json()["totalCount"] == 50

    failing = client.post(f"{BASE}/items/records/bulk/create", headers=async_headers, json={"records": [
        {"fields": {"title": "ok"}}, {"fields": {"qty": "nope"}}]})
    failed = wait_for(lambda: finished(failing.get_json()["jobId"]), timeout=60)
    assert failed["status"] == "failed" and failed["error"]["code"] == "VALIDATION_ERROR"
    assert failed["error"]["details"]["indexes"] == [1] and failed["result"] is None
    assert query(client, headers, "items").get_json()["totalCount"] == 50

    ids = [r["id"] for r in query(client, headers, "items", pageSize=10).get_json()["records"]]
    deleting = client.post(f"{BASE}/items/records/bulk/delete", headers=async_headers, json={"recordIds": ids})
    assert wait_for(lambda: finished(deleting.get_json()["jobId"]), timeout=60)["result"]["count"] == 10
    assert query(client, headers, "items").get_json()["totalCount"] == 40
    error(client.get("/api/v1/jobs/not-a-job", headers=headers), 404, "NOT_FOUND")


# --- isolation ------------------------------------------------------------------------------------

def test_tenant_and_product_isolation(client, auth, make_token):
    a = auth()
    create_definition(client, a, name="secrets")
    rec = create_record(client, a, "secrets", {"name": "A's", "fields": {"title": "t"}})
    other = create_record(client, a, "secrets", {"name": "A2", "fields": {"title": "t"}})
    rel = client.post(f"{BASE}/secrets/records/{rec['id']}/relationships", headers=a, json={
        "toEntityName": "secrets", "toRecordId": other["id"], "relationshipType": "peer"}).get_json()
    job = client.post(f"{BASE}/secrets/records/bulk/delete", headers={**a, "Prefer": "respond-async"},
                      json={"recordIds": ["nope"]}).get_json()["jobId"]

    for b in ({"Authorization": f"Bearer {make_token(org='org-b-' + rec['id'][:8])}"},
              auth(product="other")):
        assert client.get(f"{BASE}/definitions", headers=b).get_json() == {"definitions": [], "nextCursor": None}
        error(client.get(f"{BASE}/definitions/secrets", headers=b), 404, "NOT_FOUND")
        error(client.get(f"{BASE}/secrets/records/{rec['id']}", headers=b), 404, "NOT_FOUND")
        error(query(client, b, "secrets"), 404, "NOT_FOUND")
        error(client.get(f"{BASE}/secrets/records/{rec['id']}/relationships", headers=b), 404, "NOT_FOUND")
        error(client.delete(f"{BASE}/secrets/records/{rec['id']}/relationships/{rel['id']}", headers=b),
              404, "NOT_FOUND")
        error(client.get(f"/api/v1/jobs/{job}", headers=b), 404, "NOT_FOUND")
        # B's own definition of the same name never reveals A's records
        create_definition(client, b, name="secrets")
        assert query(client, b, "secrets").get_json()["totalCount"] == 0
        error(client.get(f"{BASE}/secrets/records/{rec['id']}", headers=b), 404, "NOT_FOUND")
        error(client.put(f"{BASE}/secrets/records/{rec['id']}", json={"fields": {}}, headers=b), 404, "NOT_FOUND")
        error(client.post(f"{BASE}/secrets/records/bulk/delete", json={"recordIds": [rec["id"]]}, headers=b), 400)
    assert client.get(f"{BASE}/secrets/records/{rec['id']}", headers=a).status_code == 200


def test_scopes(client, auth):
    writer = auth()
    create_definition(client, writer)
    reader = auth("read:entities")
    assert query(client, reader, "items").status_code == 200
    error(client.post(f"{BASE}/items/records", json={"fields": {"title": "t"}}, headers=reader), 403, "FORBIDDEN")
    error(query(client, auth("read:agents"), "items"), 403, "FORBIDDEN")
    assert client.post(f"{BASE}/items/records", json={"fields": {"title": "t"}},
                       headers=auth("write:entities")).status_code == 201


def test_unstorable_values_are_400_not_500(client, auth):
    headers = auth()
    create_definition(client, headers)
    # a NUL anywhere (path, query, body) is the one rule: 400 VALIDATION_ERROR naming where (app.jsonbody)
    error(client.get(f"{BASE}/definitions/a%00b", headers=headers), 400)
    error(client.get(f"{BASE}/items/records/x%00", headers=headers), 400)
    assert error(client.get(f"{BASE}/definitions?module=a%00", headers=headers), 400)["details"] == {
        "fields": {"module": ["must not contain the NUL character (U+0000)"]}, "location": "query"}
    error(client.get("/api/v1/jobs/%00", headers=headers), 400)
    err = error(client.post(f"{BASE}/definitions", json={"name": "n", "displayName": "a\x00"}, headers=headers), 400)
    assert "displayName" in err["details"]["fields"]
    # NaN/Infinity literals are not JSON (400 INVALID_INPUT, app.jsonbody); a number too big for a float
    # parses to infinity, which the store names field by field
    raw = '{"name": "x", "fields": {"title": "t", "price": 1e400, "meta": {"v": -1e999}}}'
    err = error(client.post(f"{BASE}/items/records", data=raw, headers={**headers, "Content-Type": "application/json"}),
                400)
    assert set(err["details"]["fields"]) == {"fields.price", "fields.meta.v"}
    bulk = '{"records": [{"fields": {"title": "ok"}}, {"fields": {"title": "t", "price": 2e308}}]}'
    err = error(client.post(f"{BASE}/items/records/bulk/create", data=bulk,
                            headers={**headers, "Content-Type": "application/json"}), 400)
    assert err["details"]["indexes"] == [1]
    err = error(client.post(f"{BASE}/items/records/bulk/delete", json={"recordIds": ["a\x00"]}, headers=headers), 400)
    assert set(err["details"]["fields"]) == {"recordIds[0]"}
    err = error(client.post(f"{BASE}/items/records/bulk/update", json={"records": [{"id": "a\x00"}]},
                            headers=headers), 400)
    assert set(err["details"]["fields"]) == {"records[0].id"}
    bad_schema = {"name": "weird", "schema": {"type": "object", "properties": {"a": {"type": {"x": 1}}}}}
    assert "schema.properties.a" in error(client.post(f"{BASE}/definitions", json=bad_schema, headers=headers),
                                          400)["details"]["fields"]
    assert query(client, headers, "items").get_json()["totalCount"] == 0


def test_bulk_create_names_each_unstorable_place_and_takes_the_text_backslash_u0000(client, auth):
    """A NUL anywhere in the body is the parser's one rule (app.jsonbody), which names each place; the six
    characters `\\u0000` typed as text are stored as they are."""
    headers = auth()
    create_definition(client, headers)
    records = [{"name": "plain \\u0000 text", "fields": {"title": "a \\u0000 b"}, "tags": ["\\u0000"]},
               {"name": "n\x00", "fields": {"title": "t"}},
               {"fields": {"title": "t", "x\x00": 1}, "tags": ["ok", "b\x00d"]},
               {"fields": {"title": "t"}, "metadata": {"deep": [{"v": "\x00"}]}}]
    err = error(client.post(f"{BASE}/items/records/bulk/create", json={"records": records}, headers=headers), 400)
    assert set(err["details"]["fields"]) == {"records[1].name", "records[2].fields", "records[2].tags[1]",
                                             "records[3].metadata.deep[0].v"}
    resp = client.post(f"{BASE}/items/records/bulk/create", json={"records": records[:1]}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    stored = query(client, headers, "items").get_json()["records"]
    assert [(r["name"], r["fields"]["title"], r["tags"]) for r in stored] == \
        [("plain \\u0000 text", "a \\u0000 b", ["\\u0000"])]
