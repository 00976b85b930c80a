"""Typed projection of a big definition: a narrow table of real columns, what a hand-indexed typed table has.

Per-definition expression indexes (app.entities.indexes) answer ranges, sorts and substring matches,
but an exact count over many matches still visits the heap page of every match in the wide JSONB
table: PostgreSQL cannot use an expression index over `fields` in an index-only scan. So a definition
that gets its own indexes also gets a projection table `erp_<definition key>_<plan digest>` in the
product schema:

- one row per ACTIVE record of the definition: `id` (PK), `name`, `created_at`, `updated_at`,
  `version`, `tags`, `search_vector`, and one typed column per scalar field of the schema (numbers `numeric`,
  dates `text COLLATE "C"`, datetimes `timestamptz`, booleans `boolean`, short text `text COLLATE "C"`
  holding string values plus a second, normally NULL, column holding the text of a non-string value
  so that `fields ->> name` is reproduced exactly, and, but for dropdowns, a third one holding
  `lower(fields ->> name)`: a substring match (`$contains`/`$startsWith`/`$endsWith`, an ILIKE on
  entity_records) is `folded LIKE lower(pattern)` here, which is what PostgreSQL's ILIKE computes,
  without lowering every candidate row again). Every value is computed by the filter compiler's
  own `FieldResolver` expressions (rendered here with the values inlined), so a column holds exactly
  what the compiler's typed expression evaluates to (invalid/missing → NULL): results cannot change;
  and one `text[]` column per list field (multiselect, multilookup, JSON array of strings): the string
  elements of the value when it is a JSON array, `{}` otherwise (`list_elements`), on which the
  compiler's `fields @> {name: [v]}` is exactly `column @> ARRAY[v]` (has / `$contains`) and its OR of
  those `column && ARRAY[…]` (`$in`); `$nin`/`$ne`/`$not` negate them (never NULL);
- b-trees per column (dates `DESC NULLS LAST`; those of numbers and dates INCLUDE the list columns, so
  a range with a list membership is counted index-only; `(created_at, id)` for the default order), except
  booleans and dropdowns, which share one b-tree (fewest values first: equality on any subset of them
  is an index-only scan, with PostgreSQL 18's skip scan over the columns left out), each dropdown not
  first in it also with a plain b-tree of its own (its equality alone counted from one range); pg_trgm GIN on
  the folded short text (whose statistics target is raised: `FOLDED_STATISTICS`); GIN on the tsvector,
  on `tags` and on each list column;
- a substring table per folded field (`SideTable`, the first SIDE_TABLES_MAX by field name):
  `ers_<projection>_<column digest>` holding `(id, folded column)` of every projection row, with its own
  trigram GIN. A trigram match is always rechecked on the row, and a count of substring matches on one
  field (`$contains`/`$startsWith`/`$endsWith`, alone or in AND/OR/NOT of that field) rechecks them on
  these ~90-byte rows instead of the projection's wide ones (`ProjectionResolver.count_source`): fewer
  pages and less memory per match. The page keeps reading the projection;
- all of them kept exact in the writer's own transaction by ONE set of statement-level AFTER triggers with
  transition tables per product schema (`erp_dispatch_i/_u/_d` on `entity_records`, present while the
  schema has a projection) running one generated function: one pass over the statement's rows finds
  the definitions with a projection among them (the registry `entity_projections`, migration p0002,
  holds each projection's maintenance statements), then only their upserts/deletes run. Set-based, so
  a bulk create costs one INSERT … SELECT more, not a trigger call per row; a statement on other
  definitions' records costs that one pass, whatever the number of projections.

Build (the index task, never a request): create table + registration (dispatcher rewritten, under a
SHARE ROW EXCLUSIVE lock on entity_records: the commit waits for writers in flight, every later write
statement runs the new dispatcher) in one short transaction, then backfill in
batches of `BACKFILL_BATCH` records (creation order) with `SELECT … FOR SHARE` (a row a concurrent transaction updates,
deactivates or deletes is waited for and re-read at its latest version, so the backfill never
resurrects an old version) and `ON CONFLICT DO NOTHING` (a trigger already wrote a newer one), then
the indexes, VACUUM ANALYZE (visibility map: index-only counts), and finally
`entity_definitions.projection = <table>` under the definition's row lock, only if the table's plan
is still the one of the current schema. Indexes of plain columns added to the plans later (which
change no answer) are not in the table's name: a complete table that lacks one gets it from the next
sync (`_add_indexes`, concurrently), and stays in use meanwhile; so does its autovacuum setting
(`AUTOVACUUM`: after 2 % of its rows changed, so that counts stay index-only after bulk writes).
A schema change whose plan differs clears `projection` in the same transaction (queries fall back at
once) and the task builds the new table and drops the old; a deactivated or deleted definition loses it.

Queries (app.entities.query) compile against the projection through `ProjectionResolver` (a
`FieldResolver` over the projection's columns) when every field the filter and sort mention is
projected and every operator has a column form; anything else (`$exists`, `$empty`, equality with
null, equality of a list field with a whole list, JSON/long-text fields, `is_active`, sorting by a
boolean or a list, `$similar`) raises
`NotProjected` and the request compiles against `entity_records` as before, narrowed by the
top-level AND terms the projection does answer (`id IN (SELECT id FROM <projection> WHERE …)`).
A `$similar` page reads entity_records and the vectors, but its exact count with a filter the projection
answers is counted here: `embedded_current` (v0003's stamp when of the record's version; last in the
enum b-tree, INCLUDEd by the per-field b-trees) equal to the definition's config_hash (index-only).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Boolean, Column, Integer, MetaData, Numeric, Table, Text, case, cast, func, literal, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY, TIMESTAMP, TSVECTOR
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from app.db import PRODUCT_PLACEHOLDER
from app.entities.fieldtypes import (
    KIND_ARRAY,
    KIND_BOOL,
    KIND_DATE,
    KIND_DATETIME,
    KIND_NUMBER,
    KIND_TEXT,
    FieldCatalog,
    compile_definition_schema,
)
from app.entities.filters import FieldRef, FieldResolver, NotProjected
from app.entities.similar import CURRENT_VECTOR  # = embedded_hash when embedded_version = version, else NULL
from app.reqctx import app_or_none

log = logging.getLogger(__name__)
PREFIX = "erp_"
# substring tables (`SideTable`): `ers_<projection name without its prefix>_<folded column digest>`
SIDE_PREFIX = "ers_"
SIDE_TABLES_MAX = 8  # folded fields of a definition that get one (the first by field name): the default of
# ENTITY_SUBSTRING_TABLES, which the app's config sets (`_side_tables_max`)
_DIALECT = postgresql.dialect()
LONG_TEXT = ("text", "stringMultiline")
BACKFILL_BATCH = 5000
ENUM_INDEX_COLUMNS = 8  # booleans and dropdowns in the shared b-tree (the rest get one each)
LIST_INCLUDE = 4  # list columns INCLUDEd by each range b-tree (numbers, dates, datetimes)
# ANALYZE's statistics target of the folded text columns (PostgreSQL's default: 100). The planner
# estimates a substring match (`LIKE '%…%'`) by the share of the column's histogram entries it matches,
# floored at 0.01 %: with 100 entries a term in 1 % of the rows is estimated at 10 rows one ANALYZE in
# three (no entry matched), and the page then reads and sorts every match instead of walking the sort
# order's b-tree (measured: 1.5 ms more of PostgreSQL CPU for 1 000 matches of 100 000). 300 entries:
# that estimate is off by more than 2× one ANALYZE in twenty, for ~0.15 ms more planning of a substring
# match (each entry is matched while planning; other conditions do not read this histogram). Set when
# the table is created (`install`); migration p0003 set it on the tables built before.
FOLDED_STATISTICS = 300
# autovacuum of a projection table after 2 % of its rows were inserted or changed (PostgreSQL's
# defaults: 20 %): an index-only count reads the heap for every match on a page a write made not
# all-visible, until a VACUUM sets it again (measured: `status = open` over 100 000 rows after 5 000
# inserts, 1 014 heap fetches, 0.72 → 0.84 ms of backend CPU; the default thresholds would wait for
# 21 000). Set when the table is created (`install`); the sync sets it on tables built before.
AUTOVACUUM = (("autovacuum_vacuum_insert_scale_factor", "0.02"), ("autovacuum_vacuum_scale_factor", "0.02"))
SYSTEM = {"id": "text", "name": "text", "created_at": "timestamptz", "updated_at": "timestamptz",
          "version": "integer", "tags": "text[]"}
LIST = "text[]"
_SA_TYPES = {"text": Text, 'text COLLATE "C"': Text, "numeric": Numeric, "timestamptz": TIMESTAMP(timezone=True),
             "boolean": Boolean, "integer": Integer, "tsvector": TSVECTOR, "text[]": ARRAY(Text)}


def definition_key(definition_id: str) -> str:
    return hashlib.sha256(definition_id.encode()).hexdigest()[:12]


def _digest(text_: str, n: int = 10) -> str:
    return hashlib.sha256(text_.encode()).hexdigest()[:n]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class ProjectedField:
    field: str
    kind: str
    column: str              # the typed value
    other: str | None = None  # short text: the text of a non-string value (normally NULL)
    folded: str | None = None  # short text but dropdowns: lower(`fields ->> name`), for substring matches


@dataclass(frozen=True)
class SideTable:
    """A substring table of a projection: `(id, <folded column>)` for every row of the projection, with
    the folded column's trigram GIN. An exact count of substring matches on that one field reads it
    instead of the projection: the GIN's candidates are rechecked on its ~90-byte rows, not on the
    projection's ~550-byte ones (fewer pages, less memory touched per match)."""
    name: str
    folded: str                       # the folded column, named as in the projection
    expr: str                         # its SQL expression over an entity_records row (the projection's)
    index: tuple[str, str]            # (index name, "USING gin (…)")
    table: Table = field(compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class Plan:
    definition_id: str
    name: str
    fields: tuple[ProjectedField, ...]
    columns: tuple[tuple[str, str, str], ...]   # (column, SQL type, SQL expression over an entity_records row)
    indexes: tuple[tuple[str, str], ...]         # (index name, "USING … (…)")
    table: Table = field(compare=False, hash=False, repr=False)
    sides: tuple[SideTable, ...] = ()            # the substring tables (`SideTable`)

    def field(self, name: str) -> ProjectedField | None:
        return next((f for f in self.fields if f.field == name), None)


def _sql(expr) -> str:
    """The expression exactly as the filter compiler sends it, with the bound values inlined (the DDL
    of the projection's columns and of the per-definition indexes: PostgreSQL matches queries to them)."""
    return str(expr.compile(dialect=_DIALECT, compile_kwargs={"literal_binds": True, "include_table": False}))


def list_elements(jsonb_sql: str) -> str:
    """A list field's column: the string elements of the JSON array, `{}` for anything else (missing,
    null, a scalar, an object; never NULL). The compiler's `fields @> {name: [v]}` is true exactly when
    the value is an array with the string `v` among its direct elements (numbers, nulls, nested arrays
    and objects never equal a string; duplicates and order do not matter; strings compare byte for
    byte, case included), which is `column @> ARRAY[v]`; any of several is `column && ARRAY[…]`."""
    return (f"ARRAY(SELECT e.v #>> '{{}}' FROM jsonb_array_elements(CASE WHEN jsonb_typeof({jsonb_sql}) = 'array' "
            f"THEN {jsonb_sql} END) AS e(v) WHERE jsonb_typeof(e.v) = 'string')")


def _side_tables_max() -> int:
    """ENTITY_SUBSTRING_TABLES of the app in context (SIDE_TABLES_MAX without one). Read on every query
    (`_planned`), so through the context variable, not the `current_app` proxy (app.reqctx)."""
    app = app_or_none()
    if app is None:
        return SIDE_TABLES_MAX
    return max(0, int(app.config.get("ENTITY_SUBSTRING_TABLES", SIDE_TABLES_MAX)))


def plan_projection(definition_id: str, catalog: FieldCatalog, side_tables: int | None = None) -> Plan:
    """The projection table a definition with this schema gets (pure: no session). `side_tables`: at most
    this many substring tables (None: the app's ENTITY_SUBSTRING_TABLES)."""
    side_tables = _side_tables_max() if side_tables is None else side_tables
    source = FieldResolver(catalog)
    columns: list[tuple[str, str, str]] = [(name, kind, name) for name, kind in SYSTEM.items()]
    columns.append(("search_vector", "tsvector", "search_vector"))
    # which vector the record has, when it is of the record's current version (v0003's stamp): a
    # `$similar` + filter is counted here, index-only (the shared enum b-tree ends with it)
    columns.append((CURRENT_VECTOR, 'text COLLATE "C"',
                    "CASE WHEN embedded_version = version THEN embedded_hash END"))
    fields: list[ProjectedField] = []
    for name, spec in sorted(catalog.fields.items()):
        ref = source.resolve(name)
        if ref.system:
            continue
        projected = _field_columns(source, ref, spec)
        if projected is not None:  # long text, JSON, files: not projected (queries on them fall back)
            columns.extend(projected[1])
            fields.append(projected[0])

    def table_named(name: str) -> Table:
        return Table(name, MetaData(schema=PRODUCT_PLACEHOLDER),
                     *(Column(c, _SA_TYPES[t], primary_key=c == "id") for c, t, _ in columns))

    wanted, added = _wanted_indexes(catalog, fields, ProjectionResolver(catalog, table_named("draft"),
                                                                        {f.field: f for f in fields}))
    folded = [f for f in fields if f.folded is not None][:side_tables]
    # the name changes with the columns, the indexes (but the added ones) or the substring tables:
    # another plan is another table, built anew
    digested = repr(columns) + repr(wanted) + (repr(("sides", [f.folded for f in folded])) if folded else "")
    table_name = f"{PREFIX}{definition_key(definition_id)}_{_digest(digested)}"
    indexes = tuple((f"{table_name}_{_digest(w, 8)}", w) for w in [*wanted, *added])
    expressions = {c: e for c, _, e in columns}
    sides = tuple(_side_table(table_name, f.folded, expressions[f.folded]) for f in folded)
    return Plan(definition_id, table_name, tuple(fields), tuple(columns), indexes, table_named(table_name), sides)


def _side_table(table_name: str, folded: str, expr: str) -> SideTable:
    name = f"{SIDE_PREFIX}{table_name[len(PREFIX):]}_{_digest(folded, 6)}"
    body = f"USING gin ({folded} public.gin_trgm_ops)"
    table = Table(name, MetaData(schema=PRODUCT_PLACEHOLDER), Column("id", Text, primary_key=True),
                  Column(folded, Text))
    return SideTable(name, folded, expr, (f"{name}_{_digest(body, 8)}", body), table)


# kind → the SQL type of its column (booleans and short text: below)
_TYPED_COLUMNS = {KIND_NUMBER: "numeric", KIND_DATE: 'text COLLATE "C"', KIND_DATETIME: "timestamptz"}


def _field_columns(source: FieldResolver, ref: FieldRef, spec) -> tuple[ProjectedField, list] | None:
    """A field's projected columns (column, SQL type, SQL expression), or None when it is not projected."""
    column = f"f_{_digest(ref.name)}"
    if spec.kind in _TYPED_COLUMNS:
        return ProjectedField(ref.name, spec.kind, column), [(column, _TYPED_COLUMNS[spec.kind],
                                                              _sql(source.typed(ref)))]
    if spec.kind == KIND_BOOL:
        jv = source.jsonb(ref)
        return ProjectedField(ref.name, spec.kind, column), [
            (column, "boolean", _sql(case((func.jsonb_typeof(jv) == "boolean", cast(jv, Boolean)), else_=None)))]
    if spec.kind == KIND_TEXT and spec.field_type not in LONG_TEXT:
        jv, jt = source.jsonb(ref), source.text(ref)
        other = f"o_{_digest(ref.name)}"
        columns = [(column, 'text COLLATE "C"', _sql(source.typed(ref))),
                   (other, 'text COLLATE "C"', _sql(case((func.jsonb_typeof(jv) != "string", jt), else_=None)))]
        if spec.field_type == "dropdown":  # few values, no trigram index: ILIKE on the text as it is
            return ProjectedField(ref.name, spec.kind, column, other), columns
        # `x ILIKE p` is `lower(x) LIKE lower(p)` (PostgreSQL lowers both, in the expression's
        # collation, then matches byte for byte): stored lowered once, a substring match costs a LIKE
        # per candidate row instead of two lower() calls and the ILIKE (its trigram GIN is on it)
        folded = f"l_{_digest(ref.name)}"
        columns.append((folded, "text", _sql(func.lower(jt))))
        return ProjectedField(ref.name, spec.kind, column, other, folded), columns
    if spec.kind == KIND_ARRAY:
        return ProjectedField(ref.name, spec.kind, column), [(column, LIST, list_elements(_sql(source.jsonb(ref))))]
    return None


def _wanted_indexes(catalog: FieldCatalog, fields: list[ProjectedField],
                    target: ProjectionResolver) -> tuple[list[str], list[str]]:
    """The projection's indexes ("USING … (…)"), over `target` (a resolver of the draft table): those its
    table's name is digested from, and those added to a table already built (`added`: indexes of plain
    columns, which change no answer; `sync_projection` creates them on the existing table, no rebuild)."""
    wanted: list[str] = ["USING btree (created_at, id)", "USING gin (search_vector)", "USING gin (tags)"]
    # Few-valued fields (booleans, dropdowns) share one b-tree, fewest values first: equalities on any
    # of them are answered from that index alone (index-only; PostgreSQL 18 skips over the leading
    # columns a filter leaves out), where one index per field would need a BitmapAnd and heap visits.
    enums = sorted((f for f in fields if f.kind == KIND_BOOL or catalog.get(f.field).field_type == "dropdown"),
                   key=lambda f: (2 if f.kind == KIND_BOOL else max(len(catalog.get(f.field).options), 2), f.column))
    enums = enums[:ENUM_INDEX_COLUMNS]
    if enums:
        wanted.append(f"USING btree ({', '.join(f.column for f in enums)}, {CURRENT_VECTOR})")
    # … and each dropdown after the first column gets a b-tree of its own (deduplicated: a few pages):
    # an equality on it alone, the common filter, is counted from its one range of entries rather
    # than by skipping over the shared b-tree's leading columns and reading its wider tuples (measured:
    # `status = open`, 19 907 of 100 000 records: 0.91 → 0.71 ms of PostgreSQL CPU for the count)
    added = [f"USING btree ({f.column})" for f in enums[1:] if f.kind != KIND_BOOL]
    # the list columns ride along in the range b-trees (numbers, dates), so that a range and a list
    # membership (`amount` in [a, b) and `labels` has v) are counted index-only, the membership checked
    # on the index tuples: 2.8 → 0.8 ms of PostgreSQL CPU for such a count over 100 000 records
    lists = [f.column for f in fields if f.kind == KIND_ARRAY][:LIST_INCLUDE]
    for f in fields:
        if f not in enums:
            wanted.append(_field_index(f, lists))
        if f.folded is not None:
            wanted.append(f"USING gin ({f.folded} public.gin_trgm_ops)")
    return wanted, added


def _field_index(f: ProjectedField, lists: list[str]) -> str:
    if f.kind == KIND_ARRAY:
        return f"USING gin ({f.column})"  # @> (has), && (any of)
    if f.kind in (KIND_DATE, KIND_DATETIME):
        return f"USING btree ({f.column} DESC NULLS LAST) INCLUDE ({', '.join([CURRENT_VECTOR, *lists])})"
    if f.kind == KIND_NUMBER:
        return f"USING btree ({f.column}) INCLUDE ({', '.join([CURRENT_VECTOR, *lists])})"
    return f"USING btree ({f.column}) INCLUDE ({CURRENT_VECTOR})"


# (definition id, id(catalog), substring tables) → (catalog, plan, its resolver). compile_definition_schema
# returns one FieldCatalog object per schema text (cached), so a query finds its plan by that object: no
# serialisation of the schema per query; the entry holds the catalog, so its id cannot be reused
_PLANNED: dict[tuple[str, int, int], tuple[FieldCatalog, Plan, ProjectionResolver]] = {}
_PLANNED_MAX = 512


def _planned(definition_id: str, catalog: FieldCatalog) -> tuple[Plan, ProjectionResolver]:
    sides = _side_tables_max()
    hit = _PLANNED.get((definition_id, id(catalog), sides))
    if hit is None or hit[0] is not catalog:
        plan = plan_projection(definition_id, catalog, sides)
        hit = (catalog, plan, ProjectionResolver(catalog, plan.table, {f.field: f for f in plan.fields},
                                                 {s.folded: s.table for s in plan.sides}))
        if len(_PLANNED) >= _PLANNED_MAX:
            _PLANNED.clear()
        _PLANNED[(definition_id, id(catalog), sides)] = hit
    return hit[1], hit[2]


def plan_for(definition, catalog: FieldCatalog | None = None) -> Plan:
    """The plan of the definition's current schema (`catalog`: its compiled catalog, else compiled here)."""
    return _planned(definition.id, catalog if catalog is not None else _catalog(definition))[0]


class ProjectionResolver(FieldResolver):
    """`FieldResolver` over a projection table: the same typed values, as real columns."""

    projected = True

    def __init__(self, catalog: FieldCatalog, table: Table, fields: dict[str, ProjectedField],
                 sides: dict[str, Table] | None = None):
        super().__init__(catalog, table)
        self.fields = fields
        self.sides = sides or {}  # folded column → its substring table (`SideTable.table`)
        self._counted: dict[int, tuple[ColumnElement, Table | None, ColumnElement | None]] = {}

    def count_source(self, where: ColumnElement) -> tuple[Table, ColumnElement]:
        """The table an exact count of `where` (over the projection) reads, and `where` over it: the
        substring table of a folded column when `where` reads that column alone (a substring match on
        one field, or any AND/OR/NOT of such matches on it), else the projection and `where` as it is.
        The substring table holds the projection's rows with the same folded values, so the count is
        the same. `where` keeps its bound parameters (the very objects: a reused filter shape binds
        this request's values to them); the answer is remembered per `where` object (a compiled
        shape's is reused by every request of that shape)."""
        hit = self._counted.get(id(where))
        if hit is None or hit[0] is not where:
            side, over = _over_side(where, self.t, self.sides)
            if len(self._counted) >= _COUNTED_MAX:
                self._counted.clear()
            hit = self._counted[id(where)] = (where, side, over)
        return (self.t, where) if hit[1] is None else (hit[1], hit[2])

    def resolve(self, name: Any, path: str = "field") -> FieldRef:
        ref = super().resolve(name, path)
        if (ref.system and ref.name not in SYSTEM) or (not ref.system and ref.name not in self.fields):
            raise NotProjected(ref.name)
        return ref

    def jsonb(self, ref: FieldRef) -> ColumnElement:
        raise NotProjected(f"{ref.name}: JSON value")  # $exists, $empty, = null, sort by a boolean

    def text(self, ref: FieldRef) -> ColumnElement:
        if ref.system:
            return self.t.c[ref.name]
        f = self.fields[ref.name]
        if f.other is None:
            raise NotProjected(f"{ref.name}: text of a {ref.kind}")
        # = `fields ->> name` (default collation: ILIKE folds case as it does there)
        return func.coalesce(self.t.c[f.column], self.t.c[f.other]).collate("default")

    def typed(self, ref: FieldRef) -> ColumnElement:
        if ref.system:
            return super().typed(ref)
        return self.t.c[self.fields[ref.name].column]

    def scalar_equals(self, ref: FieldRef, value: Any) -> ColumnElement:
        return self.typed(ref) == value  # NULL when missing/other type: the compiler makes it false

    def ilike(self, ref: FieldRef, pattern: str) -> ColumnElement:
        f = None if ref.system else self.fields[ref.name]
        if f is None or f.folded is None:
            return super().ilike(ref, pattern)
        # the stored lower(`fields ->> name`) against lower(pattern): what ILIKE computes (its trigram GIN)
        return self.t.c[f.folded].like(func.lower(literal(pattern, Text)), escape="\\")

    def member(self, ref: FieldRef, value: str) -> ColumnElement:
        if ref.system:
            return super().member(ref, value)
        return self.t.c[self.fields[ref.name].column].contains([value])  # the list's GIN

    def overlap(self, ref: FieldRef, values: list[str]) -> ColumnElement:
        if ref.system:
            return super().overlap(ref, values)
        return self.t.c[self.fields[ref.name].column].overlap(values)


_COUNTED_MAX = 256  # `where` objects a resolver remembers the count source of


def _over_side(where: ColumnElement, table: Table,
               sides: dict[str, Table]) -> tuple[Table | None, ColumnElement | None]:
    """(the substring table, `where` over it) when every column `where` reads is the one folded column
    of a substring table, else (None, None)."""
    if not sides:
        return None, None
    columns = {id(c): c for c in visitors.iterate(where) if isinstance(c, Column)}
    names = {c.name for c in columns.values() if c.table is table}
    if len(names) != 1 or len(names) != len(columns) or next(iter(names)) not in sides:
        return None, None
    side = sides[next(iter(names))]

    def swap(element):
        if isinstance(element, Column) and element.table is table:
            return side.c[element.name]
        if isinstance(element, BindParameter):
            return element  # the same object: its value is bound by identity
        return None

    return side, visitors.replacement_traverse(where, {}, swap)


def resolver_for(definition, catalog: FieldCatalog) -> ProjectionResolver | None:
    """The resolver of the definition's READY projection, or None (none, or not of this schema).
    `catalog`: the compiled catalog of the definition's schema (the resolver is cached with the plan:
    it holds no state of a query)."""
    if not getattr(definition, "projection", None):
        return None
    plan, resolver = _planned(definition.id, catalog)
    return resolver if plan.name == definition.projection else None


# --- DDL and the build ------------------------------------------------------------------------------

def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


REGISTRY = "entity_projections"  # migration p0002: the projections the dispatcher maintains
DISPATCH = "erp_dispatch"  # the product schema's one trigger function; its triggers `erp_dispatch_i/_u/_d`


def _maintenance(schema: str, plan: Plan) -> tuple[str, str, str]:
    """The statements that keep `plan`'s table (and its substring tables) exact after an INSERT / UPDATE /
    DELETE statement on entity_records, over its transition tables `new_rows` / `old_rows`.

    An INSERT's rows are new records: their ids are in none of these tables (a backfill copies only
    committed records, and a record's trigger runs before its commit; a hard delete removed its rows),
    so they are inserted plainly: `ON CONFLICT` costs a speculative insertion per row (measured, a
    5 000-record insert into entity_records with two substring tables, median of 10, vacuumed between:
    815 ms of PostgreSQL CPU with upserts, 678 with plain inserts; 712 for the projection alone). An
    UPDATE's rows may be new to them (a record reactivated or moved here): an upsert."""
    q = _quote(schema)
    table = f"{q}.{plan.name}"
    names = ", ".join(c for c, _, _ in plan.columns)
    exprs = ", ".join(e for _, _, e in plan.columns)
    changed = ", ".join(f"{c} = EXCLUDED.{c}" for c, _, _ in plan.columns if c != "id")
    mine = f"entity_id = {_literal(plan.definition_id)} AND is_active IS TRUE"
    insert = f"INSERT INTO {table} ({names}) SELECT {exprs} FROM new_rows WHERE {mine}"
    upsert = (f"{insert} ON CONFLICT (id) DO UPDATE SET {changed} "
              f"WHERE ({', '.join(f'{plan.name}.{c}' for c, _, _ in plan.columns)}) IS DISTINCT FROM "
              f"({', '.join(f'EXCLUDED.{c}' for c, _, _ in plan.columns)})")
    gone = f"NOT (n.{mine.replace(' AND ', ' AND n.')})"
    update = f"DELETE FROM {table} p USING new_rows n WHERE p.id = n.id AND {gone};\n    {upsert}"
    delete = f"DELETE FROM {table} p USING old_rows o WHERE p.id = o.id"
    for side in plan.sides:  # the substring tables: the same rows, their one column
        st, c = f"{q}.{side.name}", side.folded
        side_insert = f"INSERT INTO {st} (id, {c}) SELECT id, {side.expr} FROM new_rows WHERE {mine}"
        side_upsert = (f"{side_insert} ON CONFLICT (id) DO UPDATE SET {c} = EXCLUDED.{c} "
                       f"WHERE {side.name}.{c} IS DISTINCT FROM EXCLUDED.{c}")
        insert += f";\n    {side_insert}"
        update += f";\n    DELETE FROM {st} p USING new_rows n WHERE p.id = n.id AND {gone};\n    {side_upsert}"
        delete += f";\n    DELETE FROM {st} p USING old_rows o WHERE p.id = o.id"
    return insert, update, delete


def _dispatcher(schema: str, entries: list) -> str:
    """The schema's trigger function: which registered definitions the statement's rows belong to (one
    pass over the transition rows, filtered by a hashed IN list), then the maintenance of each of
    those definitions' projections. A statement on other definitions' records does that one pass."""
    q = _quote(schema)
    ids = ", ".join(sorted({_literal(e.definition_id) for e in entries}))
    blocks = {op: "\n".join(f"    IF {_literal(e.definition_id)} = ANY(touched) THEN\n    {getattr(e, op)};\n"
                             f"    END IF;" for e in entries) for op in ("on_insert", "on_update", "on_delete")}
    return f"""CREATE OR REPLACE FUNCTION {q}.{DISPATCH}() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
  touched text[];
BEGIN
  IF TG_OP = 'INSERT' THEN
    SELECT array_agg(DISTINCT entity_id) INTO touched FROM new_rows WHERE entity_id IN ({ids});
  ELSIF TG_OP = 'UPDATE' THEN  -- old_rows too: a record moved to another definition leaves this one
    SELECT array_agg(DISTINCT entity_id) INTO touched FROM (SELECT entity_id FROM new_rows UNION ALL
      SELECT entity_id FROM old_rows) r WHERE entity_id IN ({ids});
  ELSE
    SELECT array_agg(DISTINCT entity_id) INTO touched FROM old_rows WHERE entity_id IN ({ids});
  END IF;
  IF touched IS NULL THEN
    RETURN NULL;
  END IF;
  IF TG_OP = 'INSERT' THEN
{blocks["on_insert"]}
  ELSIF TG_OP = 'UPDATE' THEN
{blocks["on_update"]}
  ELSE
{blocks["on_delete"]}
  END IF;
  RETURN NULL;
END
$fn$"""


def _dispatch(conn: Connection, schema: str, *, add: Plan | None = None, remove: str | None = None) -> None:
    """Register `add` / unregister `remove` and rewrite the schema's dispatcher to match the registry,
    in the caller's transaction: one writer of the dispatcher at a time (a transaction-level advisory
    lock per schema), and a SHARE ROW EXCLUSIVE lock on entity_records (what CREATE TRIGGER took) so
    the commit waits for writers in flight: each later write statement runs the new dispatcher (a
    statement that ran the old one has committed before, so a backfill that starts after this sees
    its rows). Readers are not blocked. The triggers exist only while the schema has projections
    (no projection: writes capture no transition rows); creating or dropping them is the only DDL
    on entity_records, once per schema."""
    q = _quote(schema)
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": f"entity-projections:{schema}"})
    conn.execute(text(f"LOCK TABLE {q}.entity_records IN SHARE ROW EXCLUSIVE MODE"))
    if remove is not None:
        conn.execute(text(f"DELETE FROM {q}.{REGISTRY} WHERE name = :n"), {"n": remove})
    if add is not None:
        on_insert, on_update, on_delete = _maintenance(schema, add)
        conn.execute(text(f"INSERT INTO {q}.{REGISTRY} (name, definition_id, on_insert, on_update, on_delete) "
                          "VALUES (:n, :d, :i, :u, :x) ON CONFLICT (name) DO UPDATE SET "
                          "on_insert = EXCLUDED.on_insert, on_update = EXCLUDED.on_update, "
                          "on_delete = EXCLUDED.on_delete"),
                     {"n": add.name, "d": add.definition_id, "i": on_insert, "u": on_update, "x": on_delete})
    entries = conn.execute(text(f"SELECT name, definition_id, on_insert, on_update, on_delete FROM {q}.{REGISTRY} "
                                "ORDER BY name")).all()
    have = set(conn.scalars(text(
        "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = :schema AND c.relname = 'entity_records' "
        "AND t.tgname LIKE :p"), {"schema": schema, "p": f"{DISPATCH}\\_%"}))
    if entries:
        conn.execute(text(_dispatcher(schema, entries)))
        for suffix, event, ref in (("i", "INSERT", "NEW TABLE AS new_rows"),
                                   ("u", "UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
                                   ("d", "DELETE", "OLD TABLE AS old_rows")):
            if f"{DISPATCH}_{suffix}" not in have:
                conn.execute(text(f"CREATE TRIGGER {DISPATCH}_{suffix} AFTER {event} ON {q}.entity_records "
                                  f"REFERENCING {ref} FOR EACH STATEMENT EXECUTE FUNCTION {q}.{DISPATCH}()"))
    else:
        for name in sorted(have):  # the last projection of the schema is gone
            conn.execute(text(f"DROP TRIGGER IF EXISTS {name} ON {q}.entity_records"))
        conn.execute(text(f"DROP FUNCTION IF EXISTS {q}.{DISPATCH}()"))


def install(conn: Connection, schema: str, plan: Plan) -> None:
    """Table and its registration with the schema's dispatcher, in the caller's transaction (writers
    from its commit on maintain it)."""
    q = _quote(schema)
    cols = ", ".join(f"{c} {t}{' PRIMARY KEY' if c == 'id' else ''}" for c, t, _ in plan.columns)
    conn.execute(text(f"CREATE TABLE IF NOT EXISTS {q}.{plan.name} ({cols}) WITH ({_AUTOVACUUM_SQL})"))
    folded = [f.folded for f in plan.fields if f.folded is not None]
    if folded:
        conn.execute(text(f"ALTER TABLE {q}.{plan.name} " + ", ".join(
            f"ALTER COLUMN {c} SET STATISTICS {FOLDED_STATISTICS}" for c in folded)))
    for side in plan.sides:
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS {q}.{side.name} (id text PRIMARY KEY, {side.folded} text) "
                          f"WITH ({_AUTOVACUUM_SQL})"))
        conn.execute(text(f"ALTER TABLE {q}.{side.name} ALTER COLUMN {side.folded} SET STATISTICS {FOLDED_STATISTICS}"))
    _dispatch(conn, schema, add=plan)


