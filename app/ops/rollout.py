"""The artifact registry: publish a new artifact version and roll it out to every org.

A rollout walks the provisioned (org, product) pairs of `platform.org_artifacts` in key order, in
batches; after each org it commits the outcome and moves the cursor in the same transaction as the
org's new copy, so a crashed worker (the task is acks_late) or `flask artifacts resume` continues
where it stopped, and an org is never done twice. Per org:

- `updated`: the copy was never edited (its updatedBy is still `platform`): replaced through the
  domain service, `artifactVersion` raised;
- `forked`: the org edited its copy: kept, marked `forkedFromVersion` (the version it was edited
  from), reported;
- `added`: the org did not have the artifact yet (a newly published one): provisioned;
- `current`: already at (or above) the version; `missing`: the org deleted its copy (left deleted);
- `failed`: the service refused (detail kept); the rollout carries on with the next org.

Each org is one short transaction under the org's own advisory lock, so API traffic of every org
goes on while a rollout runs.

The lease (the shape bulk email and embedding jobs have): an unfinished rollout carries
`lease_expires_at`, a `dispatch_token` (in the task id, app.tasks.lease_message_id) and `attempts`.
A batch runs under the rollout's advisory lock (its own connection: `kill -9` or the task time limit
frees it) and only while its message's token is the rollout's; before it lets go of the lock it moves
the token on and writes the next batch's message to the outbox, in one transaction (that message, sent
at the commit, waits up to LOCK_WAIT_SECONDS for the lock, as the other leased jobs' do). The rollout lease
reaper (`requeue_stalled_rollouts`, in app.lease_reapers) sends a rollout past its lease that no worker
holds again under its current token, or, after JOB_MAX_ATTEMPTS runs that each started a batch and
never finished it, marks it `failed` with the reason (`error`; `resume` starts it again).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from flask import current_app
from marshmallow import ValidationError, fields, validate
from sqlalchemy import Integer, func, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.agents.models import Agent, CatalogSkill
from app.agents.schemas import AgentInputSchema
from app.agents.services import agents as agent_service
from app.agents.services import skills as skill_service
from app.db import db
from app.entities.fieldtypes import compile_definition_schema
from app.entities.models import EntityDefinition
from app.entities.services import definitions
from app.entities.services import views as view_service
from app.errors import ApiError, Conflict, NotFound, ValidationFailed
from app.fields import NulFree, StrictInt
from app.ops.artifacts import KINDS, artifact_id
from app.ops.seeding import (
    PROVISIONERS,
    SEED_LOCK,
    SYSTEM_USER,
    agent_input,
    ensure_product,
    entity_input,
    flatten_errors,
    platform_tenant,
    skill_input,
    storage_prefix,
    sync_builtin_artifacts,
)
from app.platform_models import Artifact, OrgArtifact, Rollout, RolloutOutcome
from app.storage import get_blob_store
from app.tasks import (
    _key_prefix,
    enqueue_message_after_commit,
    interrupted_reason,
    job_lock,
    lease_message_id,
    reap_stalled,
)
from app.tenancy import Tenant
from app.wire import iso, utcnow

log = logging.getLogger(__name__)
OUTCOMES = ("updated", "forked", "added", "current", "missing", "failed")
ROLLOUT_TASK = "seed.rollout"  # app.ops.tasks.rollout_task
DEFAULT_BATCH = 100


# --------------------------------------------------------------------------- registry & publish


def artifact_to_wire(a: Artifact) -> dict[str, Any]:
    return {"id": a.id, "kind": a.kind, "name": a.name, "artifactVersion": a.artifact_version,
            "definition": a.payload, "updatedAt": iso(a.updated_at)}


def list_artifacts() -> list[Artifact]:
    session = db.session
    sync_builtin_artifacts(session)  # committed by the caller's unit of work (the route's, the CLI command's)
    return list(session.scalars(select(Artifact).order_by(Artifact.position, Artifact.id)))


def _invalid(fields: dict[str, list[str]]) -> ValidationFailed:
    return ValidationFailed(f"Invalid artifact: {', '.join(sorted(fields))}.", {"fields": fields})


def _named(data: dict, name: str) -> None:
    if data.get("name") != name:
        raise _invalid({"definition.name": [f"must be '{name}'"]})


def _check_entity(name: str, definition: dict, known_skills: set[str]) -> None:
    data, views = entity_input(definition)
    compile_definition_schema(data.get("schema") or {"type": "object", "properties": {}})
    _named(data, name)
    if not all(isinstance(v, dict) and v.get("name") for v in views):
        raise _invalid({"definition.views": ["each view needs a name"]})


def _check_skill(name: str, definition: dict, known_skills: set[str]) -> None:
    _named(skill_input(definition, 1), name)


def _check_agent(name: str, definition: dict, known_skills: set[str]) -> None:
    skills = definition.get("skills") or []
    if not isinstance(skills, list) or not all(isinstance(s, dict) for s in skills):
        raise _invalid({"definition.skills": ["must be a list of {skillName, enabled, order}"]})
    unknown = sorted({s.get("skillName") or "?" for s in skills} - known_skills)
    if unknown:
        raise _invalid({"definition.skills": [f"unknown skill artifact(s): {', '.join(unknown)}"]})
    _named(AgentInputSchema().load({k: v for k, v in definition.items() if k != "skills"}), name)


def _check_storage(name: str, definition: dict, known_skills: set[str]) -> None:
    prefix = definition.get("prefix", "orgs")
    if not isinstance(prefix, str) or not prefix.strip("/") or ".." in prefix:
        raise _invalid({"definition.prefix": ["must be a relative path such as orgs"]})


# what each kind's definition must pass: what the kind's own API would accept
_DEFINITION_CHECKS = {"entity": _check_entity, "skill": _check_skill, "agent": _check_agent,
                      "storage": _check_storage}


def check_definition(kind: str, name: str, definition: dict, known_skills: set[str]) -> None:
    """The definition must be what the kind's own API would accept (400 naming the fields)."""
    check = _DEFINITION_CHECKS.get(kind)
    if check is None:
        return
    try:
        check(name, definition, known_skills)
    except ValidationError as exc:
        raise _invalid({f"definition.{k}": v for k, v in flatten_errors(exc.messages).items()}) from None
    except ValidationFailed as exc:
        if exc.message.startswith("Invalid artifact"):
            raise
        fields = (exc.details or {}).get("fields") or {"definition": [exc.message]}
        raise _invalid({f"definition.{k}": v for k, v in fields.items()}) from None


