"""Bulk create / update / delete (all-or-nothing) and the asynchronous bulk jobs.

Every record of a batch is checked first; one bad record rejects the batch (400, `details.indexes`)
and nothing is written. The writes then happen in the caller's transaction: the request's (sync) or
a savepoint of the job's (async). Creates take the fast path: the rows are COPY'd into a temporary
table and moved into `entity_records` with one INSERT … SELECT that also builds the tsvectors.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flask import current_app
from psycopg.types.json import Jsonb
from sqlalchemy import DateTime, Integer, String, Text, bindparam, column, func, insert, literal, select, true, update
from sqlalchemy import table as sql_table
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Session

from app.db import db
from app.entities.fieldtypes import search_document
from app.entities.filters import SEARCH_CONFIG
from app.entities.indexes import schedule_sync as schedule_index_sync
from app.entities.models import BulkJob, EntityDefinition, EntityRecord
from app.entities.services.common import unstorable_errors
from app.entities.services.context import compiled_schema
from app.entities.services.records import (
    checked_record,
    deactivate_relationships_of,
    default_name,
    merge_fields,
    record_errors,
    records_written,
)
from app.errors import ApiError, NotFound, ValidationFailed
from app.tasks import _key_prefix, enqueue_after_commit, interrupted_reason, out_of_attempts, reap_each_product
from app.tenancy import Tenant, get_owned
from app.wire import iso, new_id, utcnow

log = logging.getLogger(__name__)
T = EntityRecord.__table__
OPERATIONS = ("create", "update", "delete")
RUN_TASK = "bulk.entity_records"  # app.entities.tasks.run_bulk_job, sent by name (that module imports this one)
MAX_DETAILED = 100  # records whose errors are spelled out in details (all indexes are listed)
BULK_WORK_MEM = "32MB"  # for the INSERT … SELECT of a bulk create (the trigger's transition rows)
_STAGING = sql_table("_entity_bulk_rows", column("id", String), column("name", Text), column("fields", JSONB),
                     column("tags", ARRAY(Text)), column("metadata", JSONB), column("doc", Text))
_STAGING_DDL = ("CREATE TEMP TABLE IF NOT EXISTS _entity_bulk_rows (id text, name text, fields jsonb, "
                "tags text[], metadata jsonb, doc text) ON COMMIT DELETE ROWS")


@dataclass(frozen=True)
class BulkContext:
    """Where a bulk operation runs: a session (request or job), its product, the org and the acting user."""

    session: Session
    product: str
    org_id: str
    user_id: str | None


def max_batch() -> int:
    return current_app.config["ENTITY_MAX_BULK_RECORDS"]


def check_batch_size(count: int) -> None:
    limit = max_batch()
    if count > limit:
        raise ValidationFailed(f"At most {limit} records per bulk request (got {count}).",
                               {"fields": {"records": [f"at most {limit} items"]}})


def _reject(errors: dict[int, dict[str, list[str]]], total: int) -> ValidationFailed:
    indexes = sorted(errors)
    shown = {str(i): errors[i] for i in indexes[:MAX_DETAILED]}
    return ValidationFailed(f"{len(indexes)} of {total} records are invalid; nothing was written.",
                            {"indexes": indexes, "records": shown})


def _valid_tags(tags: Any) -> bool:
    return isinstance(tags, list) and len(tags) <= 100 and all(isinstance(t, str) and 0 < len(t) <= 200 for t in tags)


# The wire shape of a Partial EntityRecord's members, in the order errors name them: (key, null allowed,
# check, message); a member that is absent (or null where null is allowed) is not checked.
_SHAPE_RULES = (
    ("name", False, lambda v: isinstance(v, str) and len(v) <= 1000, "must be a string of at most 1000 characters"),
    ("fields", False, lambda v: isinstance(v, dict), "must be an object"),
    ("tags", True, _valid_tags, "must be a list of at most 100 non-empty strings"),
    ("metadata", True, lambda v: isinstance(v, dict), "must be an object"),
    ("version", False, lambda v: isinstance(v, int) and not isinstance(v, bool), "must be an integer"),
)


def _shape_errors(item: Any, *, needs_id: bool = False) -> dict[str, list[str]]:
    """The wire shape of one Partial EntityRecord (cheap checks; the schema check comes after)."""
    if not isinstance(item, dict):
        return {"": ["must be an object"]}
    errors: dict[str, list[str]] = {}
    if needs_id and not _usable_id(item.get("id")):
        errors["id"] = ["a record id (a non-empty string without NUL) is required"]
    for key, nullable, valid, message in _SHAPE_RULES:
        if key in item and not (nullable and item[key] is None) and not valid(item[key]):
            errors[key] = [message]
    return errors


def _usable_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 64 and "\x00" not in value


def bulk_create(ctx: BulkContext, definition: EntityDefinition, items: list[Any]) -> dict[str, Any]:
    """Validate every record, then insert them all (COPY → INSERT … SELECT)."""
    check_batch_size(len(items))
    compiled = compiled_schema(definition)
    errors: dict[int, dict[str, list[str]]] = {}
    rows = []
    for index, item in enumerate(items):
        problems = _shape_errors(item)
        if not problems:
            problems, fields_json = checked_record(compiled, item)
        if problems:
            errors[index] = problems
            continue
        name, fields = default_name(item), item.get("fields") or {}
        # `fields` as the JSON text the checks dumped (COPY text: PostgreSQL parses it into jsonb)
        if fields_json is None:
            fields_json = json.dumps(fields)
        rows.append((new_id(), name, fields_json, item.get("tags") or [], _jsonb(item.get("metadata")),
                     search_document(name, fields, compiled.catalog)))
    if errors:
        raise _reject(errors, len(items))
    _copy_insert(ctx, definition, rows)
    records_written(ctx.session, ctx.product, definition, [row[0] for row in rows])
    schedule_index_sync(ctx.session, ctx.product, definition.id)  # a definition that grew past the threshold
    return {"message": f"Created {len(rows)} records.", "count": len(rows)}


def _jsonb(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


def _copy_insert(ctx: BulkContext, definition: EntityDefinition, rows: list[tuple]) -> None:
    raw = ctx.session.connection().connection.driver_connection
    with raw.cursor() as cur:
        cur.execute(_STAGING_DDL)
        cur.execute("TRUNCATE _entity_bulk_rows")
        with cur.copy("COPY _entity_bulk_rows (id, name, fields, tags, metadata, doc) FROM STDIN") as copy:
            copy.set_types(["text", "text", "text", "text[]", "jsonb", "text"])  # fields: JSON text
            for row in rows:
                copy.write_row(row)
    now = utcnow()
    s = _STAGING.c
    source = select(s.id, literal(ctx.org_id, String), literal(definition.id, String), s.name, s.fields, s.tags,
                    s.metadata, func.to_tsvector(SEARCH_CONFIG, s.doc), true(), literal(1, Integer),
                    literal(now, DateTime(timezone=True)), literal(now, DateTime(timezone=True)),
                    literal(ctx.user_id, String), literal(ctx.user_id, String))
    # the projection's statement trigger keeps the inserted rows (its transition table) in work_mem: at
    # the default 4MB a 5 000-record batch spills them to a temporary file, written and read back twice
    # (docs/decisions.md, stop 20). Raised for this statement only, then put back.
    previous = ctx.session.execute(select(func.current_setting("work_mem"),
                                          func.set_config("work_mem", BULK_WORK_MEM, true()))).scalar()
    ctx.session.execute(insert(T).from_select(
        ["id", "org_id", "entity_id", "name", "fields", "tags", "metadata", "search_vector", "is_active",
         "version", "created_at", "updated_at", "created_by", "updated_by"], source))
    ctx.session.execute(select(func.set_config("work_mem", previous, true())))


def _load_active(ctx: BulkContext, definition: EntityDefinition, ids: list[str], columns) -> dict[str, Any]:
    stmt = (select(*columns).where(T.c.org_id == ctx.org_id, T.c.entity_id == definition.id,
                                   T.c.is_active.is_(True), T.c.id.in_(ids)).with_for_update())
    return {row.id: row for row in ctx.session.execute(stmt)}


def _duplicates(ids: list[Any]) -> set[int]:
    seen: dict[Any, int] = {}
    dupes = set()
    for index, value in enumerate(ids):
        if isinstance(value, str) and value in seen:
            dupes.add(index)
        seen.setdefault(value, index)
    return dupes


def _updated_row(compiled, item: dict, current) -> tuple[dict[str, list[str]], dict[str, Any] | None]:
    """One well-shaped update merged over its stored record (`current`, None when there is none): the
    problems that reject it, or the executemany parameters of its UPDATE."""
    if current is None:
        return {"id": ["record not found"]}, None
    if item.get("version") is not None and item["version"] != current.version:
        return {"version": [f"stale: the record is at version {current.version}"]}, None
    merged = {"name": item.get("name", current.name),
              "fields": merge_fields(current.fields, item.get("fields") or {}),
              "tags": item["tags"] if "tags" in item else current.tags,
              "metadata": item["metadata"] if "metadata" in item else current.metadata}
    problems = record_errors(compiled, merged)
    if problems:
        return problems, None
    return {}, {"b_id": item["id"], "b_name": merged["name"], "b_fields": merged["fields"],
                "b_tags": merged["tags"] or [], "b_metadata": merged["metadata"],
                "b_doc": search_document(merged["name"], merged["fields"], compiled.catalog)}


def bulk_update(ctx: BulkContext, definition: EntityDefinition, items: list[Any]) -> dict[str, Any]:
    """Merge and validate every record (all must exist), then update them all in one executemany."""
    check_batch_size(len(items))
    compiled = compiled_schema(definition)
    errors: dict[int, dict[str, list[str]]] = {i: _shape_errors(item, needs_id=True) for i, item in enumerate(items)}
    ids = [item.get("id") if isinstance(item, dict) else None for item in items]
    for index in _duplicates(ids):
        errors[index].setdefault("id", []).append("appears more than once in this batch")
    existing = _load_active(ctx, definition, [i for i in ids if _usable_id(i)],
                            [T.c.id, T.c.name, T.c.fields, T.c.tags, T.c.metadata, T.c.version])
    params = []
    for index, item in enumerate(items):
        if not errors[index]:
            errors[index], row = _updated_row(compiled, item, existing.get(item["id"]))
            if row is not None:
                params.append(row)
    errors = {i: e for i, e in errors.items() if e}
    if errors:
        raise _reject(errors, len(items))
    stmt = (update(T).where(T.c.id == bindparam("b_id"), T.c.org_id == ctx.org_id)
            .values(name=bindparam("b_name"), fields=bindparam("b_fields", type_=JSONB),
                    tags=bindparam("b_tags", type_=ARRAY(Text)), metadata=bindparam("b_metadata", type_=JSONB),
                    search_vector=func.to_tsvector(SEARCH_CONFIG, bindparam("b_doc", type_=Text)),
                    version=T.c.version + 1, updated_at=utcnow(), updated_by=ctx.user_id))
    ctx.session.connection().execute(stmt, params)
    records_written(ctx.session, ctx.product, definition, [p["b_id"] for p in params])
    return {"message": f"Updated {len(params)} records.", "count": len(params)}


def bulk_delete(ctx: BulkContext, definition: EntityDefinition, record_ids: list[Any]) -> dict[str, Any]:
    """Soft-delete every listed record (all must exist) and deactivate their relationships."""
    check_batch_size(len(record_ids))
    errors: dict[int, dict[str, list[str]]] = {}
    for index in _duplicates(record_ids):
        errors[index] = {"id": ["appears more than once in this batch"]}
    existing = _load_active(ctx, definition, [i for i in record_ids if _usable_id(i)], [T.c.id])
    for index, record_id in enumerate(record_ids):
        if not isinstance(record_id, str) or record_id not in existing:
            errors.setdefault(index, {}).setdefault("id", []).append("record not found")
    if errors:
        raise _reject(errors, len(record_ids))
    ids = list(existing)
    ctx.session.execute(update(T).where(T.c.org_id == ctx.org_id, T.c.id.in_(ids))
                        .values(is_active=False, updated_at=utcnow(), updated_by=ctx.user_id))
    deactivate_relationships_of(ids, ctx.session)
    return {"message": f"Deleted {len(ids)} records.", "count": len(ids)}


RUNNERS = {"create": bulk_create, "update": bulk_update, "delete": bulk_delete}


def run_bulk(session: Session, tenant: Tenant, definition: EntityDefinition, operation: str,
             items: list[Any]) -> dict[str, Any]:
    """Synchronous bulk operation in the caller's unit of work (the request's)."""
    ctx = BulkContext(session, tenant.product, tenant.org_id, tenant.user_id)
    return RUNNERS[operation](ctx, definition, items)


# --- asynchronous jobs ------------------------------------------------------------------------------

def start_job(session: Session, tenant: Tenant, definition: EntityDefinition, operation: str,
              items: list[Any]) -> BulkJob:
    """Store the request as a pending job in the caller's unit of work; its task (RUN_TASK, queue `bulk`)
    is sent once that commits."""
    job = _create_job(session, tenant, definition, operation, items)
    enqueue_after_commit(session, RUN_TASK, job.id, tenant.product)
    return job


def _create_job(session: Session, tenant: Tenant, definition: EntityDefinition, operation: str,
                items: list[Any]) -> BulkJob:
    """Add the request as a pending job to `session`."""
    check_batch_size(len(items))
    unstorable: dict[int, dict[str, list[str]]] = {}
    for index, item in enumerate(items):
        problems: dict[str, list[str]] = {}
        unstorable_errors(item, "record", problems)
        if problems:
            unstorable[index] = problems
    if unstorable:  # JSONB cannot hold U+0000, so such a payload cannot even be queued
        raise _reject(unstorable, len(items))
    job = BulkJob(id=new_id(), org_id=tenant.org_id, entity_id=definition.id, entity_name=definition.name,
                  operation=operation, status="pending", payload={"items": items}, user_id=tenant.user_id,
                  created_at=utcnow(), key_prefix=_key_prefix())
    session.add(job)
    return job


def requeue_orphaned_jobs() -> int:
    """Lease reaper (app.lease_reapers, run by app.tasks.run_maintenance): re-queue `running` jobs whose worker died.

    A live worker holds its job's row lock (`execute_job` reads it FOR UPDATE and keeps the lock until
    the job's writes commit), and PostgreSQL drops that lock the moment the worker's connection dies
    (kill -9 included). So a job that is `running`, started more than JOB_LEASE_SECONDS ago and can be
    locked SKIP LOCKED has no live worker: it goes back to `pending` and its task is re-sent through
    the outbox, in one transaction. Only this deployment's jobs (CELERY_KEY_PREFIX, as the outbox).
    A second delivery of the same job is a no-op (`claim_job`).
    A job that already used JOB_MAX_ATTEMPTS runs (each killed, e.g. by the task time limit) is failed
    with the reason instead (`error`, GET /jobs/{id}): it would be killed the same way again."""
    cutoff = utcnow() - timedelta(seconds=float(current_app.config["JOB_LEASE_SECONDS"]))

    def reap(product: str) -> int:
        with db.product_session(product) as session:
            orphans = list(session.scalars(
                select(BulkJob).where(BulkJob.key_prefix == _key_prefix(), BulkJob.status == "running",
                                      BulkJob.started_at < cutoff)
                .order_by(BulkJob.started_at).limit(100).with_for_update(skip_locked=True)))
            requeued = 0
            for job in orphans:
                if out_of_attempts(job.attempts):
                    log.error("bulk job %s (product %s) lost its worker on each of its %d runs; failed", job.id,
                              product, job.attempts)
                    job.status, job.payload, job.finished_at = "failed", None, utcnow()
                    job.error = {"code": "SYSTEM_ERROR", "message": interrupted_reason(job.attempts)}
                    continue
                log.warning("bulk job %s (product %s) lost its worker; re-queued", job.id, product)
                job.status, job.started_at = "pending", None
                enqueue_after_commit(session, RUN_TASK, job.id, product)
                requeued += 1
            return requeued

    return reap_each_product("bulk job lease reaper", reap)


def claim_job(job_id: str, product: str, *, new_run: bool = True) -> bool:
    """Mark a pending (or redelivered running) job as running; False when it already finished.
    `new_run` (not a Celery retry of the same run) counts the run in `attempts` (the lease reaper's bound)."""
    with db.product_session(product) as session:
        job = session.get(BulkJob, job_id, with_for_update=True)
        if job is None or job.status in ("succeeded", "failed"):
            return False
        # the message came through this deployment's broker: the job is this deployment's (a job of the
        # previous release has no prefix; its reaper is now this one's)
        job.status, job.started_at, job.key_prefix = "running", utcnow(), _key_prefix()
        if new_run:
            job.attempts = (job.attempts or 0) + 1
    return True


def execute_job(job_id: str, product: str) -> str:
    """Run the job's operation; its writes and its final status commit together (idempotent)."""
    with db.product_session(product) as session:
        job = session.get(BulkJob, job_id, with_for_update=True)
        if job is None or job.status in ("succeeded", "failed"):
            return job.status if job else "missing"
        definition = session.get(EntityDefinition, job.entity_id)
        try:
            if definition is None or definition.org_id != job.org_id or not definition.is_active:
                raise NotFound(f"Entity '{job.entity_name}' not found.")
            with session.begin_nested():
                ctx = BulkContext(session, product, job.org_id, job.user_id)
                job.result = RUNNERS[job.operation](ctx, definition, (job.payload or {}).get("items", []))
            job.status = "succeeded"
        except ApiError as exc:
            job.status = "failed"
            job.error = {"code": exc.code, "message": exc.message, **({"details": exc.details} if exc.details else {})}
        job.payload, job.finished_at = None, utcnow()
        return job.status


def fail_job(job_id: str, product: str, message: str) -> None:
    """Give up on a job after its retries (the data is untouched: its transaction rolled back)."""
    with db.product_session(product) as session:
        job = session.get(BulkJob, job_id, with_for_update=True)
        if job is not None and job.status not in ("succeeded", "failed"):
            job.status, job.finished_at = "failed", utcnow()
            job.error = {"code": "SYSTEM_ERROR", "message": message}


def job_to_wire(job: BulkJob) -> dict[str, Any]:
    return {"jobId": job.id, "status": job.status, "operation": job.operation, "entityName": job.entity_name,
            "result": job.result, "error": job.error, "createdAt": iso(job.created_at),
            "startedAt": iso(job.started_at), "finishedAt": iso(job.finished_at)}


def get_job(job_id: str) -> BulkJob:
    return get_owned(BulkJob, job_id, "Job")
