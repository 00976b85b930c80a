"""Engine, declarative bases and the per-request session.

Two kinds of tables:
- `PlatformBase` tables live in the `platform` schema (organizations, users, products, artifacts…).
- `TenantBase` tables are declared in the placeholder schema `product`; at run time the product of the
  request picks the real schema (`product_<slug>`) through `schema_translate_map`. That translation
  happens here and nowhere else (`Database.engine_for`).

`db.session` is one SQLAlchemy Session per app context (request or task), bound to the product's
engine view; the edge (a view, a task, a CLI command) owns its transaction with `db.unit_of_work()`.
A job's step that commits on its own opens `db.product_session(product)`.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import functools
import itertools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from flask import Flask, g
from flask.globals import _cv_app
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from sqlalchemy import MetaData, Table, create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, MultipleResultsFound, NoResultFound
from sqlalchemy.orm import DeclarativeBase, Session
from sqlalchemy.pool import QueuePool
from sqlalchemy.sql import ClauseElement, Executable

from app.embedded_pg import embedded_url, refuse_new_state
from app.observability import metrics, tracing
from app.reqctx import current_g, g_or_none

log = logging.getLogger(__name__)

PLATFORM_SCHEMA = "platform"
PRODUCT_PLACEHOLDER = "product"
_SLUG = re.compile(r"^[a-z][a-z0-9_]{0,39}$")

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class PlatformBase(DeclarativeBase):
    metadata = MetaData(schema=PLATFORM_SCHEMA, naming_convention=NAMING)


class TenantBase(DeclarativeBase):
    metadata = MetaData(schema=PRODUCT_PLACEHOLDER, naming_convention=NAMING)


def product_slug(name: str) -> str:
    """Normalise a product name to its slug; raises ValueError for names that cannot be one."""
    slug = re.sub(r"[^a-z0-9_]+", "_", (name or "").strip().lower()).strip("_")
    if not _SLUG.match(slug):
        raise ValueError(f"invalid product name {name!r}: use letters, digits and _ (max 40)")
    return slug


def schema_for(product: str) -> str:
    return f"product_{product_slug(product)}"


SHAPED = True  # False: execute_shaped runs every statement through SQLAlchemy (A/B: bench.ab_entities shaped)
SHAPED_MAX = 2048  # statement shapes kept per app (cleared when full, as the token cache is)
# ... and characters of rendered SQL they hold (uncacheable shapes counted too): a shape's key is several
# times its SQL's size (~300 KB for a 100-condition filter), and a caller picks filter structures at will
SHAPED_MAX_CHARS = 4_000_000
SCAN_JSON = True  # False: json_loads is json.loads, not orjson (A/B: bench.ab_entities scan)
DRIVER_ROWS = True  # False: execute_shaped's cached SQL runs through exec_driver_sql (A/B: bench.ab_entities driver)
REPEATED_PLANS = True  # False: a driver read is planned at every execution (A/B: bench.cpu_entities --ab-plans)
PLAN_AFTER = 2  # a (statement, values) pair runs with its values written in from its 2nd read on
# pairs run with their values written in (the oldest dropped beyond), below psycopg's 100 prepared statements
# per connection (prepared_max: beyond it each new one deallocates the oldest) …
PLANNED_READS_MAX = 64
PLANNED_READS_CHARS = 1_000_000  # … and the characters of their SQL
# (statement, values) pairs counted, cleared when full: a pair is written in only when it comes again within
# this many other pairs, i.e. when the reads that repeat fit in PLANNED_READS_MAX. Reads over a larger set
# (GETs of thousands of records, each read now and then) never enter: their literals would push each other
# out before a second use, and every one would cost a literal, a prepare and a deallocate (measured: a
# record GET over 500 ids 35 % dearer than without written-in values, with the count at 4 096).
SEEN_READS_MAX = 4 * PLANNED_READS_MAX
RAW_READS = True  # False: shaped reads of a read-only request use its session (A/B: bench.cpu_entities --ab-raw)


@dataclass(frozen=True)
class _Shaped:
    """A statement shape rendered once (Database.execute_shaped): its SQL, the parameter name of each
    bound value of each value source (in SQLAlchemy's cache-key order) and the bind processors."""

    sql: str
    names: tuple[tuple[str, ...], ...]
    processors: dict[str, Any]


class _DatabaseState:
    """What one app's `db.init_app` created: its engine, the per-product engine views and the SQL
    of hot constant statements rendered per product (`Database.read_first`)."""

    def __init__(self, engine: Engine, default_product: str) -> None:
        self.engine = engine
        self.default_product = default_product
        self.product_engines: dict[tuple[str, bool], Engine] = {}
        self.rendered: dict[tuple[Executable, str], tuple[str, dict[str, Any]]] = {}
        self.shaped: dict[tuple, _Shaped | None] = {}  # Database.execute_shaped (None: not cacheable)
        self.shaped_chars = 0  # characters of the SQL rendered for `shaped` (SHAPED_MAX_CHARS)
        self.replica: Replica | None = None  # DATABASE_REPLICA_URL


# -- the read replica ----------------------------------------------------------------------------------

LAG_SAMPLE_SECONDS = 2.0  # how old a process's lag sample may be before a lag-tolerant read takes a new one
REPLICA_CONNECT_TIMEOUT = 2  # seconds: an unreachable replica costs one request this much, once per retry period
# 40001: a standby cancels a query whose rows replay must remove (a recovery conflict); 40P01: one that
# holds a buffer replay waits for
_CONFLICT_STATES = frozenset({"40001", "40P01"})
_PRIMARY_LSN = "SELECT pg_current_wal_lsn()::text AS lsn"
# read on the replica after the primary's position: bytes it has yet to replay, and how long ago the last
# transaction it replayed committed on the primary, counted only while it is behind (an idle primary
# commits nothing, which is no lag). A replica that is not in recovery (promoted) has no lag.
_REPLICA_LAG = """SELECT
  GREATEST(0, COALESCE(pg_wal_lsn_diff(%(lsn)s::pg_lsn, pg_last_wal_replay_lsn()), 0))::bigint AS lag_bytes,
  CASE WHEN NOT pg_is_in_recovery() OR pg_last_wal_replay_lsn() >= %(lsn)s::pg_lsn THEN 0
       ELSE GREATEST(0, COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()), 0))
  END::float8 AS lag_seconds"""


class Replica:
    """The read replica of one app (DATABASE_REPLICA_URL): its engine, its lag as this process last
    measured it, and its breaker (after a failure, lag-tolerant reads use the primary for
    DB_REPLICA_RETRY_SECONDS instead of paying a connect attempt each)."""

    def __init__(self, engine: Engine, primary: Engine, max_lag: float, retry_seconds: float) -> None:
        self.engine = engine
        self.primary = primary
        self.max_lag = max_lag
        self.retry_seconds = retry_seconds
        self.views: dict[str, Engine] = {}
        self.down_until = 0.0
        self.lag = 0.0
        self.sampled_at: float | None = None
        self._sampling = threading.Lock()

    def view(self, product: str) -> Engine:
        """The replica's engine view for `product`'s schema; autocommit (a standby only reads)."""
        engine = self.views.get(product)
        if engine is None:
            engine = self.views[product] = self.engine.execution_options(
                schema_translate_map={PRODUCT_PLACEHOLDER: schema_for(product)}, isolation_level="AUTOCOMMIT")
        return engine

    def measure(self) -> tuple[float, int]:
        """(seconds, bytes) the replica is behind the primary now: the primary's WAL position, then
        what the replica has replayed of it. A replica error is raised (DBAPIError)."""
        lsn = _read_first_raw(self.primary, _PRIMARY_LSN, {})["lsn"]
        row = _read_first_raw(self.engine, _REPLICA_LAG, {"lsn": lsn})
        self.lag, self.sampled_at = float(row["lag_seconds"]), time.monotonic()
        return self.lag, int(row["lag_bytes"])

    def refusal(self) -> str | None:
        """Why a lag-tolerant read must not use the replica now (`down`: it failed less than
        DB_REPLICA_RETRY_SECONDS ago; `lag`: it is further behind than DB_REPLICA_MAX_LAG_SECONDS), or
        None. The lag is measured again when this process's sample is older than LAG_SAMPLE_SECONDS (by
        one thread; the others use the last sample meanwhile)."""
        now = time.monotonic()
        if now < self.down_until:
            return "down"
        if self.max_lag <= 0:
            return None
        if (self.sampled_at is None or now - self.sampled_at >= LAG_SAMPLE_SECONDS) \
                and self._sampling.acquire(blocking=False):
            try:
                lsn = _read_first_raw(self.primary, _PRIMARY_LSN, {})["lsn"]  # a primary error is the request's
                try:
                    row = _read_first_raw(self.engine, _REPLICA_LAG, {"lsn": lsn})
                except (DBAPIError, psycopg.Error) as exc:  # (a failed connect is the driver's error here)
                    self.failed(exc)
                    return "down"
                self.lag, self.sampled_at = float(row["lag_seconds"]), time.monotonic()
            finally:
                self._sampling.release()
        return "lag" if self.lag > self.max_lag else None

    def failed(self, exc: BaseException) -> None:
        """The replica failed: lag-tolerant reads use the primary for the next DB_REPLICA_RETRY_SECONDS."""
        self.down_until = time.monotonic() + self.retry_seconds
        log.warning("read replica unavailable, lag-tolerant reads use the primary for %.0f s (%s: %s)",
                    self.retry_seconds, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


def _replica_failure(exc: DBAPIError) -> str | None:
    """What a lag-tolerant read's error on the replica means: `down` (the connection broke), `conflict`
    (replay cancelled the query), or None (an error of the read itself: raised as it is)."""
    if exc.connection_invalidated:
        return "down"
    if getattr(exc.orig, "sqlstate", None) in _CONFLICT_STATES:
        return "conflict"
    return None


def replica_database_url(replica_url: str, primary_url: str) -> str:
    """DATABASE_REPLICA_URL with the primary's database name when it names none (the replica is a copy of
    the primary's whole server, so one replica URL serves any database of it)."""
    url = make_url(replica_url)
    if not url.database:
        url = url.set(database=make_url(primary_url).database)
    return url.render_as_string(hide_password=False)


class Database:
    """Unbound extension: `db.init_app(app)` creates that app's engine.

    State lives per app (`app.extensions["db"]`), so several apps in one process (tests, CLI) never
    share or overwrite each other's engine; outside an app context the last initialised app's state
    is used (benchmarks, migrations run from scripts).
    """

    def __init__(self) -> None:
        self._last: _DatabaseState | None = None

    def init_app(self, app: Flask) -> None:
        url = app.config["DATABASE_URL"]
        if not url:
            refuse_new_state(app.config, "a second embedded PostgreSQL")
            url = embedded_url(app.config["VAR_DIR"], "platform_gateway")
            app.config["DATABASE_URL"] = url
        state = _DatabaseState(make_engine(url, app.config), app.config["DEFAULT_PRODUCT"])
        replica_url = app.config.get("DATABASE_REPLICA_URL")
        if replica_url:
            # its own pool (the pool gauges count the primary's), a short connect timeout
            engine = make_engine(replica_database_url(replica_url, url), {**app.config, "METRICS_ENABLED": False},
                                 connect_timeout=REPLICA_CONNECT_TIMEOUT)
            state.replica = Replica(engine, state.engine, float(app.config.get("DB_REPLICA_MAX_LAG_SECONDS", 30)),
                                    float(app.config.get("DB_REPLICA_RETRY_SECONDS", 10)))
            if app.config.get("METRICS_ENABLED", True):
                metrics.preset_replica()
        app.extensions["db"] = self._last = state
        app.teardown_appcontext(self._teardown)

    def _state(self) -> _DatabaseState:
        ctx = _cv_app.get(None)
        if ctx is not None:
            state = ctx.app.extensions.get("db")
            if state is not None:
                return state
        if self._last is None:
            raise RuntimeError("db.init_app() was not called")
        return self._last

    @property
    def engine(self) -> Engine:
        return self._state().engine

    @property
    def default_product(self) -> str:
        return self._state().default_product

    def engine_for(self, product: str, *, autocommit: bool = False) -> Engine:
        """The engine view whose statements address `product`'s schema (cached per product); with
        `autocommit`, the view whose connections run each statement on its own (no BEGIN/ROLLBACK)."""
        state = self._state()
        engine = state.product_engines.get((product, autocommit))
        if engine is None:
            options: dict[str, Any] = {"schema_translate_map": {PRODUCT_PLACEHOLDER: schema_for(product)}}
            if autocommit:
                options["isolation_level"] = "AUTOCOMMIT"
            engine = state.product_engines[(product, autocommit)] = state.engine.execution_options(**options)
        return engine

    def context_product(self) -> str:
        """The product of the current app context: the verified tenant's (`g.tenant`, installed by
        app.tenancy.set_tenant), else the default product (tasks and CLI name theirs explicitly)."""
        names = g_or_none()
        tenant = names.get("tenant") if names is not None else None
        return tenant.product if tenant is not None else self.default_product

    @property
    def session(self) -> Session:
        """The Session of the current app context, bound to the current product."""
        names = current_g()
        session = names.get("_db_session")
        if session is None:
            session = Session(bind=self.engine_for(self.context_product(),
                                                   autocommit=names.get("_db_reads_only", False)),
                              expire_on_commit=False)
            names._db_session = session
        return session

    def lag_tolerant(self, fn: Callable) -> Callable:
        """Decorator of a read that tolerates lag (a dashboard): while `fn` runs, `replica_session()` is a
        session on the read replica (DATABASE_REPLICA_URL) when one is configured and usable. Should the
        replica fail during `fn` (the connection breaks, replay cancels a query), `fn` runs again on the
        primary, so the caller sees no error. Without a replica, `fn` runs as it is. Reads that must see
        their own request's (or a just-finished request's) writes never use it."""

        @functools.wraps(fn)
        def run(*args, **kwargs):
            if g.get("_db_lag_tolerant") or self._state().replica is None:
                return fn(*args, **kwargs)  # nested, or no replica
            g._db_lag_tolerant = True
            try:
                return fn(*args, **kwargs)
            except DBAPIError as exc:
                session = g.pop("_db_replica_session", None)
                reason = _replica_failure(exc) if session is not None and session is not g.get("_db_session") \
                    else None
                if reason is None:
                    raise
                with contextlib.suppress(Exception):
                    session.close()
                if reason == "down":
                    self._state().replica.failed(exc)
                metrics.count_replica_fallback(reason)
                g._db_replica_session = self.session  # the rest of this request reads the primary
                return fn(*args, **kwargs)
            finally:
                g._db_lag_tolerant = False

        return run

    def replica_session(self) -> Session:
        """The session of a lag-tolerant read (inside a `lag_tolerant` function): on the read replica
        when one is configured, reachable and not too far behind (DB_REPLICA_MAX_LAG_SECONDS), else the
        context's `db.session`. Decided once per request; a fallback to the primary is counted in
        gateway_db_replica_fallbacks_total. Its connection is taken at once, so an unreachable replica
        is found here (and skipped for DB_REPLICA_RETRY_SECONDS), not by the first query."""
        session = g.get("_db_replica_session")
        if session is not None:
            return session
        replica = self._state().replica
        if replica is None or not g.get("_db_lag_tolerant"):
            return self.session
        reason = replica.refusal()
        if reason is None:
            session = Session(bind=replica.view(self.context_product()), expire_on_commit=False)
            try:
                session.connection()
            except DBAPIError as exc:
                session.close()
                replica.failed(exc)
                reason = "down"
            else:
                g._db_replica_session = session
                return session
        metrics.count_replica_fallback(reason)
        g._db_replica_session = session = self.session
        return session

    def replica_lag(self) -> tuple[float, int]:
        """(seconds, bytes) the read replica is behind the primary, measured now (/metrics)."""
        replica = self._state().replica
        if replica is None:
            raise RuntimeError("no read replica (DATABASE_REPLICA_URL)")
        return replica.measure()

    def reads_only(self) -> None:
        """Declare that the current request (or app context) only reads, and needs nothing that lives
        for a transaction (SET LOCAL, FOR UPDATE, a write):
        its session, once created, runs each statement in autocommit, which saves the BEGIN and
        ROLLBACK round trips. Visibility is that of READ COMMITTED, where every statement takes its own
        snapshot inside a transaction too. A shaped read (`execute_shaped`) before the session has
        taken a connection runs on a pooled connection of its own, returned at once (`_reads_raw`).
        Does nothing when the session exists already."""
        names = current_g()
        if names.get("_db_session") is None:
            names._db_reads_only = True

    def read_first(self, stmt: Executable, params: dict[str, Any]) -> dict[str, Any] | None:
        """The first row (column name → value) of a hot one-statement read: `stmt` is a module-level
        constant with bind parameters. One round trip and as little Python as the driver allows.

        The statement's SQL is rendered once per product (schema names in place). When the request
        session has no transaction yet, the statement runs on a pooled connection in autocommit,
        returned at once: no Session, no BEGIN/ROLLBACK, the driver's cursor directly (same
        visibility as any READ COMMITTED statement); inside a transaction, on the session's
        connection. A driver error is raised as SQLAlchemy's (OperationalError → 503 in app.errors);
        a disconnect invalidates the connection and the pool's other connections of the same age,
        as SQLAlchemy's own path does. The autocommit path uses the
        driver's cursor (a repeated read: libpq's prepared statement, `_run_prepared`), so engine cursor
        events (`before_cursor_execute`) do not see it."""
        state = self._state()
        product = self.context_product()
        rendered = state.rendered.get((stmt, product))
        if rendered is None:
            compiled = stmt.compile(dialect=state.engine.dialect, render_schema_translate=True,
                                    schema_translate_map={PRODUCT_PLACEHOLDER: schema_for(product)})
            rendered = state.rendered[(stmt, product)] = (str(compiled), compiled.params)
        sql, defaults = rendered
        params = {**defaults, **params}  # the statement's own bound values, then the caller's
        names = g_or_none()
        session = names.get("_db_session") if names is not None else None
        # pending writes (autoflush would send them) or an open transaction: read on the session's
        # connection, so the statement sees what this request has written
        if session is not None and (session.in_transaction() or session.new or session.dirty or session.deleted):
            session.flush()  # what autoflush would do before a Session query
            row = session.connection().exec_driver_sql(sql, params).first()
            return dict(row._mapping) if row is not None else None
        if session is None and names is not None and names.get("_db_reads_only"):
            # a read-only request (db.reads_only) runs its next statements on its session's connection,
            # in autocommit: this read takes that connection now (one pool checkout per request, no
            # autocommit switch), through the driver's cursor (or libpq's prepared statement) all the same
            connection = self.session.connection()
            return _first_row(state.engine, connection.connection, sql, params,
                              lambda exc: (state.engine.pool._invalidate(connection.connection, exc, _checkin=False),
                                           connection.invalidate(exc)))
        return _read_first_raw(state.engine, sql, params)

    def execute_shaped(self, session: Session, shape: Hashable, build: Callable[[], Executable],
                       sources: Sequence[ClauseElement], named: dict[str, Any] | None = None,
                       values: dict[int, tuple[Any, Any]] | None = None):
        """`session.execute(build())` for a hot read whose statement has few shapes and many values
        (a record query's count and page): the SQL is rendered once per shape and product, and later
        calls skip building the statement, SQLAlchemy's cache key over it, its compiled cache and its
        execution context for compiled statements (they run as driver SQL on the session's connection,
        so engine cursor events, error wrapping and disconnect handling stay SQLAlchemy's).

        `sources`: the expressions that carry every value of the statement that may change between
        calls (WHERE terms, ORDER BY expressions); the statement `build()` returns must embed these very
        objects. Their SQLAlchemy cache keys (the structure, values left out: what SQLAlchemy's own
        compiled cache is keyed by) join `shape` to key the rendered SQL, and their bound values, in
        the cache key's order, fill its parameters (as SQLAlchemy's `extracted_parameters` do).
        `named`: the values of the statement's explicit `bindparam(name)`s (LIMIT, OFFSET), given on
        every path.
        `shape` must say everything else the statement depends on (its tables, its form). A statement
        whose parameters are not all covered by those (or that needs post-compile expansion) runs
        through `session.execute` every time. Returns the result (rows with `_mapping`).
        `values`: id of a BindParameter of the sources → (that parameter, the value to bind in its place)
        (a compiled filter shape reused with this request's values: filters.CompiledFilter.values)."""
        state = self._state()
        named = named or {}
        if not SHAPED:
            return session.execute(_rebound(build(), values), named)
        translate = session.get_bind().get_execution_options().get("schema_translate_map") or {}
        keys = [source._generate_cache_key() for source in sources]
        if any(k is None for k in keys):
            return session.execute(_rebound(build(), values), named)
        # each source's key is taken on its own: which bound values are one object across sources
        # (one parameter of the SQL) is part of the shape, or a later call could bind one value twice
        first: dict[int, int] = {}
        sharing = tuple(first.setdefault(id(bind), len(first)) for k in keys for bind in k.bindparams)
        key = (shape, tuple(sorted(translate.items())), tuple(k.key for k in keys), sharing, tuple(sorted(named)))
        shaped = state.shaped.get(key, False)
        if shaped is False:
            stmt = build()
            shaped, size = _render_shaped(stmt, session.get_bind().dialect, translate, keys, named)
            if len(state.shaped) >= SHAPED_MAX or state.shaped_chars + size > SHAPED_MAX_CHARS:
                state.shaped.clear()
                state.shaped_chars = 0
            if size <= SHAPED_MAX_CHARS:
                state.shaped[key] = shaped
                state.shaped_chars += size
            if shaped is None:
                return session.execute(_rebound(stmt, values), named)
        elif shaped is None:
            return session.execute(_rebound(build(), values), named)
        params: dict[str, Any] = {}
        for k, names in zip(keys, shaped.names, strict=True):
            for bind, name in zip(k.bindparams, names, strict=True):
                bound = values.get(id(bind)) if values else None
                params[name] = bind.effective_value if bound is None else bound[1]
        params.update(named)
        for name, processor in shaped.processors.items():
            params[name] = processor(params[name])
        if not DRIVER_ROWS:
            return session.connection().exec_driver_sql(shaped.sql, params)
        if RAW_READS and self._reads_raw(session):
            return _read_raw(session.get_bind(), shaped.sql, params, fetch_all=True)
        return _driver_rows(session.connection(), shaped.sql, params)

    @staticmethod
    def _reads_raw(session: Session) -> bool:
        """Whether a shaped read of a read-only request (`reads_only`) may run on a pooled connection of
        its own, in autocommit, returned at once (as `read_first`): the request's session has not taken
        a connection (opening one, with its autocommit switch on checkout and back on checkin, and
        closing it costs ~0.1-0.2 ms of CPU) and holds no pending writes, and no engine cursor event is
        listened to (statement captures see the session's path, as before)."""
        names = g_or_none()
        return (names is not None and names.get("_db_reads_only", False) and session is names.get("_db_session")
                and not session.in_transaction() and not (session.new or session.dirty or session.deleted)
                and not _cursor_listened(session.get_bind()))

    @contextlib.contextmanager
    def unit_of_work(self) -> Iterator[None]:
        """The unit of work of the current app context (a request, a task, a CLI command): commits the
        context's session (`db.session`) when the block ends normally, rolls it back when it raises.
        Only the edge opens it: every API view (app.extensions.Blueprint), every task
        (app.tasks.init_celery) and the CLI commands that write; services add and flush, never commit.
        Nested blocks belong to the outermost one (it alone commits). A read-only context
        (`reads_only()`: autocommit) has nothing to commit; a session never created is not created."""
        names = current_g()  # the app context's g: the block begins and ends in the same context
        depth = names.get("_db_uow_depth", 0)
        names._db_uow_depth = depth + 1
        try:
            yield
        except BaseException:
            if depth == 0:
                session = names.get("_db_session")
                if session is not None:
                    session.rollback()
            raise
        else:
            session = names.get("_db_session")
            if depth == 0 and session is not None and not names.get("_db_reads_only"):
                # also with no transaction begun (no statement ran: no round trip): after_commit sends
                # the tasks it enqueued (app.tasks, eager mode writes no outbox row)
                session.commit()
        finally:
            names._db_uow_depth = depth

    @contextlib.contextmanager
    def product_session(self, product: str) -> Iterator[Session]:
        """A standalone session for `product` that is its own unit of work (a task's or job's step, a
        CLI command): commits when the block ends normally, rolls back when it raises."""
        session = Session(bind=self.engine_for(product), expire_on_commit=False)
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _teardown(self, exc: BaseException | None) -> None:
        names = g_or_none()
        replica_session = names.pop("_db_replica_session", None) if names is not None else None
        session = names.pop("_db_session", None) if names is not None else None
        if replica_session is not None and replica_session is not session:
            replica_session.close()  # autocommit: nothing to roll back
        if session is not None:
            if exc is not None:
                session.rollback()
            session.close()

    @staticmethod
    def qualified_name(session: Session, table: Table) -> str:
        """`"<schema>".<table>` of a tenant table in the session's product schema, for SQL text that
        SQLAlchemy does not render (the schema translation applied by hand)."""
        translate = session.get_bind().get_execution_options().get("schema_translate_map") or {}
        return f'"{translate.get(table.schema, table.schema)}".{table.name}'

    @staticmethod
    def estimated_rows(session: Session, table: Table) -> float:
        """The planner's row estimate (pg_class.reltuples) of `table` in the session's product schema:
        the one place a tenant table's real name is spelled (from the schema translation)."""
        name = Database.qualified_name(session, table)
        return float(session.scalar(text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:name)"),
                                    {"name": name}) or 0)

    def dispose(self) -> None:
        """Drop pooled connections (after a worker fork)."""
        if self._last is not None:
            self._last.engine.dispose(close=False)
            if self._last.replica is not None:
                self._last.replica.engine.dispose(close=False)


class UnboundValues(Exception):  # noqa: N818 (a signal: the caller compiles afresh)
    """A statement carrying a reused filter shape's values (Database.execute_shaped `values`) cannot take
    the shaped path: SQLAlchemy's own execution would take the values from the statement's cache key,
    which the reused filter's memoized key draws from its first compilation (measured: that request's
    values came back). The caller asks again with the filter compiled afresh."""


def _rebound(stmt: Executable, values: dict[int, tuple[Any, Any]] | None) -> Executable:
    """`stmt` for SQLAlchemy's own execution: `UnboundValues` when it carries values bound apart."""
    if values:
        raise UnboundValues
    return stmt


def _render_shaped(stmt: Executable, dialect, translate: dict, keys: list,
                   named: dict[str, Any]) -> tuple[_Shaped | None, int]:
    """`stmt` rendered for Database.execute_shaped (None when its parameters are not exactly the
    sources' bound values plus `named`: then it is not cached), and the length of its SQL."""
    compiled = stmt.compile(dialect=dialect, render_schema_translate=bool(translate),
                            schema_translate_map=translate or None)
    return _checked_shape(compiled, keys, named), len(compiled.string)


def _checked_shape(compiled, keys: list, named: dict[str, Any]) -> _Shaped | None:
    if compiled.positional or compiled.post_compile_params or compiled.literal_execute_params \
            or compiled.escaped_bind_names:
        return None
    names = []
    for k in keys:
        found = tuple(compiled.bind_names.get(bind) for bind in k.bindparams)
        if None in found:
            return None  # a source's value the statement does not carry as that bind (cloned, rendered)
        names.append(found)
    covered = {name for group in names for name in group} | set(named)
    if set(compiled.bind_names.values()) != covered or (not covered and "%" in compiled.string):
        return None  # a value no source supplies (it would be frozen), or a bare % the driver would not unescape
    processors = {name: p for name, p in compiled._bind_processors.items() if p is not None}
    if any(not callable(p) for p in processors.values()):
        return None  # tuple types: processors per element
    return _Shaped(compiled.string, tuple(names), processors)


# --- a plan per connection for reads repeated with the same values ---------------------------------
#
# Every pooled connection plans each statement for its values (plan_cache_mode = force_custom_plan: a
# filter's selectivity depends on them, a generic plan can be far off), so a prepared statement is parsed
# once but planned at every execution: 0.1-0.2 ms of the backend's CPU for a count or a record GET, 0.3-0.5
# ms for a page statement. A hot read often repeats both its statement and its values, though (a polled
# list or count, a record's GET). A driver read (`_execute_read`) that comes the PLAN_AFTER-th time with
# the same SQL and the same values runs from then on as that SQL with the values written in as typed
# literals (each `'text'::type` as the driver binds it: the type it declares for the parameter, or none
# where it lets PostgreSQL infer it), prepared: a statement without parameters keeps the one plan it was
# given, and that plan is the custom plan of those values (the planner folds bound values into constants
# the same way), so it is planned once per connection and the answer is the one planned for its values.

_SEEN: dict[tuple, int] = {}  # (sql, values) → times seen
_READS: dict[tuple, str] = {}  # (sql, values) → the SQL with the values written in
_READ_CHARS = [0]  # characters of SQL held in _READS
_KEYED_TYPES = frozenset((str, int, float, bool, type(None), decimal.Decimal, datetime.date, datetime.datetime,
                          uuid.UUID))  # values compared by value and written as literals by the driver
# equal values the literal of one would not write for the other (1.0 and 1.00, one instant in two zones)
_BY_TEXT = frozenset((float, decimal.Decimal, datetime.datetime))
_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s")


def _written_in(conn, sql: str, params: dict[str, Any]) -> str | None:
    """The SQL of a repeated (statement, values) pair with its values written in (`_repeated`), or None
    for a read that runs with its parameters bound."""
    return _repeated(conn, sql, params) if REPEATED_PLANS else None


def _execute_read(cur, sql: str, params: dict[str, Any], literal: str | None) -> None:
    """`cur.execute(sql, params)` for a driver read; a repeated (statement, values) pair as `literal`, its
    SQL with the values written in (`_written_in`), prepared (see above)."""
    if literal is None:
        cur.execute(sql, params)
    else:
        cur.execute(literal, prepare=True)


def _repeated(conn, sql: str, params: dict[str, Any]) -> str | None:
    values = []
    for name, v in params.items():
        t = type(v)
        if t in _BY_TEXT:
            v = repr(v)
        elif t is list and all(type(x) in _KEYED_TYPES for x in v):  # a flat list of scalars (an array)
            v = tuple((type(x), repr(x) if type(x) in _BY_TEXT else x) for x in v)
        elif t not in _KEYED_TYPES:  # a JSON value…: not remembered
            return None
        values.append((name, t, v))
    key = (sql, tuple(values))
    literal = _READS.get(key)
    if literal is not None:
        return literal
    seen = _SEEN.get(key, 0) + 1
    if seen < PLAN_AFTER:
        if len(_SEEN) >= SEEN_READS_MAX:
            _SEEN.clear()
        _SEEN[key] = seen
        return None
    _SEEN.pop(key, None)
    try:
        literal = _literal_sql(conn, sql, params)
    except (ValueError, TypeError, LookupError, AttributeError, psycopg.DataError):  # a value or type the
        log.warning("repeated read not planned once: %.80s", sql, exc_info=True)  # driver cannot write
        return None
    while _READS and (len(_READS) >= PLANNED_READS_MAX or _READ_CHARS[0] + len(literal) > PLANNED_READS_CHARS):
        oldest = _READS.pop(next(iter(_READS)))  # the connections' statement ages out of psycopg's LRU
        _READ_CHARS[0] -= len(oldest)
        if oldest not in _READS.values():
            tracing.STATEMENT_SOURCES.pop(oldest, None)
    _READS[key] = literal
    tracing.STATEMENT_SOURCES[literal] = sql  # its span records the statement with placeholders
    _READ_CHARS[0] += len(literal)
    return literal


def _literal_sql(conn, sql: str, params: dict[str, Any]) -> str:
    """`sql` (pyformat) with each parameter written as the literal the driver's value is, cast to the type
    the driver would declare for it when it declares one (psycopg's own conversion and dumpers)."""
    from psycopg._queries import PostgresQuery

    tx = psycopg.adapt.Transformer(conn)
    query = PostgresQuery(tx)
    query.convert(sql, params)
    written = {}
    for name, oid in zip(query._order or (), query.types, strict=True):
        text = tx.as_literal(params[name]).decode()
        info = conn.adapters.types.get(oid) if oid else None
        if oid and info is None:
            raise ValueError(f"no type name for parameter {name} (oid {oid})")
        written[name] = f"({text})::{info.name}{'[]' if oid == info.array_oid else ''}" if oid else text
    return _PLACEHOLDER.sub(lambda m: written[m.group(1)] if m.group(1) else "%", sql)


def _cursor_listened(engine: Engine) -> bool:
    """Whether engine cursor events are listened to (the engine's `_has_events` is also set by its own
    isolation level's connect hook, and stays set after a listener is removed)."""
    dispatch = engine.dispatch
    return bool(dispatch.before_cursor_execute) or bool(dispatch.after_cursor_execute)


def _read_first_raw(engine: Engine, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """`sql` on a pooled connection in autocommit (Database.read_first; `_first_row`)."""
    return _read_raw(engine, sql, params)


def _read_raw(engine: Engine, sql: str, params: dict[str, Any], *, fetch_all: bool = False):
    """`sql` on a pooled connection in autocommit (`_first_row`), the connection returned
    at once: the first row as a dict (Database.read_first), or with `fetch_all` every row as
    `_driver_rows` returns them (Database.execute_shaped in a read-only request)."""
    fairy = engine.raw_connection()
    try:
        return _first_row(engine, fairy, sql, params,
                          lambda exc: (fairy.invalidate(exc), engine.pool._invalidate(fairy, exc)),
                          fetch_all=fetch_all, switch=True)
    finally:
        fairy.close()


def _first_row(engine: Engine, fairy, sql: str, params: dict[str, Any], invalidate, *, fetch_all: bool = False,
               switch: bool = False):
    """The first row of `sql` on `fairy` (a pooled connection with no transaction open), as a dict; with
    `fetch_all`, every row as a DriverResult (as `_driver_rows`). A repeated read (`_repeated`) runs
    as its prepared statement at the libpq level (`_run_prepared`); any other through the driver's
    cursor, in autocommit (`switch`: the connection is switched to it for the statement and back). A
    driver error is raised as SQLAlchemy's; on a disconnect `invalidate(exc)` drops the connection and
    the pool's others of its age (as SQLAlchemy's own path does)."""
    dialect = engine.dialect
    conn = fairy.dbapi_connection
    try:
        literal = _written_in(conn, sql, params)
        if literal is not None and PREPARED_READS and conn.cursor_factory is psycopg.Cursor:
            return _run_prepared(fairy, conn, sql, literal, fetch_all)
        if switch:
            conn.autocommit = True
        try:
            if fetch_all:
                with conn.cursor(row_factory=_row_maker(sql)) as cur:
                    _execute_read(cur, sql, params, literal)
                    return DriverResult(cur.fetchall() if cur.description is not None else [])
            with conn.cursor(row_factory=dict_row) as cur:
                _execute_read(cur, sql, params, literal)
                return cur.fetchone()
        finally:
            if switch and not conn.closed:
                conn.autocommit = False
    except dialect.loaded_dbapi.Error as exc:
        disconnect = dialect.is_disconnect(exc, conn, None)
        if disconnect:
            invalidate(exc)
        raise DBAPIError.instance(sql, params, exc, dialect.loaded_dbapi.Error,
                                  connection_invalidated=disconnect, dialect=dialect) from exc


# --- repeated reads at the libpq level -----------------------------------------------------------------
#
# A repeated read (`_repeated`: its SQL with its values written in, no parameters) on a connection that is
# not traced runs as a statement prepared on that connection under a name of this module's (beside the
# ones psycopg's cursor prepares, which it keeps apart), executed with `PGconn.exec_prepared` and its row
# loaded by psycopg's Transformer (the driver's own loaders: json through json_loads, timestamps…). It
# skips the cursor (its query conversion, its prepare bookkeeping, its per-execute row maker) and the
# connection's autocommit switch (a statement sent at the libpq level begins no transaction: it runs in
# its own, as in autocommit). What it relies on of psycopg (tests/functional/test_db_prepared_reads.py checks
# each): `Connection.pgconn`, `Connection.cursor_factory` (a traced connection's cursor class is the
# instrumentation's: its reads stay on the cursor, which makes their spans), `Connection.info.encoding`,
# `PGconn.prepare/exec_prepared/exec_` (blocking; libpq releases the GIL meanwhile), `PGresult.status,
# ntuples, nfields, fname, get_value, error_field, get_error_message`, `psycopg.adapt.Transformer(conn)`
# with `set_pgresult`, `load_row(i, make_row)` and `load_rows(i, j, make_row)`, and
# `psycopg.errors.error_from_result`.

PREPARED_READS = True  # False: a repeated read runs through the driver's cursor (A/B: bench.cpu_entities)
_PREPARED_KEY = "app.db.prepared_reads"  # the pool's per-connection info: that connection's _PreparedReads
_STATEMENT_NUMBERS = itertools.count(1)
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
_COMMAND_OK = psycopg.pq.ExecStatus.COMMAND_OK
# a statement to prepare again: 26000 (it does not exist: psycopg sends DEALLOCATE ALL after a rollback of
# a transaction in which it had prepared its own; DISCARD ALL), 0A000 (cached plan must not change result
# type: a migration altered a column it selects)
_PREPARE_AGAIN = frozenset((b"26000", b"0A000"))
_OURS = b"SELECT name FROM pg_prepared_statements WHERE name LIKE 'gw\\_read\\_%'"
_COLUMN_NAMES: dict[str, tuple[str, ...]] = {}  # a statement's SQL → its columns' names (read_first's dicts)


class _PreparedReads:
    """The repeated reads prepared on one driver connection (literal SQL → statement name) and the
    Transformer that loads their rows (kept in the pool's info of the connection, cleared when it is
    replaced; `conn` guards against a record that holds another connection)."""

    __slots__ = ("conn", "names", "tx")

    def __init__(self, conn) -> None:
        self.conn = conn
        self.names: dict[str, bytes] = {}
        self.tx = psycopg.adapt.Transformer(conn)


def _run_prepared(fairy, conn, sql: str, literal: str, fetch_all: bool):
    """`literal` (a repeated read of `sql`, values written in) prepared on `conn` once and executed there:
    the first row as a dict (`dict_row`'s), or with `fetch_all` a DriverResult of every row. A driver
    error is raised as the driver's (psycopg.Error)."""
    info = fairy.info
    state = info.get(_PREPARED_KEY)
    if state is None or state.conn is not conn:
        state = info[_PREPARED_KEY] = _PreparedReads(conn)
    pgconn = conn.pgconn
    name = state.names.get(literal)
    if name is None:
        name = _prepare(state, conn, literal)
    result = pgconn.exec_prepared(name, None)
    if result.status != _TUPLES_OK and result.error_field(psycopg.pq.DiagnosticField.SQLSTATE) in _PREPARE_AGAIN:
        state.names.clear()  # deallocated (or its result type changed) behind this module's back: once more
        result = pgconn.exec_prepared(_prepare(state, conn, literal), None)
    status = result.status
    if status != _TUPLES_OK:
        if status == _COMMAND_OK:  # a statement without result columns
            return DriverResult([]) if fetch_all else None
        raise _error(result, conn)
    tx = state.tx
    tx.set_pgresult(result)
    if fetch_all:
        return DriverResult(tx.load_rows(0, result.ntuples, _row_class(sql, _names_of(result, conn))))
    if not result.ntuples:
        return None
    names = _COLUMN_NAMES.get(sql)
    if names is None:
        if len(_COLUMN_NAMES) >= SHAPED_MAX:
            _COLUMN_NAMES.clear()
        names = _COLUMN_NAMES[sql] = _names_of(result, conn)
    return tx.load_row(0, lambda values: dict(zip(names, values, strict=True)))  # as dict_row


def _names_of(result, conn) -> tuple[str, ...]:
    encoding = conn.info.encoding
    return tuple(result.fname(i).decode(encoding) for i in range(result.nfields))


def _prepare(state: _PreparedReads, conn, literal: str) -> bytes:
    """`literal` prepared on `conn` under a new name. A connection holding PLANNED_READS_MAX of them
    deallocates them first (two round trips): the set of repeated reads changed (`_repeated`)."""
    pgconn = conn.pgconn
    if len(state.names) >= PLANNED_READS_MAX:  # those the server still holds (some may be gone, above)
        state.names.clear()
        listed = pgconn.exec_(_OURS)
        if listed.status != _TUPLES_OK:
            raise _error(listed, conn)
        held = [listed.get_value(i, 0) for i in range(listed.ntuples)]
        if held:
            result = pgconn.exec_(b"; ".join(b"DEALLOCATE " + n for n in held))
            if result.status != _COMMAND_OK:
                raise _error(result, conn)
    name = b"gw_read_%d" % next(_STATEMENT_NUMBERS)
    result = pgconn.prepare(name, literal.encode(conn.info.encoding))
    if result.status != _COMMAND_OK:
        raise _error(result, conn)
    state.names[literal] = name
    return name


def _error(result, conn) -> psycopg.Error:
    """The driver's error for a failed libpq result: the server's (by its SQLSTATE), or, for one libpq
    made itself (the connection broke: no SQLSTATE), an OperationalError, as the cursor raises then."""
    encoding = conn.info.encoding
    if not result.error_field(psycopg.pq.DiagnosticField.SQLSTATE):
        return psycopg.OperationalError(result.get_error_message(encoding) or "the connection failed")
    return psycopg.errors.error_from_result(result, encoding=encoding)


class _RowMapping(Mapping):
    """A DriverRow by column name (what SQLAlchemy's `Row._mapping` offers: `[]`, `get`, keys)."""

    __slots__ = ("_row",)

    def __init__(self, row: DriverRow) -> None:
        self._row = row

    def __getitem__(self, key: str) -> Any:
        return self._row[self._row._index[key]]

    def __iter__(self):
        return iter(self._row._index)

    def __len__(self) -> int:
        return len(self._row._index)


class DriverRow(tuple):
    """A row of `_driver_rows`: the driver's values as a tuple, by name through `_mapping` (as a
    SQLAlchemy Row; the row class of a statement carries its columns' positions)."""

    __slots__ = ()
    _index: dict[str, int] = {}

    @property
    def _mapping(self) -> _RowMapping:
        return _RowMapping(self)


class DriverResult:
    """The rows of `_driver_rows`, fetched: the part of SQLAlchemy's Result that callers of
    Database.execute_shaped use (`all`, `first`, `one`, `scalar`, `scalar_one`, iteration)."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[DriverRow]) -> None:
        self.rows = rows

    def all(self) -> list[DriverRow]:
        return self.rows

    def first(self) -> DriverRow | None:
        return self.rows[0] if self.rows else None

    def one(self) -> DriverRow:
        if len(self.rows) != 1:
            raise (NoResultFound("No row was found when one was required") if not self.rows else
                   MultipleResultsFound("Multiple rows were found when exactly one was required"))
        return self.rows[0]

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows else None

    def scalar_one(self) -> Any:
        return self.one()[0]

    def __iter__(self):
        return iter(self.rows)


_ROW_CLASSES: dict[str, type[DriverRow]] = {}  # a statement's SQL → the row class of its columns


def _row_maker(sql: str):
    """The driver's row factory for `sql`: each row made as the DriverRow class of the statement's
    columns (read from the first result's description, then kept per SQL text: a shaped statement's
    SQL names its columns)."""
    def factory(cursor) -> type[DriverRow]:
        cls = _ROW_CLASSES.get(sql)
        if cls is None:
            cls = _row_class(sql, [column.name for column in cursor.description or ()])
        return cls
    return factory


def _row_class(sql: str, names: Sequence[str]) -> type[DriverRow]:
    """The DriverRow class of `sql`'s columns `names` (made once per SQL text)."""
    cls = _ROW_CLASSES.get(sql)
    if cls is None:
        index: dict[str, int] = {}
        for i, name in enumerate(names):
            index.setdefault(name, i)  # a name selected twice reads its first column
        if len(_ROW_CLASSES) >= SHAPED_MAX:
            _ROW_CLASSES.clear()
        cls = _ROW_CLASSES[sql] = type("DriverRow", (DriverRow,), {"__slots__": (), "_index": index})
    return cls


def _driver_rows(connection, sql: str, params: dict[str, Any]) -> DriverResult:
    """`sql` (driver SQL, pyformat parameters) on the driver cursor of `connection` (a SQLAlchemy
    Connection: the session's), every row fetched: what `connection.exec_driver_sql(sql, params).all()`
    returns, without SQLAlchemy's execution context and result objects (measured: 0.05-0.16 ms of CPU
    per page query, bench.ab_entities driver). Engine cursor events (`before_cursor_execute`,
    `after_cursor_execute`) are dispatched as SQLAlchemy does when any are listened to; a driver error
    is raised as SQLAlchemy's (DBAPIError.instance), and a disconnect invalidates the connection and
    the pool's others of its age."""
    engine = connection.engine
    dialect = engine.dialect
    dbapi_connection = connection.connection.dbapi_connection
    events = connection._has_events or engine._has_events
    try:
        with dbapi_connection.cursor(row_factory=_row_maker(sql)) as cur:
            if events:
                connection.dispatch.before_cursor_execute(connection, cur, sql, params, None, False)
            _execute_read(cur, sql, params, _written_in(dbapi_connection, sql, params))
            if events:
                connection.dispatch.after_cursor_execute(connection, cur, sql, params, None, False)
            return DriverResult(cur.fetchall() if cur.description is not None else [])
    except dialect.loaded_dbapi.Error as exc:
        disconnect = dialect.is_disconnect(exc, dbapi_connection, None)
        if disconnect:
            engine.pool._invalidate(connection.connection, exc, _checkin=False)
            connection.invalidate(exc)
        raise DBAPIError.instance(sql, params, exc, dialect.loaded_dbapi.Error,
                                  connection_invalidated=disconnect, dialect=dialect) from exc


class MeteredQueuePool(QueuePool):
    """The QueuePool, counting the threads that wait for a connection because every connection (and
    every overflow slot) is taken (gateway_db_pool_waiting): only a checkout that will block pays."""

    def _do_get(self):
        if 0 <= self._max_overflow <= self._overflow and self._pool.empty():
            metrics.pool_waiting(1)
            try:
                return super()._do_get()
            finally:
                metrics.pool_waiting(-1)
        return super()._do_get()


def make_engine(url: str, config: dict, *, connect_timeout: int = 5) -> Engine:
    """The process's engine. Disconnects: a connection is pinged at checkout only when it sat idle
    in the pool longer than DB_PING_IDLE_SECONDS (a dead one is replaced before the request sees
    it); a busy connection is not pinged (one round trip saved per request). A connection that
    dies in use fails that request with an OperationalError (503 via app.errors) and SQLAlchemy
    invalidates the whole pool, so the next checkouts connect afresh."""
    metered = bool(config.get("METRICS_ENABLED", True))
    engine = create_engine(
        url,
        poolclass=MeteredQueuePool if metered else QueuePool,
        pool_size=config.get("DB_POOL_SIZE", 10),
        max_overflow=config.get("DB_POOL_SIZE", 10),
        pool_timeout=config.get("DB_POOL_TIMEOUT", 5),
        connect_args={"connect_timeout": connect_timeout},
    )
    timeout_ms = int(config.get("DB_STATEMENT_TIMEOUT_MS", 30000))
    plan_cache_mode = str(config.get("DB_PLAN_CACHE_MODE", "force_custom_plan"))
    if plan_cache_mode not in ("auto", "force_custom_plan", "force_generic_plan"):
        raise ValueError(f"DB_PLAN_CACHE_MODE must be auto, force_custom_plan or force_generic_plan, "
                         f"not {plan_cache_mode!r}")
    idle_ping = float(config.get("DB_PING_IDLE_SECONDS", 10))

    @event.listens_for(engine, "checkin")
    def _idle_since(_dbapi_conn, record):
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_conn, record, _proxy):
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since <= idle_ping:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # the pool retries the checkout with a new connection
            raise DisconnectionError(f"stale pooled connection: {exc}") from exc

    if metered:  # gateway_db_pool_connections_in_use: the pool's count, read once a second (not per checkout)
        metrics.watch_pool(engine)

    @event.listens_for(engine, "connect")
    def _set_timeouts(dbapi_conn, _record):  # every pooled connection gets the request budget
        # psycopg prepares a statement run 5 times on a connection; PostgreSQL then may switch it to a
        # generic plan, blind to the values: a filter over JSONB whose selectivity depends on them
        # (range + list containment) measured 221 ms generic vs 43 ms custom (decisions.md)
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET statement_timeout = {timeout_ms}; SET plan_cache_mode = {plan_cache_mode}")
        dbapi_conn.commit()
        set_json_loads(json_loads, dbapi_conn)  # json and jsonb values: the same objects, less overhead

    return engine


# orjson turns an integer literal beyond 64 bits into a float (json.loads: the int): a text with a run of
# 19 digits (the shortest literal that may not fit) is decoded by json.loads. The run is found at C speed:
# every digit mapped to "0", then one substring search (a run inside a string is a harmless false alarm).
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= i <= 0x39 else i for i in range(256))
_MAYBE_BIG_INT = b"0" * 19


