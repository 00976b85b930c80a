"""ExactDumpSchema: its shortcut answers exactly what marshmallow's own dump answers. Our Blueprint's
argument parser."""

from __future__ import annotations

import json

from flask_smorest.arguments import ArgumentsMixin
from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import Schema, post_dump
from marshmallow import fields as ma

from app.entities.schemas import PaginatedResultSchema, RecordSchema
from app.extensions import Blueprint, ExactDumpSchema, SafeParser

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-2, 2), st.text(max_size=3))
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                       max_leaves=6)
RECORD_KEYS = ["id", "entityId", "name", "fields", "tags", "metadata", "createdAt", "updatedAt", "createdBy",
               "updatedBy", "isActive", "version", "distance", "lookups", "unknownKey"]


def _typical_record(draw) -> dict:
    return {"id": draw(st.text(max_size=4)), "entityId": "e1", "name": draw(st.one_of(st.none(), st.text(max_size=3))),
            "fields": draw(st.dictionaries(st.text(max_size=3), JSONISH, max_size=3)),
            "tags": draw(st.lists(st.text(max_size=3), max_size=2)),
            "metadata": draw(st.one_of(st.none(), st.just({}))),
            "createdAt": "2026-01-01T00:00:00.000Z", "updatedAt": "2026-01-01T00:00:00.000Z",
            "createdBy": "u", "updatedBy": None, "isActive": True, "version": draw(st.integers(1, 9))}


@st.composite
def records(draw) -> dict:
    """Mostly wire-shaped records; some with a value of another type or an extra key."""
    record = _typical_record(draw)
    for key in draw(st.lists(st.sampled_from(RECORD_KEYS), max_size=2)):
        record[key] = draw(JSONISH)
    for key in draw(st.lists(st.sampled_from(RECORD_KEYS), max_size=1)):
        record.pop(key, None)
    return record


@st.composite
def pages(draw) -> dict:
    page = {"records": draw(st.lists(records(), max_size=3)), "totalCount": draw(st.integers(0, 9)),
            "currentPage": 1, "pageSize": 20, "totalPages": 1, "hasNextPage": False, "hasPreviousPage": False,
            "nextCursor": draw(st.one_of(st.none(), st.text(max_size=3)))}
    for key in draw(st.lists(st.sampled_from([*page, "other"]), max_size=1)):
        page[key] = draw(JSONISH)
    return page


def _marshmallow(schema: Schema, obj) -> str:
    return json.dumps(Schema.dump(schema, obj), sort_keys=True)


def _dumped(schema: Schema, obj) -> str:
    return json.dumps(schema.dump(obj), sort_keys=True)


def _comparable(schema: Schema, obj):
    """Both dumps, or None when marshmallow itself cannot dump the object (nothing to compare)."""
    try:
        expected = _marshmallow(schema, obj)
    except (TypeError, ValueError, AttributeError):
        return None
    return expected, _dumped(schema, obj)


@settings(max_examples=400, deadline=None)
@given(records())
def test_record_dump_equals_marshmallow(record):
    both = _comparable(RecordSchema(), record)
    if both is not None:
        assert both[1] == both[0]


@settings(max_examples=300, deadline=None)
@given(pages())
def test_page_dump_equals_marshmallow(page):
    both = _comparable(PaginatedResultSchema(), page)
    if both is not None:
        assert both[1] == both[0]


def test_wire_shaped_objects_are_returned_unchanged_and_others_are_dumped():
    record = {"id": "r", "entityId": "e", "name": "n", "fields": {"a": [1, {"b": None}]}, "tags": ["x"],
              "metadata": None, "createdAt": "t", "updatedAt": "t", "createdBy": "u", "updatedBy": None,
              "isActive": True, "version": 2}
    page = {"records": [record], "totalCount": 1, "currentPage": 1, "pageSize": 20, "totalPages": 1,
            "hasNextPage": False, "hasPreviousPage": False, "nextCursor": None}
    assert RecordSchema().dump(record) is record
    assert PaginatedResultSchema().dump(page) is page
    converted = RecordSchema().dump(dict(record, version=True, tags=[1], extra="dropped"))
    assert converted["version"] == 1 and converted["tags"] == ["1"] and "extra" not in converted
    assert PaginatedResultSchema().dump(dict(page, totalCount="3"))["totalCount"] == 3


