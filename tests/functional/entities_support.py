"""Helpers shared by the entity store tests: a definition with every platform field type, a fixed data set."""

from __future__ import annotations

import uuid

from tests.support import bearer, token

BASE = "/api/v1/entities"

ALL_TYPES_SCHEMA = {
    "type": "object",
    "required": ["title"],
    "properties": {
        "title": {"type": "string", "maxLength": 200},
        "notes": {"type": "stringMultiline"},
        "body": {"type": "text"},
        "qty": {"type": "int"},
        "price": {"type": "float"},
        "active": {"type": "bool"},
        "due": {"type": "date"},
        "at": {"type": "datetime"},
        "email": {"type": "email"},
        "phone": {"type": "phone"},
        "site": {"type": "url"},
        "status": {"type": "dropdown", "options": ["open", "closed", "pending"]},
        "labels": {"type": "multiselect", "options": ["red", "green", "blue"]},
        "owner": {"type": "lookup", "entity": "people"},
        "watchers": {"type": "multilookup"},
        "amount": {"type": "currency"},
        "attachment": {"type": "file"},
        "photo": {"type": "image"},
        "meta": {"type": "json"},
        "score": {"type": "integer", "fieldType": "int", "minimum": 0},
    },
}


def org_headers(scopes=("read", "write"), **kwargs) -> tuple[str, dict]:
    """A fresh org and a bearer header for it (for module-scoped data sets)."""
    org = f"org-{uuid.uuid4().hex[:12]}"
    return org, bearer(token(org=org, scopes=scopes, **kwargs))


def create_definition(client, headers, name="items", schema=None, **extra) -> str:
    body = {"name": name, "displayName": name.title(), "schema": schema or ALL_TYPES_SCHEMA, **extra}
    resp = client.post(f"{BASE}/definitions", json=body, headers=headers)
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()["id"]


def create_record(client, headers, entity, body) -> dict:
    resp = client.post(f"{BASE}/{entity}/records", json=body, headers=headers)
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()


def query(client, headers, entity, **params):
    return client.post(f"{BASE}/{entity}/records/query", json={"query": params}, headers=headers)


def names(resp) -> set[str]:
    assert resp.status_code == 200, resp.get_json()
    return {r["name"] for r in resp.get_json()["records"]}


FIXED_RECORDS = [
    {"name": "Alpha", "tags": ["vip"], "fields": {
        "title": "Hello World", "qty": 1, "price": 1.5, "active": True, "due": "2026-01-10",
        "at": "2026-01-10T10:00:00Z", "labels": ["red"], "status": "open", "amount": 10, "email": "a@x.io"}},
    {"name": "Beta", "tags": ["vip", "new"], "fields": {
        "title": "hello there 100%", "qty": 5, "price": 2.5, "active": False, "due": "2026-02-01",
        "at": "2026-01-10T12:00:00+02:00", "labels": ["red", "green"], "status": "closed",
        "amount": {"amount": 20, "currency": "EUR"}, "email": "b@y.io"}},
    {"name": "Gamma", "fields": {
        "title": "under_score", "qty": 10, "price": None, "active": True, "due": "2025-12-31", "labels": [],
        "status": "pending", "amount": 5}},
    {"name": "Delta", "fields": {"title": "", "qty": -3, "labels": ["blue"], "status": "open", "meta": {"a": 1}}},
    {"name": "Epsilon", "fields": {"title": "Ünïcode straße", "qty": 5, "price": 9.75,
                                   "at": "2026-03-01T00:00:00Z"}},
]