def json_loads(data: bytes) -> Any:
    """`json.loads(data)` for the JSON and JSONB values the driver reads (a page's 20 records each
    decode one), by orjson (~4x faster than json's C scanner on a record): the same values for valid
    JSON. What orjson reads differently or refuses goes through json.loads itself, so the result, or
    the error, is always json.loads': a run of 19 digits (an integer beyond 64 bits, `_MAYBE_BIG_INT`),
    and anything orjson raises on (a lone surrogate escape, a number too big for a float, a byte-order
    mark, NaN, invalid text)."""
    if not SCAN_JSON:
        return json.loads(data)
    if _MAYBE_BIG_INT not in data.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(data)
        except ValueError:  # orjson.JSONDecodeError
            pass
    return json.loads(data)


def json_compact(texts: list[str]) -> bytes:
    """JSON texts (a page's records as PostgreSQL wrote them: its spacing, its key order) as the JSON
    array the answer's encoder would write of their values: compact, keys sorted, characters as they are
    (the encoder escapes non-ASCII on the whole answer). One orjson decode and encode of the whole
    array, both in C; what orjson would read differently (`json_loads`) or not write (a number beyond a
    float: json writes Infinity) goes through json, so the bytes are those json.dumps would write but
    for a float's exponent form."""
    data = f"[{','.join(texts)}]".encode()
    if _MAYBE_BIG_INT not in data.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.dumps(orjson.loads(data), option=orjson.OPT_SORT_KEYS)
        except (ValueError, TypeError):  # orjson.JSONDecodeError, JSONEncodeError
            pass
    return json.dumps(json.loads(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


db = Database()
