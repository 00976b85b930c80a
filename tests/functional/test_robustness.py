"""Hostile input never stalls a worker or answers 500 (issue 12)."""

from __future__ import annotations

import json
import threading

import pytest

from tests.functional.agents_support import Registry, agent_body, tool_definition_body
from tests.functional.entities_support import BASE, create_definition
from tests.support import assert_error

BOMB = "^(a+)+$"
BOMB_INPUT = "a" * 40 + "!"


def _answers_quickly(call, seconds: float = 10.0):
    """Run `call` in a thread; the test fails (instead of hanging the suite) if it has not answered
    within `seconds` — a backtracking engine needs minutes for the inputs used here."""
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("resp", call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert "resp" in out, "the request did not answer: the pattern backtracks"
    return out["resp"]


# --- 1. caller-supplied regular expressions run on RE2 ---------------------------------------------

def test_backtracking_pattern_in_definition_is_linear(client, auth):
    headers = auth()
    create_definition(client, headers, "words", {"type": "object", "properties": {
        "word": {"type": "string", "pattern": BOMB},
        "extra": {"type": "json", "patternProperties": {"^(x+x+)+y$": {"type": "integer"}}}}})
    resp = _answers_quickly(lambda: client.post(f"{BASE}/words/records", json={"fields": {"word": BOMB_INPUT}},
                                                headers=headers))
    body = assert_error(resp, 400, "VALIDATION_ERROR")
    assert "word" in str(body["error"]["details"])
    resp = _answers_quickly(lambda: client.post(
        f"{BASE}/words/records", json={"fields": {"word": "aaa", "extra": {"x" * 40: "no"}}}, headers=headers))
    assert resp.status_code == 201, resp.get_json()  # the key does not end in y: not matched, no backtracking
    resp = client.post(f"{BASE}/words/records", json={"fields": {"word": "aaa", "extra": {"xxy": "no"}}},
                       headers=headers)
    assert_error(resp, 400, "VALIDATION_ERROR")


def test_unicode_property_patterns_work_as_in_ecma_262(client, auth):
    headers = auth()
    create_definition(client, headers, "letters", {"type": "object", "properties": {
        "word": {"type": "string", "pattern": r"^\p{L}+$"}}})
    ok = client.post(f"{BASE}/letters/records", json={"fields": {"word": "Straße"}}, headers=headers)
    assert ok.status_code == 201, ok.get_json()
    bad = client.post(f"{BASE}/letters/records", json={"fields": {"word": "R2D2"}}, headers=headers)
    assert_error(bad, 400, "VALIDATION_ERROR")


@pytest.mark.parametrize("pattern", [r"^(a)\1$", r"^(?=a)a$", r"(?<!x)y", "[unclosed"])
def test_patterns_re2_cannot_run_are_refused_when_saved(client, auth, pattern):
    headers = auth()
    resp = client.post(f"{BASE}/definitions", headers=headers, json={
        "name": "bad", "schema": {"type": "object", "properties": {"w": {"type": "string", "pattern": pattern}}}})
    body = assert_error(resp, 400, "VALIDATION_ERROR")
    assert "schema" in str(body["error"]["details"])
    registry = Registry(client, headers)
    resp = registry.post("/agents", agent_body(configSchema={"type": "object", "patternProperties": {
        pattern: {"type": "string"}}}))
    assert_error(resp, 400, "VALIDATION_ERROR")
    resp = registry.post("/tool-definitions", {"toolDefinition": tool_definition_body(
        configSchema={"type": "object", "properties": {"e": {"type": "string", "pattern": pattern}}},
        defaultConfig={})})
    assert_error(resp, 400, "VALIDATION_ERROR")


def test_backtracking_pattern_in_agent_and_tool_config_schema_is_linear(client, auth):
    registry = Registry(client, auth())
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": BOMB}}}
    resp = _answers_quickly(lambda: registry.post("/agents", agent_body(configSchema=schema,
                                                                       config={"code": BOMB_INPUT})))
    assert_error(resp, 400, "VALIDATION_ERROR")
    agent = registry.create_agent(configSchema=schema, config={"code": "aaaa"})
    resp = _answers_quickly(lambda: registry.put(f"/agents/{agent['id']}", {**agent_body(
        name=agent["name"], configSchema=schema), "config": {"code": BOMB_INPUT}}))
    assert_error(resp, 400, "VALIDATION_ERROR")
    resp = _answers_quickly(lambda: registry.post("/tool-definitions", {"toolDefinition": tool_definition_body(
        configSchema=schema, defaultConfig={"code": BOMB_INPUT})}))
    assert_error(resp, 400, "VALIDATION_ERROR")
    # `format: regex` values are judged by RE2 as well
    resp = registry.post("/agents", agent_body(
        configSchema={"type": "object", "properties": {"re": {"type": "string", "format": "regex"}}},
        config={"re": r"(a)\1"}))
    assert_error(resp, 400, "VALIDATION_ERROR")


# --- 2. hostile JSON is a 400 in the envelope ------------------------------------------------------

def _raw(client, method, path, headers, text, content_type="application/json"):
    return client.open(path, method=method, data=text.encode("utf-8", "surrogatepass"),
                       headers={**headers, "Content-Type": content_type})


def test_deep_long_and_unencodable_json_is_400_on_every_reader(client, auth):
    headers = auth()
    create_definition(client, headers, "notes", {"type": "object", "properties": {
        "title": {"type": "string"}, "meta": {"type": "json"}}})
    registry = Registry(client, headers)
    agent = registry.create_agent()
    targets = [("POST", f"{BASE}/notes/records"), ("POST", f"{BASE}/definitions"), ("POST", "/api/v1/agents"),
               ("PUT", f"/api/v1/agents/{agent['id']}"), ("POST", f"{BASE}/notes/records/query"),
               ("POST", f"{BASE}/notes/records/bulk/create"), ("POST", "/api/v1/email/send"),
               ("POST", "/api/v1/agents/images")]
    deep = "[" * 10_000 + "]" * 10_000
    for method, path in targets:
        for text in (deep, '{"a": ' + "1" * 5000 + "}", '{"a": "\\ud800"}', '{"\\udfff": 1}',
                     '{"a": "x\\u0000y"}', b"\xff\xfe{}".decode("latin-1"), "{"):
            resp = _raw(client, method, path, headers, text)
            assert resp.status_code == 400, (method, path, text[:30], resp.get_data(as_text=True)[:300])
            assert resp.get_json()["metadata"]["success"] is False
    # the recursive helpers of agents see at most JSON_MAX_DEPTH levels
    nested: dict = {}
    for _ in range(600):
        nested = {"k": nested}
    for field in ("metadata", "configSchema"):
        resp = registry.post("/agents", agent_body(**{field: nested}))
        assert_error(resp, 400, "INVALID_INPUT")
    # lone surrogates where each domain reads them: record fields, agent fields, definitions, $search
    cases = [
        (f"{BASE}/notes/records", '{"fields": {"title": "\\ud800"}}'),
        ("/api/v1/agents", '{"name": "a-\\ud800", "title": "t", "type": "chat", "provider": "p", "model": "m"}'),
        (f"{BASE}/definitions", '{"name": "s", "schema": {"type": "object", "properties": {"t": '
                                '{"type": "string", "description": "\\udc00"}}}}'),
        (f"{BASE}/notes/records/query", '{"query": {"filter": {"$search": "\\ud800"}}}'),
        (f"{BASE}/notes/records/query", '{"query": {"filter": {"title": {"$search": "\\ud83d"}}}}'),
        ("/api/v1/email/send", '{"to": ["a@example.com"], "subject": "\\ud800", "body": "b"}'),
    ]
    for path, text in cases:
        resp = _raw(client, "POST", path, headers, text)
        body = assert_error(resp, 400, "VALIDATION_ERROR")
        assert "surrogate" in str(body["error"]["details"]), body
    # a valid surrogate pair is a real character and is stored
    resp = _raw(client, "POST", f"{BASE}/notes/records", headers, '{"fields": {"title": "smile \\ud83d\\ude00"}}')
    assert resp.status_code == 201, resp.get_json()
    assert resp.get_json()["fields"]["title"] == "smile \U0001F600"


def test_nan_and_infinity_literals_are_invalid_json_on_every_reader(client, auth):
    """`NaN`, `Infinity`, `-Infinity` are not JSON (RFC 8259 §6): the one body parser refuses them for
    every route alike (400 INVALID_INPUT naming the literal), the bulk and batch paths included; a number
    too big for a float (1e400) is still refused by the domain that reads it, naming the field."""
    headers = auth()
    create_definition(client, headers, "nums", {"type": "object", "properties": {
        "title": {"type": "string"}, "n": {"type": "float"}, "meta": {"type": "json"}}})
    agent = Registry(client, headers).create_agent()
    event = '{"eventType": "click", "eventCategory": "ui", "properties": {"x": %s}}'
    targets = [
        ("POST", f"{BASE}/nums/records", '{"fields": {"n": %s}}'),
        ("POST", f"{BASE}/nums/records", '{"fields": {"meta": {"deep": [1, %s]}}}'),
        ("POST", f"{BASE}/nums/records/bulk/create", '{"records": [{"fields": {"n": %s}}]}'),
        ("POST", f"{BASE}/nums/records/query", '{"query": {"filter": {"n": {"$gt": %s}}}}'),
        ("POST", f"{BASE}/nums/records/aggregate", '{"groupBy": [], "metrics": [{"op": "sum", "field": %s}]}'),
        ("POST", f"{BASE}/definitions", '{"name": "x", "schema": {"type": "object", "maximum": %s}}'),
        ("PUT", f"/api/v1/agents/{agent['id']}", '{"metadata": {"k": %s}}'),
        ("POST", "/api/v1/analytics/events", event),
        ("POST", "/api/v1/analytics/events/batch", '{"events": [' + event + "]}"),
        ("POST", "/api/v1/email/send", '{"to": ["a@example.com"], "subject": "s", "body": "b", "x": %s}'),
    ]
    for method, path, template in targets:
        for literal in ("NaN", "Infinity", "-Infinity"):
            resp = _raw(client, method, path, headers, template % literal)
            body = assert_error(resp, 400, "INVALID_INPUT")
            assert literal in body["error"]["message"], (path, body)
            assert body["error"]["details"]["literal"] == literal, (path, body)
    # the same words as strings are text, stored as sent
    resp = _raw(client, "POST", f"{BASE}/nums/records", headers, '{"fields": {"title": "NaN", "meta": "-Infinity"}}')
    assert resp.status_code == 201, resp.get_json()
    assert resp.get_json()["fields"] == {"title": "NaN", "meta": "-Infinity"}
    # a literal too big for a float parses to infinity: refused as before, by the field that holds it
    resp = _raw(client, "POST", f"{BASE}/nums/records", headers, '{"fields": {"n": 1e400}}')
    body = assert_error(resp, 400, "VALIDATION_ERROR")
    assert "finite" in str(body["error"]["details"]), body
    listing = client.post(f"{BASE}/nums/records/query", json={"query": {}}, headers=headers).get_json()
    assert len(listing["records"]) == 1  # nothing else was stored



def test_number_too_big_for_a_float_is_named_by_the_agent_registry(client, auth):
    """`1e400` is JSON syntax but parses to infinity, which JSONB cannot hold: the registry refuses it
    as a VALIDATION_ERROR naming where it is (was a database conversion error about filters and
    sorts, naming nothing), and stores nothing."""
    headers = auth()
    registry = Registry(client, headers)
    agent = registry.create_agent()
    tool = tool_definition_body()
    tool["inputSchema"]["properties"]["number"]["maximum"] = "@@"
    targets = [
        ("POST", "/api/v1/agents", json.dumps(agent_body(metadata={"k": [1, "@@"]})), "metadata.k[1]"),
        ("PUT", f"/api/v1/agents/{agent['id']}", '{"metadata": {"k": "@@"}}', "metadata.k"),
        ("POST", "/api/v1/tool-definitions", json.dumps({"toolDefinition": tool}),
         "toolDefinition.inputSchema.properties.number.maximum"),
    ]
    for method, path, template, where in targets:
        for literal in ("1e400", "-1e999"):
            resp = _raw(client, method, path, headers, template.replace('"@@"', literal))
            body = assert_error(resp, 400, "VALIDATION_ERROR")
            assert body["error"]["details"]["fields"] == {where: ["Numbers must be finite."]}, (path, body)
    resp = client.get(f"/api/v1/agents/{agent['id']}", headers=headers)
    assert resp.status_code == 200 and resp.get_json()["agent"].get("metadata") in (None, {}), resp.get_json()

# Integer fields take only integers (2.0 is the integer 2, as JSON Schema says) that PostgreSQL `integer` holds
NOT_INTEGERS = [2.589e-42, 2.5, True, "3", None, 2**31, -(2**31) - 1, 1e300, [1], {"n": 1}]


def _names_field(body: dict, field: str) -> bool:
    return field in json.dumps(body["error"].get("details"))


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=repr)
def test_integer_fields_refuse_what_is_not_a_32_bit_integer(client, auth, value):
    headers = auth("read", "write", "read:agents", "write:agents", role="admin")
    create_definition(client, headers, "ints", {"type": "object", "properties": {"k": {"type": "string"}}})
    for field in ("forkedFromVersion", "artifactVersion", "version"):
        if value is None and field != "version":
            continue  # nullable: null clears it
        resp = client.post(f"{BASE}/definitions", json={"name": "numbered", "schema": {}, field: value},
                           headers=headers)
        assert _names_field(assert_error(resp, 400, "VALIDATION_ERROR"), field), (field, value)
    aggregate = {"aggregates": [{"field": "k", "function": "count", "alias": "n"}]}
    calls = [(f"{BASE}/ints/records/query", {"query": {"pageSize": value}}, "pageSize"),
             (f"{BASE}/ints/records/query", {"query": {"page": value}}, "page"),
             (f"{BASE}/ints/records/aggregate", {**aggregate, "limit": value}, "limit"),
             ("/api/v1/agents", agent_body(usageCount=value), "usageCount"),
             ("/api/v1/admin/artifacts", {"kind": "skill", "name": "x", "artifactVersion": value, "definition": {}},
              "artifactVersion")]
    for url, body, field in calls:
        if value is None and field in ("pageSize", "page", "limit"):
            continue  # nullable: the default applies
        resp = client.post(url, json=body, headers=headers)
        assert _names_field(assert_error(resp, 400, "VALIDATION_ERROR"), field), (url, field, value)


