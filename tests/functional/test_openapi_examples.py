"""The OpenAPI document is something a newcomer can run from.

- Every operation is sent the way Swagger UI's "Try it out" sends it: the documented request body example
  (or, where there is none, the body Swagger UI generates from the schema: "string", 0, true, …), the
  documented example (else default) of each query and path parameter. Each answers the status the document
  gives its example: the operation's success status, or the one its description names for an example that
  is refused on purpose (publishing an artifact: see ADMIN_EXAMPLE_REFUSED).
- Path parameters that are ids the server makes (an agent id, a record id…) cannot be documented as values;
  they are filled in from the answers of the earlier examples, as a reader would paste them, and so are the
  ids in a few bodies (the record a relationship points to…): RUN lists every operation in the order a
  reader would try them, and what each answer provides to the later ones.
- No example of an admin or internal operation changes platform-wide state: the registry of platform
  artifacts and the rollouts are the same after every example has run.
- Every operation has a description (what it does, its notable errors, an example); tags share one style.
"""

from __future__ import annotations

import copy
import re
import uuid
from urllib.parse import quote

import pytest
from sqlalchemy import text

from app.db import db
from tests.functional.test_images_api import Fakes
from tests.images_fakes import FakeAzureImages
from tests.support import bearer, token

# The answer the document gives to the example of POST /api/v1/admin/artifacts: as is, it republishes a
# built-in artifact at a version it already has, which is refused (409) and changes nothing; its description
# says so and how to publish for real.
ADMIN_EXAMPLE_REFUSED = {"POST /api/v1/admin/artifacts": 409}

