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
import uuid
from dataclasses import dataclass

import redis
from flask import Flask, current_app, g

from app.errors import RateLimited
from app.observability import metrics
from app.reqctx import current_g
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
            return count + 1, min(float(window), ends - now)  # (now + w) - now can exceed w


class LimitsRedis:
    """The Redis both limiters count in (one per app, `app.extensions["limits_redis"]`), and its breaker:
    after a failure every limit counts in-process for RATE_LIMIT_REDIS_RETRY_SECONDS, then Redis is
    tried again; the fallback is counted and exported (gateway_rate_limit_fallback)."""

    def __init__(self, app: Flask) -> None:
        self.retry_after_failure = float(app.config.get("RATE_LIMIT_REDIS_RETRY_SECONDS", 5))
        self._down_until = 0.0
        self.client = None
        url = app.config.get("REDIS_URL")
        if url:
            self.client = redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25,
                                               retry_on_timeout=False)

    @classmethod
    def of(cls, app: Flask) -> LimitsRedis:
        return app.extensions.setdefault("limits_redis", cls(app))

    def usable(self) -> bool:
        return self.client is not None and time.monotonic() >= self._down_until

    def answered(self) -> None:
        if self._down_until:  # Redis answers again: the shared counts are back
            self._down_until = 0.0
            metrics.rate_limit_fallback(False)

    def failed(self, what: str, exc: Exception) -> None:
        self._down_until = time.monotonic() + self.retry_after_failure
        metrics.count_redis_error("rate_limit")
        metrics.rate_limit_fallback(True)
        log.warning("%s: Redis unavailable (%s); counting in-process for %.0f s", what, type(exc).__name__,
                    self.retry_after_failure)


class RateLimiter:
    """One per app (`app.extensions["ratelimit"]`)."""

    def __init__(self, app: Flask) -> None:
        self.policies = {group: parse_policy(app.config.get(name)) for group, name in GROUPS.items()}
        self.prefix = f"{app.config.get('CELERY_KEY_PREFIX') or ''}ratelimit:"
        self.local = _LocalCounter()
        self.redis = LimitsRedis.of(app)

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
        if not self.redis.usable():
            return None
        client = self.redis.client
        try:
            pipe = client.pipeline(transaction=False)
            pipe.incr(key)
            pipe.ttl(key)
            count, ttl = pipe.execute()
            if ttl < 0:  # a new window (or a key whose EXPIRE was lost): start its clock
                client.expire(key, window)
                ttl = window
            self.redis.answered()
            return int(count), float(ttl)
        except Exception as exc:  # Redis down or slow: limit in-process, never fail the route
            self.redis.failed("rate limits", exc)
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
    decision = current_g().get("rate_limit")
    if decision is not None:
        for key, value in decision.headers().items():
            response.headers.setdefault(key, value)
    return response


# --- per-organization concurrency (fairness) ---------------------------------------------------------
#
# The windows above bound how often an organization calls a costly route; they do not stop one organization
# from holding every API thread and database connection at once with requests that are each allowed. The
# concurrency limit bounds how many requests of a group one organization has in flight: a Redis sorted set
# per (group, organization) whose members are request tokens scored by their lease deadline (ms, Redis'
# clock). A slot is taken by a Lua script (drop expired tokens, count, add), freed when the request ends; a
# process that dies mid-request leaves a token that expires with its lease, so no slot leaks for long.
# Without Redis (or while it does not answer) each process counts its own in-flight requests.

CONCURRENCY_GROUPS = {"records": "CONCURRENCY_LIMIT_RECORDS", "ingest": "CONCURRENCY_LIMIT_INGEST"}
CONCURRENCY_RETRY_AFTER = 1  # seconds: an in-flight request of the group usually ends well within it

_ACQUIRE = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[2]) then
  return {0, held}
end
local lease = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease)
return {1, held + 1}
"""


@dataclass(frozen=True)
class Slot:
    key: str
    token: str
    in_redis: bool


class _LocalInFlight:
    """In-flight counts of this process (no Redis, or Redis unavailable)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def acquire(self, key: str, limit: int) -> tuple[bool, int]:
        with self._lock:
            held = self._held.get(key, 0)
            if held >= limit:
                return False, held
            self._held[key] = held + 1
            return True, held + 1

    def release(self, key: str) -> None:
        with self._lock:
            held = self._held.get(key, 0) - 1
            if held > 0:
                self._held[key] = held
            else:
                self._held.pop(key, None)