class PublishSchema(NulFree):
    """What publishing takes — over HTTP (`@blp.arguments`: 415 for another Content-Type, 400 naming the
    fields, documented in OpenAPI) and from `flask artifacts publish FILE` alike (`publish`)."""

    kind = fields.String(required=True, validate=validate.OneOf(KINDS))
    name = fields.String(required=True, validate=validate.Length(min=1, max=64))
    artifactVersion = StrictInt(required=True, validate=validate.Range(min=1, max=1_000_000),
                              metadata={"description": "above the artifact's current version (else 409)"})
    definition = fields.Dict(required=True, metadata={"description": "the body the kind's own API accepts"})


_PUBLISH = PublishSchema()


@db.unit_of_work()
def publish(doc: Any, *, created_by: str | None = None, rollout: bool = True) -> tuple[Artifact, Rollout | None]:
    """Store a new version of an artifact (or a new artifact) and start its rollout.

    A command: its own unit of work (`db.unit_of_work`), which joins the caller's when there is one (the
    admin route's, the CLI command's): the rollout's first message is sent once that commits.

    `doc` is `{kind, name, artifactVersion, definition}` (PublishSchema; the route has loaded it
    already, the CLI has not); artifactVersion must be above the current one (409 otherwise)."""
    try:
        doc = _PUBLISH.load(doc if doc is not None else {})
    except ValidationError as exc:
        raise _invalid(flatten_errors(exc.normalized_messages())) from None
    kind, name, version, definition = doc["kind"], doc["name"], doc["artifactVersion"], doc["definition"]
    session = db.session
    sync_builtin_artifacts(session)
    skills = set(session.scalars(select(Artifact.name).where(Artifact.kind == "skill")))
    check_definition(kind, name, definition, skills)
    existing = session.scalars(select(Artifact).where(Artifact.kind == kind, Artifact.name == name)
                               .with_for_update()).first()
    if existing is not None and version <= existing.artifact_version:
        raise Conflict(f"{existing.id} is at version {existing.artifact_version}; publish a higher artifactVersion.",
                       {"currentVersion": existing.artifact_version})
    if existing is None:
        position = (session.scalar(select(func.max(Artifact.position))) or 0) + 1
        existing = Artifact(id=artifact_id(kind, name), kind=kind, name=name, position=position,
                            created_at=utcnow())
        session.add(existing)
    existing.artifact_version, existing.payload, existing.updated_at = version, definition, utcnow()
    started = None
    if rollout:
        started = start_rollout(session, existing, created_by=created_by)
    return existing, started