# Every operation, in the order a reader tries them: (operation, provides, body patch, setup).
# `provides`: name → function of the answer's JSON, for the path parameters (and body ids) of later operations.
# `patch`: body field path → name of a provided value (ids the reader pastes into the example).
RUN: list[tuple[str, dict, dict]] = [
    ("GET /health", {}, {}),
    ("GET /api/v1/me", {}, {}),
    ("POST /internal/seed", {}, {}),
    ("GET /internal/seed/{orgId}", {}, {}),
    ("GET /api/v1/admin/artifacts", {}, {}),
    ("POST /api/v1/admin/artifacts", {}, {}),
    ("GET /api/v1/admin/artifacts/rollouts", {}, {}),
    ("GET /api/v1/admin/artifacts/rollouts/{rolloutId}", {}, {}),
    ("POST /api/v1/admin/artifacts/rollouts/{rolloutId}/resume", {}, {}),
    # entity store
    ("POST /api/v1/entities/definitions", {}, {}),
    ("GET /api/v1/entities/definitions", {}, {}),
    ("GET /api/v1/entities/definitions/{entityName}", {}, {}),
    ("PUT /api/v1/entities/definitions/{entityName}", {}, {}),
    ("POST /api/v1/entities/definitions/{entityName}/views", {"viewId": lambda b: b["id"]}, {}),
    ("GET /api/v1/entities/definitions/{entityName}/views", {}, {}),
    ("PUT /api/v1/entities/definitions/{entityName}/views/{viewId}", {}, {}),
    ("POST /api/v1/entities/{entityName}/records", {"recordId": lambda b: b["id"]}, {}),
    ("POST /api/v1/entities/{entityName}/records", {"otherRecordId": lambda b: b["id"]}, {}),
    ("GET /api/v1/entities/{entityName}/records/{recordId}", {}, {}),
    ("PUT /api/v1/entities/{entityName}/records/{recordId}", {}, {}),
    ("POST /api/v1/entities/{entityName}/records/query", {}, {}),
    ("POST /api/v1/entities/{entityName}/records/count", {}, {}),
    ("POST /api/v1/entities/{entityName}/records/aggregate", {}, {}),
    ("POST /api/v1/entities/{entityName}/records/bulk/create", {}, {}),
    ("POST /api/v1/entities/{entityName}/records/bulk/update", {}, {"records.0.id": "recordId"}),
    ("POST /api/v1/entities/{entityName}/records/{recordId}/relationships", {"relationshipId": lambda b: b["id"]},
     {"toRecordId": "otherRecordId"}),
    ("GET /api/v1/entities/{entityName}/records/{recordId}/relationships", {}, {}),
    ("DELETE /api/v1/entities/{entityName}/records/{recordId}/relationships/{relationshipId}", {}, {}),
    ("POST /api/v1/entities/{entityName}/records/bulk/delete", {}, {"recordIds.0": "otherRecordId"}),
    ("GET /api/v1/jobs/{jobId}", {}, {}),
    ("DELETE /api/v1/entities/{entityName}/records/{recordId}", {}, {}),
    ("POST /api/v1/admin/entities/update", {}, {}),
    ("DELETE /api/v1/entities/definitions/{entityName}/views/{viewId}", {}, {}),
    ("DELETE /api/v1/entities/definitions/{entityName}", {}, {}),
    # agent registry
    ("POST /api/v1/tool-definitions", {"toolDefId": lambda b: b["toolDefinition"]["id"]}, {}),
    ("GET /api/v1/tool-definitions", {}, {}),
    ("POST /api/v1/tool-definitions/by-ids", {}, {}),
    ("GET /api/v1/tool-definitions/{toolDefId}", {}, {}),
    ("PUT /api/v1/tool-definitions/{toolDefId}", {}, {}),
    ("POST /api/v1/skills", {"skillId": lambda b: b["skill"]["id"]}, {}),
    ("GET /api/v1/skills", {}, {}),
    ("GET /api/v1/skills/categories", {}, {}),
    ("GET /api/v1/skills/by-name", {}, {}),
    ("PUT /api/v1/skills/by-name", {}, {}),
    ("GET /api/v1/skills/{skillId}", {}, {}),
    ("POST /api/v1/subagents", {"subAgentId": lambda b: b["subAgent"]["id"]}, {}),
    ("GET /api/v1/subagents", {}, {}),
    ("GET /api/v1/subagents/{subAgentId}", {}, {}),
    ("PUT /api/v1/subagents/{subAgentId}", {}, {}),
    ("POST /api/v1/agents", {"agentId": lambda b: b["agent"]["id"]}, {}),
    ("GET /api/v1/agents", {}, {}),
    ("GET /api/v1/agents/summary", {}, {}),
    ("GET /api/v1/agents/default", {}, {}),
    ("GET /api/v1/agents/by-name", {}, {}),
    ("GET /api/v1/agents/{agentId}", {}, {}),
    ("PUT /api/v1/agents/{agentId}", {}, {}),
    ("GET /api/v1/agents/{agentId}/export", {}, {}),
    ("POST /api/v1/agents/import", {}, {}),
    ("POST /api/v1/agents/{agentId}/widgets", {"widgetId": lambda b: b["widget"]["id"]}, {}),
    ("GET /api/v1/agents/{agentId}/widgets", {}, {}),
    ("GET /api/v1/widgets/{widgetId}", {}, {}),
    ("PUT /api/v1/widgets/{widgetId}", {}, {}),
    ("POST /api/v1/widgets/{widgetId}/default", {}, {"agentId": "agentId"}),
    ("GET /api/v1/agents/{agentId}/widgets/default", {}, {}),
    ("DELETE /api/v1/widgets/{widgetId}", {}, {}),
    ("DELETE /api/v1/subagents/{subAgentId}", {}, {}),
    ("DELETE /api/v1/agents/{agentId}", {}, {}),
    ("DELETE /api/v1/skills/by-name", {}, {}),
    ("DELETE /api/v1/tool-definitions/{toolDefId}", {}, {}),
    ("POST /api/v1/agents/images", {}, {}),
    # email and newsletter
    ("POST /api/v1/email/send", {}, {}),
    ("POST /api/v1/email/bulk-send", {"bulkJobId": lambda b: b["jobId"]}, {}),
    ("GET /api/v1/email/bulk-send/{jobId}", {}, {}),
    ("GET /api/v1/email/bulk-send/{jobId}/recipients", {}, {}),
    ("POST /api/v1/newsletter/subscribers", {"subscriberId": lambda b: b["subscriber"]["id"]}, {}),
    ("GET /api/v1/newsletter/subscribers", {}, {}),
    ("GET /api/v1/newsletter/unsubscribe", {}, {}),
    ("POST /api/v1/newsletter/issues", {}, {}),
    ("GET /api/v1/newsletter/issues", {}, {}),
    ("POST /api/v1/newsletter/unsubscribe", {}, {}),
    ("DELETE /api/v1/newsletter/subscribers/{subscriber}", {}, {}),
    # analytics
    ("POST /api/v1/analytics/events", {}, {}),
    ("POST /api/v1/analytics/events/batch", {}, {}),
    ("GET /api/v1/analytics/events", {}, {}),
    ("GET /api/v1/analytics/summary", {}, {}),
    ("GET /api/v1/analytics/chats", {}, {}),
    ("GET /api/v1/analytics/agents", {}, {}),
    ("GET /api/v1/analytics/usage", {}, {}),
    ("GET /api/v1/analytics/daily", {}, {}),
    ("GET /api/v1/analytics/series", {}, {}),
    ("GET /api/v1/analytics/channels", {}, {}),
    ("GET /api/v1/analytics/global/summary", {}, {}),
    ("GET /api/v1/analytics/global/orgs", {}, {}),
    ("GET /api/v1/analytics/global/series", {}, {}),
    ("GET /api/v1/analytics/global/channels", {}, {}),
    ("GET /api/v1/analytics/global/channels/{channel}/daily", {}, {}),
    ("GET /api/v1/analytics/global/channels/{channel}/orgs", {}, {}),
]
# the path parameters whose value an operation's path names under another name
PATH_ALIASES = {"GET /api/v1/email/bulk-send/{jobId}": {"jobId": "bulkJobId"},
                "GET /api/v1/email/bulk-send/{jobId}/recipients": {"jobId": "bulkJobId"},
                "GET /api/v1/jobs/{jobId}": {"jobId": "entityJobId"}}
