"""Conditional requests (RFC 9110 §13) on versioned resources: `ETag`, `If-Match`, `If-None-Match`.

A resource with a `version` (entity records and definitions) has the strong entity tag `"<version>"`:
every write of the row bumps the version, so one version is one representation. A document of the
agent registry (agents, catalog skills, tool definitions, sub-agents, widgets: no version column) has
the tag of its representation: the md5 of the JSON text GET sends
(app.agents.services.documents.DocumentStore.etag_of). Strong tags, so `If-Match` can use them (RFC 9110 compares
If-Match strongly: a weak tag `W/"…"` never matches there).

- Reads answer `ETag`; `If-None-Match` naming the current tag (or `*`) answers 304 with no body
  (`tagged`).
- Writes (PUT, DELETE) take `If-Match`: the service compares it with the row it has locked for the
  write (`SELECT … FOR UPDATE`, held to the commit), so no other write can slip between the comparison
  and the update; a stale tag is 412 PRECONDITION_FAILED and nothing changes (`require_match`).
  Without the header the write is unconditional, as before. Write answers carry the new `ETag`.
"""

from __future__ import annotations

from flask import Response
from werkzeug.datastructures import ETags

from app.errors import PreconditionFailed
from app.reqctx import current_request, request_or_none


def etag(version: int | str) -> str:
    """The strong entity tag of a resource version (quoted, as the header carries it)."""
    return f'"{version}"'


def if_match() -> ETags | None:
    """The request's If-Match tags, or None when it sent none (the write is unconditional)."""
    req = request_or_none()
    if req is None or "HTTP_IF_MATCH" not in req.environ:  # `"If-Match" in headers`, without its KeyError
        return None
    return req.if_match


def require_match(expected: ETags | None, current: str, what: str) -> None:
    """412 unless `expected` (If-Match) is absent, `*`, or names `current` (strong comparison)."""
    if expected is None or expected.star_tag or expected.contains(current.strip('"')):
        return
    raise PreconditionFailed(f"The {what} was changed since you read it (its ETag is now {current}); "
                             "reload it and retry.", {"header": "If-Match", "etag": current})


def tagged(body, tag: str, status: int = 200):
    """A read's answer with its ETag; 304 Not Modified (ETag, no body) when If-None-Match names it
    (weak comparison, as RFC 9110 says for If-None-Match) or is `*`. `body` is what the view returns
    (a dict for its response schema, or a Response)."""
    req = current_request()
    if req.method in ("GET", "HEAD") and "HTTP_IF_NONE_MATCH" in req.environ \
            and req.if_none_match.contains_weak(tag.strip('"')):
        return Response(status=304, headers={"ETag": tag})
    if isinstance(body, Response):
        body.headers["ETag"] = tag
        return body
    return body, status, {"ETag": tag}


def with_etag(body, tag: str, status: int = 200):
    """A write's answer carrying the resource's new ETag."""
    if isinstance(body, Response):
        body.headers["ETag"] = tag
        return body
    return body, status, {"ETag": tag}