def start_rollout(session, artifact: Artifact, *, created_by: str | None = None) -> Rollout:
    """A pending rollout of the artifact's current version; its task is sent once this commits."""
    total = session.scalar(select(func.count()).select_from(
        select(OrgArtifact.org_id, OrgArtifact.product).distinct().subquery()))
    rollout = Rollout(artifact_id=artifact.id, kind=artifact.kind, name=artifact.name,
                      artifact_version=artifact.artifact_version, status="pending", total=total or 0,
                      counts={k: 0 for k in OUTCOMES}, created_by=created_by, created_at=utcnow(),
                      updated_at=utcnow(), cursor_org="", cursor_product="")
    session.add(rollout)
    session.flush()
    _lease_and_send(session, rollout)
    return rollout


def _lease_and_send(session, rollout: Rollout) -> None:
    """Renew the rollout's lease and send its next batch under its current token once `session` commits
    (sent by name: app.ops.tasks imports this module)."""
    rollout.lease_expires_at, rollout.key_prefix = _lease_end(), _key_prefix()
    enqueue_message_after_commit(session, ROLLOUT_TASK, lease_message_id(rollout.id, rollout.dispatch_token or 0),
                                 (rollout.id,))


def _lease_end():
    return utcnow() + timedelta(seconds=float(current_app.config["JOB_LEASE_SECONDS"]))


def chain_next_batch(session, rollout: Rollout) -> None:
    """A batch is done and the rollout goes on: move the token on and write the next batch's message, in
    `session`'s transaction (the caller commits, still holding the rollout's lock)."""
    rollout.dispatch_token, rollout.attempts = (rollout.dispatch_token or 0) + 1, 0
    _lease_and_send(session, rollout)


# --------------------------------------------------------------------------- running


ROLLOUT_LOCK = 0x524F_4C4C  # pg advisory lock class: one runner per rollout (app.tasks.job_lock)
# How long a leased message waits for the rollout's lock (its predecessor's unlock) before `busy`.
LOCK_WAIT_SECONDS = 5.0


def run_rollout(rollout_id: str, *, batch_size: int = DEFAULT_BATCH, max_batches: int | None = None,
                token: int | None = None, chain=None) -> str:
    """Process batches from the cursor; returns the rollout's status (`done`, or `running` when
    `max_batches` stopped it early: `chain(session, rollout)`, if given, then writes the next batch's
    message before the lock is let go), `busy` when another runner holds the rollout (a duplicate
    delivery, or a resume of a live rollout): that one goes on, this one stops without re-sending, so
    progress is never counted twice; `stale` when `token` (a leased message's) is not the rollout's
    current one (a duplicate of a message whose batch is done).

    A leased message (`token` given) waits up to LOCK_WAIT_SECONDS for the lock before it answers
    `busy`: the chained message goes out when the previous batch commits, a few statements before that
    runner lets go of the lock, and it must not be dropped (it would wait for the lease reaper)."""
    with job_lock(ROLLOUT_LOCK, rollout_id, LOCK_WAIT_SECONDS if token is not None else 0.0) as mine:
        if not mine:
            log.info("rollout %s is being run by another worker", rollout_id)
            return "busy"
        status = _run_rollout(rollout_id, batch_size=batch_size, max_batches=max_batches, token=token)
        if status == "running" and chain is not None:
            session = db.session
            rollout = session.get(Rollout, rollout_id)
            chain(session, rollout)
            session.commit()
        return status


def _claim(session, rollout: Rollout, token: int) -> bool:
    """A leased message's run: False when `token` is not the rollout's current one (or the rollout is not
    pending or running), else the run is counted (the reaper's bound) and its lease renewed."""
    if token != (rollout.dispatch_token or 0) or rollout.status not in ("pending", "running"):
        log.info("rollout %s: message of token %s superseded (token %s, %s)", rollout.id, token,
                 rollout.dispatch_token, rollout.status)
        return False
    rollout.attempts, rollout.lease_expires_at = (rollout.attempts or 0) + 1, _lease_end()
    session.commit()
    return True


