"""Contract test: schemathesis generates requests from our OpenAPI document for every operation.

Checks: no 500 (an unhandled error), and every documented response matches its documented schema.
503/504 are legitimate answers for unconfigured upstreams, so only 500 counts as a server error.
For the agent registry and the entity store, a request the documented schema allows must also be
accepted (schemathesis' `positive_data_acceptance`): the code is no stricter than the schema says,
except for the rules the document states in prose (`info.description`, field descriptions) because
they depend on data or cannot be written as a schema: references that must exist, fields a definition
does not have, valid JSON Schemas, `config` against `configSchema`, a skillId at most once per agent.
Generated text holds no NUL characters or lone surrogates (also a rule of `info.description`).
Runs as an admin of a dedicated org, so generated writes stay inside that org.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance, response_schema_conformance
from sqlalchemy import bindparam
from sqlalchemy.dialects.postgresql import JSONB

from tests.support import bearer, token

# Examples per operation: 25 for a quick local run; CI (.ci/run) raises it (150: about 2.5 minutes of CPU,
# split over SHARDS tests; at 150 the last examples still find response classes the first 100 do not).
MAX_EXAMPLES = int(os.environ.get("CONTRACT_MAX_EXAMPLES", "25"))
# CONTRACT_CHECKS=all: what `schemathesis run --checks all` runs — every registered check (status codes,
# content types, headers, negative data rejected, missing headers, unsupported methods, ignored auth…)
# and negative as well as positive examples. Off by default: a review tool (its findings are listed in
# docs/decisions.md), not every CI run.
ALL_CHECKS = os.environ.get("CONTRACT_CHECKS", "") == "all"
# The operations are split over this many tests (the parallel suite runs them on several workers).
SHARDS = 4
CONTRACT_ORG = f"org-contract-{uuid.uuid4().hex[:12]}"  # fresh per run: generated writes never accumulate
ACCEPTANCE_CHECKED = ("/api/v1/agents", "/api/v1/skills", "/api/v1/tool-definitions", "/api/v1/subagents",
                      "/api/v1/widgets", "/api/v1/entities", "/api/v1/admin/entities")
# 400 messages of the rules stated in prose: data-dependent references and field names, JSON Schema
# validity, uniqueness by key (a skillId once per agent, a record id once per bulk update, an aggregate
# alias once per request), the aggregate rules that depend on the definition's field types or on the
# request's own aliases (sortBy/having name an alias; a function's field type; percentile), a cursor that
# must be a `nextCursor` this API issued, a byte limit of a JSON field (stated as `x-maxBytes`)
PROSE_RULES = re.compile(r"Unknown sub-agent id|unknown field|record not found|Not a valid JSON Schema|"
                         r"is not valid under any of the given schemas|unknown time zone|lookup|unknown view|"
                         r"attached twice|appears more than once in this batch|bytes as JSON \(|is used twice|"
                         r"unknown alias|cannot group by|needs a (field|numeric|number|single-valued|datetime)|"
                         r"bucket suffix needs|percentile function|takes a percentile")
PROSE_PATHS = re.compile(r"\.(config|defaultConfig)$|\.(fields|schema)(\.|$)|\.cursor$")


def no_internal_error(ctx, response, case):
    if response.status_code == 500:
        raise AssertionError(f"500 from {case.method} {case.formatted_path}: {response.text[:500]}")


def _reasons(value, path=""):
    """(field path, message) of every message in `details.fields` (or a bulk request's `details.records`)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _reasons(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from _reasons(item, path)
    elif isinstance(value, str):
        yield path, value


def _prose_rule(response) -> bool:
    """A 400 whose every reason is one of the rules stated in prose: a message above, a `config` (or
    `defaultConfig`) that does not validate against its `configSchema`, record `fields` that do not
    validate against the definition's schema, or a definition `schema` that is no valid JSON Schema."""
    if response.status_code != 400:
        return False
    error = (response.json() or {}).get("error") or {}
    details = error.get("details") or {}
    reasons = list(_reasons(details.get("fields") or details.get("records"))) or [("", error.get("message", ""))]
    return all(PROSE_RULES.search(message) or PROSE_PATHS.search(path) for path, message in reasons)


def _key_state(response) -> bool:
    """A refusal that depends on an earlier request, not on this one's data: its Idempotency-Key (generated,
    so repeated across examples) was used for another request, or that request is still running."""
    if response.status_code not in (409, 422):
        return False
    code = ((response.json() or {}).get("error") or {}).get("code")
    return code in ("IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_KEY_IN_USE", "IDEMPOTENCY_ANSWER_NOT_STORED")


def _stale_precondition(response) -> bool:
    """A refusal that depends on the stored resource, not on the request's data: its generated `If-Match`
    names another version than the stored one (a named skill or widget exists, so its tag is checked)."""
    if response.status_code != 412:
        return False
    return ((response.json() or {}).get("error") or {}).get("code") == "PRECONDITION_FAILED"


def schema_valid_requests_are_accepted(ctx, response, case):
    if not case.operation.path.startswith(ACCEPTANCE_CHECKED) or case.operation.path == "/api/v1/agents/images":
        return None
    if _prose_rule(response) or response.status_code == 429:  # a rate limit may refuse any valid request
        return None
    if _key_state(response) or _stale_precondition(response):
        return None
    return positive_data_acceptance(ctx, response, case)


@pytest.fixture()
def platform_registry_restored(app):
    """The test runs as an admin, so generated bodies may publish platform artifacts (and start their
    rollouts) for every org of the test database. Put the registry back afterwards: later tests (seeding
    provisions exactly the built-in artifacts) must not see what schemathesis published."""
    from sqlalchemy import text

    from app.db import db

    with app.app_context():
        with db.engine.begin() as conn:
            before = [dict(row) for row in conn.execute(text("SELECT * FROM platform.artifacts")).mappings()]
            started = conn.scalar(text("SELECT clock_timestamp()"))
    yield
    with app.app_context():
        with db.engine.begin() as conn:
            rollouts = "SELECT id FROM platform.rollouts WHERE created_at >= :t"
            conn.execute(text(f"DELETE FROM platform.rollout_outcomes WHERE rollout_id IN ({rollouts})"),
                         {"t": started})
            conn.execute(text(rollouts.replace("SELECT id", "DELETE")), {"t": started})
            conn.execute(text("DELETE FROM platform.org_artifacts WHERE NOT (artifact_id = ANY(:ids))"),
                         {"ids": [row["id"] for row in before]})
            conn.execute(text("DELETE FROM platform.artifacts"))
            for row in before:
                columns = ", ".join(row)
                values = ", ".join(f":{name}" for name in row)
                conn.execute(text(f"INSERT INTO platform.artifacts ({columns}) VALUES ({values})").bindparams(
                    *[bindparam(name, type_=JSONB) for name in row if name == "payload"]), row)


def _all_checks() -> list:
    """Every function check schemathesis registers, ours in place of its acceptance and 500 checks."""
    from schemathesis.checks import CHECKS as REGISTERED
    from schemathesis.checks import is_check_class, load_all_checks

    load_all_checks()
    ours = {"not_a_server_error", "response_schema_conformance", "positive_data_acceptance"}
    return [check for check in REGISTERED.get_all() if not is_check_class(check) and check.__name__ not in ours]


CHECKS = [no_internal_error, response_schema_conformance, schema_valid_requests_are_accepted,
          *(_all_checks() if ALL_CHECKS else [])]


def _strategy(operation, headers: dict):
    if not ALL_CHECKS:
        return operation.as_strategy()
    from schemathesis import GenerationMode

    # the token is fixed in the strategy too: a negative case that "drops Authorization" would otherwise
    # be sent with it all the same (call_and_validate's headers) and judged as invalid data accepted
    return (operation.as_strategy(headers=headers)
            | operation.as_strategy(generation_mode=GenerationMode.NEGATIVE, headers=headers))


def _routed_elsewhere(app, case) -> bool:
    """Whether the case's path reaches another route than its operation's template does."""
    adapter = app.url_map.bind("localhost")
    try:
        reached, _ = adapter.match(case.formatted_path, method=case.method)
        own, _ = adapter.match(re.sub(r"\{[^}/]+\}", "contract-probe", case.path), method=case.method)
    except Exception:  # 404/405/redirects: the operation's own answer to judge
        return False
    return reached != own


@pytest.mark.parametrize("shard", range(SHARDS))  # each its own unit of the parallel suite (tests/conftest.py)
def test_every_operation_conforms_to_the_openapi_document(app, platform_registry_restored, shard):
    """Every operation, in SHARDS tests (the i-th operation in shard i % SHARDS), so that the parallel
    suite runs them side by side; each operation's examples are those of a run in one test (derandomize:
    Hypothesis seeds from the test function, not from its neighbours)."""
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    schema.config.generation.update(allow_x00=False, codec="utf-8")
    headers = bearer(token(org=CONTRACT_ORG, scopes=["*"], role="admin"))
    failures, seen = [], 0
    for index, result in enumerate(schema.get_all_operations()):
        if index % SHARDS != shard:
            continue
        operation = result.ok()
        seen += 1

        @given(case=_strategy(operation, headers))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def exercise(case):
            # a path value that spells a sibling route (`/agents/summary` for `/agents/{agentId}`) is that
            # route's request, judged by its own operation: not a case of this one
            assume(not _routed_elsewhere(app, case))
            case.call_and_validate(headers=headers, checks=CHECKS)

        try:
            exercise()
        except (Exception, BaseExceptionGroup) as exc:  # collect every failing operation, then report them all
            # (schemathesis raises a FailureGroup, a BaseExceptionGroup, when a case fails several checks)
            failures.append(f"{operation.label}: {str(exc)[:2000 if ALL_CHECKS else 800]}")
    assert seen > 0
    assert failures == [], "\n\n".join(failures)
