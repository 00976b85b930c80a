"""Record aggregation: groupBy (with date buckets), count/sum/avg/min/max/distinct_count/percentile,
having, sorting, a group limit and totals — one SQL statement per request.

Built on the entity store's query compiler: `filters` go through `compile_filters` (same language, same
field checks), fields are typed by `FieldResolver`, and every read starts from `record_scope` (org,
entity, active records only). `having` is parsed by the same filter parser against a small catalog of
the request's aliases and compiled here over the grouped columns.

The statement has three layers, so that expressions with bound parameters (`fields -> :key`) are written
once and the outer layers only name columns:

1. `rows`: one row per matched record (one per record and value when grouping on a multiselect / tags):
   the group keys `k<i>` and the per-record inputs `m<j>` of the aggregates (typed, blanks as NULL).
2. `grouped`: the aggregates `v<j>` and the record count per group, plus the totals row (`_total = 1`):
   `GROUP BY GROUPING SETS ((k…), ())`; when a multiselect key multiplies rows, the totals come from a
   second, un-multiplied branch (UNION ALL) so every record counts once in them.
3. the outer select: `having` (the totals row always passes), ORDER BY the totals row first, then
   `sortBy`, then the keys (deterministic), LIMIT `limit + 2` (totals + one more to detect truncation).
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import cache
from typing import Any

from flask import current_app
from sqlalchemy import (
    Boolean,
    Date,
    Text,
    and_,
    case,
    cast,
    false,
    func,
    literal_column,
    not_,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement

from app.db import db
from app.entities.aggregation_schemas import FUNCTIONS
from app.entities.counting import record_scope
from app.entities.fieldtypes import (
    KIND_ARRAY,
    KIND_BOOL,
    KIND_DATE,
    KIND_DATETIME,
    KIND_JSON,
    KIND_NUMBER,
    KIND_TEXT,
    FieldCatalog,
    FieldSpec,
)
from app.entities.filters import (
    Condition,
    FieldRef,
    FieldResolver,
    FilterContext,
    FilterError,
    Logical,
    Negation,
    compile_filters,
    parse_filters,
)
from app.entities.models import EntityDefinition
from app.entities.query import compile_request_filters
from app.entities.services.context import definition_context
from app.errors import ValidationFailed

BUCKETS = ("hour", "day", "week", "month", "quarter", "year")
NUMERIC_FUNCTIONS = ("sum", "avg", "percentile")
HAVING_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$between", "$exists")
ALIAS = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")
MAX_GROUP_BY = 8
MAX_AGGREGATES = 32
# what min/max/distinct_count accept; sum/avg/percentile need KIND_NUMBER
ORDERED_KINDS = (KIND_NUMBER, KIND_TEXT, KIND_DATE, KIND_DATETIME)
SCALAR_KINDS = (KIND_NUMBER, KIND_TEXT, KIND_DATE, KIND_DATETIME, KIND_BOOL)
# the field type the `having` catalog gives an alias of each output kind (so the parser types values)
_HAVING_FIELD_TYPES = {KIND_NUMBER: "float", KIND_TEXT: "string", KIND_BOOL: "bool", KIND_DATE: "date",
                       KIND_DATETIME: "datetime"}
ONE, ZERO = literal_column("1"), literal_column("0")  # constants of ours


# --- the plan: a validated request ----------------------------------------------------------------

@dataclass(frozen=True)
class GroupKey:
    """One `groupBy` entry. `kind` is the kind of the key values (a multiselect key is text)."""

    alias: str
    ref: FieldRef
    bucket: str | None
    kind: str

    @property
    def exploded(self) -> bool:
        return self.ref.kind == KIND_ARRAY


@dataclass(frozen=True)
class Measure:
    """One aggregate. `ref` is None for a bare `count`; `fraction` is set for `percentile`."""

    alias: str
    function: str
    ref: FieldRef | None
    kind: str
    fraction: float | None = None


@dataclass(frozen=True)
class AggregatePlan:
    keys: tuple[GroupKey, ...]
    measures: tuple[Measure, ...]
    having: Any  # the parsed filter tree of `having` (app.entities.filters nodes), or None
    sort_by: str | None
    descending: bool
    limit: int
    timezone: str

    def kind_of(self, alias: str) -> str:
        for item in (*self.keys, *self.measures):
            if item.alias == alias:
                return item.kind
        if alias == "count":  # the group's record count, addressable even when not requested
            return KIND_NUMBER
        raise KeyError(alias)

    def aliases(self) -> list[str]:
        names = [k.alias for k in self.keys] + [m.alias for m in self.measures]
        return names if "count" in names else [*names, "count"]


def _invalid(path: str, reason: str) -> ValidationFailed:
    return ValidationFailed(f"Invalid aggregate request at {path}: {reason}.",
                            {"fields": {path: [reason]}})


def plan_aggregate(request: dict[str, Any], ctx: FilterContext, max_groups: int) -> AggregatePlan:
    """Check an AggregateRequest against the definition; ValidationFailed names the offending part."""
    resolver = FieldResolver(ctx.catalog)
    timezone = _timezone(request.get("timezone"))
    keys = _group_keys(resolver, request.get("groupBy") or [])
    measures = _measures(resolver, request.get("aggregates") or [])
    taken: dict[str, str] = {}
    for path, alias in [(f"groupBy[{i}]", k.alias) for i, k in enumerate(keys)] + \
                       [(f"aggregates[{i}].alias", m.alias) for i, m in enumerate(measures)]:
        if alias in taken:
            raise _invalid(path, f"alias '{alias}' is used twice (also by {taken[alias]}); give one an alias")
        taken[alias] = path
    limit = request.get("limit")
    if limit is None:
        limit = max_groups
    elif not 1 <= limit <= max_groups:
        raise _invalid("limit", f"must be between 1 and {max_groups}")
    plan = AggregatePlan(keys, measures, None, None, request.get("sortOrder") == -1, limit, timezone)
    sort_by = request.get("sortBy")
    if sort_by is not None and sort_by not in plan.aliases():
        raise _invalid("sortBy", f"unknown alias '{_short(sort_by)}'; known: {', '.join(plan.aliases())}")
    having = request.get("having") or None
    if having is not None:
        having = _check_having(plan, having, ctx)
    return AggregatePlan(keys, measures, having, sort_by, plan.descending, limit, timezone)


def _timezone(name: Any) -> str:
    if name is None:
        return "UTC"
    if not isinstance(name, str) or name not in _known_zones():
        raise _invalid("timezone", f"unknown time zone '{_short(name)}' (use an IANA name such as Europe/Berlin)")
    return name


@cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones() | {"UTC"})


def _group_keys(resolver: FieldResolver, entries: list[Any]) -> tuple[GroupKey, ...]:
    if len(entries) > MAX_GROUP_BY:
        raise _invalid("groupBy", f"at most {MAX_GROUP_BY} entries")
    keys = []
    for i, entry in enumerate(entries):
        path = f"groupBy[{i}]"
        if not isinstance(entry, str) or not entry:
            raise _invalid(path, "must be a field name, optionally with a bucket suffix (created_at:day)")
        name, _, bucket = entry.partition(":")
        ref = _resolve(resolver, name, path)
        if ref.kind == KIND_JSON:
            raise _invalid(path, f"cannot group by '{name}': it is a {ref.spec.field_type} field")
        if not bucket:
            keys.append(GroupKey(name, ref, None, KIND_TEXT if ref.kind == KIND_ARRAY else ref.kind))
            continue
        if bucket not in BUCKETS:
            raise _invalid(path, f"unknown bucket ':{_short(bucket)}'; allowed: "
                                 f"{', '.join(':' + b for b in BUCKETS)}")
        if ref.kind == KIND_DATE and bucket == "hour":
            raise _invalid(path, f"'{name}' is a date: ':hour' needs a datetime field")
        if ref.kind not in (KIND_DATE, KIND_DATETIME):
            raise _invalid(path, f"a bucket suffix needs a date or datetime field; '{name}' is {ref.kind}")
        keys.append(GroupKey(f"{name}_{bucket}", ref, bucket, ref.kind))
    return tuple(keys)


def _measures(resolver: FieldResolver, items: list[dict]) -> tuple[Measure, ...]:
    if not items:
        raise _invalid("aggregates", "at least one aggregate is required")
    if len(items) > MAX_AGGREGATES:
        raise _invalid("aggregates", f"at most {MAX_AGGREGATES} aggregates")
    return tuple(_measure(resolver, item, f"aggregates[{i}]") for i, item in enumerate(items))


def _measure(resolver: FieldResolver, item: dict, path: str) -> Measure:
    function, name, fraction = item["function"], item.get("field"), item.get("percentile")
    if function not in FUNCTIONS:
        raise _invalid(f"{path}.function", f"unknown function '{_short(function)}'; allowed: {', '.join(FUNCTIONS)}")
    ref = _resolve(resolver, name, f"{path}.field") if name is not None else None
    if ref is None and function != "count":
        raise _invalid(f"{path}.field", f"{function} needs a field")
    if function == "percentile":
        fraction = _fraction(fraction, f"{path}.percentile")
    elif fraction is not None:
        raise _invalid(f"{path}.percentile", f"only the percentile function takes a percentile, not {function}")
    kind = _measured_kind(function, ref, f"{path}.field")
    alias = item.get("alias") or (function if ref is None else f"{function}_{ref.name}")
    if not ALIAS.match(alias):
        raise _invalid(f"{path}.alias", "letters, digits and _, starting with a letter; at most 63")
    return Measure(alias, function, ref, kind, fraction)


def _measured_kind(function: str, ref: FieldRef | None, path: str) -> str:
    """The kind of the aggregate's value, after checking that `function` takes the field `ref`."""
    if function in NUMERIC_FUNCTIONS and ref.kind != KIND_NUMBER:
        raise _invalid(path, f"{function} needs a numeric field; '{ref.name}' is {ref.kind}")
    if function in ("min", "max"):
        if ref.kind not in ORDERED_KINDS:
            raise _invalid(path, f"{function} needs a number, text, date or datetime field; "
                                 f"'{ref.name}' is {ref.kind}")
        return ref.kind
    if function == "distinct_count" and ref.kind not in SCALAR_KINDS:
        raise _invalid(path, f"distinct_count needs a single-valued field; '{ref.name}' is {ref.kind}")
    return KIND_NUMBER


