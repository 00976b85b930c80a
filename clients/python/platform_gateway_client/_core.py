"""What the synchronous and the asynchronous client share: how a call becomes an HTTP request, when and how
long to wait before a retry, and how an answer becomes data or a typed exception. No I/O here."""

from __future__ import annotations

import email.utils
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from platform_gateway_client import errors

__version__ = "0.1.0"
USER_AGENT = f"platform-gateway-client/{__version__} httpx/{httpx.__version__}"
T = TypeVar("T")

# Methods whose repetition has the effect of one call (RFC 9110 §9.2.2): retried freely.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# Answers worth another try: the rate limiter refused (it answers before the route runs), or the service
# or an upstream is briefly unavailable.
RETRY_STATUSES = frozenset({429, 503})
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# Image generation may take the whole gateway budget (120 s) before it answers.
IMAGE_TIMEOUT = httpx.Timeout(150.0, connect=5.0)
NO_BODY: Any = object()

TokenProvider = Callable[[], str]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of one logical call: at most `max_retries` more attempts after the first.

    The wait before retry n (0-based) is a random value in [0, min(backoff_max, backoff_base * 2**n)]
    ("full jitter": clients that failed together do not retry together). An answer with `Retry-After`
    (429, 503) is waited exactly that long plus up to `backoff_base` of jitter, never less; a Retry-After
    above `max_retry_after` is not waited for: the error is raised at once (its `retry_after` says when).
    """

    max_retries: int = 3
    backoff_base: float = 0.5
    backoff_max: float = 8.0
    max_retry_after: float = 60.0

    def backoff(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        return rand() * min(self.backoff_max, self.backoff_base * (2.0 ** retry))

    def delay(self, retry: int, retry_after: float | None,
              rand: Callable[[], float] = random.random) -> float | None:
        """Seconds to wait before retry `retry`, or None: do not retry."""
        if retry >= self.max_retries:
            return None
        if retry_after is not None:
            if retry_after > self.max_retry_after:
                return None
            return retry_after + rand() * self.backoff_base
        return self.backoff(retry, rand)


NO_RETRIES = RetryPolicy(max_retries=0)


@dataclass
class Call:
    """One logical API call, before any attempt: the same for every retry of it."""

    method: str
    template: str  # the OpenAPI path template, e.g. /api/v1/agents/{agentId}
    path_params: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, Any] | None = None
    json: Any = NO_BODY
    headers: dict[str, str] = field(default_factory=dict)
    # a POST that only reads (query, count, aggregate, by-ids): as safe to repeat as a GET
    safe: bool = False
    # a POST that creates or acts: sent with an Idempotency-Key, generated once here (or the caller's)
    idempotent_post: bool = False
    idempotency_key: str | None = None
    timeout: httpx.Timeout | None = None
    auth: bool = True  # False: no Authorization header (the unsubscribe link, /health)

    def __post_init__(self) -> None:
        if self.method == "POST" and self.idempotent_post:
            self.idempotency_key = self.idempotency_key or uuid.uuid4().hex
            self.headers["Idempotency-Key"] = self.idempotency_key

    @property
    def path(self) -> str:
        path = self.template
        for name, value in self.path_params.items():
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, not {value!r}")
            path = path.replace("{" + name + "}", quote(value, safe=""))
        return path

    @property
    def retry_safe(self) -> bool:
        """Whether repeating this call after an answer of 503 or a lost connection is harmless."""
        return self.method in IDEMPOTENT_METHODS or self.safe or self.idempotency_key is not None

    def query(self) -> list[tuple[str, str]] | None:
        if not self.params:
            return None
        items: list[tuple[str, str]] = []
        for key, value in self.params.items():
            if value is None:
                continue
            for one in value if isinstance(value, list | tuple) else (value,):
                items.append((key, "true" if one is True else "false" if one is False else str(one)))
        return items


def build_request(http: httpx.Client | httpx.AsyncClient, call: Call, token: str | None,
                  extra_headers: Mapping[str, str]) -> httpx.Request:
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **extra_headers, **call.headers}
    if token and call.auth:
        headers["Authorization"] = f"Bearer {token}"
    kwargs: dict[str, Any] = {"params": call.query(), "headers": headers}
    if call.json is not NO_BODY:
        kwargs["json"] = call.json
    if call.timeout is not None:
        kwargs["timeout"] = call.timeout
    return http.build_request(call.method, call.path, **kwargs)


def retry_after_seconds(headers: Mapping[str, str], details: Mapping[str, Any] | None = None) -> float | None:
    """`Retry-After` as seconds (delta-seconds or an HTTP date), else `details.retryAfterSeconds`."""
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value:
        value = value.strip()
        try:
            return max(0.0, float(value))
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(value) if value else None
            if parsed is not None:
                return max(0.0, parsed.timestamp() - time.time())
    hint = (details or {}).get("retryAfterSeconds")
    if isinstance(hint, int | float) and not isinstance(hint, bool):
        return max(0.0, float(hint))
    return None


def retry_delay(policy: RetryPolicy, call: Call, retry: int, *, response: httpx.Response | None = None,
                exc: Exception | None = None) -> float | None:
    """Seconds to wait before retrying `call` after this answer (or transport error), or None.

    - 429: always (the limiter refused before the route ran), honouring Retry-After.
    - 503: when repeating the call is harmless (idempotent method, read-only POST, or a POST with its
      Idempotency-Key), honouring Retry-After.
    - 409 IDEMPOTENCY_KEY_IN_USE: the same call (same key) is still running, honouring Retry-After; the
      retry gets its stored answer once it finishes.
    - no answer: a connection that was never established (refused, DNS, connect timeout) always;
      one lost after the request was sent only when repeating is harmless.
    """
    if response is not None:
        if response.status_code == 409 and call.idempotency_key and _code(response) == KEY_IN_USE:
            return policy.delay(retry, retry_after_seconds(response.headers, _details(response)))
        if response.status_code not in RETRY_STATUSES:
            return None
        if response.status_code == 503 and not call.retry_safe:
            return None
        return policy.delay(retry, retry_after_seconds(response.headers, _details(response)))
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return policy.delay(retry, None)
    if isinstance(exc, httpx.TransportError) and call.retry_safe:
        return policy.delay(retry, None)
    return None


KEY_IN_USE = "IDEMPOTENCY_KEY_IN_USE"


def _code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _details(response: httpx.Response) -> Mapping[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        details = body["error"].get("details")
        return details if isinstance(details, dict) else None
    return None


def api_error(response: httpx.Response) -> errors.ApiError:
    """The typed exception of an error answer (any status >= 400)."""
    status = response.status_code
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or "")
        message = str(error.get("message") or response.reason_phrase)
        details = error.get("details") if isinstance(error.get("details"), dict) else None
    else:  # not our envelope (a proxy's page): still typed by status
        code, message, details = "", f"HTTP {status} {response.reason_phrase}", None
    cls = errors.error_class(status, code)
    return cls(message, status=status, code=code or cls.__name__, details=details,
               request_id=response.headers.get("X-Request-ID"), headers=dict(response.headers), body=body)


def decode(response: httpx.Response) -> Any:
    """The JSON of a successful answer (None when it has no body)."""
    if response.status_code in (204, 304) or not response.content:
        return None
    return response.json()


@dataclass(frozen=True)
class Tagged(Generic[T]):
    """A resource with its `ETag`: send `etag` back as `if_match=` (a write that fails with
    PreconditionFailedError when someone else wrote in between) or `if_none_match=` (a read that answers
    `not_modified=True` and no `value` when nothing changed)."""

    value: T | None
    etag: str | None
    not_modified: bool = False

    def unwrap(self) -> T:
        if self.value is None:
            raise ValueError("not modified: the cached copy is current (no value in this answer)")
        return self.value


def conditional_headers(if_match: str | None = None, if_none_match: str | None = None) -> dict[str, str]:
    headers = {}
    if if_match:
        headers["If-Match"] = if_match
    if if_none_match:
        headers["If-None-Match"] = if_none_match
    return headers


def token_of(token: str | TokenProvider | None) -> str | None:
    return token() if callable(token) else token


# How each kind of 202 job reports the end (wait()).
JOB_DONE = {"succeeded", "failed"}  # /api/v1/jobs/{jobId}
EMAIL_JOB_DONE = {"done"}  # /api/v1/email/bulk-send/{jobId}
SEED_DONE = {"done", "failed"}  # /internal/seed/{orgId} (lastRequest)
ROLLOUT_DONE = {"done", "failed", "superseded"}  # /api/v1/admin/artifacts/rollouts/{rolloutId}


def poll_delays(first: float, maximum: float) -> Callable[[], float]:
    """Successive waits between two status reads: `first`, growing by half each time up to `maximum`."""
    state = {"next": first}

    def step() -> float:
        current = state["next"]
        state["next"] = min(maximum, current * 1.5)
        return current

    return step


Sleep = Callable[[float], None]
AsyncSleep = Callable[[float], Awaitable[None]]
AsyncTokenProvider = Callable[[], str | Awaitable[str]]
monotonic = time.monotonic
