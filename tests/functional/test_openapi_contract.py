"""Contract test: schemathesis generates requests from our OpenAPI document for every operation.

Checks: no 500 (an unhandled error), and every documented response matches its documented schema.
503/504 are legitimate answers for unconfigured upstreams, so only 500 counts as a server error.
Runs as an admin of a dedicated org, so generated writes stay inside that org.
"""

from __future__ import annotations

import os
import uuid

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.support import bearer, token

# Examples per operation: 25 for a quick local run; CI (.ci/run) raises it (~4 s per example × operation
# count on 2 cores: 150 takes about 10 minutes).
MAX_EXAMPLES = int(os.environ.get("CONTRACT_MAX_EXAMPLES", "25"))
CONTRACT_ORG = f"org-contract-{uuid.uuid4().hex[:12]}"  # fresh per run: generated writes never accumulate


def no_internal_error(ctx, response, case):
    if response.status_code == 500:
        raise AssertionError(f"500 from {case.method} {case.formatted_path}: {response.text[:500]}")


def test_every_operation_conforms_to_the_openapi_document(app):
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    headers = bearer(token(org=CONTRACT_ORG, scopes=["*"], role="admin"))
    failures, seen = [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        seen += 1

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def exercise(case):
            case.call_and_validate(headers=headers, checks=[no_internal_error, response_schema_conformance])

        try:
            exercise()
        except Exception as exc:  # collect every failing operation, then report them all
            failures.append(f"{operation.label}: {str(exc)[:800]}")
    assert seen > 0
    assert failures == [], "\n\n".join(failures)