def backfill(engine, schema: str, plan: Plan, *, batch: int = BACKFILL_BATCH) -> int:
    """Copy the definition's active records, `batch` per transaction, in creation order (the table's
    physical order then follows `created_at`, as later inserts do: the default listing reads few
    pages). FOR SHARE waits for a concurrent writer of a row and re-reads its latest version, so a
    record deactivated or deleted meanwhile is skipped; ON CONFLICT keeps what a trigger already wrote
    (a newer version)."""
    q = _quote(schema)
    names = ", ".join(c for c, _, _ in plan.columns)
    exprs = ", ".join(e for _, _, e in plan.columns)
    with engine.connect() as conn:
        org = conn.scalar(text(f"SELECT org_id FROM {q}.entity_definitions WHERE id = :d"), {"d": plan.definition_id})
    if org is None:
        return 0
    scope = "org_id = :org AND entity_id = :d AND is_active IS TRUE"
    after, total = None, 0
    while True:
        with engine.begin() as conn:
            params = {"org": org, "d": plan.definition_id, "n": batch}
            where = scope + " AND created_at IS NOT NULL"
            if after is not None:
                where += " AND (created_at, id) > (:c, :i)"
                params.update(c=after[0], i=after[1])
            keys = conn.execute(text(f"SELECT created_at, id FROM {q}.entity_records WHERE {where} "
                                     "ORDER BY created_at, id LIMIT :n"), params).all()
            ids = [k.id for k in keys]
            if not ids:  # last: records without created_at (none are written so; for completeness)
                ids = list(conn.scalars(text(f"SELECT id FROM {q}.entity_records WHERE {scope} "
                                             "AND created_at IS NULL"), params))
            if ids:
                conn.execute(text(
                    f"INSERT INTO {q}.{plan.name} ({names}) SELECT {exprs} FROM (SELECT * FROM {q}.entity_records "
                    f"WHERE id = ANY(:ids) AND {scope} ORDER BY created_at, id FOR SHARE) r "
                    f"ON CONFLICT (id) DO NOTHING"), {**params, "ids": ids})
                for side in plan.sides:  # from the rows just written (or a trigger's newer ones), locked
                    conn.execute(text(  # by FOR SHARE until this commits
                        f"INSERT INTO {q}.{side.name} (id, {side.folded}) SELECT id, {side.folded} "
                        f"FROM {q}.{plan.name} WHERE id = ANY(:ids) ON CONFLICT (id) DO NOTHING"), {"ids": ids})
            total += len(ids)
            if not keys:
                return total
            after = tuple(keys[-1])