class ConcurrencyLimiter:
    """One per app (`app.extensions["concurrency"]`): in-flight requests per (group, organization)."""

    def __init__(self, app: Flask) -> None:
        self.limits = {}
        for group, name in CONCURRENCY_GROUPS.items():
            limit = int(app.config.get(name) or 0)
            if limit < 0:
                raise ValueError(f"{name} must be >= 0 (0 = unlimited), not {limit}")
            self.limits[group] = limit
        self.lease_ms = int(1000 * float(app.config.get("CONCURRENCY_LEASE_SECONDS", 60)))
        if self.lease_ms <= 0:
            raise ValueError("CONCURRENCY_LEASE_SECONDS must be > 0")
        self.prefix = f"{app.config.get('CELERY_KEY_PREFIX') or ''}inflight:"
        self.local = _LocalInFlight()
        self.redis = LimitsRedis.of(app)
        self._script = self.redis.client.register_script(_ACQUIRE) if self.redis.client is not None else None

    def acquire(self, group: str, org_id: str) -> tuple[Slot | None, int, int]:
        """(slot or None when refused, requests in flight, limit); a limit of 0 gives (None, 0, 0)."""
        limit = self.limits.get(group, 0)
        if not limit:
            return None, 0, 0
        key = f"{self.prefix}{group}:{org_id}"
        token = uuid.uuid4().hex
        taken = self._redis_acquire(key, token, limit)
        if taken is not None:
            ok, held = taken
            return (Slot(key, token, True) if ok else None), held, limit
        ok, held = self.local.acquire(key, limit)
        return (Slot(key, token, False) if ok else None), held, limit

    def release(self, slot: Slot) -> None:
        if not slot.in_redis:
            self.local.release(slot.key)
            return
        try:
            self.redis.client.zrem(slot.key, slot.token)
        except Exception as exc:  # the token expires with its lease
            log.warning("concurrency limits: could not free a slot in Redis (%s); it expires with its lease",
                        type(exc).__name__)

    def _redis_acquire(self, key: str, token: str, limit: int) -> tuple[bool, int] | None:
        if not self.redis.usable():
            return None
        try:
            ok, held = self._script(keys=[key], args=[token, limit, self.lease_ms])
            self.redis.answered()
            return bool(ok), int(held)
        except Exception as exc:  # Redis down or slow: count in-process, never fail the route
            self.redis.failed("concurrency limits", exc)
            return None


def init_concurrency(app: Flask) -> None:
    app.extensions["concurrency"] = ConcurrencyLimiter(app)  # a bad setting stops start-up
    app.teardown_request(_release_slots)


def enter(group: str) -> None:
    """Take one of the current organization's `group` slots until the request ends; 429 RATE_LIMITED
    with Retry-After when the organization has its limit in flight already."""
    limiter: ConcurrencyLimiter | None = current_app.extensions.get("concurrency")
    slots = g.setdefault("_concurrency_slots", {})
    if limiter is None or group in slots:  # one request holds one slot per group
        return
    slot, held, limit = limiter.acquire(group, current_tenant().org_id)
    if not limit:
        return
    if slot is None:
        raise RateLimited(
            f"This organization already has {limit} {group} requests in flight (the most it may have at "
            f"once); retry in {CONCURRENCY_RETRY_AFTER} s.",
            {"concurrencyLimit": limit, "inFlight": held, "group": group,
             "retryAfterSeconds": CONCURRENCY_RETRY_AFTER},
            headers={"Retry-After": str(CONCURRENCY_RETRY_AFTER)})
    slots[group] = (limiter, slot)


def _release_slots(_exc: BaseException | None) -> None:
    """After the response is built (or the request failed): free what `enter` took."""
    for limiter, slot in current_g().pop("_concurrency_slots", {}).values():
        limiter.release(slot)


def concurrency_limited(group: str):
    """View decorator: `enter(group)` before the view runs; the slot is held until the request ends."""
    if group not in CONCURRENCY_GROUPS:
        raise ValueError(f"unknown concurrency group {group!r}")

    def decorate(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            enter(group)
            return view(*args, **kwargs)

        wrapper._concurrency_group = group
        return wrapper

    return decorate