@pytest.mark.parametrize("value", ["0.9", True, [90]], ids=repr)
def test_the_aggregate_percentile_takes_a_json_number_only(client, auth, value):
    headers = auth()
    create_definition(client, headers, "pct", {"type": "object", "properties": {"n": {"type": "int"}}})
    body = {"aggregates": [{"field": "n", "function": "percentile", "percentile": value, "alias": "p"}]}
    resp = client.post(f"{BASE}/pct/records/aggregate", json=body, headers=headers)
    assert _names_field(assert_error(resp, 400, "VALIDATION_ERROR"), "percentile")


def test_an_integral_float_is_the_integer(client, auth):
    headers = auth("read", "write", role="admin")
    resp = client.post(f"{BASE}/definitions", json={"name": "floaty", "schema": {}, "forkedFromVersion": 3.0,
                                                    "version": 1.0}, headers=headers)
    assert resp.status_code == 201, resp.get_json()
    resp = client.post(f"{BASE}/floaty/records/query", json={"query": {"pageSize": 5.0}}, headers=headers)
    assert resp.status_code == 200 and resp.get_json()["pageSize"] == 5


@pytest.mark.parametrize("text", ["1_000", "1.0", "+5", " 5", "\u0661\u0660", "0x10", "1e2", "99999999999", ""])
def test_integer_query_parameters_take_ascii_decimal_digits_only(client, auth, text):
    headers = auth("read", "write", "read:analytics", "read:notifications", role="admin")
    for url, field in (("/api/v1/analytics/events", "limit"), ("/api/v1/analytics/events", "offset"),
                       ("/api/v1/email/bulk-send/no-such-job/recipients", "after"),
                       ("/api/v1/email/bulk-send/no-such-job/recipients", "limit"),
                       ("/api/v1/newsletter/subscribers", "limit"),
                       ("/api/v1/admin/artifacts/rollouts/no-such", "limit")):
        resp = client.get(url, query_string={field: text}, headers=headers)
        assert _names_field(assert_error(resp, 400, "VALIDATION_ERROR"), field), (url, field, text)
    resp = client.get("/api/v1/analytics/events", query_string={"limit": "7", "offset": "0"}, headers=headers)
    assert resp.status_code == 200, resp.get_json()