def _fraction(value: Any, path: str) -> float:
    """0.9 and 90 mean the same; values in [0, 1] are fractions (so 1 is the maximum)."""
    if value is None:
        raise _invalid(path, "percentile is required for the percentile function (0.9 or 90)")
    if not 0 <= value <= 100:
        raise _invalid(path, "must be between 0 and 100 (or a fraction between 0 and 1)")
    return float(value) if value <= 1 else float(value) / 100


def _resolve(resolver: FieldResolver, name: Any, path: str) -> FieldRef:
    try:
        return resolver.resolve(name, path)
    except FilterError as exc:
        raise _invalid(path, exc.details["reason"]) from None


# --- having: the filter language over aliases -----------------------------------------------------

def _having_catalog(plan: AggregatePlan) -> FieldCatalog:
    fields = {a: FieldSpec(a, _HAVING_FIELD_TYPES[plan.kind_of(a)], plan.kind_of(a)) for a in plan.aliases()}
    return FieldCatalog(fields)


def _check_having(plan: AggregatePlan, having: Any, ctx: FilterContext) -> Any:
    """The parsed `having` tree (typed values), after checking aliases and operators."""
    if not isinstance(having, dict):
        raise _invalid("having", "must be an object keyed by alias")
    for key in having:
        if not key.startswith("$") and key not in plan.aliases():
            raise _invalid(f"having.{_short(key)}", f"unknown alias '{_short(key)}'; known: "
                                                    f"{', '.join(plan.aliases())}")
    root = _parse_having(plan, having, ctx).root
    _walk_having(root)
    return root