def _next_pairs(session, rollout: Rollout, batch_size: int) -> list:
    """The next (org, product) pairs after the rollout's cursor."""
    pairs = session.execute(
        select(OrgArtifact.org_id, OrgArtifact.product).distinct()
        .where(tuple_(OrgArtifact.org_id, OrgArtifact.product) > tuple_(rollout.cursor_org, rollout.cursor_product))
        .order_by(OrgArtifact.org_id, OrgArtifact.product).limit(batch_size)).all()
    session.commit()  # no snapshot held between batches
    return pairs


def _run_rollout(rollout_id: str, *, batch_size: int, max_batches: int | None, token: int | None) -> str:
    session = db.session
    rollout = session.get(Rollout, rollout_id)
    if rollout is None:
        raise NotFound(f"Rollout {rollout_id} not found.")
    if rollout.status in ("done", "cancelled"):
        return rollout.status
    if token is not None and not _claim(session, rollout, token):
        return "stale"
    artifact = session.get(Artifact, rollout.artifact_id)
    if artifact is None or artifact.artifact_version != rollout.artifact_version:
        _finish(session, rollout, "superseded", "a newer version of the artifact was published")
        return "superseded"
    if rollout.status != "running":
        rollout.status, rollout.updated_at = "running", utcnow()
        session.commit()
    if artifact.kind == "database":
        ensure_product_all(session)
    batches = 0
    while max_batches is None or batches < max_batches:
        pairs = _next_pairs(session, rollout, batch_size)
        if not pairs:
            _finish(session, rollout, "done")
            return "done"
        for org_id, product in pairs:
            apply_to_org(rollout.id, artifact, org_id, product)
        session.expire(rollout)  # progress was written by the per-org transactions; `artifact` stays as read
        batches += 1
    return "running"


def ensure_product_all(session) -> None:
    for product in session.scalars(select(OrgArtifact.product).distinct()):
        ensure_product(product)


def _finish(session, rollout: Rollout, status: str, error: str | None = None) -> None:
    rollout.status, rollout.error, rollout.finished_at, rollout.updated_at = status, error, utcnow(), utcnow()
    rollout.lease_expires_at = None
    session.commit()


def requeue_stalled_rollouts() -> int:
    """Lease reaper (app.lease_reapers, run by every worker's maintenance loop): a pending or running
    rollout of this deployment past its lease whose advisory lock is free (no live worker runs it: the
    worker was killed, the task hit its time limit, or the message was lost with Redis' memory) is sent
    again under its current token, or marked `failed` with the reason once JOB_MAX_ATTEMPTS runs were
    lost. Returns how many were sent again."""
    session = db.session

    def give_up(rollout: Rollout) -> None:
        reason = interrupted_reason(rollout.attempts)
        log.error("rollout %s: %s", rollout.id, reason)
        rollout.status, rollout.error, rollout.updated_at = "failed", reason, utcnow()
        rollout.lease_expires_at = None

    def resend(rollout: Rollout) -> None:
        log.warning("rollout %s past its lease with no worker; dispatched again", rollout.id)
        _lease_and_send(session, rollout)

    try:
        requeued = reap_stalled(session, Rollout, ROLLOUT_LOCK, Rollout.status.in_(("pending", "running")),
                                give_up=give_up, resend=resend)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return requeued


def apply_to_org(rollout_id: str, artifact: Artifact, org_id: str, product: str) -> str:
    """Bring one org's copy to the rollout's version (one unit of work: the copy, its registry row and the
    rollout's progress commit together); returns the outcome. The domain services are called with the
    platform's tenant in the org (seeding.platform_tenant) and this step's session.

    The org's seeding lock is taken for this transaction (`pg_advisory_xact_lock`, the key space of
    `org_lock`), so seeding and a rollout never work on the same org at once."""
    tenant = platform_tenant(org_id, product)
    with db.product_session(product) as session:
        session.execute(text("SELECT pg_advisory_xact_lock(:c, hashtext(:k))"),
                        {"c": SEED_LOCK, "k": f"{org_id}/{product}"})
        row = session.get(OrgArtifact, (org_id, product, artifact.id), with_for_update=True)
        try:
            outcome, detail = _decide_and_apply(session, tenant, artifact, row, rollout_id)
        except ApiError as exc:
            session.rollback()
            outcome, detail = "failed", f"{exc.message} {json.dumps(exc.details) if exc.details else ''}".strip()
            _progress(session, rollout_id, org_id, product, outcome, detail)
        except Exception as exc:  # one org's failure never stops the rollout
            session.rollback()
            log.exception("rollout %s: org %s/%s failed", rollout_id, org_id, product)
            outcome, detail = "failed", f"{type(exc).__name__}: {exc}"[:2000]
            _progress(session, rollout_id, org_id, product, outcome, detail)
    return outcome