def test_every_request_integer_field_is_the_strict_32_bit_one(app):
    """The one integer field of request schemas: every Integer a route loads (body, nested, list items,
    query string) is `StrictInt` (`QueryInt` in the query string) bounded within PostgreSQL `integer`."""
    from marshmallow import fields

    from app.fields import INT32_MAX, INT32_MIN, QueryInt, StrictInt

    found, wrong = [], []

    def walk_field(field, where, location, seen):
        if isinstance(field, fields.Integer):
            found.append(where)
            ranges = [v for v in field.validators if hasattr(v, "min") and hasattr(v, "max")]
            low = max([r.min for r in ranges if r.min is not None], default=None)
            high = min([r.max for r in ranges if r.max is not None], default=None)
            kind = QueryInt if location == "query" else StrictInt
            if not isinstance(field, kind) or low is None or high is None or low < INT32_MIN or high > INT32_MAX:
                wrong.append(f"{where}: {type(field).__name__} {low}..{high}")
        elif isinstance(field, fields.Nested) and type(field.schema) not in seen:
            walk(field.schema, where, location, seen | {type(field.schema)})
        elif isinstance(field, fields.List):
            walk_field(field.inner, f"{where}[]", location, seen)
        elif isinstance(field, fields.Dict) and field.value_field is not None:
            walk_field(field.value_field, f"{where}{{}}", location, seen)

    def walk(schema, where, location, seen):
        schema = schema() if isinstance(schema, type) else schema
        for name, field in schema.fields.items():
            if not field.dump_only:
                walk_field(field, f"{where}.{name}", location, seen)

    for endpoint, view in app.view_functions.items():
        view_class = getattr(view, "view_class", None)
        methods = [getattr(view_class, m) for m in ("get", "post", "put", "delete", "patch")
                   if hasattr(view_class, m)] if view_class else [view]
        for method in methods:
            for parameter in getattr(method, "_apidoc", {}).get("arguments", {}).get("parameters", []):
                location = parameter.get("in", "json")
                walk(parameter["schema"], f"{endpoint} {location}", location, frozenset())
    assert len(found) > 40
    assert wrong == []


