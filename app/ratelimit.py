"""Per-organization rate limits on the costly routes (issue 12).

Fixed windows per (route group, organization), each starting with its first request: Redis `INCR` +
`EXPIRE` when REDIS_URL is set (every API process shares the count), an in-process counter otherwise — and
whenever Redis does not answer, so a Redis outage never fails a route (each process then limits on its
own until Redis is back; Redis is retried after RATE_LIMIT_REDIS_RETRY_SECONDS).

Groups and their settings (`"<requests>/<seconds>"`, empty or 0 = unlimited; README):
images (RATE_LIMIT_IMAGES), bulk (RATE_LIMIT_BULK: bulk create/update/delete, sync or async jobs),
aggregate (RATE_LIMIT_AGGREGATE), similar (RATE_LIMIT_SIMILAR: record queries that use `$similar`),
email (RATE_LIMIT_EMAIL).

Over the limit: 429 RATE_LIMITED in the envelope with `Retry-After`. Every limited answer (2xx or
not) carries `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds until the window
ends) and `RateLimit-Policy` (IETF draft-ietf-httpapi-ratelimit-headers).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from dataclasses import dataclass

import redis
from flask import Flask, current_app, g

from app.errors import RateLimited
from app.observability import metrics
from app.tenancy import current_tenant

log = logging.getLogger(__name__)

GROUPS = {"images": "RATE_LIMIT_IMAGES", "bulk": "RATE_LIMIT_BULK", "aggregate": "RATE_LIMIT_AGGREGATE",
          "similar": "RATE_LIMIT_SIMILAR", "email": "RATE_LIMIT_EMAIL"}


@dataclass(frozen=True)
class Policy:
    limit: int
    window: int


@dataclass(frozen=True)
class Decision:
    policy: Policy
    count: int
    reset: int  # seconds until the window ends

    @property
    def allowed(self) -> bool:
        return self.count <= self.policy.limit

    def headers(self) -> dict[str, str]:
        return {"RateLimit-Limit": str(self.policy.limit),
                "RateLimit-Remaining": str(max(0, self.policy.limit - self.count)),
                "RateLimit-Reset": str(self.reset),
                "RateLimit-Policy": f"{self.policy.limit};w={self.policy.window}"}


def parse_policy(value: str | None) -> Policy | None:
    """`"30/60"` → 30 requests per 60 s; `"30"` → per minute; empty or 0 → None (unlimited)."""
    text = (value or "").strip()
    if not text or text == "0":
        return None
    count, _, window = text.partition("/")
    try:
        policy = Policy(int(count), int(window or 60))
    except ValueError:
        raise ValueError(f"rate limit {value!r}: use '<requests>/<seconds>', e.g. 30/60") from None
    if policy.limit < 0 or policy.window <= 0:
        raise ValueError(f"rate limit {value!r}: requests >= 0 and seconds > 0")
    return policy if policy.limit > 0 else None


class _LocalCounter:
    """Window counts of this process (no Redis, or Redis unavailable)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, float]] = {}  # key -> (count, monotonic end)

    def hit(self, key: str, window: int) -> tuple[int, float]:
        now = time.monotonic()
        with self._lock:
            if len(self._windows) > 100_000:  # forget windows that ended
                self._windows = {k: v for k, v in self._windows.items() if v[1] > now}
            count, ends = self._windows.get(key, (0, 0.0))
            if ends <= now:
                count, ends = 0, now + window
            self._windows[key] = (count + 1, ends)
            return count + 1, ends - now


class RateLimiter:
    """One per app (`app.extensions["ratelimit"]`)."""

    def __init__(self, app: Flask) -> None:
        self.policies = {group: parse_policy(app.config.get(name)) for group, name in GROUPS.items()}
        self.prefix = f"{app.config.get('CELERY_KEY_PREFIX') or ''}ratelimit:"
        self.retry_after_failure = float(app.config.get("RATE_LIMIT_REDIS_RETRY_SECONDS", 5))
        self.local = _LocalCounter()
        self._redis = None
        self._redis_down_until = 0.0
        url = app.config.get("REDIS_URL")
        if url:
            self._redis = redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25,
                                               retry_on_timeout=False)

    def hit(self, group: str, org_id: str) -> Decision | None:
        policy = self.policies.get(group)
        if policy is None:
            return None
        key = f"{self.prefix}{group}:{org_id}:{policy.window}"
        hit = self._redis_hit(key, policy.window) or self.local.hit(key, policy.window)
        count, left = hit
        return Decision(policy, count, max(1, math.ceil(left)))

    def _redis_hit(self, key: str, window: int) -> tuple[int, float] | None:
        """A window starts with its first request (INCR, then EXPIRE when the key has no TTL yet)."""
        if self._redis is None or time.monotonic() < self._redis_down_until:
            return None
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.incr(key)
            pipe.ttl(key)
            count, ttl = pipe.execute()
            if ttl < 0:  # a new window (or a key whose EXPIRE was lost): start its clock
                self._redis.expire(key, window)
                ttl = window
            if self._redis_down_until:  # Redis answers again: the shared count is back
                self._redis_down_until = 0.0
                metrics.rate_limit_fallback(False)
            return int(count), float(ttl)
        except Exception as exc:  # Redis down or slow: limit in-process, never fail the route
            self._redis_down_until = time.monotonic() + self.retry_after_failure
            metrics.count_redis_error("rate_limit")
            metrics.rate_limit_fallback(True)
            log.warning("rate limits: Redis unavailable (%s); counting in-process for %.0f s",
                        type(exc).__name__, self.retry_after_failure)
            return None


def init_app(app: Flask) -> None:
    app.extensions["ratelimit"] = RateLimiter(app)  # parses every policy: a bad setting stops start-up
    app.after_request(_add_headers)


def check(group: str) -> None:
    """Count one request of the current organization against `group`; 429 RATE_LIMITED when over."""
    limiter: RateLimiter | None = current_app.extensions.get("ratelimit")
    checked = g.setdefault("_rate_limit_groups", set())
    if limiter is None or group in checked:  # one request counts once per group
        return
    checked.add(group)
    decision = limiter.hit(group, current_tenant().org_id)
    if decision is None:
        return
    g.rate_limit = decision
    if not decision.allowed:
        metrics.count_rate_limited(group)
        raise RateLimited(
            f"Rate limit of {decision.policy.limit} {group} requests per {decision.policy.window} s for this "
            f"organization reached; retry in {decision.reset} s.",
            {"limit": decision.policy.limit, "windowSeconds": decision.policy.window,
             "retryAfterSeconds": decision.reset},
            headers={"Retry-After": str(decision.reset)})


def rate_limited(group: str):
    """View decorator: `check(group)` before the view runs."""
    if group not in GROUPS:
        raise ValueError(f"unknown rate-limit group {group!r}")

    def decorate(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            check(group)
            return view(*args, **kwargs)

        wrapper._rate_limit_group = group
        return wrapper

    return decorate


def may_be_rate_limited(group: str):
    """View marker for OpenAPI only: the view can answer 429 from a check deeper in (`$similar` in a
    record query or count is checked where the query vector is resolved, app.embeddings.search)."""
    if group not in GROUPS:
        raise ValueError(f"unknown rate-limit group {group!r}")

    def decorate(view):
        view._rate_limit_group = group
        return view

    return decorate


def _add_headers(response):
    decision = g.get("rate_limit")
    if decision is not None:
        for key, value in decision.headers().items():
            response.headers.setdefault(key, value)
    return response
