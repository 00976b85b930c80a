"""Counting a definition's matching records: exact, or the planner's estimate (PostgREST's count modes).

The statements every record read starts from (`record_scope`) and counts with (`counted`,
`planned_count`); app.entities.query runs them, app.entities.similar counts a `$similar` through them.
"""

from __future__ import annotations

import json

from flask import current_app
from sqlalchemy import func, literal, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.sql.expression import Executable

from app.db import db
from app.entities.models import EntityDefinition, EntityRecord

T = EntityRecord.__table__
COUNT_MODES = ("exact", "planned", "estimated")


def record_scope(definition: EntityDefinition) -> list:
    """The conditions every record read of a definition starts with: org, entity, active."""
    return [T.c.org_id == definition.org_id, T.c.entity_id == definition.id, T.c.is_active.is_(True)]


class _ExplainJson(Executable, ClauseElement):
    """`EXPLAIN (FORMAT JSON) <select>`, with the select's parameters bound as usual."""

    inherit_cache = False

    def __init__(self, stmt):
        self.stmt = stmt


@compiles(_ExplainJson, "postgresql")
def _compile_explain(element, compiler, **kw):
    return "EXPLAIN (FORMAT JSON) " + compiler.process(element.stmt, **kw)


def planned_count(where: list, table=T) -> int:
    """The planner's estimate of the matching rows (PostgREST's `count=planned`): no scan at all."""
    plan = db.session.scalar(_ExplainJson(select(literal(1)).select_from(table).where(*where)))
    if isinstance(plan, str):
        plan = json.loads(plan)
    return max(0, int(round(plan[0]["Plan"]["Plan Rows"])))


def counted(where: list, mode: str = "exact", count_where: list | None = None, table=T,
            token_of: str | None = None, token=None, values: dict | None = None) -> tuple[int, str, str | None]:
    """(count, how it was counted, a row token). `estimated` counts exactly while the estimate is at most
    ENTITY_COUNT_ESTIMATE_ABOVE, and reports the estimate beyond (PostgREST's `count=estimated`).
    `count_where` (a `$similar`: CompiledFilter.where_to_count) is the same set, cheaper to count
    exactly; the planner estimates `where` (it cannot estimate the stamp's `embedded_version = version`).
    `token_of`: a definition id whose current row token (`token`: the column of it, definitions.TOKEN_OF)
    the exact count selects beside the count, from the same snapshot (the token is None when not asked
    or when no exact count ran). `values`: the bound values of a reused filter shape
    (filters.CompiledFilter.values; exact counts only: an estimate renders `where` as it is)."""
    if mode in ("planned", "estimated"):
        if values:
            raise ValueError("an estimate renders `where` with its own values: not for a reused filter shape")
        estimate = planned_count(where, table)
        if mode == "planned" or estimate > current_app.config["ENTITY_COUNT_ESTIMATE_ABOVE"]:
            return estimate, "planned" if mode == "planned" else "estimated", None
    terms = count_where or where
    if token_of is None:
        result = db.execute_shaped(db.session, ("count", table.schema, table.name),
                                   lambda: select(func.count()).select_from(table).where(*terms), terms,
                                   values=values)
        return int(result.scalar() or 0), "exact", None
    result = db.execute_shaped(db.session, ("count+token", table.schema, table.name),
                               lambda: select(func.count(), token).select_from(table).where(*terms),
                               terms, {"definition_token_id": token_of}, values=values)
    count, row_token = result.first()
    return int(count or 0), "exact", row_token