def create_indexes(conn: Connection, schema: str, plan: Plan, *, concurrently: bool = True) -> None:
    """The projection's indexes. Concurrently (off the request path): a plain CREATE INDEX holds a SHARE
    lock on the table, and the triggers write it for every statement on entity_records, so every
    tenant's writes would wait for the whole build. An interrupted concurrent build leaves the table
    without its COMPLETE mark, and the next sync starts over."""
    q = _quote(schema)
    word = "CONCURRENTLY " if concurrently else ""
    for name, body in plan.indexes:
        conn.execute(text(f"CREATE INDEX {word}IF NOT EXISTS {name} ON {q}.{plan.name} {body}"))
    for side in plan.sides:
        name, body = side.index
        conn.execute(text(f"CREATE INDEX {word}IF NOT EXISTS {name} ON {q}.{side.name} {body}"))


def _add_indexes(conn: Connection, schema: str, plan: Plan, *, concurrently: bool = True) -> list[str]:
    """The plan's indexes a complete table lacks (added to the plan after the table was built: those
    its name is not digested from, `_wanted_indexes`), created on it as they would be at its build; one
    left invalid by an interrupted concurrent build is dropped first. Returns the names created."""
    have = _table_indexes(conn, schema, plan)
    missing = [(name, body) for name, body in plan.indexes if not have.get(name)]
    for side in plan.sides:
        have.update(_table_indexes(conn, schema, side))
    sides = [side for side in plan.sides if not have.get(side.index[0])]
    word = "CONCURRENTLY " if concurrently else ""
    for name in [n for n, _ in missing] + [side.index[0] for side in sides]:
        if name in have:  # left invalid by an interrupted build
            conn.execute(text(f"DROP INDEX {word}IF EXISTS {_quote(schema)}.{name}"))
    create_indexes(conn, schema, replace(plan, indexes=tuple(missing), sides=tuple(sides)), concurrently=concurrently)
    added = [n for n, _ in missing] + [side.index[0] for side in sides]
    if added:
        log.info("entity projection %s in %s: indexes added %s", plan.name, schema, added)
    return added


