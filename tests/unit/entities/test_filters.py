"""The filter compiler without a database: typing, limits, and that nothing caller-supplied reaches SQL text."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import pytest
from sqlalchemy.dialects import postgresql

from app.entities.fieldtypes import compile_definition_schema
from app.entities.filters import (
    Condition,
    FilterContext,
    FilterLimits,
    Logical,
    Negation,
    compile_filters,
    parse_filters,
)
from app.entities.similar import SimilarityClause
from app.errors import ValidationFailed

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "qty": {"type": "int"}, "at": {"type": "datetime"}, "due": {"type": "date"},
    "labels": {"type": "multiselect", "options": ["a", "b"]}, "meta": {"type": "json"}}}
CTX = FilterContext(compile_definition_schema(SCHEMA).catalog)


def sql(filters, ctx=CTX) -> str:
    compiled = compile_filters(filters, ctx)
    return str(compiled.where.compile(dialect=postgresql.dialect()))


def test_values_and_field_names_are_bound_parameters():
    evil = "x'); DROP TABLE entity_records; --"
    text = sql({"title": {"$contains": evil}, "qty": {"$gt": 5}, "$search": evil,
                "$or": [{"labels": evil}, {"meta": {"k": evil}}]})
    assert "DROP TABLE" not in text and "'x'" not in text
    assert "title" not in text and "labels" not in text and "qty" not in text  # keys are parameters too
    assert "%(" in text


def test_values_are_typed():
    parsed = parse_filters({"qty": "7", "at": "2026-01-01", "due": "2026-01-02"}, CTX)
    by_field = {c.field: c.value for c in parsed.root.children}
    assert by_field["qty"] == Decimal(7)
    assert by_field["at"].isoformat() == "2026-01-01T00:00:00+00:00"
    assert by_field["due"] == "2026-01-02"


def test_tree_shape():
    parsed = parse_filters({"$not": {"$or": [{"qty": 1}, {"title": {"$ne": "x"}}]}}, CTX)
    assert isinstance(parsed.root, Negation) and isinstance(parsed.root.child, Logical)
    assert parsed.root.child.children[1] == Condition("title", "$ne", "x")


@pytest.mark.parametrize("filters", [
    {"nope": 1}, {"qty": {"$gt": None}}, {"labels": {"$gt": "a"}}, {"meta": {"$contains": "x"}},
    {"at": {"$lt": "2026-01-01T10:00:00"}}, {"qty": {"$in": [1, "x"]}}, {"$or": [{}, 5]}, [1],
    {"title": "x" * 1001}, {"qty": 1e400 if False else "1e999"}, {"$similar": {"query": "x", "maxDistance": 5}},
])
def test_rejections(filters):
    with pytest.raises(ValidationFailed):
        compile_filters(filters, CTX)


def test_limits_are_configurable():
    tight = FilterContext(CTX.catalog, limits=FilterLimits(max_depth=1, max_conditions=2, max_list=2))
    with pytest.raises(ValidationFailed, match="levels deep"):
        parse_filters({"$not": {"$not": {"qty": 1}}}, tight)
    with pytest.raises(ValidationFailed, match="conditions"):
        parse_filters({"qty": 1, "title": "a", "due": "2026-01-01"}, tight)
    with pytest.raises(ValidationFailed, match="at most 2"):
        parse_filters({"qty": {"$in": [1, 2, 3]}}, tight)


def test_similar_without_embeddings_matches_nothing_and_hook_plugs_in():
    assert "false" in sql({"$similar": "hello"}).lower()
    enabled = FilterContext(CTX.catalog, embeddings_enabled=True)
    from sqlalchemy import literal

    seen = []

    def hook(spec, ctx):
        seen.append(spec)
        return SimilarityClause(where=literal(True), distance=literal(0.25))

    parsed = parse_filters({"$similar": {"query": "cats", "maxDistance": 0.4}, "qty": 1}, enabled)
    compiled = compile_filters(parsed, enabled, hook(parsed.similar, enabled))
    assert compiled.distance is not None and seen[0].query == "cats" and seen[0].max_distance == 0.4
    assert compiled.similarity is not None
    assert "false" in sql({"$similar": "hello"}, enabled).lower()  # enabled but no hook: still nothing


def test_a_lone_similar_hands_over_the_hooks_total():
    """`count_total` (the hook's counter) only when `$similar` is the only condition; otherwise the
    count goes through `count_where` with every other condition."""
    from sqlalchemy import literal, select

    enabled = FilterContext(CTX.catalog, embeddings_enabled=True)
    total = select(literal(7))
    clause = SimilarityClause(where=literal(True), count_where=literal(True), count_total=total,
                              distance=literal(0.25))

    def compiled(filters, similarity=clause):
        parsed = parse_filters(filters, enabled)
        return compile_filters(parsed, enabled, similarity)

    assert compiled({"$similar": "cats"}).count_total is total
    assert compiled({"qty": {"$similar": "cats"}}).count_total is total  # field-level, still alone
    for other in ({"qty": 1}, {"$search": "cats"}, {"$or": [{"qty": 1}, {"qty": 2}]}, {"$not": {"qty": 1}}):
        assert compiled({**other, "$similar": "cats"}).count_total is None, other
    bare = SimilarityClause(where=literal(True), distance=literal(0.25))  # a hook without count_where/total
    assert compiled({"$similar": "cats"}, bare).count_total is None
    assert compiled({"$similar": "cats"}, None).count_total is None  # no hook: matches nothing


@pytest.mark.parametrize("condition", [
    {"qty": {"$gte": 5}}, {"title": {"$contains": "x"}}, {"at": {"$lt": "2026-01-01T00:00:00Z"}},
    {"due": {"$between": ["2026-01-01", "2026-02-01"]}}])
def test_conditions_are_bare_outside_negations_and_two_valued_inside(condition):
    """Bare, a per-definition expression index can answer the condition (NULL drops the row as false
    does); under $not / $ne / $nin the COALESCE keeps NOT two-valued."""
    assert "coalesce" not in sql(condition).lower()
    assert "coalesce" not in sql({"$or": [condition, {"qty": 1}]}).lower()
    assert "coalesce" in sql({"$not": condition}).lower()
    assert "coalesce" in sql({"$not": {"$and": [condition, {"qty": 1}]}}).lower()


def test_datetimes_compare_through_the_immutable_cast():
    assert "public.entity_iso_timestamptz" in sql({"at": {"$gte": "2026-01-01T00:00:00Z"}})


def test_a_partly_projected_filter_compiles_each_term_against_the_projection_once(monkeypatch):
    """query.compile_request_filters: the terms the projection answers are compiled once, then either make
    the whole projected filter or narrow the entity_records one (`project_terms`)."""
    from app.entities import projection
    from app.entities.query import compile_request_filters
    from app.entities.services.context import DefinitionContext

    definition = SimpleNamespace(id="d1", projection=None)
    plan = projection.plan_for(definition, CTX.catalog)
    definition.projection = plan.name
    dctx = DefinitionContext(definition, compile_definition_schema(SCHEMA), CTX)
    resolved: list[str] = []
    original = projection.ProjectionResolver.resolve

    def counting(self, name, path="field"):
        resolved.append(name)
        return original(self, name, path)

    monkeypatch.setattr(projection.ProjectionResolver, "resolve", counting)
    partly = compile_request_filters({"qty": {"$gte": 2}, "meta": {"$exists": True}}, dctx, projected=True)
    assert not partly.projected and plan.name in str(partly.where.compile(dialect=postgresql.dialect()))
    assert resolved.count("qty") == 1
    resolved.clear()
    whole = compile_request_filters({"qty": {"$gte": 2}, "title": "x"}, dctx, sort_by="due", projected=True)
    assert whole.projected and resolved.count("qty") == 1 and resolved.count("title") == 1
