"""The filter language → SQLAlchemy expressions over `entity_records` (reused by aggregation and search).

Two steps, both pure (no session, no request):

1. `parse_filters(raw, ctx)` validates a filter object against the definition's `FieldCatalog` and the
   limits, and returns a tree of `Node`s with values already typed (numbers as Decimal, dates as
   ISO strings, datetimes as aware datetimes). Anything wrong is a `ValidationFailed` (400) whose
   `details.path` points at the offending part (`filters.$or[1].amount.$gt`).
2. `compile_filters(parsed, ctx, similarity)` turns the tree into one boolean SQL expression. Field names only ever
   reach SQL as bound parameters (`fields -> :key`), after they were checked against the schema;
   values are always bound parameters. Every condition compiles to an expression that is never NULL,
   so `$not` and `$ne` have plain two-valued logic (a missing field is "not equal").

`FieldResolver` is the part aggregation (group by, sum over a field) reuses: it gives the typed SQL
expression of a field or system column. `$similar` (semantic search) is parsed here; what it compiles
to is a `SimilarityClause` the caller resolved beforehand (app.entities.query.compile_request_filters
asks the app's similarity hook, which embeds the query text: the only I/O, kept out of this module).
Without an enabled `embeddingsConfig` on the definition it matches nothing (no records, not an error).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import Numeric, and_, case, cast, false, func, literal_column, not_, or_, select, true
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP
from sqlalchemy.sql.elements import ColumnElement

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
    parse_date,
    parse_datetime,
)
from app.entities.models import EntityRecord
from app.entities.similar import SimilarityClause, SimilarSpec, joined, projected_count
from app.errors import ValidationFailed

SEARCH_CONFIG = literal_column("'english'::regconfig")  # a constant of ours, never caller input
OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$contains", "$startsWith",
             "$endsWith", "$exists", "$empty", "$between", "$search", "$similar")
RANGE_OPS = {"$gt": "__gt__", "$gte": "__ge__", "$lt": "__lt__", "$lte": "__le__"}
RANGE_KINDS = (KIND_TEXT, KIND_NUMBER, KIND_DATE, KIND_DATETIME)
SYSTEM_COLUMNS = {"id": KIND_TEXT, "name": KIND_TEXT, "created_at": KIND_DATETIME, "updated_at": KIND_DATETIME,
                  "is_active": KIND_BOOL, "version": KIND_NUMBER, "tags": KIND_ARRAY}
_DATE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_DATETIME_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?([Zz]|[+-][0-9]{2}:[0-9]{2})$"


@dataclass(frozen=True)
class FilterLimits:
    max_depth: int = 8          # nesting of $and/$or/$not
    max_conditions: int = 100   # field conditions in one filter
    max_list: int = 1000        # values in one $in/$nin
    max_string: int = 1000      # characters of one string value


@dataclass(frozen=True)
class FilterContext:
    """What a filter is checked and compiled against: the definition's fields and settings."""

    catalog: FieldCatalog
    embeddings_enabled: bool = False
    limits: FilterLimits = field(default_factory=FilterLimits)
    definition_id: str | None = None
    embeddings_config: dict[str, Any] | None = None
    org_id: str | None = None


# --- the parsed tree ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Condition:
    field: str
    op: str
    value: Any


@dataclass(frozen=True)
class Logical:
    op: str  # "and" | "or"
    children: tuple[Any, ...]


@dataclass(frozen=True)
class Negation:
    child: Any


@dataclass(frozen=True)
class TextSearch:
    query: str
    field: str | None = None  # None = the whole record (stored tsvector)


Node = Condition | Logical | Negation | TextSearch


@dataclass
class ParsedFilter:
    root: Node
    similar: SimilarSpec | None = None
    search: str | None = None  # first top-level $search: ranks results when there is no sortBy


class FilterError(ValidationFailed):
    def __init__(self, path: str, message: str):
        super().__init__(f"Invalid filter at {path}: {message}", {"path": path, "reason": message})


# --- fields ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FieldRef:
    name: str
    kind: str
    system: bool
    spec: FieldSpec | None = None


class NotProjected(Exception):  # noqa: N818 (a signal, not an error: the caller falls back)
    """Raised by a projection's resolver for what its typed table cannot answer exactly (the caller
    compiles the query against `entity_records` instead)."""


