"""Idempotency keys: a retried POST carrying the same `Idempotency-Key` runs once.

An operation opts in with `@blp.idempotent` (app.extensions.Blueprint); a request to it that carries
the header is run by `run_idempotent` instead of the plain unit of work (a request without the header
pays one header lookup, nothing else). The semantics are Stripe's and those of the IETF
`Idempotency-Key` header draft:

- The key's scope is (org, product, caller, method, route template, key): two callers never see each
  other's answers, nor one route another's.
- The request's fingerprint is the sha256 of its path, query string and raw body bytes. The same key
  with another fingerprint is 422 IDEMPOTENCY_KEY_REUSED (nothing runs).
- The first request claims the key with `INSERT … ON CONFLICT DO NOTHING` on a row marked `running`,
  committed at once: a duplicate arriving while it runs finds the row and answers 409
  IDEMPOTENCY_KEY_IN_USE without waiting (whatever process it reached).
- When the operation answers, its response (status, body bytes, the headers that belong to it) is
  written into the row in the operation's own transaction (the request's unit of work): the effect and
  the stored answer commit together, or neither does. A later request with the key and fingerprint
  gets that answer replayed, with `Idempotent-Replayed: true`, and nothing runs again.
- An answer the caller should retry (5xx, 429) releases the key: the row is deleted, the retry runs.
  Any other 4xx is stored and replayed like a success (Stripe): the same request gets the same answer.
- A process that dies mid-request leaves its row `running` until `locked_until`
  (IDEMPOTENCY_LOCK_SECONDS, longer than any request may run); after that, the next request with the
  key takes the claim over. The stored answer is written only by the claim's owner (`owner`), so a
  request whose claim was taken over cannot commit its effect a second time: it rolls back with 409.
- An answer body larger than IDEMPOTENCY_MAX_ANSWER_BYTES is not stored: the row keeps its status, its
  headers (Location, ETag…), its size and sha256, and a replay answers 409 IDEMPOTENCY_ANSWER_NOT_STORED
  saying the request did run (with what status, where the result is) — never a second effect, never a
  silently different body. The bound keeps one keyed bulk write from parking megabytes in the table. A
  refusal that large (nothing happened: a 5 000-item bulk rejection) releases the key instead: the retry
  runs and is refused again.
- Rows live IDEMPOTENCY_TTL_SECONDS (24 h) from the first request; an expired row is as good as none,
  and the workers' maintenance loop deletes expired rows (`purge_expired`, app.tasks.run_maintenance).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from flask import Response, current_app, g, request
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    and_,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from werkzeug.exceptions import HTTPException

from app.db import PLATFORM_SCHEMA, db
from app.errors import ApiError, Conflict, InvalidInput, handle_api_error, handle_http_exception
from app.reqctx import current_request

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
_ENVIRON_KEY = "HTTP_" + HEADER.upper().replace("-", "_")  # where WSGI puts the header
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_CHARS = 255
# Headers of a response that are part of the answer and replayed with it (the rest is per request:
# X-Request-ID, CORS, rate-limit counters)
KEPT_HEADERS = ("Content-Type", "Location", "Preference-Applied", "ETag", "Link")
# Answers the caller should retry after: the key is released instead of stored
RETRYABLE = frozenset({408, 425, 429})
_CLAIM_ATTEMPTS = 4  # a row deleted or expired between our INSERT and SELECT: claim again

keys = Table(
    "idempotency_keys", MetaData(schema=PLATFORM_SCHEMA),
    Column("id", BigInteger, primary_key=True),
    Column("org_id", String(64)), Column("product", String(40)), Column("subject", String(200)),
    Column("method", String(10)), Column("route", String(300)), Column("idem_key", String(255)),
    Column("fingerprint", LargeBinary), Column("state", String(10)), Column("owner", String(36)),
    Column("locked_until", DateTime(timezone=True)), Column("created_at", DateTime(timezone=True)),
    Column("expires_at", DateTime(timezone=True)),
    Column("response_status", SmallInteger), Column("response_headers", JSONB),
    Column("response_body", LargeBinary), Column("response_bytes", Integer),
    Column("response_sha256", LargeBinary),
)
_SCOPE = ("org_id", "product", "subject", "method", "route", "idem_key")


class KeyInUse(ApiError):
    """The key's first request is still running."""

    status, code = 409, "IDEMPOTENCY_KEY_IN_USE"