# --- 3. a body that is not JSON where JSON is expected is 415 ----------------------------------------

def test_body_of_another_type_is_415(client, auth):
    headers = auth()
    create_definition(client, headers, "plain", {"type": "object", "properties": {"title": {"type": "string"}}})
    agent = Registry(client, headers).create_agent()
    body = '{"fields": {"title": "x"}}'
    for method, path in (("POST", f"{BASE}/plain/records"), ("PUT", f"/api/v1/agents/{agent['id']}")):
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            extra = {"Content-Type": content_type} if content_type else {}
            resp = client.open(path, method=method, data=body, headers={**headers, **extra})
            assert resp.status_code == 415, (path, content_type, resp.get_data(as_text=True)[:200])
            assert resp.get_json()["error"]["code"] == "INVALID_INPUT"
    resp = client.post(f"{BASE}/plain/records", data={"fields": "x"}, headers=headers)  # multipart form
    assert resp.status_code == 415
    listing = client.post(f"{BASE}/plain/records/query", json={"query": {}}, headers=headers).get_json()
    assert listing["records"] == []  # nothing was created from the ignored bodies
    # application/*+json is JSON
    resp = client.post(f"{BASE}/plain/records", data=body, headers={**headers,
                                                                      "Content-Type": "application/merge+json"})
    assert resp.status_code == 201, resp.get_json()