def test_schemas_with_dump_hooks_or_unknown_field_kinds_always_dump():
    class Hooked(ExactDumpSchema):
        name = ma.String()

        @post_dump
        def shout(self, data, **kwargs):
            return {"name": data["name"].upper()}

    class Dated(ExactDumpSchema):
        when = ma.DateTime()

    assert Hooked().dump({"name": "a"}) == {"name": "A"}
    assert Hooked(only=("name",))._exact_checks() is None
    assert Dated()._exact_checks() is None
    assert RecordSchema(only=("id",)).dump({"id": "r", "name": "n"}) == {"id": "r"}


def test_the_safe_parser_is_our_blueprints_not_a_patch_of_flask_smorest():
    """Importing app.extensions changes nothing of flask-smorest's: only our Blueprint parses with
    SafeParser (400, app.jsonbody)."""
    assert isinstance(Blueprint.ARGUMENTS_PARSER, SafeParser)
    assert not isinstance(ArgumentsMixin.ARGUMENTS_PARSER, SafeParser)
    assert Blueprint("probe", __name__).ARGUMENTS_PARSER.DEFAULT_VALIDATION_STATUS == 400


def test_a_response_wrapper_answers_what_flask_smorests_answers():
    """Blueprint.response's wrapper (the app and `g` read from their context variables): the same status,
    headers, body and `g._flask_smorest["result_dump"]` as flask-smorest's own wrapper, and the same
    document, for each kind of view return."""
    from flask import Flask, g
    from flask_smorest import Blueprint as SmorestBlueprint
    from werkzeug import Response

    class Item(Schema):
        name = ma.String()
        count = ma.Integer()

    returns = [
        {"name": "a", "count": 1, "dropped": True},
        ({"name": "b"}, 201),
        ({"name": "c"}, {"X-One": "1"}),
        ({"name": "d"}, "202 Accepted", [("X-Two", "2")]),
        "response",  # a werkzeug Response (a fresh one per view: its headers are extended)
    ]
    app = Flask(__name__)
    answers = {}
    for cls in (SmorestBlueprint, Blueprint):
        blp = cls(f"probe_{cls.__module__.split('.')[0]}", __name__)
        for schema in (Item, None):
            for n, value in enumerate(returns):
                def returned(value=value):
                    return (Response("raw", status=203), 206, {"X-Three": "3"}) if value == "response" else value

                view = blp.response(200, schema, description="d")(returned)
                with app.test_request_context("/"):
                    resp = app.make_response(view())
                    dumped = g.get("_flask_smorest", {}).get("result_dump", "absent")
                answers.setdefault((schema, n), []).append(
                    (resp.status, sorted(resp.headers.items()), resp.get_data(), dumped, repr(view._apidoc)))
    for key, (theirs, ours) in answers.items():
        assert ours == theirs, key


def test_arguments_parse_and_document_as_flask_smorests_arguments():
    """Blueprint.arguments (its innermost wrapper reads the app from the context variable): stacked query
    and body arguments give the view the same values, the same 400 for an unknown parameter, and the
    same document and webargs markers as flask-smorest's own `arguments` given the same schema."""
    from flask import Flask
    from flask_smorest import Blueprint as SmorestBlueprint
    from marshmallow import RAISE

    class Query(Schema):
        limit = ma.Integer()

    class Body(Schema):
        name = ma.String(required=True)

    def view(*args, **kwargs):
        return args, kwargs

    blp = Blueprint("probe_args", __name__)
    query, body = Query(), Body()
    ours = blp.arguments(query, location="query", as_kwargs=True)(
        blp.arguments(body, description="the body", example={"name": "x"})(view))
    theirs = SmorestBlueprint.arguments(blp, query, location="query", as_kwargs=True, unknown=RAISE)(
        SmorestBlueprint.arguments(blp, body, description="the body", example={"name": "x"})(view))
    assert repr(ours._apidoc) == repr(theirs._apidoc)
    assert getattr(ours, "__webargs_argnames__", None) == getattr(theirs, "__webargs_argnames__", None)
    app = Flask(__name__)
    for url, payload in [("/?limit=3", {"name": "a"}), ("/", {"name": "b"}), ("/?nope=1", {"name": "c"}),
                         ("/", {})]:
        answers = []
        for decorated in (ours, theirs):
            with app.test_request_context(url, method="POST", json=payload):
                try:
                    answers.append(decorated())
                except Exception as exc:  # webargs' 400 (flask-smorest's abort)
                    answers.append((type(exc), getattr(exc, "code", None), repr(getattr(exc, "data", None))))
        assert answers[0] == answers[1], url