class FieldResolver:
    """Typed SQL expressions of record fields and system columns (filters, sorting, aggregation).

    The target is `entity_records` (fields as JSONB expressions); app.entities.projection subclasses
    it to target a definition's typed projection table (real columns), raising `NotProjected` for
    what that table does not hold."""

    projected = False  # True: expressions over a projection's columns (equality may be NULL)

    def __init__(self, catalog: FieldCatalog, table=None):
        self.catalog = catalog
        self.t = table if table is not None else EntityRecord.__table__

    def resolve(self, name: Any, path: str = "field") -> FieldRef:
        """A property the definition's schema declares wins over a system column of the same name
        (a schema with its own `is_active` or `name` filters, sorts and groups on that field)."""
        if not isinstance(name, str):
            raise FilterError(path, "field names are strings")
        spec = self.catalog.get(name)
        if spec is not None:
            return FieldRef(name, spec.kind, False, spec)
        if name in SYSTEM_COLUMNS:
            return FieldRef(name, SYSTEM_COLUMNS[name], True)
        raise FilterError(path, f"unknown field '{_shorten(name)}'")

    def column(self, ref: FieldRef):
        return self.t.c[ref.name]

    def jsonb(self, ref: FieldRef) -> ColumnElement:
        """`fields -> :name` (the key is a bound parameter)."""
        return self.t.c.fields[ref.name]

    def text(self, ref: FieldRef) -> ColumnElement:
        """`fields ->> :name`, or the text column."""
        return self.t.c[ref.name] if ref.system else self.t.c.fields[ref.name].astext

    def typed(self, ref: FieldRef) -> ColumnElement:
        """The field as a SQL value of its type; NULL when missing or not of that type (never an error)."""
        if ref.system:
            column = self.t.c[ref.name]
            return column.collate("C") if ref.kind == KIND_TEXT else column
        jv, jt = self.jsonb(ref), self.text(ref)
        kind_of = func.jsonb_typeof(jv)
        if ref.kind == KIND_NUMBER:
            whens = [(kind_of == "number", cast(jv, Numeric))]
            if ref.spec is not None and ref.spec.field_type == "currency":
                amount = jv["amount"]
                whens.append((func.jsonb_typeof(amount) == "number", cast(amount, Numeric)))
            return case(*whens, else_=None)
        if ref.kind == KIND_DATE:  # ISO dates compare chronologically as bytes
            return case((jt.op("~")(_DATE_RE), jt.collate("C")), else_=None)
        if ref.kind == KIND_DATETIME:
            # text::timestamptz is only STABLE; on strings with an explicit offset it is immutable, and
            # the IMMUTABLE wrapper (migration x0001) lets the per-definition index hold this expression.
            # It answers NULL for a string of this shape that is no instant (`2026-02-30…`, left by a
            # schema change from string to datetime; migration x0002), so such a value acts as null.
            return case((jt.op("~")(_DATETIME_RE), func.public.entity_iso_timestamptz(
                jt, type_=TIMESTAMP(timezone=True))), else_=None)
        if ref.kind == KIND_TEXT:
            return case((kind_of == "string", jt.collate("C")), else_=None)
        return jv

    def scalar_equals(self, ref: FieldRef, value: Any) -> ColumnElement:
        """Equality of a text, number, bool or date field with a scalar: JSONB containment, which the
        GIN (jsonb_path_ops) index answers (never NULL). Same matches as `typed(ref) == value`: a
        JSON string/number/boolean contains only an equal value of its own type."""
        return self.t.c.fields.contains({ref.name: _json_scalar(value)})

    def member(self, ref: FieldRef, value: str) -> ColumnElement:
        """A list field (or `tags`) holds the string `value`: `fields @> {name: [value]}`, true exactly
        when the field is a JSON array with that string among its elements (never NULL)."""
        if ref.system:
            return self.t.c[ref.name].contains([value])
        return self.t.c.fields.contains({ref.name: [value]})

    def overlap(self, ref: FieldRef, values: list[str]) -> ColumnElement:
        """A list field holds at least one of `values` (not empty)."""
        if ref.system:
            return self.t.c[ref.name].overlap(values)
        return or_(*(self.member(ref, v) for v in values))

    def ilike(self, ref: FieldRef, pattern: str) -> ColumnElement:
        """The text of the field matches the LIKE `pattern` (backslash escapes), case-insensitively."""
        return self.text(ref).ilike(pattern, escape="\\")

    def sort_key(self, ref: FieldRef) -> ColumnElement:
        """Ordering expression: typed for numbers and datetimes, text for the rest."""
        if ref.system or ref.kind in (KIND_NUMBER, KIND_DATETIME, KIND_DATE):
            return self.typed(ref)
        if ref.kind == KIND_TEXT:
            return self.text(ref)
        return self.jsonb(ref)


# --- parsing --------------------------------------------------------------------------------------

