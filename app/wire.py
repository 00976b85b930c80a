"""The wire layer's helpers, one of each: ids, the clock, the timestamp format and the envelopes.

Timestamps. Every timestamp the server fills in (createdAt, updatedAt, startedAt, finishedAt, the
agent documents' stamps) is ISO 8601 in UTC with milliseconds and a `Z`:
`2026-11-23T16:25:02.123Z`. `utcnow()` is already truncated to milliseconds, so what is stored is
exactly what is returned (a `createdAt` sent back in a filter matches the row it came from), and
the fixed width sorts as text. The envelopes' `metadata.timestamp` is integer Unix seconds (what clients parse).

Response kinds, each built here and nowhere else. A resource or list is a dict the route returns
through its marshmallow response schema; an operation without a resource answers `SUCCESS`; the
image call answers `success_envelope(data)` and analytics `response_wrapper(data, metadata)` (the two
success envelopes: `{data, metadata}` for images, `{success, data, metadata}` for analytics); work
accepted to run later answers `accepted(body, location)` (202);
a response the route must hold itself (a header or cookie beside the body, a bare number) is
`json_response`; errors answer `app.errors.envelope`. JSON the database already holds as text
(agent documents) is returned as is by `json_text` — the measured fast path (bench/results/agents.md).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from flask import Response, current_app, request

SUCCESS = {"success": True}  # the answer of a write with nothing else to say


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


def response_wrapper(data: Any, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """The analytics `*Response` wrapper: `{success: true, data, metadata?}` (metadata only when it
    says something: the resolved window, paging)."""
    return {"success": True, "data": data, **({"metadata": metadata} if metadata else {})}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """`body` as a JSON response (the app's JSON provider, as flask-smorest's own answers), for a route
    that needs the Response itself: a header or cookie beside it, or a body that is not an object."""
    response = current_app.json.response(body)
    response.status_code = status
    if headers:
        response.headers.update(headers)
    return response


def accepted(body: dict[str, Any], location: str | None = None, *, respond_async: bool = False) -> Response:
    """202 Accepted: the work runs later. `location` (the job's status URL) is sent as `Location`;
    `respond_async=True` when the 202 answers the caller's `Prefer: respond-async` (else the operation
    would have answered its result): `Preference-Applied: respond-async`. The body is sent as given
    (the route's `@blp.response(202, …)` documents it)."""
    headers = {"Location": location} if location else {}
    if respond_async:
        headers["Preference-Applied"] = "respond-async"
    return json_response(body, 202, headers)


def json_text(body: str, status: int = 200) -> Response:
    """A response whose body is JSON text already (from the database), sent without decoding."""
    return Response(body, status=status, mimetype="application/json")


def preferences() -> list[str]:
    """The tokens of the request's Prefer headers (RFC 7240), lower-cased, parameters dropped. Read from
    the WSGI environ, where the server joins repeated headers with commas (werkzeug's `getlist` walks
    every header of the request to find them)."""
    prefer = request.environ.get("HTTP_PREFER")
    if not prefer:
        return []
    return [token.strip().split(";")[0].strip().lower() for token in prefer.split(",") if token.strip()]


def wants_async() -> bool:
    """`Prefer: respond-async`: the caller takes a 202 and a job to follow instead of the result."""
    return "respond-async" in preferences()