def test_an_empty_body_labelled_json_is_no_body(client, auth):
    """Many HTTP clients send `Content-Type: application/json` on every request, GETs included: an empty
    body is "no body" (reads answer as usual; a route that needs a body names the missing fields)."""
    headers = {**auth(), "Content-Type": "application/json"}
    for path in ("/api/v1/me", "/api/v1/agents", f"{BASE}/definitions", "/api/v1/skills",
                 "/api/v1/analytics/summary"):
        resp = client.get(path, headers=headers)
        assert resp.status_code == 200, (path, resp.get_data(as_text=True)[:200])
    resp = client.post(f"{BASE}/definitions", headers=headers)
    assert_error(resp, 400, "VALIDATION_ERROR")
    assert "name" in resp.get_json()["error"]["details"]["fields"]


# --- 4. an email subject is one clean header line ----------------------------------------------------

@pytest.mark.parametrize("subject", ["a\u0000b", "a\rBcc: x@evil.test", "a\nBcc: x@evil.test", "a\r\n\r\nbody",
                                     "bell\u0007", "del\u007f"])
def test_email_subject_with_nul_or_line_breaks_is_400(client, auth, subject):
    resp = client.post("/api/v1/email/send", headers=auth("write:notifications"),
                       json={"to": ["someone@example.com"], "subject": subject, "body": "hello"})
    body = assert_error(resp, 400, "VALIDATION_ERROR")
    assert "subject" in str(body["error"]["details"]), body


