"""Organization seeding: the org, its admin user and the 15 platform artifacts (docs/decisions.md).

Every artifact is created through the domain services (app.entities, app.agents), exactly as the
org's admin would through the API, called with the platform's tenant in the org (`platform_tenant`:
role admin, user `platform`) and the step's session. Each artifact is one unit of work
(`db.product_session`): what was provisioned is recorded in `platform.org_artifacts` in the same
transaction as the object itself, so a crash never leaves an object the registry does not know about;
a second call finds every row and creates nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

from flask import current_app
from marshmallow import RAISE, ValidationError, fields, validate, validates
from sqlalchemy import func, select, text, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.agents.models import Agent, CatalogSkill
from app.agents.schemas import AgentInputSchema, SkillInputSchema
from app.agents.services import agents, skills
from app.db import db, product_slug, schema_for
from app.entities.schemas import DefinitionInputSchema
from app.entities.services import definitions
from app.entities.services import views as view_service
from app.errors import ApiError, NotFound, ValidationFailed
from app.fields import NulFree
from app.ops.artifacts import BUILTIN, artifact_id
from app.platform_models import Artifact, Organization, OrgArtifact, User
from app.storage import get_blob_store
from app.storage.keys import org_segment
from app.tenancy import Tenant
from app.wire import new_id, utcnow

log = logging.getLogger(__name__)
_DOMAIN = re.compile(r"^(?=.{1,253}$)(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))+$")
SEED_LOCK = 0x5345_4544  # pg advisory lock class for seeding one org
# The identity the platform acts as when it writes an org's artifact copies (createdBy/updatedBy).
# A copy whose updatedBy is anyone else was edited by the org (see app.ops.rollout).
SYSTEM_USER = "platform"


# --------------------------------------------------------------------------- request shape


class _Strict(NulFree):
    class Meta:
        unknown = RAISE


class SeedOrgSchema(_Strict):
    title = fields.String(required=True, validate=validate.Length(min=1, max=200))
    mainDomain = fields.String(required=True, validate=validate.Length(min=1, max=253),
                               metadata={"description": "the org's id is derived from it (lower-cased)"})
    product = fields.String(required=True, validate=validate.Length(min=1, max=40))

    @validates("mainDomain")
    def _domain(self, value: str, **_) -> None:
        if not _DOMAIN.match(value.strip().lower().rstrip(".")):
            raise ValidationError("Must be a domain name such as example.com.")

    @validates("product")
    def _product(self, value: str, **_) -> None:
        try:
            ok = product_slug(value) == value
        except ValueError:
            ok = False
        if not ok:
            raise ValidationError("Must be a product slug: lower-case letters, digits and _, starting with a "
                                  "letter (at most 40).")


class SeedAdminSchema(_Strict):
    email = fields.Email(required=True, validate=validate.Length(max=320))
    firstName = fields.String(required=True, validate=validate.Length(min=1, max=200))
    lastName = fields.String(required=True, validate=validate.Length(min=1, max=200))


class SeedRequestSchema(_Strict):
    org = fields.Nested(SeedOrgSchema, required=True)
    admin = fields.Nested(SeedAdminSchema, required=True)


def flatten_errors(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """`{"org": {"mainDomain": [...]}}` → `{"org.mainDomain": [...]}`."""
    out: dict[str, list[str]] = {}
    if isinstance(messages, dict):
        for key, value in messages.items():
            out.update(flatten_errors(value, f"{prefix}{key}." if prefix or key != "_schema" else ""))
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        out[prefix.rstrip(".") or "body"] = messages
    else:
        out[prefix.rstrip(".") or "body"] = [str(messages)]
    return out


def validate_seed_request(payload: Any) -> dict:
    """The loaded request, or 400 VALIDATION_ERROR naming every bad field (`org.mainDomain`, …)."""
    if not isinstance(payload, dict):
        raise ValidationFailed("Request body must be a JSON object with org and admin.",
                               {"fields": {"body": ["must be an object"]}})
    try:
        return SeedRequestSchema().load(payload)
    except ValidationError as exc:
        fields_ = flatten_errors(exc.messages)
        raise ValidationFailed(f"Invalid seed request: {', '.join(sorted(fields_))}.", {"fields": fields_}) from None


def org_id_for(main_domain: str) -> str:
    """The org id derived from its main domain: the domain itself, lower-cased (unique, path-safe)."""
    return main_domain.strip().lower().rstrip(".")


# --------------------------------------------------------------------------- registry


def sync_builtin_artifacts(session) -> bool:
    """Make sure every built-in artifact has its row. A version published later (higher
    artifactVersion) is kept; the release's own definition replaces an equal or older one.

    Called on every registry read, so it reads first and writes only the built-ins whose row is
    missing or behind (a release that changed them): a read of the registry issues no write (no row
    locks, no WAL, nothing for a read replica to refuse). Returns whether it wrote."""
    wanted = {(a["kind"], a["name"]): (i, a) for i, a in enumerate(BUILTIN)}
    stored = {(r.kind, r.name): r for r in session.execute(
        select(Artifact.kind, Artifact.name, Artifact.artifact_version, Artifact.payload)
        .where(tuple_(Artifact.kind, Artifact.name).in_(list(wanted))))}
    stale = [(i, a) for key, (i, a) in wanted.items()
             if key not in stored or stored[key].artifact_version < a["artifactVersion"]
             or (stored[key].artifact_version == a["artifactVersion"]
                 and not _same_json(stored[key].payload, a["definition"]))]
    if not stale:
        return False
    rows = [{"id": artifact_id(a["kind"], a["name"]), "kind": a["kind"], "name": a["name"],
             "artifact_version": a["artifactVersion"], "payload": a["definition"], "position": i}
            for i, a in stale]
    stmt = insert(Artifact).values(rows)
    session.execute(stmt.on_conflict_do_update(  # the same guard in SQL: a concurrent publish wins
        index_elements=["kind", "name"],
        set_={"payload": stmt.excluded.payload, "artifact_version": stmt.excluded.artifact_version,
              "position": stmt.excluded.position, "updated_at": func.now()},
        where=(Artifact.artifact_version < stmt.excluded.artifact_version)
        | ((Artifact.artifact_version == stmt.excluded.artifact_version)
           & Artifact.payload.is_distinct_from(stmt.excluded.payload))))
    return True


def _same_json(a: Any, b: Any) -> bool:
    """The same JSON document: compared as canonical JSON text, not with `==` (Python holds `1 == True`
    and `0 == False`, jsonb does not)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def current_artifacts(session) -> list[Artifact]:
    return list(session.scalars(select(Artifact).order_by(Artifact.position, Artifact.id)))


