"""Keyset pagination for record queries: an opaque, signed `cursor` (returned as `nextCursor`).

A cursor names the last row of a page by its sort key and id, so the next page is `WHERE (key, id)
after (k, id) ORDER BY key, id LIMIT n`: as fast on page 5 000 as on page 1 (no OFFSET to walk), and
stable under concurrent inserts and deletes (no row is repeated or skipped because others moved).

Payload (JSON, base64url) + "." + HMAC-SHA256 (base64url, 128 bits) under a key derived from
JWT_SECRET. The payload binds the org, the definition, a digest of the query's filters, sortBy,
sortOrder and pageSize, the number of the page it leads to, and the last row's key and id. A cursor
that does not verify, or was made for another org, entity or query, is a 400 naming `query.cursor`.

The agent registry's lists use the same cursors (`decode(..., path="cursor", what="list")`): there the
"definition" is the list (e.g. `agents`, `widgets:<agentId>`), the digest covers the list's filters,
and the key is the row's `name`.

Orders a cursor can follow: the default (created_at, id) and any sortBy (typed key with NULLs last,
id in the same direction). Relevance orders — `$similar` (vector index walk) and a ranked `$search`
without sortBy — are not keyset-able here: a cursor there is a 400.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from flask import current_app
from sqlalchemy import JSON, Text, and_, cast, literal, or_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

from app.errors import ValidationFailed

VERSION = 1
PATH = "query.cursor"


@dataclass(frozen=True)
class Position:
    """Where a cursor points: after the row with sort key `key` and id `id`; `page` is the next page's number."""

    page: int
    key: Any
    id: str


# json.dumps with arguments builds an encoder per call: one of each kept (the same text)
_DIGEST_JSON = json.JSONEncoder(sort_keys=True, default=str)
_PAYLOAD_JSON = json.JSONEncoder(separators=(",", ":"))


def query_digest(params: dict[str, Any]) -> str:
    shape = {k: params.get(k) for k in ("sortBy", "sortOrder", "pageSize")} | {"filters": params.get("filters") or {}}
    return hashlib.sha256(_DIGEST_JSON.encode(shape).encode()).hexdigest()[:32]


_KEYS: dict[str, bytes] = {}  # JWT_SECRET → the cursor key derived from it


def _key() -> bytes:
    secret = current_app.config["JWT_SECRET"]
    key = _KEYS.get(secret)
    if key is None:
        if len(_KEYS) > 8:  # secrets rotate rarely; tests make many apps
            _KEYS.clear()
        key = _KEYS[secret] = hashlib.sha256(b"entity-record-cursor\x00" + secret.encode()).digest()
    return key


def _mac(payload: bytes) -> bytes:
    return hmac.digest(_key(), payload, "sha256")[:16]  # one call into OpenSSL (hmac.new: a Python object)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(org_id: str, definition_id: str, digest: str, position: Position) -> str:
    payload = _PAYLOAD_JSON.encode({"v": VERSION, "o": org_id, "d": definition_id, "q": digest, "p": position.page,
                                    "k": _dump(position.key), "i": position.id}).encode()
    return f"{_b64(payload)}.{_b64(_mac(payload))}"


def decode(cursor: str, org_id: str, definition_id: str, digest: str, *, path: str = PATH,
           what: str = "entity") -> Position:
    """The position a cursor names; 400 (naming `path`) when it is malformed, forged, or made for another
    query (`what`: the kind of thing `definition_id` names, for the message)."""
    try:
        body, mac = cursor.split(".")
        payload, sent = _unb64(body), _unb64(mac)
    except (ValueError, binascii.Error):
        raise _invalid("not a cursor this API issued", path) from None
    if not hmac.compare_digest(_mac(payload), sent):
        raise _invalid("the cursor was altered or was not issued by this API", path)
    data = json.loads(payload)
    if data.get("v") != VERSION or data.get("o") != org_id or data.get("d") != definition_id:
        raise _invalid(f"the cursor belongs to another {what}", path)
    if data.get("q") != digest:
        raise _invalid("the cursor was issued for different filters, sort or pageSize", path)
    return Position(int(data["p"]), _load(data["k"]), data["i"])


def _invalid(reason: str, path: str = PATH) -> ValidationFailed:
    return ValidationFailed(f"Invalid cursor: {reason}.", {"fields": {path: [reason]}})


@dataclass(frozen=True)
class JsonText:
    """A JSONB sort key's value as its JSON text (`null` for a JSON null, which sorts among the values;
    a missing field is SQL NULL, the key None)."""

    text: str


def _dump(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, JsonText):
        return {"J": value.text}
    if isinstance(value, bool):
        return {"b": value}
    if isinstance(value, Decimal | int | float):
        return {"n": str(value)}
    if isinstance(value, datetime):
        return {"t": value.isoformat()}
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {"a": value}
    return {"j": value}  # a JSON field's value (sorted as JSONB)


def _load(value: Any) -> Any:
    if value is None:
        return None
    (tag, raw), = value.items()
    return {"b": bool, "n": Decimal, "t": datetime.fromisoformat, "s": str, "a": list,
            "j": lambda v: cast(v, JSONB), "J": lambda v: JsonText(str(v))}[tag](raw)


def after(key: ColumnElement, id_column: ColumnElement, descending: bool, position: Position) -> ColumnElement:
    """Rows after `position` in the order `key ASC|DESC NULLS LAST, id ASC|DESC`."""
    if position.key is None:  # inside the trailing NULLs: only the id moves on
        return and_(key.is_(None), id_column < position.id if descending else id_column > position.id)
    value = position.key
    if isinstance(value, JsonText):
        value = cast(literal(value.text, Text), JSONB)
    elif isinstance(key.type, JSON) and not isinstance(value, ColumnElement):
        value = _jsonb(value)  # a cursor issued before JsonText: its key compared as JSONB
    beyond = key < value if descending else key > value
    tie = and_(key == value, id_column < position.id if descending else id_column > position.id)
    return or_(beyond, tie, key.is_(None))


def _jsonb(value: Any) -> ColumnElement:
    """A cursor key read back from a JSONB sort key (a bool, a number as Decimal, a string, a list of
    strings) as that JSONB value: `CAST(:text AS JSONB)` (a Decimal keeps its digits)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, Decimal):
        text = str(value)
    else:
        text = json.dumps(value)
    return cast(literal(text, Text), JSONB)
