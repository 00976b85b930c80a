"""Aggregation planning, SQL shape and response shaping, without a database."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from sqlalchemy.dialects import postgresql

from app.entities.aggregation import build_statement, plan_aggregate, shape_response
from app.entities.fieldtypes import compile_definition_schema
from app.entities.filters import FilterContext, compile_filters
from app.errors import ValidationFailed

SCHEMA = {"type": "object", "properties": {
    "qty": {"type": "int"}, "price": {"type": "float"}, "status": {"type": "dropdown", "options": ["a", "b"]},
    "labels": {"type": "multiselect", "options": ["x", "y"]}, "due": {"type": "date"}, "at": {"type": "datetime"},
    "owner": {"type": "string"}, "meta": {"type": "json"}}}
CTX = FilterContext(compile_definition_schema(SCHEMA).catalog)


def plan(**request):
    request.setdefault("aggregates", [{"function": "count"}])
    return plan_aggregate(request, CTX, 1000)


def sql(**request) -> str:
    p = plan(**request)
    stmt = build_statement(p, CTX, [], compile_filters(request.get("filters") or {}, CTX).where)
    return str(stmt.compile(dialect=postgresql.dialect()))


def reason(exc_info, path):
    return " ".join(exc_info.value.details["fields"][path])


def test_default_aliases_and_bucket_folding():
    p = plan(groupBy=["created_at:day", "due:month", "status", "labels"],
             aggregates=[{"function": "count"}, {"function": "count", "field": "qty"},
                         {"function": "sum", "field": "qty"}, {"function": "percentile", "field": "price",
                                                                "percentile": 90},
                         {"function": "max", "field": "at", "alias": "lastSeen"}])
    assert [k.alias for k in p.keys] == ["created_at_day", "due_month", "status", "labels"]
    assert [k.exploded for k in p.keys] == [False, False, False, True]
    assert [m.alias for m in p.measures] == ["count", "count_qty", "sum_qty", "percentile_price", "lastSeen"]
    assert p.measures[3].fraction == pytest.approx(0.9)
    assert p.measures[4].kind == "datetime"
    assert (p.limit, p.timezone, p.descending, p.sort_by) == (1000, "UTC", False, None)


@pytest.mark.parametrize(("given", "fraction"), [(0, 0.0), (0.5, 0.5), (0.9, 0.9), (1, 1.0), (90, 0.9), (100, 1.0),
                                                 (2, 0.02), (99.5, 0.995)])
def test_percentile_fraction_or_percent(given, fraction):
    p = plan(aggregates=[{"function": "percentile", "field": "qty", "percentile": given}])
    assert p.measures[0].fraction == pytest.approx(fraction)


@pytest.mark.parametrize(("request_", "path", "text"), [
    ({"groupBy": ["at:fortnight"]}, "groupBy[0]", "unknown bucket"),
    ({"groupBy": ["owner:day"]}, "groupBy[0]", "date or datetime"),
    ({"groupBy": ["meta"]}, "groupBy[0]", "json"),
    ({"aggregates": [{"function": "sum", "field": "status"}]}, "aggregates[0].field", "numeric"),
    ({"aggregates": [{"function": "percentile", "field": "qty", "percentile": 100.5}]}, "aggregates[0].percentile",
     "between 0 and 100"),
    ({"aggregates": []}, "aggregates", "at least one"),
    ({"timezone": "Europe/Nowhere"}, "timezone", "unknown time zone"),
    ({"limit": 1001}, "limit", "between 1 and 1000"),
    ({"sortBy": "sum_qty"}, "sortBy", "unknown alias"),
    ({"having": {"sum_qty": 1}}, "having.sum_qty", "unknown alias"),
    ({"having": {"count": {"$startsWith": "1"}}}, "having.count.$startsWith", "needs a text field"),
    ({"groupBy": ["owner"], "having": {"owner": {"$startsWith": "1"}}}, "having.owner", "not available in having"),
    ({"having": {"$and": [{"count": {"$gt": True}}]}}, "having.$and[0].count.$gt", "expected a number"),
])
def test_invalid_requests_name_the_problem(request_, path, text):
    with pytest.raises(ValidationFailed) as exc_info:
        plan(**request_)
    assert text in reason(exc_info, path)


def test_plain_grouping_is_one_statement_with_grouping_sets():
    text = sql(groupBy=["status", "at:day"], aggregates=[{"function": "avg", "field": "qty"}],
               having={"avg_qty": {"$gt": 1}}, sortBy="avg_qty", sortOrder=-1, limit=10)
    assert text.count("SELECT") == 3 and "GROUPING SETS" in text and "UNION" not in text
    assert "date_trunc" in text and "timezone(" in text
    assert "ORDER BY grouped._total != " in text and "LIMIT" in text
    # field names and values reach SQL only as bound parameters
    assert "'qty'" not in text and "'status'" not in text


def test_multiselect_grouping_takes_totals_from_an_unmultiplied_branch():
    text = sql(groupBy=["labels"], aggregates=[{"function": "sum", "field": "qty"}])
    assert "LEFT OUTER JOIN LATERAL (SELECT DISTINCT jsonb_array_elements_text" in text
    assert "UNION ALL" in text and "GROUPING SETS" not in text


def test_no_group_by_is_a_single_aggregate_row():
    text = sql(aggregates=[{"function": "percentile", "field": "price", "percentile": 0.9}])
    assert "GROUP BY" not in text and "percentile_cont" in text and "WITHIN GROUP" in text


def _row(total, count, keys=(), values=(), keep=True):
    row = {"_total": total, "_count": count, "_keep": keep}
    row.update({f"k{i}": v for i, v in enumerate(keys)})
    row.update({f"v{j}": v for j, v in enumerate(values)})
    return row


def test_shape_response_converts_values_and_detects_truncation():
    p = plan(groupBy=["at:day", "due:month"], limit=2,
             aggregates=[{"function": "sum", "field": "qty"}, {"function": "avg", "field": "price"}])
    day = datetime(2026, 3, 8, 5, tzinfo=UTC)
    rows = [_row(3, 10, (None, None), (Decimal("40"), Decimal("2.5"))),
            _row(0, 4, (day, date(2026, 3, 1)), (Decimal("12.000"), None)),
            _row(0, 3, (day + timedelta(days=1), date(2026, 3, 1)), (Decimal("-1"), Decimal("1.25"))),
            _row(0, 3, (None, None), (Decimal("29"), 7.0))]
    body = shape_response(p, rows)
    assert body["groups"] == [
        {"key": {"at_day": "2026-03-08T05:00:00Z", "due_month": "2026-03-01"}, "values": {"sum_qty": 12,
                                                                                          "avg_price": None},
         "count": 4},
        {"key": {"at_day": "2026-03-09T05:00:00Z", "due_month": "2026-03-01"}, "values": {"sum_qty": -1,
                                                                                          "avg_price": 1.25},
         "count": 3}]
    assert body["totals"] == {"sum_qty": 40, "avg_price": 2.5}
    assert body["metadata"] == {"truncated": True, "limit": 2, "totalCount": 10}


def test_shape_response_without_group_by_respects_having():
    p = plan(aggregates=[{"function": "max", "field": "at"}], having={"max_at": {"$exists": True}})
    at = datetime(2026, 1, 1, 9, tzinfo=timezone(timedelta(hours=9)))
    kept = shape_response(p, [_row(1, 2, values=(at,), keep=True)])
    assert kept["groups"] == [{"key": {}, "values": {"max_at": "2026-01-01T00:00:00Z"}, "count": 2}]
    assert shape_response(p, [_row(1, 2, values=(at,), keep=False)])["groups"] == []


def test_a_field_named_count_is_a_group_key_in_having():
    ctx = FilterContext(compile_definition_schema({"type": "object", "properties": {
        "count": {"type": "string"}}}).catalog)
    p = plan_aggregate({"groupBy": ["count"], "aggregates": [{"function": "sum", "field": "version"}],
                        "having": {"count": "many"}, "sortBy": "count"}, ctx, 1000)
    assert p.kind_of("count") == "text"
    with pytest.raises(ValidationFailed):
        plan_aggregate({"groupBy": ["count"], "aggregates": [{"function": "count"}]}, ctx, 1000)  # alias twice
