"""Cursor keys of a JSONB sort key (app.entities.cursor.after): compared as JSONB, whichever way the
cursor carries them (JSON text since the review of round 2; Python values in cursors issued before)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import column, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB

from app.entities.cursor import JsonText, Position, _dump, _load, after

KEY, ID = column("k", JSONB), column("id")


def _sql(position: Position) -> tuple[str, dict]:
    compiled = select(ID).where(after(KEY, ID, False, position)).compile(dialect=postgresql.psycopg.dialect())
    return compiled.string, compiled.params


@pytest.mark.parametrize(("key", "text"), [(JsonText("null"), "null"), (JsonText('{"a": 1}'), '{"a": 1}'),
                                           (False, "false"), (True, "true"), (Decimal("2.50"), "2.50"),
                                           ("x", '"x"'), (["a", "b"], '["a", "b"]')])
def test_a_jsonb_key_is_bound_as_json_text_cast_to_jsonb(key, text):
    sql, params = _sql(Position(2, key, "id-1"))
    assert "AS JSONB" in sql and text in params.values()


def test_json_text_survives_the_cursor_payload_and_null_text_is_not_sql_null():
    assert _load(_dump(JsonText("null"))) == JsonText("null")
    sql, _params = _sql(Position(2, JsonText("null"), "id-1"))
    assert "k > CAST" in sql and "k IS NULL" in sql  # beyond the JSON null, then the SQL NULLs