def _parse_having(plan: AggregatePlan, having: dict, ctx: FilterContext):
    try:
        return parse_filters(having, FilterContext(_having_catalog(plan), limits=ctx.limits))
    except FilterError as exc:
        path = "having" + exc.details["path"].removeprefix("filters")
        raise _invalid(path, exc.details["reason"].replace("unknown field", "unknown alias")) from None


def _walk_having(node: Any) -> None:
    if isinstance(node, Logical):
        for child in node.children:
            _walk_having(child)
    elif isinstance(node, Negation):
        _walk_having(node.child)
    elif not isinstance(node, Condition):
        raise _invalid("having", "$search and $similar are not available in having")
    elif node.op not in HAVING_OPERATORS:
        raise _invalid(f"having.{node.field}", f"{node.op} is not available in having; use "
                                               f"{', '.join(HAVING_OPERATORS)}")
    elif isinstance(node.value, tuple) and node.op in ("$eq", "$ne"):
        raise _invalid(f"having.{node.field}", "compare a group key with one value")


def _compile_having(node: Any, columns: dict[str, ColumnElement], plan: AggregatePlan) -> ColumnElement:
    if isinstance(node, Logical):
        parts = [_compile_having(c, columns, plan) for c in node.children]
        return true() if not parts else (and_(*parts) if node.op == "and" else or_(*parts))
    if isinstance(node, Negation):
        return not_(_compile_having(node.child, columns, plan))
    return _having_condition(columns[node.field], node.op, _having_value(plan, node.field, node.value))


