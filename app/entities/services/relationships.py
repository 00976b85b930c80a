"""Relationships between two records of the same org."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, aliased

from app.db import db
from app.entities.models import EntityDefinition, EntityRelationship
from app.entities.services.common import (
    flush_unique,
    unstorable_errors,
)
from app.entities.services.definitions import find_definition
from app.entities.services.records import (
    find_record,
)
from app.errors import NotFound, ValidationFailed
from app.tenancy import Tenant, tenant_select
from app.wire import iso, utcnow


def create_relationship(session: Session, tenant: Tenant, definition: EntityDefinition, record_id: str,
                        data: dict) -> dict[str, Any]:
    """Link a record to another record of the same org (both must exist and be active)."""
    source = find_record(definition, record_id, session=session)
    target_definition = find_definition(data["toEntityName"], session=session, org_id=tenant.org_id)
    target = find_record(target_definition, data["toRecordId"], session=session)
    errors: dict[str, list[str]] = {}
    unstorable_errors(data.get("fields"), "fields", errors)
    unstorable_errors(data["relationshipType"], "relationshipType", errors)
    if errors:
        raise ValidationFailed("Invalid relationship.", {"fields": errors})
    relationship = EntityRelationship(
        org_id=tenant.org_id, from_entity_id=definition.id, from_record_id=source.id,
        to_entity_id=target_definition.id, to_record_id=target.id, relationship_type=data["relationshipType"],
        fields=data.get("fields"), is_active=True, created_by=tenant.user_id, created_at=utcnow())
    session.add(relationship)
    flush_unique(session, "This relationship already exists.")
    return relationship_to_wire(relationship, definition.name, target_definition.name)


def relationship_to_wire(r: EntityRelationship, from_name: str, to_name: str) -> dict[str, Any]:
    return {"id": r.id, "fromEntityName": from_name, "fromRecordId": r.from_record_id, "toEntityName": to_name,
            "toRecordId": r.to_record_id, "relationshipType": r.relationship_type, "fields": r.fields,
            "createdAt": iso(r.created_at), "isActive": r.is_active}


def list_relationships(definition: EntityDefinition, record_id: str, *, direction: str = "both",
                       relationship_type: str | None = None, target_entity: str | None = None) -> list[dict]:
    """Active relationships of a record; `targetEntity` names the entity on the other end."""
    record = find_record(definition, record_id)
    from_def, to_def = aliased(EntityDefinition), aliased(EntityDefinition)
    rel = EntityRelationship
    stmt = (select(rel, from_def.name, to_def.name)
            .join(from_def, from_def.id == rel.from_entity_id)
            .join(to_def, to_def.id == rel.to_entity_id)
            .where(rel.org_id == record.org_id, rel.is_active.is_(True)))
    outgoing = and_(rel.from_record_id == record.id, *([to_def.name == target_entity] if target_entity else []))
    incoming = and_(rel.to_record_id == record.id, *([from_def.name == target_entity] if target_entity else []))
    stmt = stmt.where({"outgoing": outgoing, "incoming": incoming, "both": or_(outgoing, incoming)}[direction])
    if relationship_type:
        stmt = stmt.where(rel.relationship_type == relationship_type)
    stmt = stmt.order_by(rel.created_at, rel.id)
    return [relationship_to_wire(r, f, t) for r, f, t in db.session.execute(stmt)]


def delete_relationship(session: Session, definition: EntityDefinition, record_id: str, relationship_id: str) -> None:
    record = find_record(definition, record_id, session=session)
    relationship = session.scalar(tenant_select(EntityRelationship, definition.org_id).where(
        EntityRelationship.id == relationship_id,
        or_(EntityRelationship.from_record_id == record.id, EntityRelationship.to_record_id == record.id)))
    if relationship is None:
        raise NotFound("Relationship not found.")
    session.delete(relationship)
    session.flush()
