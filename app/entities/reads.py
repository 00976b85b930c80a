"""Hot read paths of the entity store, in as few round trips as the answer allows."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.db import db
from app.entities.models import EntityDefinition, EntityRecord
from app.entities.services.definitions import find_definition
from app.entities.services.records import RECORD_COLUMNS, record_to_wire
from app.errors import NotFound
from app.tenancy import current_org

T = EntityRecord.__table__
D = EntityDefinition.__table__
_COLUMNS = [T.c[name] for name in RECORD_COLUMNS]


def get_record(entity_name: str, record_id: str) -> dict[str, Any]:
    """The org's active record `record_id` of its active definition `entity_name`, as the wire dict.

    One statement (record joined with its definition) instead of loading the definition first; only
    a miss asks again, to say whether the entity or the record is what does not exist."""
    org = current_org()
    stmt = (select(*_COLUMNS).join(D, D.c.id == T.c.entity_id)
            .where(T.c.id == record_id, T.c.org_id == org, T.c.is_active.is_(True),
                   D.c.org_id == org, D.c.name == entity_name, D.c.is_active.is_(True)))
    row = db.session.execute(stmt).first()
    if row is None:
        find_definition(entity_name)  # 404 "Entity … not found" when the entity is what is missing
        raise NotFound("Record not found.")
    return record_to_wire(row)