class AnswerNotStored(ApiError):
    """The key's request ran, but its answer was larger than IDEMPOTENCY_MAX_ANSWER_BYTES: not replayable."""

    status, code = 409, "IDEMPOTENCY_ANSWER_NOT_STORED"


class KeyReused(ApiError):
    """The key was used for another request (another body, path or query)."""

    status, code = 422, "IDEMPOTENCY_KEY_REUSED"


@dataclass(frozen=True)
class Claim:
    """This request owns the key's row `row_id` (as `owner`) until it answers or its lock expires."""

    row_id: int
    owner: str


# --------------------------------------------------------------------------- the edge


def wanted(view) -> bool:
    """Whether this request asks for idempotency on an operation that offers it (`@blp.idempotent`).
    Called by the unit of work at the edge for every request: one header lookup when it has none."""
    if _ENVIRON_KEY not in current_request().environ:  # `HEADER in headers`, without its KeyError when absent
        return False
    return bool(getattr(_method_of(view), "_idempotent", False))


def _method_of(view):
    view_class = getattr(view, "view_class", None)
    return getattr(view_class, request.method.lower(), None) if view_class is not None else view


def run_idempotent(view, args, kwargs) -> Response:
    """`view` run once per key: the stored answer replayed, or the view run in the request's unit of
    work with its answer stored in the same transaction (module docstring)."""
    scope = _scope(_parse_key(request.headers.get(HEADER, "")))
    fingerprint = request_fingerprint()
    found = _claim(scope, fingerprint)
    if isinstance(found, Response):
        return found
    claim = found
    try:
        with db.unit_of_work():
            response = current_app.make_response(view(*args, **kwargs))
            if _releases(response.status_code):
                stored = False
            else:
                _store(claim, response)
                stored = True
    except (ApiError, HTTPException) as exc:
        status = exc.status if isinstance(exc, ApiError) else (exc.code or 500)
        if _releases(status):
            _release(claim)
            raise
        # a refusal the same request would get again (Stripe keeps 4xx): stored after the rollback
        response = handle_api_error(exc) if isinstance(exc, ApiError) else handle_http_exception(exc)
        if len(response.get_data()) > int(current_app.config["IDEMPOTENCY_MAX_ANSWER_BYTES"]):
            _release(claim)  # nothing happened: a retry may run again (and be refused again) rather than 409
        else:
            _store_after_failure(claim, response)
        return response
    except BaseException:
        _release(claim)
        raise
    if not stored:
        _release(claim)
    return response


def _releases(status: int) -> bool:
    return status >= 500 or status in RETRYABLE


def _parse_key(value: str) -> str:
    """The header's key: 1-255 visible ASCII characters. The draft's form is an RFC 8941 string
    (`"…"`); a bare token is accepted too, and both name the same key."""
    key = value.strip()
    if len(key) > 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key or len(key) > MAX_KEY_CHARS or not all(" " < ch < "\x7f" for ch in key):
        raise InvalidInput(f"{HEADER} must be 1 to {MAX_KEY_CHARS} visible ASCII characters (a UUID is a good key).",
                           {"header": HEADER})
    return key


def _scope(key: str) -> dict[str, str]:
    tenant = g.get("tenant")
    subject = f"user:{tenant.user_id}" if tenant is not None else str(g.get("internal_caller") or "-")
    return {"org_id": tenant.org_id if tenant is not None else "-",
            "product": tenant.product if tenant is not None else "-",
            "subject": subject[:200], "method": request.method,
            "route": request.url_rule.rule[:300] if request.url_rule is not None else request.path[:300],
            "idem_key": key}


def request_fingerprint() -> bytes:
    """sha256 over the request's path, query string and raw body bytes (module docstring)."""
    digest = hashlib.sha256()
    digest.update(request.path.encode("utf-8", "surrogateescape"))
    digest.update(b"?" + request.query_string + b"\n")
    digest.update(request.get_data(cache=True))
    return digest.digest()