def test_email_subject_with_a_tab_is_sent(client, auth):
    resp = client.post("/api/v1/email/send", headers=auth("write:notifications"),
                       json={"to": ["someone@example.com"], "subject": "a\tb", "body": "hello"})
    assert resp.status_code == 200, resp.get_json()


# --- 5. an over-long Authorization header is answered by the app, in the envelope ------------------

def test_oversized_authorization_header_gets_the_envelope_through_gunicorn(database_url):
    import http.client
    import json

    from tests.functional.test_reliability import start_gunicorn

    proc, port = start_gunicorn(database_url, GUNICORN_THREADS="4")
    try:
        for size in (9_000, 40_000):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/api/v1/agents", headers={"Authorization": "Bearer " + "a" * size})
            resp = conn.getresponse()
            body = json.loads(resp.read())
            assert resp.status == 401, body
            assert body["error"]["code"] == "UNAUTHORIZED" and body["metadata"]["success"] is False
            conn.close()
    finally:
        proc.terminate()
        proc.wait(30)



def _raw_http(port: int, request: bytes, *, half_close: bool = False) -> tuple[bytes, int, str, dict]:
    """Send `request` on a fresh connection and read until the server closes it: (all bytes received,
    status, Content-Type, JSON body of the first answer). `half_close` ends the sending side first
    (the server sees the body end early)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    length = int(headers.get("Content-Length", len(body)))
    return data, int(lines[0].split()[1]), headers.get("Content-Type", ""), json.loads(body[:length])


def test_gunicorn_level_errors_get_the_envelope(database_url):
    """Requests gunicorn refuses before the app sees them (a header field over 64 KB, a request line
    over 8 KB, a malformed header) are answered in the JSON envelope, not gunicorn's HTML page."""
    from tests.functional.test_reliability import start_gunicorn

    proc, port = start_gunicorn(database_url, GUNICORN_THREADS="4")
    try:
        cases = [
            (b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
            (b"GET /api/v1/health?" + b"a" * 9_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
            (b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", 400),
        ]
        for request, status in cases:
            _, got, content_type, body = _raw_http(port, request)
            assert got == status, body
            assert content_type == "application/json"
            assert body["error"]["code"] == "INVALID_INPUT" and body["metadata"]["success"] is False
            assert body["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(30)


# Bodies gunicorn cannot read, each raised by its body reader while the app reads the request:
# gunicorn.http.errors class → the chunked body after the headers
MALFORMED_CHUNKED = {
    "InvalidChunkSize": b"ZZ\r\n{}\r\n0\r\n\r\n",
    "InvalidChunkExtension": b"2;\x01\r\n{}\r\n0\r\n\r\n",
    "ChunkMissingTerminator": b"2\r\n{}xx\r\n0\r\n\r\n",  # a chunk longer than its size line says
    "InvalidHeader": b"2\r\n{}\r\n0\r\nX-Trailer: y\n\r\n",  # a trailer ended by a bare LF
}
BODY_ROUTES = [  # every kind of body reader: webargs JSON, request.get_json, a non-JSON (multipart) body
    ("POST", "/api/v1/agents", "application/json"),
    ("POST", "/api/v1/entities/definitions", "application/json"),
    ("PUT", "/api/v1/skills/by-name?name=x", "application/json"),
    ("POST", "/api/v1/email/send", "application/json"),
    ("POST", "/api/v1/agents/images", "multipart/form-data; boundary=b"),
]


def test_unreadable_request_body_is_a_400_not_a_500(database_url, auth):
    """A malformed chunked body (bad size line, bad chunk extension, a chunk longer than its size, a bad
    trailer) or a body that ends before it is complete is the client's error: 400 INVALID_INPUT in the
    envelope on every route that reads a body, and the connection is closed (where the next request
    would start is unknown)."""
    from tests.functional.test_reliability import start_gunicorn

    token = auth("read", "write", "write:notifications", "write:image-gen", role="admin")["Authorization"]
    proc, port = start_gunicorn(database_url, GUNICORN_THREADS="4")
    try:
        for method, path, content_type in BODY_ROUTES:
            head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\n"
                    f"Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
            cases = [(name, head + body, False) for name, body in MALFORMED_CHUNKED.items()]
            cases.append(("NoMoreData", head + b"10\r\n{\"a\"", True))  # the client stops mid-chunk
            for name, request, half_close in cases:
                data, status, got_type, body = _raw_http(port, request, half_close=half_close)
                where = f"{method} {path} {name}"
                assert status == 400, (where, body)
                assert got_type == "application/json", where
                assert body["error"]["code"] == "INVALID_INPUT" and body["metadata"]["success"] is False, where
                assert "body" in body["error"]["message"], (where, body)
                assert data.count(b"HTTP/1.1 ") == 1, (where, data)  # one answer, then the connection closed
                assert b"\r\nConnection: close\r\n" in data.partition(b"\r\n\r\n")[0], (where, data)  # and said so
    finally:
        proc.terminate()
        proc.wait(30)

# --- 6. documented caps per string, per record, per response ----------------------------------------

def test_default_caps_refuse_a_huge_title(client, auth):
    headers = auth()
    create_definition(client, headers, "docs", {"type": "object", "properties": {"title": {"type": "string"}}})
    resp = client.post(f"{BASE}/docs/records", json={"fields": {"title": "x" * (2 * 1024 * 1024)}}, headers=headers)
    body = assert_error(resp, 400, "VALIDATION_ERROR")
    assert "at most 1048576 bytes" in str(body["error"]["details"])


def test_string_record_and_response_caps(make_app, auth):
    app = make_app(MAX_STRING_CHARS=1000, ENTITY_MAX_RECORD_BYTES=5000, MAX_RESPONSE_BYTES=20_000)
    client, headers = app.test_client(), auth()
    create_definition(client, headers, "docs", {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "string"}, "d": {"type": "string"},
        "e": {"type": "string"}, "f": {"type": "string"}}})
    resp = client.post(f"{BASE}/docs/records", json={"fields": {"a": "x" * 1001}}, headers=headers)
    body = assert_error(resp, 413, "PAYLOAD_TOO_LARGE")
    assert body["error"]["details"]["field"] == "fields.a"
    big = {key: "y" * 990 for key in "abcdef"}  # each string fits, the record does not
    resp = client.post(f"{BASE}/docs/records", json={"fields": big}, headers=headers)
    assert_error(resp, 400, "VALIDATION_ERROR")
    resp = client.post(f"{BASE}/docs/records/bulk/create", headers=headers,
                       json={"records": [{"fields": {"a": "ok"}}, {"fields": big}]})
    assert assert_error(resp, 400, "VALIDATION_ERROR")["error"]["details"]["indexes"] == [1]
    fitting = {key: "z" * 900 for key in "abcd"}
    for _ in range(8):
        resp = client.post(f"{BASE}/docs/records", json={"fields": fitting}, headers=headers)
        assert resp.status_code == 201, resp.get_json()
    rid = resp.get_json()["id"]
    resp = client.put(f"{BASE}/docs/records/{rid}", json={"fields": {"e": "w" * 900, "f": "w" * 900}},
                      headers=headers)  # the merged record is what counts
    assert_error(resp, 400, "VALIDATION_ERROR")
    resp = client.post(f"{BASE}/docs/records/query", json={"query": {"pageSize": 8}}, headers=headers)
    body = assert_error(resp, 413, "PAYLOAD_TOO_LARGE")
    assert body["error"]["details"]["maxResponseBytes"] == 20_000
    resp = client.post(f"{BASE}/docs/records/query", json={"query": {"pageSize": 2}}, headers=headers)
    assert resp.status_code == 200 and len(resp.get_json()["records"]) == 2


def test_lone_surrogate_after_an_escaped_backslash_is_found(client, auth):
    headers = auth()
    create_definition(client, headers, "notes", {"type": "object", "properties": {"title": {"type": "string"}}})
    # `\\ud83d` is a backslash and the letters "ud83d"; the `\ude00` after it is a lone low surrogate
    resp = _raw(client, "POST", f"{BASE}/notes/records", headers, '{"fields": {"title": "\\\\ud83d\\ude00"}}')
    assert_error(resp, 400, "VALIDATION_ERROR")
    resp = _raw(client, "POST", f"{BASE}/notes/records", headers, '{"fields": {"title": "\\\\ud800"}}')
    assert resp.status_code == 201 and resp.get_json()["fields"]["title"] == "\\ud800"  # just text