METHODS = ("get", "put", "post", "delete", "patch")
# sentence case: a capital first letter, the other words lower case ("Entity store", "Tool definitions", "Sub-agents")
TAG_STYLE = re.compile(r"^[A-Z][a-z]+(-[a-z]+)*( [a-z]+(-[a-z]+)*)*$")


def _operations(doc):
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                yield f"{method.upper()} {path}", path, method, item[method], item.get("parameters", [])


def _resolve(schema, doc):
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def swagger_sample(schema, doc, depth=0):
    """The body Swagger UI's "Try it out" shows for a schema without a media-type example (its
    sampleFromSchema, simplified): the schema's example, else a property's example, default or first
    enum value, else "string", 0 (clamped to minimum/maximum), true, one-item arrays, every property."""
    schema = _resolve(schema, doc)
    if "example" in schema:
        return copy.deepcopy(schema["example"])
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("allOf", "anyOf", "oneOf"):
        if schema.get(key):
            merged = {}
            for part in (schema[key] if key == "allOf" else schema[key][:1]):
                merged.update(_resolve(part, doc))
            return swagger_sample({**{k: v for k, v in schema.items() if k != key}, **merged}, doc, depth)
    kind = schema.get("type") or ("object" if "properties" in schema else None)
    if kind == "object" or kind is None:
        if depth > 6:
            return {}
        props = schema.get("properties") or {}
        body = {name: swagger_sample(sub, doc, depth + 1) for name, sub in props.items()
                if not _resolve(sub, doc).get("readOnly")}
        extra = schema.get("additionalProperties")
        if not props and extra not in (None, False):
            body = {"additionalProp1": swagger_sample(extra, doc, depth + 1) if isinstance(extra, dict) else {}}
        return body
    if kind == "array":
        return [swagger_sample(schema.get("items") or {}, doc, depth + 1)] * max(1, schema.get("minItems", 1))
    if kind in ("integer", "number"):
        value = 0
        if "minimum" in schema:
            value = max(value, schema["minimum"])
        if "maximum" in schema:
            value = min(value, schema["maximum"])
        return value
    if kind == "boolean":
        return True
    return {"date-time": "2026-11-27T08:00:00.000Z", "date": "2026-11-27", "email": "user@example.com",
            "uuid": "3fa85f64-5717-4562-b3fc-2c963f66afa6", "uri": "https://example.com/"}.get(
        schema.get("format"), "string")


def documented_body(op, doc):
    """The body Swagger UI sends: the media type's example (or its first named example), else a sample."""
    content = (op.get("requestBody") or {}).get("content", {}).get("application/json")
    if content is None:
        return None
    if "example" in content:
        return copy.deepcopy(content["example"])
    if content.get("examples"):
        return copy.deepcopy(next(iter(content["examples"].values()))["value"])
    return swagger_sample(content["schema"], doc)