def _table_indexes(conn: Connection, schema: str, plan: Plan | SideTable) -> dict[str, bool]:
    """The indexes on `plan`'s table (or a substring table's) → valid?"""
    return dict(conn.execute(text("SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = "
                                  "i.indexrelid WHERE i.indrelid = to_regclass(:t)"),
                             {"t": f"{_quote(schema)}.{plan.name}"}).all())


_AUTOVACUUM_SQL = ", ".join(f"{k} = {v}" for k, v in AUTOVACUUM)


def _autovacuum_set(conn: Connection, schema: str, plan: Plan) -> bool:
    options = conn.scalar(text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:t)"),
                          {"t": f"{_quote(schema)}.{plan.name}"}) or []
    return {f"{k}={v}" for k, v in AUTOVACUUM} <= set(options)


def _set_autovacuum(conn: Connection, schema: str, plan: Plan) -> None:
    """AUTOVACUUM on a table built before it was set at creation."""
    if not _autovacuum_set(conn, schema, plan):
        conn.execute(text(f"ALTER TABLE {_quote(schema)}.{plan.name} SET ({_AUTOVACUUM_SQL})"))


def needs_upkeep(conn: Connection, schema: str, plan: Plan) -> bool:
    """Whether `plan`'s complete table lacks one of its indexes, has one left invalid (`_add_indexes`),
    or lacks its autovacuum settings (`_set_autovacuum`)."""
    have = _table_indexes(conn, schema, plan)
    return (not all(have.get(name) for name, _ in plan.indexes) or not _autovacuum_set(conn, schema, plan)
            or not all(_table_indexes(conn, schema, side).get(side.index[0]) for side in plan.sides))