def _having_condition(col: ColumnElement, op: str, value: Any) -> ColumnElement:
    """One condition on an aggregate or group key (NULL: false, so negations stay two-valued)."""
    if op == "$exists":
        return col.isnot(None) if value else col.is_(None)
    if op in ("$eq", "$ne"):
        if value is None:
            return col.is_(None) if op == "$eq" else col.isnot(None)
        return func.coalesce(col == value, false()) if op == "$eq" else col.is_distinct_from(value)
    if op in ("$in", "$nin"):
        matched = func.coalesce(col.in_(list(value)), false()) if value else false()
        return matched if op == "$in" else not_(matched)
    if op == "$between":
        return func.coalesce(and_(col >= value[0], col <= value[1]), false())
    compare = {"$gt": col.__gt__, "$gte": col.__ge__, "$lt": col.__lt__, "$lte": col.__le__}[op]
    return func.coalesce(compare(value), false())


def _having_value(plan: AggregatePlan, alias: str, value: Any) -> Any:
    """Bucketed date keys are SQL dates; the parser gives ISO strings for date fields."""
    bucketed_date = any(k.alias == alias and k.bucket and k.kind == KIND_DATE for k in plan.keys)
    if not bucketed_date or value is None or isinstance(value, bool):
        return value
    if isinstance(value, tuple):
        return tuple(date.fromisoformat(v) for v in value)
    return date.fromisoformat(value)


# --- SQL ------------------------------------------------------------------------------------------

def _key_expression(r: FieldResolver, key: GroupKey, timezone: str) -> ColumnElement:
    typed = r.typed(key.ref)
    if key.ref.kind == KIND_BOOL and not key.ref.system:
        return case((func.jsonb_typeof(typed) == "boolean", cast(typed, Boolean)), else_=None)
    if key.bucket is None:
        return typed
    if key.ref.kind == KIND_DATE:  # a date has no time zone: truncate the calendar date itself
        local = cast(cast(typed, Date), TIMESTAMP(timezone=False))
        return cast(func.date_trunc(key.bucket, local), Date)
    local = func.timezone(timezone, typed)  # wall time in the zone (timestamp without time zone)
    return func.timezone(timezone, func.date_trunc(key.bucket, local))  # back to an instant