# --------------------------------------------------------------------------- the row


def _autocommit():
    """A pooled connection whose statements commit one by one (the claim must be visible to a
    duplicate at once, and survive the request's rollback)."""
    return db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def _claim(scope: dict[str, str], fingerprint: bytes) -> Claim | Response:
    config = current_app.config
    owner = str(uuid.uuid4())
    lock = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, float(config["IDEMPOTENCY_LOCK_SECONDS"]))
    expires = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, float(config["IDEMPOTENCY_TTL_SECONDS"]))
    running = {"fingerprint": fingerprint, "state": "running", "owner": owner, "locked_until": lock,
               "expires_at": expires}
    where = and_(*(keys.c[name] == scope[name] for name in _SCOPE))
    with _autocommit() as conn:
        for _ in range(_CLAIM_ATTEMPTS):
            row_id = conn.scalar(pg_insert(keys).values(**scope, **running, created_at=func.now())
                                 .on_conflict_do_nothing(constraint="uq_idempotency_keys_scope")
                                 .returning(keys.c.id))
            if row_id is not None:
                return Claim(row_id, owner)
            row = conn.execute(select(keys.c.id, keys.c.fingerprint, keys.c.state, keys.c.response_status,
                                      keys.c.response_headers, keys.c.response_body, keys.c.response_bytes,
                                      keys.c.response_sha256,
                                      (keys.c.expires_at <= func.now()).label("expired"),
                                      (keys.c.locked_until <= func.now()).label("lock_expired"),
                                      func.ceil(func.extract("epoch", keys.c.locked_until - func.now()))
                                      .label("lock_left")).where(where)).first()
            if row is None:
                continue  # released between the two statements: claim again
            if row.expired:
                # a key past its lifetime is a new key: take the row over for this request
                taken = conn.scalar(update(keys).where(keys.c.id == row.id, keys.c.expires_at <= func.now())
                                    .values(**running, created_at=func.now(), response_status=None,
                                            response_headers=None, response_body=None, response_bytes=None,
                                            response_sha256=None).returning(keys.c.id))
                if taken is not None:
                    return Claim(taken, owner)
                continue
            if bytes(row.fingerprint) != fingerprint:
                raise KeyReused(f"This {HEADER} was used for a different request (another body, path or query); "
                                "use a new key for a new request.", {"header": HEADER})
            if row.state == "done":
                return _replay(row)
            if not row.lock_expired:
                wait = max(1, min(int(row.lock_left or 1), 5))
                raise KeyInUse(f"A request with this {HEADER} is still being processed; retry after it "
                               "finishes to get its answer.", {"header": HEADER, "retryAfterSeconds": wait},
                               headers={"Retry-After": str(wait)})
            # its request died (process killed) without answering: this request runs it
            taken = conn.scalar(update(keys).where(keys.c.id == row.id, keys.c.state == "running",
                                                   keys.c.locked_until <= func.now())
                                .values(owner=owner, locked_until=lock).returning(keys.c.id))
            if taken is not None:
                log.warning("idempotency key of %s %s: the claim of a request that did not answer was taken over",
                            scope["method"], scope["route"])
                return Claim(taken, owner)
    raise KeyInUse(f"The {HEADER} is contended; retry.", {"header": HEADER, "retryAfterSeconds": 1},
                   headers={"Retry-After": "1"})


def _answer(response: Response) -> dict[str, Any]:
    """The row's answer columns. A body above IDEMPOTENCY_MAX_ANSWER_BYTES is replaced by its size and
    sha256 (module docstring)."""
    headers = {name: response.headers[name] for name in KEPT_HEADERS if name in response.headers}
    body = response.get_data()
    stored: dict[str, Any] = {"state": "done", "response_status": response.status_code,
                              "response_headers": headers, "response_bytes": len(body)}
    if len(body) > int(current_app.config["IDEMPOTENCY_MAX_ANSWER_BYTES"]):
        log.info("idempotency: the %d-byte answer of %s %s is not stored (IDEMPOTENCY_MAX_ANSWER_BYTES); a "
                 "replay answers 409 IDEMPOTENCY_ANSWER_NOT_STORED", len(body), request.method, request.path)
        return {**stored, "response_body": None, "response_sha256": hashlib.sha256(body).digest()}
    return {**stored, "response_body": body, "response_sha256": None}