# --------------------------------------------------------------------------- seeding


def platform_tenant(org_id: str, product: str) -> Tenant:
    """The platform acting in the org (role admin), the tenant the domain services are called with: they
    write the org's copies stamped createdBy/updatedBy `platform`."""
    return Tenant(org_id=org_id, user_id=SYSTEM_USER, email=None, role="admin", scopes=("*",), product=product)


@contextlib.contextmanager
def org_lock(org_id: str, product: str) -> Iterator[None]:
    """One seeder (or rollout step) per org and product at a time, across processes."""
    key = f"{org_id}/{product}"
    with db.engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:c, hashtext(:k))"), {"c": SEED_LOCK, "k": key})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:c, hashtext(:k))"), {"c": SEED_LOCK, "k": key})
            conn.commit()


def ensure_product(product: str) -> None:
    """Register the product and migrate its schema (idempotent; one migrator at a time)."""
    from migrations.runner import ADVISORY_LOCK, create_product  # alembic: imported only where a migration runs

    with db.engine.connect() as conn:
        known = conn.scalar(text("SELECT 1 FROM platform.products WHERE slug = :s"), {"s": product})
    if known and product in current_app.extensions.get("_seed_migrated", ()):
        return
    with db.engine.connect() as lock_conn:
        lock_conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK})
        try:
            create_product(db.engine, product)
        finally:
            lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK})
            lock_conn.commit()
    current_app.extensions.setdefault("_seed_migrated", set()).add(product)


