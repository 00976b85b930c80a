"""Domain errors and the one place that turns any error into the error envelope every answer uses.

Services raise the `ApiError` subclasses below; routes never build error bodies themselves.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, g, jsonify
from gunicorn.http.errors import NoMoreData
from gunicorn.http.errors import ParseException as GunicornParseError
from werkzeug.exceptions import ClientDisconnected, HTTPException

from app.wire import metadata

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error with an HTTP status and an error code of the envelope (VALIDATION_ERROR, NOT_FOUND, …)."""

    status = 500
    code = "SYSTEM_ERROR"

    def __init__(self, message: str, details: dict[str, Any] | None = None, *, headers=None):
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}


class InvalidInput(ApiError):
    status, code = 400, "INVALID_INPUT"


class ValidationFailed(ApiError):
    status, code = 400, "VALIDATION_ERROR"


class Unauthorized(ApiError):
    status, code = 401, "UNAUTHORIZED"


class Forbidden(ApiError):
    status, code = 403, "FORBIDDEN"


class NotFound(ApiError):
    status, code = 404, "NOT_FOUND"


class Conflict(ApiError):
    status, code = 409, "CONFLICT"


class PreconditionFailed(ApiError):
    """An If-Match that names a version the resource no longer has (app.preconditions)."""

    status, code = 412, "PRECONDITION_FAILED"


class PayloadTooLarge(ApiError):
    status, code = 413, "PAYLOAD_TOO_LARGE"


class RateLimited(ApiError):
    status, code = 429, "RATE_LIMITED"


class SystemFailure(ApiError):
    status, code = 500, "SYSTEM_ERROR"


class ServiceUnavailable(ApiError):
    status, code = 503, "SERVICE_UNAVAILABLE"


class GatewayTimeout(ApiError):
    status, code = 504, "TIMEOUT"


# Werkzeug/flask-smorest HTTP errors -> (code, default message)
_HTTP_CODES = {
    400: "INVALID_INPUT",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "INVALID_INPUT",
    409: "CONFLICT",
    412: "PRECONDITION_FAILED",
    413: "PAYLOAD_TOO_LARGE",
    415: "INVALID_INPUT",
    422: "VALIDATION_ERROR",
    429: "RATE_LIMITED",
    503: "SERVICE_UNAVAILABLE",
    504: "TIMEOUT",
}


