"""Strict JSON fields and JSON Schema checks."""

from __future__ import annotations

import pytest
from marshmallow import Schema, ValidationError, fields, validate

from app.fields import (
    QueryInt,
    StrictBool,
    StrictFloat,
    StrictInt,
    check_json_schema,
    check_object_schema,
    schema_errors,
)
from tests.support import marshmallow_load


class Sample(Schema):
    flag = StrictBool()
    number = StrictFloat()
    count = StrictInt()


@pytest.mark.parametrize("field,value", [("flag", "true"), ("flag", 1), ("number", "0.5"), ("number", True),
                                         ("number", None), ("count", 1.5), ("count", "3"), ("count", False),
                                         ("number", float("nan"))])
def test_strict_fields_refuse_other_json_types(field, value):
    with pytest.raises(ValidationError) as info:
        Sample().load({field: value})
    assert field in info.value.messages


def test_strict_fields_accept_their_types():
    assert Sample().load({"flag": False, "number": 1, "count": 3.0}) == {"flag": False, "number": 1.0, "count": 3}


class Bounded(Schema):
    free = StrictInt()
    order = StrictInt(validate=validate.Range(min=0))
    small = StrictInt(validate=validate.Range(min=1, max=48))
    limit = QueryInt(validate=validate.Range(min=1, max=1000))


@pytest.mark.parametrize("field,value", [("free", 2**31), ("free", -(2**31) - 1), ("free", 1e300), ("order", -1),
                                         ("order", 2**31), ("small", 49), ("free", 2.589e-42), ("limit", 5),
                                         ("limit", "1_000"), ("limit", "+5"), ("limit", "5.0"), ("limit", "\u0665")])
def test_integers_outside_32_bits_or_their_range_are_refused(field, value):
    with pytest.raises(ValidationError) as info:
        Bounded().load({field: value})
    assert field in info.value.messages


def test_integers_within_bounds_are_accepted():
    assert Bounded().load({"free": -(2**31), "order": 2**31 - 1, "small": 48.0, "limit": "1000"}) == {
        "free": -(2**31), "order": 2**31 - 1, "small": 48, "limit": 1000}


DRAFT7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
          "properties": {"a": {"type": "string"}}}


@pytest.mark.parametrize("schema", [{}, {"type": "object"}, DRAFT7])
def test_valid_json_schemas(schema):
    check_json_schema(schema)


@pytest.mark.parametrize("schema", [[], "object", {"type": "strin"}, {"required": "a"}, {"minimum": "1"},
                                    {"properties": {"a": {"type": 5}}}])
def test_invalid_json_schemas(schema):
    with pytest.raises(ValidationError):
        check_json_schema(schema)


def test_tool_input_schema_must_describe_an_object():
    check_object_schema({"type": "object", "properties": {}})
    with pytest.raises(ValidationError):
        check_object_schema({"type": "array"})


def test_schema_errors_lists_every_failure_with_its_path():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"format": "email", "type": "string"}},
              "required": ["c"]}
    errors = schema_errors(schema, {"a": "x", "b": "not-an-email"})
    assert len(errors) == 3
    assert any("(at /a)" in e for e in errors) and any("(at /b)" in e for e in errors)
    assert any("'c' is a required property" in e for e in errors)
    assert schema_errors(schema, {"a": 1, "b": "a@b.co", "c": None}) == []


def test_unresolvable_ref_is_a_validation_message_not_a_crash():
    errors = schema_errors({"$ref": "https://example.invalid/schema.json"}, {"a": 1})
    assert len(errors) == 1 and "cannot be applied" in errors[0]


def test_a_nul_anywhere_in_a_body_is_one_validation_error_naming_each_place():
    from app.errors import ValidationFailed
    from app.jsonbody import loads

    with pytest.raises(ValidationFailed) as caught:
        loads('{"a": ["ok", {"b\\u0000": 1}], "c": "x\\u0000", "d": {"e": ["\\u0000"]}}')
    assert caught.value.code == "VALIDATION_ERROR"
    assert caught.value.details == {"fields": {"a[1]": ["a key contains the NUL character (U+0000)"],
                                               "c": ["must not contain the NUL character (U+0000)"],
                                               "d.e[0]": ["must not contain the NUL character (U+0000)"]}}
    # the six characters typed as text are text
    assert loads('{"a": "\\\\u0000", "b\\\\u0000": 1}') == {"a": "\\u0000", "b\\u0000": 1}


def test_a_nul_in_the_url_is_the_same_rule():
    from werkzeug.datastructures import MultiDict

    from app.jsonbody import nul_problem

    assert nul_problem("/api/v1/x", MultiDict([("a", "b"), ("c", "")])) is None
    path = nul_problem("/api/v1/a\x00b", MultiDict())
    assert (path.code, path.details) == ("VALIDATION_ERROR", {"fields": {"path": [
        "must not contain the NUL character (U+0000)"]}, "location": "path"})
    query = nul_problem("/api/v1/x", MultiDict([("a", "ok"), ("a", "b\x00"), ("k\x00", "v")]))
    assert (query.code, query.details["location"], sorted(query.details["fields"])) == (
        "VALIDATION_ERROR", "query", ["a", "k?"])