def _retrying(conn: Connection, timeout: str, attempts: int, action) -> None:
    """Run `action()` with a short lock_timeout, a few times: registering takes a SHARE ROW EXCLUSIVE
    lock on entity_records (DROP TRIGGER, for the last projection of a schema or one built before the
    dispatcher, an ACCESS EXCLUSIVE one); waiting long would queue every request's writes (or reads)
    behind it."""
    conn.execute(text(f"SET lock_timeout = '{timeout}'"))
    try:
        for attempt in range(attempts):
            try:
                return action()
            except OperationalError as exc:
                if "lock timeout" not in str(exc) or attempt == attempts - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
    finally:
        conn.execute(text("SET lock_timeout = '10s'"))


def drop(conn: Connection, schema: str, table_name: str) -> None:
    """Unregister (its own transaction, under a short lock timeout, retried), then the table; and the
    triggers and function of a projection built before the dispatcher, if any."""
    q = _quote(schema)
    legacy = _legacy_triggers(conn, schema, table_name)
    for name in sorted(legacy):
        _retrying(conn, "500ms", 10, lambda name=name: conn.execute(
            text(f"DROP TRIGGER IF EXISTS {name} ON {q}.entity_records")))
    if legacy:
        conn.execute(text(f"DROP FUNCTION IF EXISTS {q}.{table_name}()"))

    def unregister():
        with conn.engine.begin() as tx:
            tx.execute(text("SET LOCAL lock_timeout = '500ms'"))
            _dispatch(tx, schema, remove=table_name)
    _retrying(conn, "500ms", 10, unregister)
    conn.execute(text(f"DROP TABLE IF EXISTS {q}.{table_name}"))
    for side in sorted(side_tables(conn, schema, table_name)):
        conn.execute(text(f"DROP TABLE IF EXISTS {q}.{side}"))


