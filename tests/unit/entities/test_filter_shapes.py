"""Compiled filter shapes (filters.compile_request `shapes`): a filter of a shape seen before reuses that
compilation with its own values, and binds exactly what compiling it afresh binds."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import postgresql

from app.entities.fieldtypes import compile_definition_schema
from app.entities.filters import FilterContext, compile_request

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "qty": {"type": "int"}, "price": {"type": "float"}, "at": {"type": "datetime"},
    "due": {"type": "date"}, "ok": {"type": "bool"}, "labels": {"type": "multiselect", "options": ["a", "b", "c"]},
    "meta": {"type": "json"}, "cost": {"type": "currency"}}}
CTX = FilterContext(compile_definition_schema(SCHEMA).catalog)


def rendered(compiled) -> list[tuple[str, dict]]:
    """The SQL and the bound values of the filter's `where` and `rank`, with its reused values in place."""
    out = []
    for expr in (compiled.where, compiled.rank):
        if expr is None:
            out.append(None)
            continue
        if compiled.values:
            expr = expr.params({bind.key: value for bind, value in compiled.values.values()})
        text = expr.compile(dialect=postgresql.dialect())
        out.append((str(text), {k: (v.__class__, v) for k, v in text.params.items()}))
    return out


PAIRS = [
    ({"qty": {"$gte": 1, "$lt": 5}}, {"qty": {"$gte": 70, "$lt": 90}}),
    ({"price": {"$between": [1.5, 2]}}, {"price": {"$between": [3, 4.25]}}),
    ({"title": {"$contains": "a%b"}}, {"title": {"$contains": "z_\\q"}}),
    ({"title": {"$startsWith": "ab"}}, {"title": {"$startsWith": "%"}}),
    ({"title": {"$endsWith": "ab"}}, {"title": {"$endsWith": "x_"}}),
    ({"title": "open"}, {"title": "won"}),
    ({"qty": 3}, {"qty": 4}),
    ({"price": 3}, {"price": 4.5}),
    ({"cost": 3}, {"cost": 7}),
    ({"ok": True, "title": "xy"}, {"ok": True, "title": "zz"}),
    ({"labels": "a"}, {"labels": "b"}),
    ({"labels": {"$in": ["a", "b"]}}, {"labels": {"$in": ["c", "a"]}}),
    ({"title": {"$in": ["ab", "cd"]}}, {"title": {"$in": ["ef", "gh"]}}),
    ({"$search": "quantum"}, {"$search": "zephyr"}),
    ({"title": {"$search": "quantum"}, "qty": {"$ne": 2}}, {"title": {"$search": "red"}, "qty": {"$ne": 9}}),
    ({"at": {"$gt": "2026-01-01T00:00:00Z"}}, {"at": {"$gt": "2025-06-01T10:30:00+02:00"}}),
    ({"at": "2026-01-01"}, {"at": "2026-02-03"}),
    ({"due": {"$lte": "2026-01-01"}}, {"due": {"$lte": "2027-12-31"}}),
    ({"$or": [{"title": {"$startsWith": "ab"}}, {"$not": {"qty": {"$in": [1, 2]}}}]},
     {"$or": [{"title": {"$startsWith": "cd"}}, {"$not": {"qty": {"$in": [5, 6]}}}]}),
    ({"$and": [{"name": "n1"}, {"version": {"$gt": 1}}, {"tags": "vip"}]},
     {"$and": [{"name": "n2"}, {"version": {"$gt": 4}}, {"tags": "new"}]}),
]


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_a_shape_seen_before_binds_what_a_fresh_compilation_binds(first, second):
    shapes: dict = {}
    filled = compile_request(first, CTX, shapes=shapes)
    assert filled.values is None and rendered(filled) == rendered(compile_request(first, CTX))
    reused = compile_request(second, CTX, shapes=shapes)
    assert reused.values is not None, "the shape was reused"
    assert rendered(reused) == rendered(compile_request(second, CTX))
    again = compile_request(first, CTX, shapes=shapes)  # and back: nothing of `second` stays behind
    assert rendered(again) == rendered(compile_request(first, CTX))


@pytest.mark.parametrize(("first", "second"), [
    ({"meta": {"k": "v"}}, {"meta": {"k": "w"}}),  # a JSON value: compiled every time
    ({"labels": ["a", "b"]}, {"labels": ["b", "c"]}),  # equality with a whole list: one parameter, two values
    ({"title": "a", "$or": [{"title": {"$endsWith": "a"}}]},  # one string object in two places
     {"title": "b", "$or": [{"title": {"$endsWith": "c"}}]}),
])
def test_shapes_that_cannot_be_told_exactly_are_compiled_every_time(first, second):
    shapes: dict = {}
    compile_request(first, CTX, shapes=shapes)
    again = compile_request(second, CTX, shapes=shapes)
    assert again.values is None
    assert rendered(again) == rendered(compile_request(second, CTX))


def test_other_structures_are_other_shapes():
    shapes: dict = {}
    compile_request({"qty": {"$gte": 1}}, CTX, shapes=shapes)
    for other in ({"qty": {"$gt": 1}}, {"price": {"$gte": 1}}, {"qty": {"$gte": 1}, "ok": False},
                  {"ok": True}, {"ok": False}, {"title": None}, {"labels": {"$in": ["a"]}}):
        compiled = compile_request(other, CTX, shapes=shapes)
        assert rendered(compiled) == rendered(compile_request(other, CTX)), other
    assert rendered(compile_request({"ok": False}, CTX, shapes=shapes)) == rendered(compile_request({"ok": False}, CTX))


def test_equal_values_do_not_decide_a_shape():
    """Two equal values (or a number the second compilation cannot change) cannot tell which parameter
    carries which: that request compiles afresh, and a later one of the shape decides."""
    shapes: dict = {}
    for flt in ({"qty": {"$gte": 5, "$lt": 5}}, {"price": {"$gt": 1e100, "$lt": 2e100}}):
        compile_request(flt, CTX, shapes=shapes)
        assert not shapes
    compile_request({"qty": {"$gte": 5, "$lt": 6}}, CTX, shapes=shapes)
    reused = compile_request({"qty": {"$gte": 8, "$lt": 8}}, CTX, shapes=shapes)
    assert reused.values is not None
    assert rendered(reused) == rendered(compile_request({"qty": {"$gte": 8, "$lt": 8}}, CTX))