def _progress(session, rollout_id: str, org_id: str, product: str, outcome: str, detail: str | None) -> None:
    """Outcome row, counts and cursor: staged in the org's transaction (committed with its copy)."""
    session.execute(insert(RolloutOutcome).values(
        rollout_id=rollout_id, org_id=org_id, product=product, outcome=outcome, detail=detail, at=utcnow())
        .on_conflict_do_update(index_elements=["rollout_id", "org_id", "product"],
                               set_={"outcome": outcome, "detail": detail, "at": utcnow()}))
    session.execute(update(Rollout).where(Rollout.id == rollout_id).values(
        cursor_org=org_id, cursor_product=product, updated_at=utcnow(),
        counts=Rollout.counts.op("||")(func.jsonb_build_object(
            outcome, func.coalesce(Rollout.counts[outcome].astext.cast(Integer), 0) + 1))))


def _decide_and_apply(session: Session, tenant: Tenant, artifact: Artifact, row: OrgArtifact | None,
                      rollout_id: str) -> tuple[str, str | None]:
    """The org's outcome, its copy and progress added to `session` (apply_to_org commits them together)."""
    org_id, product = tenant.org_id, tenant.product
    target = artifact.artifact_version
    if row is None:
        _progress(session, rollout_id, org_id, product, "added", None)
        PROVISIONERS[artifact.kind](session, tenant, artifact)
        return "added", None
    if row.artifact_version >= target:
        _progress(session, rollout_id, org_id, product, "current", None)
        return "current", None
    state = _copy_state(session, row)
    if state == "missing":
        detail = f"the org deleted its copy ({row.object_id})"
        _progress(session, rollout_id, org_id, product, "missing", detail)
        return "missing", detail
    if state == "edited":
        row.forked_from_version, row.updated_at = row.artifact_version, utcnow()
        if row.kind == "entity":
            session.execute(update(EntityDefinition).where(EntityDefinition.id == row.object_id)
                            .values(forked_from_version=row.artifact_version))
        detail = f"edited copy kept at version {row.artifact_version} (latest {target})"
        _progress(session, rollout_id, org_id, product, "forked", detail)
        return "forked", detail
    row.artifact_version, row.forked_from_version, row.updated_at = target, None, utcnow()
    _progress(session, rollout_id, org_id, product, "updated", None)
    REPLACERS[row.kind](session, tenant, artifact, row)
    return "updated", None


def _copy_state(session: Session, row: OrgArtifact) -> str:
    """`unedited`, `edited` or `missing` for the org's current copy."""
    if row.kind in ("database", "storage"):
        return "unedited"
    if row.kind == "entity":
        definition = session.get(EntityDefinition, row.object_id)
        if definition is None:
            return "missing"
        return "unedited" if definition.updated_by == SYSTEM_USER and definition.is_active else "edited"
    model = Agent if row.kind == "agent" else CatalogSkill
    obj = session.get(model, row.object_id)
    if obj is None:
        return "missing"
    return "unedited" if obj.doc.get("updatedBy") == SYSTEM_USER else "edited"


# REPLACERS[kind](session, tenant, artifact, row): the org's unedited copy replaced by the artifact's version,
# in `session` (apply_to_org's unit of work commits it with the row and the progress).


def _replace_database(session: Session, tenant: Tenant, artifact: Artifact, row: OrgArtifact) -> None:
    ensure_product(row.product)


def _replace_storage(session: Session, tenant: Tenant, artifact: Artifact, row: OrgArtifact) -> None:
    store = get_blob_store()
    prefix = storage_prefix(artifact, row.org_id)
    store.put(prefix + "README.txt", f"Files of organization {row.org_id}.\n".encode(), "text/plain")
    row.object_id = f"{store.container}/{prefix}"


def _replace_entity(session: Session, tenant: Tenant, artifact: Artifact, row: OrgArtifact) -> None:
    data, views = entity_input(artifact.payload)
    data.update(artifactVersion=artifact.artifact_version, forkedFromVersion=None, source="platform")
    current = session.get(EntityDefinition, row.object_id)
    definition = definitions.update_definition(session, tenant, current.name, data, provenance=True)
    have = {v.name for v in view_service.list_views(session, definition)}
    for view in views:
        if view["name"] not in have:
            view_service.create_view(session, tenant, definition, dict(view))