def envelope(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The error envelope: `{"error": {code, message, details?}, "metadata": {success: false, timestamp}}`."""
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return {"error": error, "metadata": metadata(False)}


def error_response(status: int, code: str, message: str, details=None, headers=None):
    response = jsonify(envelope(code, message, details))
    response.status_code = status
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def _webargs_details(messages: Any) -> dict[str, Any]:
    """webargs nests messages by location ({"json": {"field": [...]}}); flatten one level."""
    if isinstance(messages, dict) and len(messages) == 1:
        (location, inner), = messages.items()
        if location in {"json", "query", "querystring", "form", "files", "headers", "view_args", "path"}:
            return {"fields": inner, "location": location}
    return {"fields": messages}


def handle_api_error(exc: ApiError):
    if exc.status == 500:
        log.error("request %s failed: %s %s", getattr(g, "request_id", "-"), exc.code, exc.message)
    elif exc.status > 500:  # upstream/configuration trouble the service reports on purpose
        log.warning("request %s failed: %s %s", getattr(g, "request_id", "-"), exc.code, exc.message)
    return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)


def _validation_message(details: dict[str, Any]) -> str:
    """"Request validation failed.", or, when the query string names parameters the operation does not
    take (app.extensions refuses them), which ones and what it takes."""
    fields = details.get("fields")
    if details.get("location") not in ("query", "querystring") or not isinstance(fields, dict):
        return "Request validation failed."
    unknown = sorted(name for name, problems in fields.items()
                     if isinstance(problems, list) and problems and str(problems[0]).startswith("Unknown query"))
    if not unknown:
        return "Request validation failed."
    names = ", ".join(f"'{name}'" for name in unknown)
    takes = str(fields[unknown[0]][0]).split(" This operation takes: ", 1)
    suffix = f"; this operation takes: {takes[1]}" if len(takes) == 2 else "."
    return f"Unknown query parameter{'s' if len(unknown) > 1 else ''} {names}{suffix}"


def handle_http_exception(exc: HTTPException):
    if isinstance(exc, ClientDisconnected):  # werkzeug's word for a body that ended early (or NoMoreData)
        return unreadable_body(exc)
    status = exc.code or 500
    if status == 422 or (status == 400 and getattr(exc, "data", {}).get("messages")):
        messages = exc.data.get("messages", {})
        if _is_json_decode_error(messages):
            return error_response(400, "INVALID_INPUT", "Request body is not valid JSON.")
        details = _webargs_details(messages)
        return error_response(400, "VALIDATION_ERROR", _validation_message(details), details)
    code = _HTTP_CODES.get(status, "SYSTEM_ERROR" if status >= 500 else "INVALID_INPUT")
    messages = {
        404: "The requested resource was not found.",
        405: "Method not allowed for this path.",
        413: "Request body is too large.",
    }
    message = messages.get(status) or (exc.description or exc.name)
    headers = {"Allow": exc.valid_methods and ", ".join(exc.valid_methods)} if status == 405 else None
    return error_response(status, code, message, None, {k: v for k, v in (headers or {}).items() if v})


def _is_json_decode_error(messages: Any) -> bool:
    text = str(messages)
    return "Invalid JSON body" in text or "JSONDecodeError" in text


def handle_unexpected(exc: Exception):
    # not at module level: app.errors loads with the app package (app/__init__), which the worker health
    # check imports too, and needs the database libraries only when an error is handled
    from sqlalchemy.exc import DataError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, HTTPException):
        return handle_http_exception(exc)
    if isinstance(exc, ApiError):
        return handle_api_error(exc)
    if isinstance(exc, UNREADABLE_BODY):
        return unreadable_body(exc)
    if isinstance(exc, PoolTimeout):
        log.warning("request %s: database pool exhausted", getattr(g, "request_id", "-"))
        return error_response(503, "SERVICE_UNAVAILABLE", "Database is busy; retry shortly.",
                              {"retryAfterSeconds": 1}, {"Retry-After": "1"})
    if isinstance(exc, DataError):
        # A value PostgreSQL cannot convert (e.g. a stored "2026-02-30T00:00:00Z" compared as a
        # timestamp after a field changed type): the caller's query cannot be answered as asked.
        log.warning("request %s: data conversion error: %s", getattr(g, "request_id", "-"),
                    str(getattr(exc, "orig", exc)).splitlines()[0])
        return error_response(400, "INVALID_INPUT",
                              "A stored or supplied value could not be converted to the type the "
                              "query needs; check the field types of the filter, sort or aggregate.")
    if isinstance(exc, OperationalError) and _is_cancelled(exc):
        log.warning("request %s: statement cancelled (timeout)", getattr(g, "request_id", "-"))
        return error_response(503, "SERVICE_UNAVAILABLE", "The query took too long and was cancelled.")
    if isinstance(exc, OperationalError):
        log.exception("request %s: database unavailable", getattr(g, "request_id", "-"))
        return error_response(503, "SERVICE_UNAVAILABLE", "Database unavailable.")
    log.exception("request %s: unhandled error", getattr(g, "request_id", "-"))
    return error_response(500, "SYSTEM_ERROR", "Internal error. Quote the request id when reporting it.",
                          {"requestId": getattr(g, "request_id", None)})


# What gunicorn's body readers raise while the app reads `wsgi.input` (request.get_data, webargs, form
# parsing) when the bytes are not a well-formed body: every `ParseException` (InvalidChunkSize,
# InvalidChunkExtension, ChunkMissingTerminator, InvalidHeader in a trailer, LimitRequestHeaders for
# the trailer section...) and `NoMoreData` (the connection ended inside the body; an IOError, which
# werkzeug's input stream usually turns into `ClientDisconnected`, answered the same way). The
# client's fault, wherever in the app the body is read.
UNREADABLE_BODY = (GunicornParseError, NoMoreData)


def unreadable_body(exc: Exception):
    """400 INVALID_INPUT for a request body the server could not read, with `Connection: close`:
    after a broken body, where the next request on the connection would start is unknown."""
    if isinstance(exc, ClientDisconnected | NoMoreData):
        reason = "the connection ended before the body was complete"
    else:
        reason = str(exc)[:200]
    log.info("request %s: unreadable request body: %s: %s", getattr(g, "request_id", "-"),
             type(exc).__name__, reason)
    return error_response(400, "INVALID_INPUT", f"The request body could not be read: {reason}.",
                          {"reason": reason}, {"Connection": "close"})


def _is_cancelled(exc: Exception) -> bool:
    import psycopg.errors  # as in handle_unexpected

    return isinstance(getattr(exc, "orig", None), psycopg.errors.QueryCanceled)


def register_error_handlers(app: Flask) -> None:
    """Bind the envelope to every error path (after flask-smorest registered its own)."""
    app.register_error_handler(ApiError, handle_api_error)
    app.register_error_handler(HTTPException, handle_http_exception)
    app.register_error_handler(Exception, handle_unexpected)