def _exploded(r: FieldResolver, key: GroupKey, index: int):
    """A LATERAL of a record's distinct values of a multiselect / tags (no values → one NULL row)."""
    if key.ref.system:
        values = func.unnest(r.column(key.ref), type_=Text)
    else:
        jv = r.jsonb(key.ref)
        values = func.jsonb_array_elements_text(case((func.jsonb_typeof(jv) == "array", jv), else_=None),
                                                type_=Text)
    return select(values.label("value")).distinct().correlate(r.t).lateral(f"x{index}")


def _measure_input(r: FieldResolver, m: Measure, ctx: FilterContext) -> ColumnElement:
    """The per-record value an aggregate consumes; blank (missing, null, "", []) is NULL."""
    if m.ref is None:
        return ONE
    if m.function == "count":  # records whose field is not blank, by the filter language's $empty
        not_blank = compile_filters({m.ref.name: {"$empty": False}}, ctx).where
        return case((not_blank, 1), else_=None)
    typed = r.typed(m.ref)
    if m.ref.kind == KIND_TEXT:
        return func.nullif(typed, "")
    if m.ref.kind == KIND_BOOL and not m.ref.system:
        return case((func.jsonb_typeof(typed) == "boolean", cast(typed, Boolean)), else_=None)
    return typed


def _aggregate(m: Measure, col: ColumnElement) -> ColumnElement:
    if m.function == "count":
        return func.count() if m.ref is None else func.count(col)
    if m.function == "distinct_count":
        return func.count(col.distinct())
    if m.function == "percentile":
        return func.percentile_cont(m.fraction).within_group(col)
    return getattr(func, m.function)(col)


def build_statement(plan: AggregatePlan, ctx: FilterContext, scope: list, where: ColumnElement):
    """The one SELECT answering the plan (see the module docstring for its layers)."""
    r = FieldResolver(ctx.catalog)
    base = r.t
    key_cols, joins = [], []
    for i, key in enumerate(plan.keys):
        if key.exploded:
            lateral = _exploded(r, key, i)
            joins.append(lateral)
            key_cols.append(lateral.c.value.label(f"k{i}"))
        else:
            key_cols.append(_key_expression(r, key, plan.timezone).label(f"k{i}"))
    inputs = [_measure_input(r, m, ctx).label(f"m{j}") for j, m in enumerate(plan.measures)]

    def rows(with_keys: bool):
        source = base
        if with_keys:
            for lateral in joins:
                source = source.outerjoin(lateral, true())
        cols = key_cols if with_keys else []
        return select(*cols, *inputs).select_from(source).where(*scope, where).subquery("rows")

    grouped = _grouped(plan, rows, bool(joins))
    columns = {key.alias: grouped.c[f"k{i}"] for i, key in enumerate(plan.keys)}
    columns.update({m.alias: grouped.c[f"v{j}"] for j, m in enumerate(plan.measures)})
    columns.setdefault("count", grouped.c._count)
    keep = true()
    if plan.having is not None:
        keep = _compile_having(plan.having, columns, plan)
    is_total = grouped.c._total != 0  # grouping() is a bit mask: non-zero on the totals row
    stmt = select(grouped, keep.label("_keep"))
    if not plan.keys:
        return stmt
    order = [is_total.desc()]
    if plan.sort_by is not None:
        col = columns[plan.sort_by]
        order.append(col.desc().nulls_last() if plan.descending else col.asc().nulls_last())
    order += [grouped.c[f"k{i}"].asc().nulls_last() for i in range(len(plan.keys))]
    return stmt.where(or_(is_total, keep)).order_by(*order).limit(plan.limit + 2)


