"""Exceptions: one class per error code of the API's envelope, each carrying the envelope's `details`.

    try:
        client.entities.records.create("deals", {"fields": {"title": 42}})
    except ValidationError as exc:
        exc.status, exc.code, exc.message, exc.details   # 400, "VALIDATION_ERROR", "…", {"fields": {…}}

An unknown code (a newer server) still raises: the class of its HTTP status (`ConflictError` for a 409…),
or `ApiError` itself; `exc.code` keeps the code the server sent.
"""

from __future__ import annotations

from typing import Any


class PlatformGatewayError(Exception):
    """Base of every exception this client raises."""


class ApiError(PlatformGatewayError):
    """The API answered with an error envelope `{error: {code, message, details?}, metadata}`."""

    status: int = 0
    code: str = ""

    def __init__(self, message: str, *, status: int, code: str, details: dict[str, Any] | None = None,
                 request_id: str | None = None, headers: dict[str, str] | None = None,
                 body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.details: dict[str, Any] = details or {}
        self.request_id = request_id
        self.headers: dict[str, str] = headers or {}
        self.body = body

    def __str__(self) -> str:
        rid = f", request {self.request_id}" if self.request_id else ""
        return f"{self.status} {self.code}: {self.message}{rid}"


class InvalidInputError(ApiError):
    """400 INVALID_INPUT (also 405 and 415 answers)."""


class ValidationError(ApiError):
    """400 VALIDATION_ERROR: `details.fields` names the offending fields."""


class UnauthorizedError(ApiError):
    """401 UNAUTHORIZED: token missing, expired or signed with another secret."""


class ForbiddenError(ApiError):
    """403 FORBIDDEN: the token lacks the scope or role, or names an unprovisioned product."""


class NotFoundError(ApiError):
    """404 NOT_FOUND."""


class ConflictError(ApiError):
    """409 CONFLICT: a name taken, a stale `version`, a status transition refused, an idempotent request
    still in flight…"""


class PreconditionFailedError(ApiError):
    """412 PRECONDITION_FAILED: the `If-Match` ETag is not the resource's current one (someone else wrote)."""


class IdempotencyKeyReusedError(ApiError):
    """422: the `Idempotency-Key` was already used with another request body."""


class PayloadTooLargeError(ApiError):
    """413 PAYLOAD_TOO_LARGE."""


class RateLimitedError(ApiError):
    """429 RATE_LIMITED; `retry_after` is the server's `Retry-After` in seconds (None if absent)."""

    @property
    def retry_after(self) -> float | None:
        from platform_gateway_client._core import retry_after_seconds

        return retry_after_seconds(self.headers, self.details)


class SystemError_(ApiError):
    """500 SYSTEM_ERROR (named with a trailing underscore: `SystemError` is a Python builtin)."""


class ServiceUnavailableError(ApiError):
    """503 SERVICE_UNAVAILABLE: an upstream or a dependency is down, or the provider is not configured."""

    @property
    def retry_after(self) -> float | None:
        from platform_gateway_client._core import retry_after_seconds

        return retry_after_seconds(self.headers, self.details)


class GatewayTimeoutError(ApiError):
    """504 TIMEOUT: the upstream provider exceeded the time budget."""


class TransportError(PlatformGatewayError):
    """No HTTP answer: connection refused or reset, DNS, TLS, or a timeout (after the retries). The httpx
    exception is `__cause__`."""


class JobFailedError(PlatformGatewayError):
    """`wait()` saw the job end in failure; `job` is its last status document."""

    def __init__(self, message: str, job: Any) -> None:
        super().__init__(message)
        self.job = job


class WaitTimeoutError(PlatformGatewayError):
    """`wait()` gave up before the job finished; `job` is its last status document."""

    def __init__(self, message: str, job: Any) -> None:
        super().__init__(message)
        self.job = job


BY_CODE: dict[str, type[ApiError]] = {
    "INVALID_INPUT": InvalidInputError,
    "VALIDATION_ERROR": ValidationError,
    "UNAUTHORIZED": UnauthorizedError,
    "FORBIDDEN": ForbiddenError,
    "NOT_FOUND": NotFoundError,
    "CONFLICT": ConflictError,
    "PRECONDITION_FAILED": PreconditionFailedError,
    "PAYLOAD_TOO_LARGE": PayloadTooLargeError,
    "RATE_LIMITED": RateLimitedError,
    "SYSTEM_ERROR": SystemError_,
    "SERVICE_UNAVAILABLE": ServiceUnavailableError,
    "TIMEOUT": GatewayTimeoutError,
}
BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidInputError, 401: UnauthorizedError, 403: ForbiddenError, 404: NotFoundError,
    409: ConflictError, 412: PreconditionFailedError, 413: PayloadTooLargeError,
    422: IdempotencyKeyReusedError, 429: RateLimitedError, 500: SystemError_, 503: ServiceUnavailableError,
    504: GatewayTimeoutError,
}


def error_class(status: int, code: str) -> type[ApiError]:
    """The class of an error answer: by its code, then by its status (a code this client does not know)."""
    if status == 422:  # the idempotency answer, whatever code names it
        return IdempotencyKeyReusedError
    return BY_CODE.get(code) or BY_STATUS.get(status) or ApiError