def _prefill(param):
    """Swagger UI's initial value of a parameter in "Try it out": example, schema example, schema default."""
    schema = param.get("schema") or {}
    for value in (param.get("example"), schema.get("example"), schema.get("default")):
        if value is not None:
            return value
    return None


def _as_query(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _patch(body, dotted: str, value):
    *parents, last = dotted.split(".")
    node = body
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def success_statuses(op) -> set[int]:
    """The 2xx statuses the operation documents (several for some: 200 or 201 for an idempotent create…)."""
    return {int(code) for code in op["responses"] if code.isdigit() and 200 <= int(code) < 300}


@pytest.fixture(scope="module")
def doc(app):
    return app.test_client().get("/api/v1/openapi.json").get_json()


@pytest.fixture(scope="module")
def images_app(make_app_module):
    """The app, with provider-a pointed at a fake upstream (the image example must reach a provider)."""
    fakes = Fakes()
    yield make_app_module(PROVIDER_A_ENDPOINT=fakes.a.url, PROVIDER_A_API_KEY=FakeAzureImages.API_KEY,
                          PROVIDER_A_API_VERSION=FakeAzureImages.GENERATION_VERSION,
                          PROVIDER_A_EDIT_API_VERSION=FakeAzureImages.EDIT_VERSION)
    fakes.a.close()
    fakes.b.close()
    fakes.tls.close()


@pytest.fixture(scope="module")
def make_app_module(app, database_url):
    from app import create_app
    from app.extensions import celery_app
    from app.tasks import init_celery
    from tests.conftest import app_config, dispose_database
    from tests.functional.conftest import INTERNAL

    made = []

    def factory(**overrides):
        made.append(create_app(app_config(database_url, INTERNAL_API_TOKEN=INTERNAL, **overrides)))
        return made[-1]

    yield factory
    init_celery(celery_app, app)
    for built in made:
        dispose_database(built)


def _platform_state(app):
    """The platform-wide state an admin example could change: the artifact registry and the rollouts."""
    with app.app_context():
        with db.engine.connect() as conn:
            artifacts = conn.execute(text("SELECT id, artifact_version, payload::text FROM platform.artifacts "
                                          "ORDER BY id")).all()
            rollouts = conn.execute(text("SELECT id, status, counts::text FROM platform.rollouts ORDER BY id")).all()
    return artifacts, rollouts


def _finished_rollout(app) -> str:
    """A finished rollout of a built-in artifact at its current version (what GET and resume of a rollout
    are shown on): resuming a finished rollout changes nothing."""
    from app.ops.artifacts import BUILTIN, artifact_id

    rollout_id, artifact = uuid.uuid4().hex, BUILTIN[0]
    with app.app_context():
        with db.engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO platform.rollouts (id, artifact_id, kind, name, artifact_version, status, total, "
                "counts, created_at, updated_at, finished_at, cursor_org, cursor_product) VALUES "
                "(:id, :a, :k, :n, :v, 'done', 0, '{}'::jsonb, now(), now(), now(), '', '')"),
                {"id": rollout_id, "a": artifact_id(artifact["kind"], artifact["name"]), "k": artifact["kind"],
                 "n": artifact["name"], "v": artifact["artifactVersion"]})
    return rollout_id


def _entity_job(client, headers, entity: str) -> str:
    """An asynchronous entity job (a bulk create sent with `Prefer: respond-async`)."""
    resp = client.post(f"/api/v1/entities/{entity}/records/bulk/create", headers={**headers,
                       "Prefer": "respond-async"}, json={"records": [{"fields": {}}]})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["jobId"]


def test_the_run_lists_every_documented_operation_once(doc):
    documented = sorted(key for key, *_ in _operations(doc))
    listed = sorted({key for key, *_ in RUN})
    assert listed == documented


