"""The wire layer's helpers, one of each: ids, the clock, the timestamp format and the envelopes.

Timestamps. Every timestamp the server fills in (createdAt, updatedAt, startedAt, finishedAt, the
agent documents' stamps) is ISO 8601 in UTC with milliseconds and a `Z`:
`2026-11-23T16:25:02.123Z`. `utcnow()` is already truncated to milliseconds, so what is stored is
exactly what is returned (a `createdAt` sent back in a filter matches the row it came from), and
the fixed width sorts as text. The envelopes' `metadata.timestamp` is integer Unix seconds (spec).

Response kinds. A resource or list is a dict the route returns through its marshmallow response
schema; an operation without a resource answers `SUCCESS`; the image call answers
`success_envelope(data)`; errors answer `app.errors.envelope`. JSON the database already holds as
text (agent documents) is returned as is by `json_text` — the measured fast path (bench/results/agents.md).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from flask import Response, request

SUCCESS = {"success": True}  # the spec's "success indicator"


def new_id() -> str:
    return str(uuid.uuid4())


def utcnow() -> datetime:
    """Now, in UTC, at the wire's precision (milliseconds)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def iso(moment: datetime | None) -> str | None:
    """The one timestamp format: ISO 8601 UTC with milliseconds and Z (None stays None)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    utc = moment.astimezone(UTC)
    if utc.year >= 1000:  # isoformat truncates to milliseconds as below (3x faster: every record's stamps)
        return utc.isoformat(timespec="milliseconds")[:23] + "Z"
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_instant(value: str) -> datetime:
    """A caller's ISO 8601 date or instant (analytics event times and windows) as an aware UTC datetime
    (no offset = UTC); ValueError otherwise."""
    text = (value or "").strip()
    if not text or len(text) > 64 or not text[:4].isdigit():
        raise ValueError(value)
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValueError(value) from None


def metadata(success: bool) -> dict[str, Any]:
    return {"success": success, "timestamp": int(time.time())}


def success_envelope(data: Any) -> dict[str, Any]:
    """`{data, metadata: {success: true, timestamp}}`."""
    return {"data": data, "metadata": metadata(True)}


def json_text(body: str, status: int = 200) -> Response:
    """A response whose body is JSON text already (from the database), sent without decoding."""
    return Response(body, status=status, mimetype="application/json")


def preferences() -> list[str]:
    """The tokens of the request's Prefer headers (RFC 7240), lower-cased, parameters dropped."""
    prefer = ",".join(request.headers.getlist("Prefer"))
    return [token.strip().split(";")[0].strip().lower() for token in prefer.split(",") if token.strip()]


def wants_async() -> bool:
    """`Prefer: respond-async`: the caller takes a 202 and a job to follow instead of the result."""
    return "respond-async" in preferences()
