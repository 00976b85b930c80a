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


def test_a_cursor_is_the_payload_and_mac_it_always_was_and_old_ones_decode():
    """The cursor's text is unchanged by the kept encoders and the one-call MAC (a cursor issued before
    still decodes, a new one is the same text): the payload and MAC built the original way."""
    import base64
    import datetime
    import hashlib
    import hmac
    import json

    from flask import Flask

    from app.entities import cursor

    app = Flask(__name__)
    app.config["JWT_SECRET"] = "s3cret"
    key = hashlib.sha256(b"entity-record-cursor\x00s3cret").digest()
    with app.app_context():
        for value in (None, "é", 7, Decimal("1.50"), True, datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
                      JsonText('{"a": 1}'), ["a", "b"], {"x": [1, 2]}):
            position = Position(3, value, "id-9")
            payload = json.dumps({"v": 1, "o": "org", "d": "def", "q": "dig", "p": 3, "k": _dump(value),
                                  "i": "id-9"}, separators=(",", ":")).encode()
            mac = hmac.new(key, payload, hashlib.sha256).digest()[:16]
            old = (f"{base64.urlsafe_b64encode(payload).rstrip(b'=').decode()}."
                   f"{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}")
            assert cursor.encode("org", "def", "dig", position) == old
            decoded = cursor.decode(old, "org", "def", "dig")
            assert (decoded.page, decoded.id) == (3, "id-9")
            if not isinstance(value, dict):  # a JSON value's key decodes to a SQL expression
                assert decoded.key == _load(_dump(value))
        params = {"filters": {"b": 1, "a": [Decimal("2")]}, "sortBy": "x", "pageSize": 20}
        shape = {"sortBy": "x", "sortOrder": None, "pageSize": 20, "filters": params["filters"]}
        expected = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:32]
        assert cursor.query_digest(params) == expected
