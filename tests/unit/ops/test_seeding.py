"""Seeding logic that needs no database: the 15 artifacts, org ids, request validation."""

from __future__ import annotations

import pytest

from app.errors import ValidationFailed
from app.ops.artifacts import BUILTIN, artifact_id
from app.ops.seeding import flatten_errors, org_id_for, validate_seed_request


def test_fifteen_artifacts_unique_and_agents_name_known_skills():
    ids = [artifact_id(a["kind"], a["name"]) for a in BUILTIN]
    assert len(ids) == 15 == len(set(ids))
    skills = {a["name"] for a in BUILTIN if a["kind"] == "skill"}
    for agent in (a for a in BUILTIN if a["kind"] == "agent"):
        assert {s["skillName"] for s in agent["definition"]["skills"]} <= skills
    order = [a["kind"] for a in BUILTIN]
    assert max(i for i, k in enumerate(order) if k == "skill") < min(i for i, k in enumerate(order) if k == "agent")


def test_org_id_is_the_normalised_domain():
    assert org_id_for(" Acme.COM. ") == "acme.com"


def test_flatten_errors_names_nested_fields():
    assert flatten_errors({"org": {"mainDomain": ["bad"]}, "admin": ["Missing."]}) == {
        "org.mainDomain": ["bad"], "admin": ["Missing."]}


@pytest.mark.parametrize("payload,field", [
    (None, "body"), ([], "body"),
    ({"org": {"title": "t", "mainDomain": "-bad-.com", "product": "default"},
      "admin": {"email": "a@b.com", "firstName": "a", "lastName": "b"}}, "org.mainDomain"),
    ({"org": {"title": "t", "mainDomain": "a.com", "product": "default"},
      "admin": {"email": "a@b.com", "firstName": "a"}}, "admin.lastName"),
])
def test_validation_names_the_field(payload, field):
    with pytest.raises(ValidationFailed) as info:
        validate_seed_request(payload)
    assert field in info.value.details["fields"]