def seed_org(payload: Any) -> dict[str, Any]:
    """Create (or complete) an organization: org row, admin user, every platform artifact.

    A job of its own steps, whoever calls it (the internal route, the CLI, the seed task): the org and
    its admin are one unit of work, committed before the artifacts are provisioned, each in its own.
    Idempotent: what exists is reported as `existing`, nothing is created twice."""
    data = validate_seed_request(payload)
    org_in, admin_in = data["org"], data["admin"]
    org_id = org_id_for(org_in["mainDomain"])
    product = product_slug(org_in["product"])
    email = admin_in["email"].strip().lower()
    ensure_product(product)

    with org_lock(org_id, product):
        with db.product_session(product) as session:  # the org and its admin: committed before the artifacts
            org_created = session.execute(insert(Organization).values(
                id=org_id, title=org_in["title"], main_domain=org_id, product=product, created_at=utcnow())
                .on_conflict_do_nothing().returning(Organization.id)).first() is not None
            user_created = session.execute(insert(User).values(
                id=new_id(), org_id=org_id, email=email, first_name=admin_in["firstName"],
                last_name=admin_in["lastName"], role="admin", created_at=utcnow())
                .on_conflict_do_nothing(index_elements=["org_id", "email"]).returning(User.id)).first() is not None
            user = session.scalars(select(User).where(User.org_id == org_id, func.lower(User.email) == email)).one()
            org = session.get(Organization, org_id)
            sync_builtin_artifacts(session)
            artifacts = current_artifacts(session)

        results = []
        for artifact in artifacts:
            results.append(provision_one(artifact, org_id, product))

    created = sum(1 for r in results if r["status"] == "created")
    return {
        "orgId": org_id, "title": org.title, "mainDomain": org.main_domain, "product": product,
        "schema": schema_for(product), "orgCreated": org_created,
        "created": bool(created or org_created or user_created),
        "admin": {"id": user.id, "email": user.email, "firstName": user.first_name, "lastName": user.last_name,
                  "role": user.role, "created": user_created},
        "artifacts": results,
        "summary": {"total": len(results), "created": created,
                    "existing": sum(1 for r in results if r["status"] == "existing"),
                    "conflict": sum(1 for r in results if r["status"] == "conflict")},
    }


def seed_status(org_id: str, product: str) -> dict[str, Any]:
    """What an org holds in a product: every registry artifact, `existing` or `missing` (not yet
    provisioned), with the org's version and fork marker."""
    session = db.session
    org = session.get(Organization, org_id)
    if org is None:
        raise NotFound(f"Organization '{org_id}' not found.")
    rows = {r.artifact_id: r for r in session.scalars(select(OrgArtifact).where(
        OrgArtifact.org_id == org_id, OrgArtifact.product == product))}
    lines = []
    for artifact in current_artifacts(session):
        row = rows.get(artifact.id)
        lines.append(_line(artifact, row.object_id, row.artifact_version, "existing", row.forked_from_version)
                     if row else _line(artifact, None, artifact.artifact_version, "missing"))
    return {"orgId": org_id, "title": org.title, "mainDomain": org.main_domain, "product": product,
            "artifacts": lines, "summary": {"total": len(lines),
                                            "existing": sum(1 for x in lines if x["status"] == "existing"),
                                            "missing": sum(1 for x in lines if x["status"] == "missing")}}


def provision_one(artifact: Artifact, org_id: str, product: str) -> dict:
    """Provision one artifact into the org unless it already is, as one unit of work (the object and its
    registry row commit together); returns its line of the report."""
    tenant = platform_tenant(org_id, product)
    try:
        with db.product_session(product) as session:
            row = session.get(OrgArtifact, (org_id, product, artifact.id))
            if row is not None:
                return _line(artifact, row.object_id, row.artifact_version, "existing", row.forked_from_version)
            object_id = PROVISIONERS[artifact.kind](session, tenant, artifact)
    except ApiError as exc:  # e.g. the org already has its own object with that name (the step rolled back)
        log.warning("seeding %s into %s/%s: %s", artifact.id, org_id, product, exc.message)
        return {**_line(artifact, None, artifact.artifact_version, "conflict"), "detail": exc.message}
    return _line(artifact, object_id, artifact.artifact_version, "created")


def _line(artifact: Artifact, object_id: str | None, version: int, status: str, forked: int | None = None) -> dict:
    line = {"id": artifact.id, "kind": artifact.kind, "name": artifact.name, "objectId": object_id,
            "artifactVersion": version, "status": status}
    if forked is not None:
        line["forkedFromVersion"] = forked
    return line