def side_tables(conn: Connection, schema: str, table_name: str) -> set[str]:
    """The substring tables of projection `table_name` (`SideTable`) that exist."""
    pattern = f"{SIDE_PREFIX}{table_name[len(PREFIX):]}_".replace("_", "\\_") + "%"
    return set(conn.scalars(text("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                 "WHERE n.nspname = :schema AND c.relkind = 'r' AND c.relname LIKE :p"),
                            {"schema": schema, "p": pattern}))


def _legacy_triggers(conn: Connection, schema: str, pattern: str) -> set[str]:
    """Per-projection triggers `<table>_i/_u/_d` (before the dispatcher) whose name starts with `pattern`."""
    return set(conn.scalars(text(
        "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = :schema AND c.relname = 'entity_records' "
        "AND t.tgname LIKE :p"), {"schema": schema, "p": pattern.replace("_", "\\_") + "%"}))


COMPLETE = "complete"  # the table comment once backfilled and indexed (else: an interrupted build)


def existing(conn: Connection, schema: str, definition_id: str) -> dict[str, bool]:
    """The definition's projection tables → complete?"""
    pattern = f"{PREFIX}{definition_key(definition_id)}\\_%"
    rows = conn.execute(text("SELECT c.relname, obj_description(c.oid, 'pg_class') = :done FROM pg_class c "
                             "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :schema "
                             "AND c.relkind = 'r' AND c.relname LIKE :p"),
                        {"schema": schema, "p": pattern, "done": COMPLETE})
    return {name: bool(done) for name, done in rows}


def triggered(conn: Connection, schema: str, definition_id: str) -> set[str]:
    """Projection names the dispatcher maintains (or, built before it, that have triggers on
    entity_records): a table dropped by hand leaves them."""
    key = f"{PREFIX}{definition_key(definition_id)}_"
    names = set(conn.scalars(text(f"SELECT name FROM {_quote(schema)}.{REGISTRY} WHERE definition_id = :d"),
                             {"d": definition_id}))
    return names | {name[:-2] for name in _legacy_triggers(conn, schema, key)}


def _point_at(engine, schema: str, definition_id: str, plan: Plan | None) -> bool:
    """Set the definition's `projection` to `plan`'s table if its current schema still plans that table
    (else, or with no plan, to NULL), under the definition's row lock. True when it points at it."""
    q = _quote(schema)
    with engine.begin() as conn:
        row = conn.execute(text(f"SELECT schema, is_active, projection FROM {q}.entity_definitions WHERE id = :d "
                                "FOR UPDATE"), {"d": definition_id}).first()
        if row is None:
            return False
        target = None
        if plan is not None and row.is_active and plan_projection(
                definition_id, compile_definition_schema(row.schema or {}).catalog).name == plan.name:
            target = plan.name
        if row.projection != target:
            conn.execute(text(f"UPDATE {q}.entity_definitions SET projection = :p WHERE id = :d"),
                         {"p": target, "d": definition_id})
        return target is not None


def sync_projection(engine, schema: str, definition_id: str, plan: Plan | None, *,
                    concurrently: bool = True) -> dict[str, Any]:
    """Build `plan`'s table if missing and make it the definition's; drop the definition's others.
    `plan` None: the definition keeps none. One build per definition at a time (advisory lock).
    Returns created / dropped table names and `ready` (the definition now points at `plan`'s table)."""
    created, dropped = [], []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("SET lock_timeout = '10s'"))
        lock = conn.scalar(text("SELECT hashtextextended(:k, 0)"), {"k": f"entity-projection:{definition_id}"})
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": lock})
        try:
            have = existing(conn, schema, definition_id)
            if plan is not None and have.get(plan.name) and plan.sides and \
                    side_tables(conn, schema, plan.name) != {side.name for side in plan.sides}:
                have[plan.name] = False  # a substring table dropped by hand: built again, as a whole
            for name in sorted(triggered(conn, schema, definition_id) - set(have)):
                drop(conn, schema, name)  # triggers (and function) whose table is gone
            if plan is not None and not have.get(plan.name):
                if plan.name in have:  # an interrupted build: start over
                    drop(conn, schema, plan.name)
                def create():
                    with engine.begin() as tx:  # one transaction: every write after it maintains the table
                        tx.execute(text("SET LOCAL lock_timeout = '1s'"))
                        install(tx, schema, plan)
                _retrying(conn, "1s", 10, create)
                backfill(engine, schema, plan)
                create_indexes(conn, schema, plan, concurrently=concurrently)
                for name in [plan.name, *(side.name for side in plan.sides)]:
                    conn.execute(text(f"VACUUM (ANALYZE) {_quote(schema)}.{name}"))
                conn.execute(text(f"COMMENT ON TABLE {_quote(schema)}.{plan.name} IS '{COMPLETE}'"))
                created.append(plan.name)
            elif plan is not None:
                _add_indexes(conn, schema, plan, concurrently=concurrently)
                _set_autovacuum(conn, schema, plan)
            ready = _point_at(engine, schema, definition_id, plan)
            keep = {plan.name} if plan is not None and ready else set()
            for name in sorted(set(have) - keep - set(created)):
                drop(conn, schema, name)
                dropped.append(name)
            if plan is not None and not ready and plan.name in created:
                drop(conn, schema, plan.name)  # the schema changed meanwhile: the next task builds its own
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock})
    if created or dropped:
        log.info("entity projection of %s in %s: created %s, dropped %s", definition_id, schema, created, dropped)
    return {"created": created, "dropped": dropped, "ready": plan is not None and ready}


def follow_schema(definition) -> None:
    """A definition's schema or isActive changed (in the caller's transaction, the row locked): its
    projection is no longer the current one unless the new schema plans the same table."""
    if definition.projection and (not definition.is_active or plan_for(
            definition, _catalog(definition)).name != definition.projection):
        definition.projection = None


def _catalog(definition) -> FieldCatalog:
    return compile_definition_schema(definition.schema or {}).catalog