@pytest.mark.parametrize("raw,stored", [("2026-11-20T08:00:00Z", "2026-11-20T08:00:00Z"),
                                        ("2026-11-20T10:00:00+02:00", "2026-11-20T08:00:00Z"),
                                        ("2026-11-20T08:00:00.123456", "2026-11-20T08:00:00Z"),
                                        ("0381-05-23T03:29:34-16:08", "0381-05-23T19:37:34Z")])
def test_timestamps_are_normalised_to_utc(raw, stored):
    from app.agents.schemas import AgentInputSchema

    assert AgentInputSchema._declared_fields["lastUsedAt"].deserialize(raw) == stored


def test_timestamps_that_leave_the_calendar_are_invalid():
    from app.agents.schemas import AgentInputSchema

    with pytest.raises(ValidationError):
        AgentInputSchema._declared_fields["lastUsedAt"].deserialize("0001-01-01T00:00:00+05:00")


def test_a_fast_lane_is_derived_from_its_schema_so_a_rule_changed_there_changes_it():
    from marshmallow import ValidationError, validates_schema

    from app.fields import FastLane, FastLoad, text

    class Wide(FastLoad):
        name = text(10, min_length=1, required=True)
        size = StrictInt(load_default=5, validate=validate.Range(min=1, max=9))

    class Narrow(Wide):
        name = text(3, min_length=1, required=True)

        @validates_schema
        def _even(self, data, **_):
            if data["size"] % 2:
                raise ValidationError("even sizes only")

    body = {"name": "abcd", "size": 4}
    assert FastLane(Wide()).load(Wide(), body) == Wide().load(body) == body
    assert FastLane(Narrow()).load(Narrow(), body) is None  # the narrower length: declined, the schema reports
    with pytest.raises(ValidationError):
        Narrow().load(body)
    assert FastLane(Narrow()).load(Narrow(), {"name": "abc", "size": 3}) is None  # the schema's own hook ran
    assert FastLane(Wide()).load(Wide(), {"name": "a"}) == {"name": "a", "size": 5}


def test_the_generated_lane_agrees_with_the_schema_on_every_field_kind_it_writes():
    from app.fields import FastLane, FastLoad

    class Inner(FastLoad):
        n = StrictInt(required=True)

    class Kinds(FastLoad):
        exact = fields.String(validate=validate.Length(equal=2))
        open_range = StrictInt(validate=validate.Range(min=0, max=2, min_inclusive=False, max_inclusive=False))
        ratio = fields.Float(validate=validate.Range(max=1))
        raw = fields.Raw(allow_none=True)
        raw_strict = fields.Raw()
        method = fields.Method(deserialize="_twice", allow_none=True)
        keyed = fields.Dict(keys=fields.String(), load_default=dict)
        words = fields.List(fields.String(validate=validate.Length(min=1)), allow_none=True)
        inner = fields.Nested(Inner)
        inners = fields.List(fields.Nested(Inner), validate=validate.Length(max=2))
        flag = fields.Boolean(load_default=False)
        key = fields.String(data_key="the-key", attribute="key_")

        def _twice(self, value):
            return [value, value]

    schema = Kinds()
    lane = FastLane(schema)
    assert "def lane_Kinds(schema, data):" in lane.source and Kinds.fast_lane().source == lane.source
    values = [None, "", "ab", "abc", 0, 0.5, 1, 2, True, [], ["a"], [""], {}, {"a": 1}, {1: 2}, {"n": 3}, {"n": "3"},
              [{"n": 1}], [{"n": 1}] * 3, [{"n": "x"}]]
    names = ["exact", "open_range", "ratio", "raw", "raw_strict", "method", "keyed", "words", "inner", "inners", "flag",
             "the-key", "key_", "unknown"]
    for name in names:
        for value in values:
            body = {name: value}
            expected = marshmallow_load(schema, body)
            got = lane.load(schema, body)
            assert got is None or got == expected, (body, got, expected)
            assert expected != "refused" or got is None, body
    assert lane.load(schema, {"exact": "ab", "open_range": 1, "raw": None, "inners": [{"n": 1}], "the-key": "k"}) == {
        "exact": "ab", "open_range": 1, "raw": None, "inners": [{"n": 1}], "key_": "k", "keyed": {}, "flag": False}


def test_a_query_of_thousands_of_nul_parameters_gets_a_bounded_answer():
    from werkzeug.datastructures import MultiDict

    from app.jsonbody import NUL_QUERY_MAX_NAMED, nul_problem

    problem = nul_problem("/api/v1/agents", MultiDict([(f"a\x00{i}", "v") for i in range(5000)]))
    assert problem.code == "VALIDATION_ERROR" and problem.details["location"] == "query"
    assert len(problem.details["fields"]) == NUL_QUERY_MAX_NAMED
    assert len(problem.message) < 40 * NUL_QUERY_MAX_NAMED