def record(session: Session, tenant: Tenant, artifact: Artifact, object_id: str, stamp: str | None = None) -> None:
    """Add the provenance row to `session` (committed with the object)."""
    session.add(OrgArtifact(org_id=tenant.org_id, product=tenant.product, artifact_id=artifact.id, kind=artifact.kind,
                            name=artifact.name, object_id=object_id, artifact_version=artifact.artifact_version,
                            stamp=stamp, created_at=utcnow(), updated_at=utcnow()))


# --------------------------------------------------------------------------- provisioners (one per kind)
#
# PROVISIONERS[kind](session, tenant, artifact) -> object id: the org's copy and its registry row, added to
# `session` (the caller's unit of work commits them: provision_one's, or a rollout's per-org one).


def _provision_database(session: Session, tenant: Tenant, artifact: Artifact) -> str:
    schema = schema_for(tenant.product)  # migrated by ensure_product
    record(session, tenant, artifact, schema)
    return schema


def storage_prefix(artifact: Artifact, org_id: str) -> str:
    return f"{(artifact.payload or {}).get('prefix') or 'orgs'}/{org_segment(org_id)}/"


def _provision_storage(session: Session, tenant: Tenant, artifact: Artifact) -> str:
    store = get_blob_store()
    prefix = storage_prefix(artifact, tenant.org_id)
    store.put(prefix + "README.txt", f"Files of organization {tenant.org_id}.\n".encode(), "text/plain")
    object_id = f"{store.container}/{prefix}"
    record(session, tenant, artifact, object_id)
    return object_id


def entity_input(definition: dict) -> tuple[dict, list[dict]]:
    body = {k: v for k, v in definition.items() if k != "views"}
    return DefinitionInputSchema().load(body), list(definition.get("views") or [])


def _provision_entity(session: Session, tenant: Tenant, artifact: Artifact) -> str:
    data, views = entity_input(artifact.payload)
    data.update(artifactVersion=artifact.artifact_version, forkedFromVersion=None, source="platform")
    definition = definitions.create_definition(session, tenant, data, provenance=True)
    record(session, tenant, artifact, definition.id)
    for view in views:
        view_service.create_view(session, tenant, definition, dict(view))
    return definition.id


def skill_input(definition: dict, version: int) -> dict:
    data = SkillInputSchema().load(definition)
    data["artifactVersion"] = version
    return data


def _provision_skill(session: Session, tenant: Tenant, artifact: Artifact) -> str:
    data = skill_input(artifact.payload, artifact.artifact_version)
    data["id"] = new_id()
    record(session, tenant, artifact, data["id"])
    skills.create_skill(session, tenant, data)
    return data["id"]


def agent_input(session: Session, definition: dict, version: int, org_id: str) -> dict:
    """The agent body with embedded skills named by `skillName` resolved to the org's catalog ids."""
    body = dict(definition)
    wanted = [s for s in body.get("skills") or []]
    names = [s.get("skillName") for s in wanted if s.get("skillName")]
    ids = dict(session.execute(select(CatalogSkill.name, CatalogSkill.id).where(
        CatalogSkill.org_id == org_id, CatalogSkill.name.in_(names))).all()) if names else {}
    body["skills"] = [{"skillId": s.get("skillId") or ids[s["skillName"]], "enabled": s.get("enabled", True),
                       "order": s.get("order", i)}
                      for i, s in enumerate(wanted) if s.get("skillId") or s.get("skillName") in ids]
    data = AgentInputSchema().load(body)
    data["artifactVersion"] = version
    return data


def _provision_agent(session: Session, tenant: Tenant, artifact: Artifact) -> str:
    data = agent_input(session, artifact.payload, artifact.artifact_version, tenant.org_id)
    if data.get("isDefault") and session.scalar(select(Agent.id).where(
            Agent.org_id == tenant.org_id, Agent.is_default.is_(True))):
        data["isDefault"] = False  # the org already chose its default agent
    data["id"] = new_id()
    record(session, tenant, artifact, data["id"])
    agents.create_agent(session, tenant, data)
    return data["id"]


PROVISIONERS = {"database": _provision_database, "storage": _provision_storage, "entity": _provision_entity,
                "skill": _provision_skill, "agent": _provision_agent}