class _Parser:
    def __init__(self, ctx: FilterContext):
        self.ctx = ctx
        self.resolver = FieldResolver(ctx.catalog)
        self.conditions = 0
        self.similar: SimilarSpec | None = None
        self.search: str | None = None

    def parse(self, raw: Any) -> ParsedFilter:
        if raw is None:
            raw = {}
        root = self.filter_object(raw, "filters", depth=0)
        return ParsedFilter(root, self.similar, self.search)

    def filter_object(self, raw: Any, path: str, depth: int) -> Node:
        if not isinstance(raw, dict):
            raise FilterError(path, "a filter must be an object")
        if depth > self.ctx.limits.max_depth:
            raise FilterError(path, f"filters nest at most {self.ctx.limits.max_depth} levels deep")
        parts: list[Node] = []
        for key, value in raw.items():
            where = f"{path}.{_shorten(key)}" if isinstance(key, str) else path
            if key in ("$and", "$or"):
                parts.append(self.logical(key, value, where, depth))
            elif key == "$not":
                parts.append(Negation(self.filter_object(value, where, depth + 1)))
            elif key == "$search":
                parts.append(self.text_search(value, where, None, depth))
            elif key == "$similar":
                self.set_similar(value, where, None, depth)
            elif isinstance(key, str) and key.startswith("$"):
                raise FilterError(where, f"unknown operator '{_shorten(key)}' (use $and, $or, $not, $search, "
                                         "$similar or a field name)")
            else:
                parts.extend(self.field_filter(key, value, where, depth))
        return parts[0] if len(parts) == 1 else Logical("and", tuple(parts))

    def logical(self, key: str, value: Any, path: str, depth: int) -> Node:
        if not isinstance(value, list) or not value:
            raise FilterError(path, f"{key} takes a non-empty list of filter objects")
        children = tuple(self.filter_object(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
        return Logical(key[1:], children)

    def text_search(self, value: Any, path: str, field_name: str | None, depth: int) -> TextSearch:
        text = self.string(value, path)
        if not text.strip():
            raise FilterError(path, "$search needs a non-empty search text")
        self.count(path)
        if field_name is None and depth == 0 and self.search is None:
            self.search = text
        return TextSearch(text, field_name)

    def set_similar(self, value: Any, path: str, field_name: str | None, depth: int) -> None:
        if depth != 0:
            raise FilterError(path, "$similar is allowed only at the top level of filters")
        if self.similar is not None:
            raise FilterError(path, "only one $similar per query")
        max_distance = None
        if isinstance(value, dict):
            unknown = set(value) - {"query", "maxDistance"}
            if unknown:
                raise FilterError(path, f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                                        "use {query, maxDistance}")
            max_distance = value.get("maxDistance")
            if max_distance is not None and (isinstance(max_distance, bool)
                                             or not isinstance(max_distance, int | float)
                                             or not 0 <= max_distance <= 2):
                raise FilterError(f"{path}.maxDistance", "must be a number between 0 and 2")
            value = value.get("query")
        text = self.string(value, path)
        if not text.strip():
            raise FilterError(path, "$similar needs a non-empty query text")
        self.similar = SimilarSpec(text, max_distance, field_name)

    def count(self, path: str) -> None:
        self.conditions += 1
        if self.conditions > self.ctx.limits.max_conditions:
            raise FilterError(path, f"at most {self.ctx.limits.max_conditions} conditions per filter")

    def field_filter(self, name: Any, value: Any, path: str, depth: int) -> list[Node]:
        ref = self.resolver.resolve(name, path)
        if isinstance(value, dict) and value and any(isinstance(k, str) and k.startswith("$") for k in value):
            if not all(isinstance(k, str) and k.startswith("$") for k in value):
                raise FilterError(path, "do not mix operators and plain keys in one operator object")
            nodes = []
            for op, operand in value.items():
                nodes.extend(self.operator(ref, op, operand, f"{path}.{_shorten(op)}", depth))
            return nodes
        self.count(path)
        return [Condition(ref.name, "$eq", self.eq_value(ref, value, path))]

    def operator(self, ref: FieldRef, op: str, operand: Any, path: str, depth: int) -> list[Node]:
        if op not in OPERATORS:
            raise FilterError(path, f"unknown operator '{_shorten(op)}'; allowed: {', '.join(OPERATORS)}")
        if op == "$search":
            if ref.kind != KIND_TEXT:
                raise FilterError(path, f"$search needs a text field; '{ref.name}' is {ref.kind}")
            return [self.text_search(operand, path, ref.name, depth)]
        if op == "$similar":
            self.set_similar(operand, path, ref.name, depth)
            return []
        self.count(path)
        return [Condition(ref.name, op, self.operand(ref, op, operand, path))]

    def operand(self, ref: FieldRef, op: str, value: Any, path: str) -> Any:
        if op in ("$eq", "$ne"):
            return self.eq_value(ref, value, path)
        if op in ("$in", "$nin"):
            return self.list_operand(ref, op, value, path)
        if op in RANGE_OPS or op == "$between":
            return self.range_operand(ref, op, value, path)
        if op in ("$contains", "$startsWith", "$endsWith"):
            return self.text_operand(ref, op, value, path)
        if op in ("$exists", "$empty"):
            if not isinstance(value, bool):
                raise FilterError(path, f"{op} takes true or false")
            return value
        raise FilterError(path, f"unsupported operator {op}")  # pragma: no cover (OPERATORS covers all)

    def list_operand(self, ref: FieldRef, op: str, value: Any, path: str) -> tuple:
        if not isinstance(value, list):
            raise FilterError(path, f"{op} takes a list")
        if len(value) > self.ctx.limits.max_list:
            raise FilterError(path, f"{op} takes at most {self.ctx.limits.max_list} values")
        return tuple(self.scalar(ref, v, f"{path}[{i}]") for i, v in enumerate(value))

    def range_operand(self, ref: FieldRef, op: str, value: Any, path: str) -> Any:
        if ref.kind not in RANGE_KINDS:
            raise FilterError(path, f"{op} needs a text, number, date or datetime field; "
                                    f"'{ref.name}' is {ref.kind}")
        if op != "$between":
            return self.scalar(ref, value, path)
        if not isinstance(value, list) or len(value) != 2:
            raise FilterError(path, "$between takes [low, high]")
        return tuple(self.scalar(ref, v, f"{path}[{i}]") for i, v in enumerate(value))

    def text_operand(self, ref: FieldRef, op: str, value: Any, path: str) -> Any:
        if ref.kind == KIND_ARRAY and op == "$contains":
            return self.scalar(ref, value, path)
        if ref.kind != KIND_TEXT:
            raise FilterError(path, f"{op} needs a text field (or, for $contains, a list field); "
                                    f"'{ref.name}' is {ref.kind}")
        return self.string(value, path)

    def eq_value(self, ref: FieldRef, value: Any, path: str) -> Any:
        if value is None:
            return None
        if ref.kind == KIND_ARRAY and isinstance(value, list):
            if len(value) > self.ctx.limits.max_list:
                raise FilterError(path, f"at most {self.ctx.limits.max_list} values")
            return tuple(self.scalar(ref, v, f"{path}[{i}]") for i, v in enumerate(value))
        if ref.kind == KIND_JSON:
            self.check_json(value, path, 0)
            return _Json(value)
        return self.scalar(ref, value, path)

    def scalar(self, ref: FieldRef, value: Any, path: str) -> Any:
        """One comparable value of the field's kind (the element kind for list fields)."""
        kind = ref.kind
        if kind in (KIND_TEXT, KIND_ARRAY):
            return self.string(value, path)
        if kind == KIND_NUMBER:
            return self.number(value, path, integral=ref.system and ref.name == "version")
        if kind == KIND_BOOL:
            if not isinstance(value, bool):
                raise FilterError(path, f"'{ref.name}' is a boolean: compare it with true or false")
            return value
        if kind == KIND_DATE:
            text = self.string(value, path)
            try:
                return parse_date(text).isoformat()
            except ValueError:
                raise FilterError(path, f"'{ref.name}' is a date: use YYYY-MM-DD") from None
        if kind == KIND_DATETIME:
            text = self.string(value, path)
            try:
                return parse_datetime(text)
            except ValueError:
                try:
                    return datetime.combine(parse_date(text), datetime.min.time(), tzinfo=UTC)
                except ValueError:
                    raise FilterError(path, f"'{ref.name}' is a datetime: use an ISO 8601 date-time with "
                                            "offset (2026-11-22T10:00:00Z) or a date") from None
        self.check_json(value, path, 0)
        return _Json(value)

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise FilterError(path, "expected a string")
        if len(value) > self.ctx.limits.max_string:
            raise FilterError(path, f"strings are at most {self.ctx.limits.max_string} characters")
        if "\x00" in value:
            raise FilterError(path, "strings cannot contain the NUL character")
        return value

    def number(self, value: Any, path: str, integral: bool = False) -> Decimal:
        if isinstance(value, bool):
            raise FilterError(path, "expected a number")
        if isinstance(value, str):
            try:
                value = Decimal(value.strip())
            except InvalidOperation:
                raise FilterError(path, "expected a number") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise FilterError(path, "expected a finite number")
        if not isinstance(value, int | float | Decimal):
            raise FilterError(path, "expected a number")
        number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
        if not number.is_finite() or abs(number.adjusted()) > 100:
            raise FilterError(path, "expected a finite number of reasonable size")
        if integral and number != number.to_integral_value():
            raise FilterError(path, "expected an integer")
        return number

    def check_json(self, value: Any, path: str, depth: int) -> None:
        if depth > 20:
            raise FilterError(path, "value nests too deeply")
        if isinstance(value, str):
            self.string(value, path)
        elif isinstance(value, float) and not math.isfinite(value):
            raise FilterError(path, "expected a finite number")
        elif isinstance(value, dict):
            for k, v in value.items():
                self.string(k, path)
                self.check_json(v, path, depth + 1)
        elif isinstance(value, list):
            for v in value:
                self.check_json(v, path, depth + 1)


@dataclass(frozen=True)
class _Json:
    """A JSON value compared as JSONB (json/file/image fields)."""

    value: Any

    def __hash__(self) -> int:
        return id(self)


def parse_filters(raw: Any, ctx: FilterContext) -> ParsedFilter:
    """Validate `raw` (the `filters` object) against the definition; 400 with a path on any problem."""
    return _Parser(ctx).parse(raw)


# --- compiling ------------------------------------------------------------------------------------

@dataclass
class CompiledFilter:
    where: ColumnElement
    search: str | None = None
    rank: ColumnElement | None = None       # ts_rank_cd of the top-level $search
    distance: ColumnElement | None = None   # from the similarity hook
    similar: SimilarSpec | None = None
    similarity: SimilarityClause | None = None
    count_where: ColumnElement | None = None  # `where` for counting, when it differs (a $similar)
    resolver: FieldResolver | None = None     # what it was compiled against (entity_records or a projection)
    count_total: Any = None  # a statement giving the exact count directly (a $similar and nothing else)
    count_projected: Any = None  # a statement giving the exact count from the projection ($similar + filter)
    # this request's values of a compiled shape's bound parameters (`compile_request(shapes=…)`): id of a
    # BindParameter of `where`/`rank` → (that parameter, its value here); None: the values are in place
    values: dict[int, tuple[Any, Any]] | None = None

    @property
    def table(self):
        """The table `where` is over: entity_records, or the definition's projection."""
        return self.resolver.t if self.resolver is not None else EntityRecord.__table__

    @property
    def projected(self) -> bool:
        return self.resolver is not None and self.resolver.projected

    @property
    def where_to_count(self) -> ColumnElement:
        return self.where if self.count_where is None else self.count_where


@dataclass
class ProjectedTerms:
    """A filter's top-level AND terms split by what a projection's resolver answers (`project_terms`):
    `covered` compiled against the projection, `rest` (parsed nodes) not."""

    covered: list[ColumnElement]
    rest: list[Node]


def project_terms(parsed: ParsedFilter, narrow: FieldResolver) -> ProjectedTerms:
    """Compile each top-level AND term of `parsed` against the projection once: a filter it answers whole
    compiles from these (`compile_filters(..., resolver=narrow, terms=…)`), one it answers in part
    narrows with them (`narrow=…, terms=…`), without compiling them a second time."""
    root = parsed.root
    terms = root.children if isinstance(root, Logical) and root.op == "and" else (root,)
    covered, rest = [], []
    for term in terms:
        try:
            covered.append(_Compiler(narrow).node(term))
        except NotProjected:
            rest.append(term)
    return ProjectedTerms(covered, rest)


def compile_filters(raw: Any, ctx: FilterContext, similarity: SimilarityClause | None = None,
                    resolver: FieldResolver | None = None, narrow: FieldResolver | None = None,
                    terms: ProjectedTerms | None = None) -> CompiledFilter:
    """Compile `raw` (a filter object, or one `parse_filters` already checked) into a WHERE expression
    (plus ranking / distance expressions); `similarity` is what its `$similar` was resolved to.
    `resolver` targets another table (a projection's; `NotProjected` when it cannot answer).
    `narrow` (a projection's resolver, when the filter as a whole is not projected): the top-level
    AND terms it can answer become one `id IN (SELECT id FROM <projection> WHERE …)`, which its
    indexes answer; the other terms compile against entity_records as usual. `terms`: `project_terms`
    of this filter and of that projection (`resolver` or `narrow`), already compiled."""
    parsed = raw if isinstance(raw, ParsedFilter) else parse_filters(raw, ctx)
    resolver = resolver if resolver is not None else FieldResolver(ctx.catalog)
    if resolver.projected and parsed.similar is not None:
        raise NotProjected("$similar")  # semantic search reads entity_records (its stamp, its vectors)
    where = _where(parsed, resolver, narrow, terms)
    out = CompiledFilter(where, parsed.search, similar=parsed.similar, resolver=resolver)
    if parsed.search is not None:
        query = func.websearch_to_tsquery(SEARCH_CONFIG, parsed.search)
        out.rank = func.ts_rank_cd(resolver.t.c.search_vector, query)
    if parsed.similar is not None:
        _with_similarity(out, where, similarity if ctx.embeddings_enabled else None)
    return out


def compile_request(raw: Any, ctx: FilterContext, *, projection: FieldResolver | None = None,
                    sort_by: str | None = None,
                    resolve_similar: Callable[[SimilarSpec], SimilarityClause | None] | None = None,
                    shapes: dict | None = None) -> CompiledFilter:
    """A request's `filters`, from the body to SQL in one pass: parse; against `projection` (a typed
    projection's resolver) when it answers the filter and `sort_by` exactly, else against
    entity_records, narrowed by the top-level terms the projection answers; a `$similar` compiled to
    what `resolve_similar(spec)` gives (the caller's I/O: the app's similarity hook), and counted on
    the projection when it answers the rest of the filter (`count_projected`).

    `shapes` (a dict the caller keeps per definition context; a filter without `$similar`): each filter
    shape is compiled once, and a later filter of the same shape reuses that compilation with its own
    values (`CompiledFilter.values`, which db.execute_shaped binds): see `_compiled_shape`."""
    parsed = parse_filters(raw, ctx)
    if shapes is not None and parsed.similar is None:  # a `$similar` needs `resolve_similar`: compiled afresh
        return _compiled_shape(parsed, ctx, projection, sort_by, shapes)
    return _compile_parsed(parsed, ctx, projection, sort_by, resolve_similar)


def _compile_parsed(parsed: ParsedFilter, ctx: FilterContext, projection: FieldResolver | None,
                    sort_by: str | None,
                    resolve_similar: Callable[[SimilarSpec], SimilarityClause | None] | None) -> CompiledFilter:
    terms = None
    if projection is not None and parsed.similar is None:
        terms = project_terms(parsed, projection)  # each top-level term compiled once against the projection
        try:
            if sort_by:
                projection.sort_key(projection.resolve(sort_by))
            return compile_filters(parsed, ctx, None, projection, terms=terms)
        except (NotProjected, FilterError):  # not projected, or an unknown sortBy (the caller's 400)
            pass
    clause = resolve_similar(parsed.similar) if parsed.similar is not None and resolve_similar is not None else None
    out = compile_filters(parsed, ctx, clause, narrow=projection if parsed.similar is None else None,
                          terms=terms)  # $similar: its own path
    if projection is not None and out.similarity is not None and out.count_total is None:
        out.count_projected = _projected_similar_count(parsed, ctx, projection, out.similarity)
    return out


def _projected_similar_count(parsed: ParsedFilter, ctx: FilterContext, projection: FieldResolver,
                             clause: SimilarityClause) -> Any:
    """`$similar` + the rest of the filter, when the projection answers that rest: its count there
    (app.entities.similar.projected_count); None when it cannot."""
    if clause.current_hash is None:
        return None
    try:
        rest = compile_filters(replace(parsed, similar=None), ctx, None, projection)
    except (NotProjected, FilterError):
        return None
    return projected_count(rest.where, projection.t, clause)


def _where(parsed: ParsedFilter, resolver: FieldResolver, narrow: FieldResolver | None,
           terms: ProjectedTerms | None) -> ColumnElement:
    """The filter's conditions (all but `$similar`) as one expression over `resolver`'s table."""
    compiler = _Compiler(resolver)
    if terms is not None and resolver.projected:  # the projection answers the filter: its terms, compiled
        if terms.rest:
            raise NotProjected("a term")
        return and_(*terms.covered) if len(terms.covered) > 1 else terms.covered[0] if terms.covered else true()
    if narrow is not None:
        where = _narrowed(compiler, terms if terms is not None else project_terms(parsed, narrow), narrow)
        if where is not None:
            return where
    return compiler.node(parsed.root)


def _with_similarity(out: CompiledFilter, where: ColumnElement, clause: SimilarityClause | None) -> None:
    """`$similar` resolved to `clause` joins the other conditions (app.entities.similar); unresolved
    (no embeddings enabled, no hook) it matches nothing: no records, not an error."""
    if clause is None:
        out.where = false()
        return
    both = joined(where, clause)
    out.where, out.distance, out.similarity = both.where, clause.distance, clause
    out.count_where, out.count_total = both.count_where, both.count_total


def _narrowed(compiler: _Compiler, terms: ProjectedTerms, narrow: FieldResolver) -> ColumnElement | None:
    """A filter's top-level AND terms split between the projection (`narrow`, `terms`) and entity_records,
    or None when the projection answers none of them."""
    if not terms.covered:
        return None
    ids = select(narrow.t.c.id).where(*terms.covered)
    return and_(compiler.t.c.id.in_(ids), *(compiler.node(term) for term in terms.rest))


class _Compiler:
    """Conditions outside any negation are emitted bare (`typed >= 5`, `text ILIKE …`): there a NULL
    drops the row exactly as false does, and the bare form is what a per-definition expression index
    (app.entities.indexes) matches. Under a negation they are wrapped in COALESCE(…, false) so that
    NOT stays two-valued."""

    def __init__(self, resolver: FieldResolver):
        self.r = resolver
        self.t = resolver.t
        self.negated = 0

    def negate(self, build: Callable[[], ColumnElement]) -> ColumnElement:
        self.negated += 1
        try:
            return not_(build())
        finally:
            self.negated -= 1

    def true_only(self, expr: ColumnElement) -> ColumnElement:
        return expr if not self.negated else _true_only(expr)

    def node(self, node: Node) -> ColumnElement:
        if isinstance(node, Logical):
            parts = [self.node(c) for c in node.children]
            if not parts:
                return true()
            return and_(*parts) if node.op == "and" else or_(*parts)
        if isinstance(node, Negation):
            return self.negate(lambda: self.node(node.child))
        if isinstance(node, TextSearch):
            return self.text_search(node)
        return self.condition(node)

    def text_search(self, node: TextSearch) -> ColumnElement:
        query = func.websearch_to_tsquery(SEARCH_CONFIG, node.query)
        if node.field is None:
            return self.t.c.search_vector.op("@@")(query)
        ref = self.r.resolve(node.field)
        document = func.to_tsvector(SEARCH_CONFIG, func.coalesce(self.r.text(ref), ""))
        return func.coalesce(document.op("@@")(query), false())

    def condition(self, c: Condition) -> ColumnElement:
        ref = self.r.resolve(c.field)
        op, value = c.op, c.value
        if op == "$eq":
            return self.eq(ref, value)
        if op == "$ne":
            return self.negate(lambda: self.eq(ref, value))
        if op == "$in":
            return self.any_of(ref, value)
        if op == "$nin":
            return self.negate(lambda: self.any_of(ref, value))
        if op in RANGE_OPS:
            return self.true_only(getattr(self.r.typed(ref), RANGE_OPS[op])(value))
        if op == "$between":
            typed = self.r.typed(ref)
            lo, hi = value
            return self.true_only(and_(typed >= lo, typed <= hi))
        if op == "$contains" and ref.kind == KIND_ARRAY:
            return self.member(ref, value)
        if op in ("$contains", "$startsWith", "$endsWith"):
            pattern = _like_escape(value)
            pattern = {"$contains": f"%{pattern}%", "$startsWith": f"{pattern}%", "$endsWith": f"%{pattern}"}[op]
            return self.true_only(self.r.ilike(ref, pattern))
        if op == "$exists":
            return self.exists(ref) if value else self.negate(lambda: self.exists(ref))
        if op == "$empty":
            return self.empty(ref) if value else self.negate(lambda: self.empty(ref))
        raise AssertionError(op)  # pragma: no cover

    def eq(self, ref: FieldRef, value: Any) -> ColumnElement:
        if value is None:
            return not_(self.exists(ref))
        if ref.system:
            col = self.r.column(ref)
            if ref.kind == KIND_ARRAY:
                return col.contains([value]) if isinstance(value, str) else col == list(value)
            return col == value
        if ref.kind == KIND_ARRAY:
            if isinstance(value, str):
                return self.member(ref, value)
            return self.true_only(self.r.jsonb(ref) == cast(list(value), JSONB))
        if isinstance(value, _Json):
            return self.true_only(self.r.jsonb(ref) == cast(value.value, JSONB))
        if ref.kind == KIND_DATETIME or (ref.spec is not None and ref.spec.field_type == "currency"):
            return self.true_only(self.r.typed(ref) == value)
        # text, number, bool, date: JSONB containment (GIN), or a projection's typed column
        equal = self.r.scalar_equals(ref, value)
        return self.true_only(equal) if self.r.projected else equal

    def member(self, ref: FieldRef, value: str) -> ColumnElement:
        return self.r.member(ref, value)

    def any_of(self, ref: FieldRef, values: tuple) -> ColumnElement:
        if not values:
            return false()
        if ref.kind == KIND_ARRAY:  # overlap
            return self.r.overlap(ref, list(values))
        return or_(*(self.eq(ref, v) for v in values))

    def exists(self, ref: FieldRef) -> ColumnElement:
        if ref.system:
            return true()
        return _true_only(func.jsonb_typeof(self.r.jsonb(ref)) != "null")

    def empty(self, ref: FieldRef) -> ColumnElement:
        if ref.system:
            if ref.name == "tags":
                return func.cardinality(self.r.column(ref)) == 0
            if ref.name == "name":
                return self.r.column(ref) == ""
            return false()
        jv = self.r.jsonb(ref)
        return or_(jv.is_(None), func.jsonb_typeof(jv) == "null", jv == cast("", JSONB), jv == cast([], JSONB),
                   jv == cast({}, JSONB))


def _json_scalar(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and abs(value) < 2**63 else float(value)
    return value


def _true_only(expr: ColumnElement) -> ColumnElement:
    """NULL (missing field, other type) counts as false, so negations stay two-valued."""
    return func.coalesce(expr, false())


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _shorten(text: Any, limit: int = 64) -> str:
    text = str(text).replace("\x00", "\\0")
    return text if len(text) <= limit else text[:limit] + "…"


# --- compiled shapes --------------------------------------------------------------------------------
#
# A filter's SQL depends on its structure (fields, operators, nesting, the kind of each value), not on
# its values: those are bound parameters. `compile_request(shapes=…)` compiles a structure once and
# reuses it: the cached compilation (a template) with each value-carrying parameter mapped to the
# value of this request (`CompiledFilter.values`). Which parameter carries which value, and how (the
# value itself, `[v]`, a LIKE pattern, `{field: v}`), is found when the shape is first compiled, by
# compiling it a second time with other values: every parameter of the two compilations must either
# be the same constant in both or derive, the same way in both, from the same value; anything else
# (an unknown derivation, a shared value object, a structure that differs) leaves the shape uncached
# (compiled every time, as without `shapes`).

SHAPES_MAX = 256  # cached shapes per definition context (cleared when full)
_NO_SHAPE = object()  # a shape found not reusable


class _Unshaped(Exception):  # noqa: N818 (a signal: compile this filter every time)
    pass


class _Ambiguous(_Unshaped):
    """This request's values cannot tell the parameters apart (two equal values): try with a later one."""


def _skeleton(parsed: ParsedFilter) -> tuple[tuple, list]:
    """(the structure of `parsed`, its values in walk order): strings, numbers, instants and the texts of
    `$search` are values; None and booleans (they choose the SQL's form) are structure."""
    if parsed.similar is not None:
        raise _Unshaped
    leaves: list = []

    def value(v: Any) -> Any:
        if v is None or v is True or v is False:
            return ("=", v)
        if v.__class__ in (str, Decimal, datetime):
            leaves.append(v)
            return v.__class__.__name__
        if v.__class__ is tuple:
            return ("tuple", *(value(x) for x in v))
        raise _Unshaped  # a JSON value (_Json), or another kind

    def node(n: Any) -> tuple:
        if n.__class__ is Condition:
            return ("c", n.field, n.op, value(n.value))
        if n.__class__ is Logical:
            return ("l", n.op, *(node(c) for c in n.children))
        if n.__class__ is Negation:
            return ("n", node(n.child))
        if n.__class__ is TextSearch:
            leaves.append(n.query)
            return ("s", n.field)
        raise _Unshaped

    shape = node(parsed.root)
    search_at = None
    if parsed.search is not None:  # the text of the first top-level $search: one of the values
        search_at = next((i for i, v in enumerate(leaves) if v is parsed.search), None)
        if search_at is None:
            raise _Unshaped
    if len({id(v) for v in leaves}) != len(leaves):
        raise _Unshaped  # one object in two places (a cached one-character string): ambiguous
    return (shape, search_at), leaves


def _with_leaves(parsed: ParsedFilter, search_at: int | None, leaves: list) -> ParsedFilter:
    """`parsed` with its values (`_skeleton`'s order) replaced by `leaves`."""
    it = iter(leaves)

    def value(v: Any) -> Any:
        if v is None or v is True or v is False:
            return v
        if v.__class__ is tuple:
            return tuple(value(x) for x in v)
        return next(it)

    def node(n: Any) -> Any:
        if n.__class__ is Condition:
            return Condition(n.field, n.op, value(n.value))
        if n.__class__ is Logical:
            return Logical(n.op, tuple(node(c) for c in n.children))
        if n.__class__ is Negation:
            return Negation(node(n.child))
        return TextSearch(next(it), n.field)

    root = node(parsed.root)
    return ParsedFilter(root, None, leaves[search_at] if search_at is not None else None)


def _other(v: Any, i: int) -> Any:
    """A value of the same kind as `v` and unlike any value of the request (the second compilation)."""
    if v.__class__ is str:
        return f"{v}\x01{i}"
    if v.__class__ is Decimal:
        return v + 1_000_003 + i
    return v + timedelta(microseconds=1 + i)


def _json_scalar_of(v: Any) -> Any:
    return _json_scalar(v)


# how a parameter's value may derive from a filter value: (name, derivation); `same` is identity
_DERIVATIONS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("same", lambda v: v),
    ("list", lambda v: [v]),
    ("json", _json_scalar_of),
    ("contains", lambda v: f"%{_like_escape(v)}%" if v.__class__ is str else None),
    ("startsWith", lambda v: f"{_like_escape(v)}%" if v.__class__ is str else None),
    ("endsWith", lambda v: f"%{_like_escape(v)}" if v.__class__ is str else None),
)


def _strict_eq(a: Any, b: Any) -> bool:
    """Equal as bound values: same types throughout (1 and 1.0, or True and 1, bind differently)."""
    if a.__class__ is not b.__class__:
        return False
    if a.__class__ is dict:
        return a.keys() == b.keys() and all(_strict_eq(a[k], b[k]) for k in a)
    if a.__class__ in (list, tuple):
        return len(a) == len(b) and all(_strict_eq(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _derivation(first: Any, second: Any, leaves: list, others: list) -> tuple[int, Callable] | None:
    """(value index, derivation) such that `first` derives from `leaves[i]` and `second` from `others[i]`
    the same way (also inside a one-key object `{field: …}`, a field's JSONB containment), or None."""
    wrap = None
    if first.__class__ is dict and second.__class__ is dict and len(first) == 1 and first.keys() == second.keys():
        (wrap,) = first
        first, second = first[wrap], second[wrap]
    for i, (leaf, other) in enumerate(zip(leaves, others, strict=True)):
        for name, derive in _DERIVATIONS:
            if name == "same":
                found = first is leaf and second is other
            else:
                a, b = derive(leaf), derive(other)
                found = a is not None and _strict_eq(a, first) and _strict_eq(b, second)
            if found:
                if wrap is None:
                    return i, derive
                return i, (lambda v, derive=derive, key=wrap: {key: derive(v)})
    return None


def _bound(compiled: CompiledFilter) -> tuple[list, list]:
    """(the cache-key structure, the bound parameters) of what a query binds from a compiled filter:
    its `where` and its `rank`."""
    structure, binds = [], []
    for expr in (compiled.where, compiled.rank):
        if expr is None:
            structure.append(None)
            continue
        key = expr._generate_cache_key()
        if key is None:
            raise _Unshaped
        structure.append(key.key)
        binds.extend(key.bindparams)
    return structure, binds


def _template(parsed: ParsedFilter, search_at: int | None, leaves: list, compiled: CompiledFilter,
              ctx: FilterContext, projection: FieldResolver | None, sort_by: str | None) -> list:
    """The value-carrying parameters of `compiled` (this request's compilation of `parsed`) as
    [(parameter, value index, derivation)], from a second compilation with other values; `_Unshaped`
    when that cannot be told exactly."""
    if compiled.similar is not None or compiled.count_where is not None or compiled.distance is not None:
        raise _Unshaped
    try:
        others = [_other(v, i) for i, v in enumerate(leaves)]
        if len({(v.__class__, v) for v in (*leaves, *others)}) != 2 * len(leaves):
            raise _Ambiguous  # equal values (or one the change above did not change): which is which?
        second = _compile_parsed(_with_leaves(parsed, search_at, others), ctx, projection, sort_by, None)
    except (ValidationFailed, NotProjected, ArithmeticError, OverflowError, TypeError):
        raise _Unshaped from None
    structure, binds = _bound(compiled)
    structure_2, binds_2 = _bound(second)
    if structure != structure_2 or len(binds) != len(binds_2) or compiled.projected != second.projected:
        raise _Unshaped
    slots = []
    for bind, bind_2 in zip(binds, binds_2, strict=True):
        if bind.callable is not None or bind_2.callable is not None:
            raise _Unshaped
        found = _derivation(bind.value, bind_2.value, leaves, others)
        if found is not None:
            slots.append((bind, *found))
        elif not _strict_eq(bind.value, bind_2.value) or any(bind.value is v for v in leaves):
            raise _Unshaped  # a value the filter's values change in a way not known here
    return slots


def _compiled_shape(parsed: ParsedFilter, ctx: FilterContext, projection: FieldResolver | None,
                    sort_by: str | None, shapes: dict) -> CompiledFilter:
    """`parsed` compiled, through the cache of compiled shapes `shapes` (see above)."""
    try:
        skeleton, leaves = _skeleton(parsed)
    except _Unshaped:
        return _compile_parsed(parsed, ctx, projection, sort_by, None)
    key = (id(projection), sort_by, skeleton)
    cached = shapes.get(key)
    if cached is not None and cached is not _NO_SHAPE and cached[0] is projection:
        _, template, slots = cached
        out = copy.copy(template)  # (dataclasses.replace re-reads the fields: ~10 times the cost)
        out.values = {id(bind): (bind, derive(leaves[i])) for bind, i, derive in slots}
        return out
    compiled = _compile_parsed(parsed, ctx, projection, sort_by, None)
    if cached is _NO_SHAPE:
        return compiled
    try:
        slots = _template(parsed, skeleton[1], leaves, compiled, ctx, projection, sort_by)
    except _Ambiguous:
        return compiled  # not decided: a later request of this shape tries again
    except _Unshaped:
        entry: Any = _NO_SHAPE
    else:
        entry = (projection, compiled, slots)
    if len(shapes) >= SHAPES_MAX:
        shapes.clear()
    shapes[key] = entry
    return compiled