def _grouped(plan: AggregatePlan, rows, exploded: bool):
    """The groups and the totals row (`_total` non-zero), from `rows(with_keys)`: without keys one row;
    with plain keys GROUPING SETS; with exploded keys (laterals) the groups UNION ALL the totals over
    the records themselves (a record counts once in the totals, whatever its number of values)."""
    def aggregates(sub) -> list:
        out = [_aggregate(m, sub.c[f"m{j}"]).label(f"v{j}") for j, m in enumerate(plan.measures)]
        return [*out, func.count().label("_count")]

    if not plan.keys:
        sub = rows(False)
        return select(*aggregates(sub), ONE.label("_total")).select_from(sub).subquery("grouped")
    if not exploded:
        sub = rows(True)
        keys = [sub.c[f"k{i}"] for i in range(len(plan.keys))]
        return (select(*keys, *aggregates(sub), func.grouping(*keys).label("_total")).select_from(sub)
                .group_by(func.grouping_sets(tuple_(*keys), tuple_()))
                .subquery("grouped"))
    sub, flat = rows(True), rows(False)
    keys = [sub.c[f"k{i}"] for i in range(len(plan.keys))]
    groups = select(*keys, *aggregates(sub), ZERO.label("_total")).select_from(sub).group_by(*keys)
    totals = select(*[cast(null(), k.type).label(k.name) for k in keys], *aggregates(flat),
                    ONE.label("_total")).select_from(flat)
    return union_all(groups, totals).subquery("grouped")


# --- the service ----------------------------------------------------------------------------------

def aggregate_records(definition: EntityDefinition, request: dict[str, Any]) -> dict[str, Any]:
    """Groups and totals of the active records of `definition` matching `request["filters"]`."""
    dctx = definition_context(definition)
    ctx = dctx.filters
    plan = plan_aggregate(request, ctx, current_app.config["ENTITY_AGGREGATE_MAX_GROUPS"])
    compiled = compile_request_filters(request.get("filters") or {}, dctx)
    stmt = build_statement(plan, ctx, record_scope(definition), compiled.where)
    try:
        rows = list(db.session.execute(stmt).mappings())
    except DBAPIError as exc:
        # Python's and PostgreSQL's time zone databases can differ by a release: a name zoneinfo knows
        # but the server does not is the caller's bad input, not a server failure.
        if getattr(exc.orig, "sqlstate", None) != "22023" or "time zone" not in str(exc.orig):
            raise
        db.session.rollback()
        raise _invalid("timezone", f"time zone '{plan.timezone}' is not known to the database") from None
    return shape_response(plan, rows)


def shape_response(plan: AggregatePlan, rows: list) -> dict[str, Any]:
    """Rows of `build_statement` → AggregateResponse (+ metadata.truncated when groups were cut)."""
    totals_row = next(row for row in rows if row["_total"])
    totals = _values(plan, totals_row)
    if not plan.keys:
        groups = [{"key": {}, "values": totals, "count": totals_row["_count"]}] if totals_row["_keep"] else []
        truncated = False
    else:
        group_rows = [row for row in rows if not row["_total"]]
        truncated = len(group_rows) > plan.limit
        groups = [{"key": {k.alias: _wire(k.kind, row[f"k{i}"]) for i, k in enumerate(plan.keys)},
                   "values": _values(plan, row), "count": row["_count"]} for row in group_rows[:plan.limit]]
    return {"groups": groups, "totals": totals,
            "metadata": {"truncated": truncated, "limit": plan.limit, "totalCount": totals_row["_count"]}}


def _values(plan: AggregatePlan, row) -> dict[str, Any]:
    return {m.alias: _wire(m.kind, row[f"v{j}"]) for j, m in enumerate(plan.measures)}


def _wire(kind: str, value: Any) -> Any:
    """JSON value of a key or aggregate: numbers as int when integral, instants as ISO 8601 UTC."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, datetime):  # a value of the data (a field, a bucket): its own precision, not app.wire's
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal | float):
        if isinstance(value, Decimal) and value == value.to_integral_value() and abs(value) < 2**53:
            return int(value)
        return float(value)
    return value


def _short(value: Any, limit: int = 64) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"