def _replace_skill(session: Session, tenant: Tenant, artifact: Artifact, row: OrgArtifact) -> None:
    data = skill_input(artifact.payload, artifact.artifact_version)
    skill_service.update_skill(session, tenant, session.get(CatalogSkill, row.object_id).name, data)


def _replace_agent(session: Session, tenant: Tenant, artifact: Artifact, row: OrgArtifact) -> None:
    data = agent_input(session, artifact.payload, artifact.artifact_version, row.org_id)
    data.pop("isDefault", None)  # which agent is the default stays the org's choice
    agent_service.update_agent(session, tenant, row.object_id, data)


REPLACERS = {"database": _replace_database, "storage": _replace_storage, "entity": _replace_entity,
             "skill": _replace_skill, "agent": _replace_agent}


# --------------------------------------------------------------------------- status


def rollout_to_wire(r: Rollout) -> dict[str, Any]:
    done = sum((r.counts or {}).values())
    return {"id": r.id, "artifactId": r.artifact_id, "kind": r.kind, "name": r.name,
            "artifactVersion": r.artifact_version, "status": r.status, "total": r.total, "processed": done,
            "counts": {k: (r.counts or {}).get(k, 0) for k in OUTCOMES}, "error": r.error,
            "createdBy": r.created_by, "createdAt": iso(r.created_at), "updatedAt": iso(r.updated_at),
            "finishedAt": iso(r.finished_at)}




def rollout_progress() -> tuple[int, int, int]:
    """(rollouts of this deployment pending or running, orgs they cover, orgs done) for /metrics, in one
    statement of at most 1 s."""
    with db.engine.begin() as conn:
        conn.execute(text("SET LOCAL statement_timeout = 1000"))
        row = conn.execute(text(
            "SELECT count(*), coalesce(sum(total), 0), coalesce(sum((SELECT coalesce(sum(value::int), 0) "
            "FROM jsonb_each_text(counts))), 0) FROM platform.rollouts "
            "WHERE status IN ('pending', 'running') AND key_prefix = :prefix"),
            {"prefix": current_app.config.get("CELERY_KEY_PREFIX") or ""}).one()
    return int(row[0]), int(row[1]), int(row[2])


def list_rollouts(limit: int = 50) -> list[Rollout]:
    return list(db.session.scalars(select(Rollout).order_by(Rollout.created_at.desc()).limit(limit)))


def get_rollout(rollout_id: str) -> Rollout:
    rollout = db.session.get(Rollout, rollout_id)
    if rollout is None:
        raise NotFound(f"Rollout {rollout_id} not found.")
    return rollout


def rollout_outcomes(rollout_id: str, outcome: str | None = None, after: str | None = None,
                     limit: int = 100) -> list[RolloutOutcome]:
    stmt = select(RolloutOutcome).where(RolloutOutcome.rollout_id == rollout_id)
    if outcome:
        stmt = stmt.where(RolloutOutcome.outcome == outcome)
    if after:
        org, _, product = after.partition("/")
        stmt = stmt.where(tuple_(RolloutOutcome.org_id, RolloutOutcome.product) > tuple_(org, product))
    return list(db.session.scalars(stmt.order_by(RolloutOutcome.org_id, RolloutOutcome.product).limit(limit)))


def outcome_to_wire(o: RolloutOutcome) -> dict[str, Any]:
    return {"orgId": o.org_id, "product": o.product, "outcome": o.outcome, "detail": o.detail, "at": iso(o.at)}


@db.unit_of_work()
def resume(rollout_id: str) -> Rollout:
    """Re-send a rollout that stopped (worker lost, `failed`); it continues from its cursor. A command,
    like `publish`: its own unit of work, or the caller's."""
    session = db.session
    rollout = get_rollout(rollout_id)
    if rollout.status in ("done", "superseded"):
        return rollout
    rollout.status, rollout.error, rollout.updated_at = "pending", None, utcnow()
    # a new token: a message of the stopped chain still on its way does nothing; the runs start counting anew
    rollout.dispatch_token, rollout.attempts = (rollout.dispatch_token or 0) + 1, 0
    _lease_and_send(session, rollout)
    return rollout