def test_every_documented_example_answers_its_documented_status(images_app, doc):
    """Each operation sent as Swagger UI sends it (see the module docstring), in the order of RUN, by an
    admin of a fresh organization; the platform registry and rollouts are unchanged afterwards."""
    app = images_app
    client = app.test_client()
    org = f"org-examples-{uuid.uuid4().hex[:10]}"
    headers = bearer(token(org=org, scopes=["*"], role="admin", email="ada@example.com"))
    operations = {key: (path, method, op, shared) for key, path, method, op, shared in _operations(doc)}
    world: dict[str, str] = {"rolloutId": _finished_rollout(app)}
    assert client.get("/api/v1/admin/artifacts", headers=headers).status_code == 200  # the built-ins' rows exist
    before = _platform_state(app)
    failures = []
    for key, provides, patch in RUN:
        path, method, op, shared = operations[key]
        params = {p["name"]: p for p in [*shared, *op.get("parameters", [])]}
        if key == "GET /api/v1/jobs/{jobId}" and "entityName" in world:
            world["entityJobId"] = _entity_job(client, headers, world["entityName"])
        if key in ("GET /api/v1/newsletter/unsubscribe", "POST /api/v1/newsletter/unsubscribe") \
                and "subscriberId" in world:
            from app.email.newsletter import unsubscribe_token

            with app.app_context():
                world["token"] = unsubscribe_token(app.config["DEFAULT_PRODUCT"], org, world["subscriberId"])
        url = path
        query = {}
        missing = []
        for name, param in params.items():
            value = _prefill(param)
            alias = PATH_ALIASES.get(key, {}).get(name, name)
            if param["in"] == "path":
                value = world.get(alias, value)
                if value is None:
                    missing.append(name)
                    continue
                url = url.replace("{" + name + "}", quote(str(value), safe=""))
                if name == "entityName":
                    world["entityName"] = value
            elif param["in"] == "query":
                if name in world and name == "token":
                    value = world[name]
                if value is not None:
                    query[name] = _as_query(value)
        if missing:
            failures.append(f"{key}: no value for path parameters {missing}")
            continue
        body = documented_body(op, doc)
        for field, source in patch.items():
            _patch(body, field, world[source])
        kwargs = {"json": body} if body is not None else {}
        if key == "POST /api/v1/newsletter/unsubscribe":
            kwargs = {"data": {"List-Unsubscribe": "One-Click"}}
        resp = client.open(url, method=method.upper(), query_string=query, headers=headers, **kwargs)
        expected = {ADMIN_EXAMPLE_REFUSED[key]} if key in ADMIN_EXAMPLE_REFUSED else success_statuses(op)
        if resp.status_code not in expected or not all(str(code) in op["responses"] for code in expected):
            failures.append(f"{key}: {resp.status_code} (documented {expected}) for {body!r:.300}: "
                            f"{resp.get_data(as_text=True)[:400]}")
            continue
        answer = resp.get_json(silent=True)
        for name, pick in provides.items():
            try:
                world[name] = pick(answer)
            except (KeyError, TypeError, IndexError):
                failures.append(f"{key}: the answer has no {name}: {answer!r:.300}")
    assert failures == [], "\n".join(failures)
    assert _platform_state(app) == before


def test_request_examples_are_documented_for_every_operation_with_a_body(doc):
    """Swagger UI shows the documented example, never a body generated from the schema ("string", 0…)."""
    missing = [key for key, _, _, op, _ in _operations(doc)
               if (op.get("requestBody") or {}).get("content", {}).get("application/json") is not None
               and "example" not in op["requestBody"]["content"]["application/json"]]
    assert missing == []


def test_every_operation_has_a_description_with_its_errors_and_an_example(doc):
    lacking = []
    for key, _, _, op, _ in _operations(doc):
        description = op.get("description") or ""
        if not op.get("summary") or len(description) < 40 or "Example" not in description:
            lacking.append(key)
    assert lacking == []


def test_tags_share_one_style_and_every_tag_is_described(doc):
    tags = {tag["name"]: tag.get("description") for tag in doc["tags"]}
    assert [name for name in tags if not TAG_STYLE.match(name)] == []
    assert [name for name, description in tags.items() if not description] == []
    used = {tag for _, _, _, op, _ in _operations(doc) for tag in op["tags"]}
    assert used == set(tags)


OUTSIDE = re.compile(r"DESIGN|§|shared/|security\.md|providers\.md|style\.md|the spec\b|spec's", re.I)


def test_the_document_cites_no_document_outside_the_repository(doc):
    import json

    found = sorted(set(OUTSIDE.findall(json.dumps(doc))))
    assert found == []