def _store(claim: Claim, response: Response) -> None:
    """The answer, in the request's transaction (it commits with the effect). A claim taken over since
    (this request outlived its lock) is not ours to answer: 409, and the effect rolls back."""
    stored = db.session.execute(update(keys).where(keys.c.id == claim.row_id, keys.c.owner == claim.owner,
                                                   keys.c.state == "running").values(**_answer(response)))
    if stored.rowcount != 1:
        raise Conflict(f"This request outlived its {HEADER} claim (IDEMPOTENCY_LOCK_SECONDS) and another "
                       "request took it over; nothing was changed.", {"header": HEADER})


def _store_after_failure(claim: Claim, response: Response) -> None:
    try:
        with _autocommit() as conn:
            conn.execute(update(keys).where(keys.c.id == claim.row_id, keys.c.owner == claim.owner,
                                            keys.c.state == "running").values(**_answer(response)))
    except Exception:
        log.warning("storing the refusal of an idempotent request failed; the key expires with its lock",
                    exc_info=True)


def _release(claim: Claim) -> None:
    """Forget the claim: the next request with the key runs. A failure here leaves the lock to expire."""
    try:
        with _autocommit() as conn:
            conn.execute(delete(keys).where(keys.c.id == claim.row_id, keys.c.owner == claim.owner,
                                            keys.c.state == "running"))
    except Exception:
        log.warning("releasing an idempotency key failed; it is held until its lock expires", exc_info=True)


def _replay(row) -> Response:
    if row.response_body is None and row.response_sha256 is not None:
        return _not_stored(row)
    response = Response(bytes(row.response_body or b""), status=row.response_status)
    for name, value in (row.response_headers or {}).items():
        response.headers[name] = value
    response.headers[REPLAYED_HEADER] = "true"
    return response


def _not_stored(row) -> Response:
    """The replay of an answer too large to have been kept: 409 naming what did happen (status, size,
    sha256, Location), with the original's Location/ETag headers, so the client looks the result up."""
    headers = dict(row.response_headers or {})
    details: dict[str, Any] = {"header": HEADER, "originalStatus": row.response_status,
                               "answerBytes": row.response_bytes,
                               "answerSha256": bytes(row.response_sha256).hex(),
                               "maxAnswerBytes": int(current_app.config["IDEMPOTENCY_MAX_ANSWER_BYTES"])}
    if "Location" in headers:
        details["location"] = headers["Location"]
    response = handle_api_error(AnswerNotStored(
        f"The request with this {HEADER} already ran (it answered {row.response_status}), but its answer "
        f"({row.response_bytes} bytes) was too large to keep for replay; it was not run again. Look the "
        "result up (Location, or list what you created) instead of retrying.", details))
    for name in ("Location", "ETag"):
        if name in headers:
            response.headers[name] = headers[name]
    response.headers[REPLAYED_HEADER] = "true"
    return response


# --------------------------------------------------------------------------- maintenance


def purge_expired(batch: int = 1000, rounds: int = 10) -> int:
    """Delete expired keys, `batch` rows a statement (short locks), at most `rounds` statements a call
    (the maintenance loop comes back); returns how many were deleted."""
    doomed = select(keys.c.id).where(keys.c.expires_at <= func.now()).limit(batch).scalar_subquery()
    deleted = 0
    with _autocommit() as conn:
        for _ in range(rounds):
            count = conn.execute(delete(keys).where(keys.c.id.in_(doomed))).rowcount
            deleted += count
            if count < batch:
                break
    return deleted


__all__ = ["HEADER", "REPLAYED_HEADER", "AnswerNotStored", "KeyInUse", "KeyReused", "purge_expired", "run_idempotent",
           "wanted"]
