"""Event ingest on the `analytics` queue: a Redis buffer drained in batches by one flush task.

Why a buffer and not one Celery message per event: a Celery message costs the worker more than
storing the event does, and Celery has no batching of its own. So POST /events appends the event's
JSON to a Redis list (one round trip, with the flag below) and only schedules `analytics.flush` when
no flush is pending (`SET flag NX`). The flush task moves up to ANALYTICS_BATCH_SIZE events at a time
into an in-flight list (atomically, in Lua), stores them in one transaction per product
(`app.analytics.writer`: COPY of the JSON lines, then set-based SQL for the events and rollups), and
deletes the in-flight list. A worker that dies mid-batch leaves the list behind; the next flush puts
lists older than ANALYTICS_INFLIGHT_STALE_SECONDS back into the buffer. Re-storing them is harmless:
ingest is idempotent by (org, eventId). No lost wake-up: a flusher clears its flag *then* re-checks
the buffer, and the API pushes *then* tries to set the flag.
A backlog of at least a batch behind the one just taken starts a helper flush (up to
ANALYTICS_FLUSH_PARALLEL at once, each holding its own flag `flush-pending:<slot>`), so several worker
processes drain in parallel: PostgreSQL then uses more than one core. Concurrent batches are safe:
each statement locks what it touches in key order (events, chats, rollups, usage, users, names), and a
deadlock would only roll one batch back into the buffer.
Without REDIS_URL (or when Redis fails) the event is written inline in the request.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections import defaultdict
from typing import Any

import redis
from flask import current_app
from sqlalchemy.exc import DBAPIError, OperationalError

from app.analytics.writer import encode, write_lines
from app.db import db
from app.extensions import celery_app
from app.observability import metrics
from app.registry import find_service
from app.tasks import retry_or_give_up

log = logging.getLogger(__name__)

_TAKE = """
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items == 0 then return {0, items} end
redis.call('LTRIM', KEYS[1], #items, -1)
for i = 1, #items, 500 do
  redis.call('RPUSH', KEYS[2], unpack(items, i, math.min(i + 499, #items)))
end
redis.call('ZADD', KEYS[3], ARGV[2], KEYS[2])
return {redis.call('LLEN', KEYS[1]), items}
"""
_REQUEUE = """
local items = redis.call('LRANGE', KEYS[2], 0, -1)
for i = 1, #items, 500 do
  redis.call('LPUSH', KEYS[1], unpack(items, i, math.min(i + 499, #items)))
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], KEYS[2])
return #items
"""


def _config(name: str) -> Any:
    return current_app.config[name]


def key(name: str) -> str:
    return f"{current_app.config.get('CELERY_KEY_PREFIX') or ''}analytics:{name}"


def build_redis_client(config):
    """Service `analytics_redis` (app.registry): the buffer's Redis client (None without REDIS_URL)."""
    url = config.get("REDIS_URL")
    if not url:
        return None
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def redis_client():
    """This app's Redis client for the buffer (None without REDIS_URL)."""
    return find_service("analytics_redis")


def submit_many(events: list[dict[str, Any]]) -> None:
    """Hand normalised events to the ingest path (buffer + flush task, or inline), in one round trip."""
    client = redis_client()
    if client is not None:
        try:
            pipe = client.pipeline(transaction=False)
            received = f"{time.time():.3f}\t"  # each line carries its receive time (buffer_backlog)
            pipe.rpush(key("buffer"), *[received + json.dumps(e, separators=(",", ":")) for e in events])
            pipe.set(key("flush-pending"), "1", nx=True, ex=_config("ANALYTICS_FLUSH_TTL_SECONDS"))
            _, scheduled = pipe.execute()
        except Exception:  # Redis down: store them now rather than lose them
            metrics.count_redis_error("analytics_buffer")
            log.warning("analytics buffer unavailable; writing %s event(s) inline", len(events), exc_info=True)
            write_inline(events)
            return
        if scheduled:
            _schedule_flush(client)
        return
    write_inline(events)


def _schedule_flush(client) -> None:
    try:
        flush.apply_async()
    except Exception:  # the events wait in the buffer; the next request tries to schedule again
        log.warning("analytics: could not send the flush task", exc_info=True)
        try:
            client.delete(key("flush-pending"))
        except Exception:
            pass


def buffer_backlog() -> tuple[int, float]:
    """(events waiting in the buffer or in flight, seconds the oldest of them has waited) for /metrics;
    (0, 0) without Redis. Each buffered line starts with its receive time (`submit_many`), and the oldest
    waiting line is the head of the buffer (pushed at the tail, taken from the head; a re-queued batch
    goes back to the head with its own times) or of an in-flight batch."""
    client = redis_client()
    if client is None:
        return 0, 0.0
    pipe = client.pipeline(transaction=False)
    pipe.llen(key("buffer"))
    pipe.lindex(key("buffer"), 0)
    pipe.zrange(key("inflight"), 0, -1)
    waiting, head, batches = pipe.execute()
    inflight, heads = 0, [head]
    if batches:
        counting = client.pipeline(transaction=False)
        for batch in batches[:100]:
            counting.llen(batch)
            counting.lindex(batch, 0)
        found = counting.execute()
        inflight = sum(found[0::2])
        heads.extend(found[1::2])
    now, ages = time.time(), [0.0]
    for line in heads:
        received = received_at(line) if line else None
        if received is not None:
            ages.append(now - received)
    return int(waiting) + int(inflight), max(ages)


def received_at(line: bytes) -> float | None:
    """The receive time a buffered line starts with (`<unix time>\t<event JSON>`); None for a line
    without one (pushed by an older release, or straight into the buffer)."""
    stamp, tab, _ = line.partition(b"\t")
    if not tab or not stamp[:1].isdigit():
        return None
    try:
        return float(stamp)
    except ValueError:
        return None


def event_line(line: bytes) -> bytes:
    """A buffered line without its receive time: the event's JSON."""
    return line.split(b"\t", 1)[1] if received_at(line) is not None else line


def write_inline(events: list[dict[str, Any]]) -> int:
    stored, _ = write_lines_by_product(encode(events))
    return stored


_PRODUCT = re.compile(rb'^\{"product":"([A-Za-z0-9_.-]{1,128})",')


def _product_of(line: bytes) -> str | None:
    """The product of a buffer line: normalised events start with it, so most lines need no parsing."""
    found = _PRODUCT.match(line)
    if found:
        return found.group(1).decode()
    try:
        product = json.loads(line).get("product")
    except (ValueError, AttributeError):
        return None
    return product if isinstance(product, str) else None


def write_lines_by_product(lines: list[bytes]) -> tuple[int, list[bytes]]:
    """Store buffer lines, one transaction per product (sorted). Returns (stored, unusable lines)."""
    stored, dead = 0, []
    by_product: dict[str, list[bytes]] = defaultdict(list)
    for line in lines:
        product = _product_of(line)
        if product is None:
            dead.append(line)
        else:
            by_product[product].append(line)
    for product, group in sorted(by_product.items()):
        with db.product_session(product) as session:
            new, bad = write_lines(session, group)
        stored += new
        dead.extend(bad)
    return stored, dead


def requeue_stale(client, older_than: float) -> int:
    """Put in-flight batches older than `older_than` seconds back into the buffer."""
    moved = 0
    cutoff = time.time() - older_than
    for name in client.zrangebyscore(key("inflight"), "-inf", cutoff):
        moved += int(client.eval(_REQUEUE, 3, key("buffer"), name, key("inflight")))
    if moved:
        log.warning("analytics: re-queued %s events of interrupted batches", moved)
    return moved


def _flag(slot: int) -> str:
    return key("flush-pending") if slot == 0 else key(f"flush-pending:{slot}")


def _start_helper(client) -> None:
    """Claim a free helper slot, if any, and send a flush task for it."""
    ttl = _config("ANALYTICS_FLUSH_TTL_SECONDS")
    for slot in range(1, _config("ANALYTICS_FLUSH_PARALLEL")):
        if client.set(_flag(slot), "1", nx=True, ex=ttl):
            try:
                flush.apply_async(kwargs={"slot": slot})
            except Exception:
                log.warning("analytics: could not send a helper flush task", exc_info=True)
                client.delete(_flag(slot))
            return


def flush_once(client, batch_size: int, on_backlog=None) -> int:
    """Take one batch from the buffer and store it; returns how many events it held (0 = empty).
    `on_backlog(client)` is called when at least another batch is waiting behind this one."""
    batch_key = key(f"batch:{uuid.uuid4().hex}")
    remaining, items = client.eval(_TAKE, 3, key("buffer"), batch_key, key("inflight"), batch_size, time.time())
    if not items:
        return 0
    if on_backlog is not None and remaining >= batch_size:
        on_backlog(client)
    dead: list[bytes] = []
    lines = [event_line(item) for item in items]
    try:
        _, dead = write_lines_by_product(lines)
    except (OperationalError, DBAPIError) as exc:
        if isinstance(exc, OperationalError) or getattr(exc, "connection_invalidated", False):
            client.eval(_REQUEUE, 3, key("buffer"), batch_key, key("inflight"))  # transient: retry later
            raise
        dead.extend(lines)  # an error the data itself causes: park the batch, keep the queue moving
        log.exception("analytics: a batch of %s events could not be stored; parked in %s",
                      len(items), key("dead"))
    if dead:
        client.rpush(key("dead"), *dead)
    client.delete(batch_key)
    client.zrem(key("inflight"), batch_key)
    return len(items)


@celery_app.task(name="analytics.flush", bind=True, acks_late=True, reject_on_worker_lost=True,
                 ignore_result=True)
def flush(self, slot: int = 0) -> int:
    """Drain the buffer in batches for up to ANALYTICS_FLUSH_BUDGET_SECONDS, then re-arm. Slot 0 is the
    flush the API schedules; slots 1… are helpers started by a backlog."""
    client = redis_client()
    if client is None:
        return 0
    if slot == 0:
        requeue_stale(client, _config("ANALYTICS_INFLIGHT_STALE_SECONDS"))
    budget = time.monotonic() + _config("ANALYTICS_FLUSH_BUDGET_SECONDS")
    stored = 0
    try:
        while time.monotonic() < budget:
            taken = flush_once(client, _config("ANALYTICS_BATCH_SIZE"), on_backlog=_start_helper)
            if not taken:
                break
            stored += taken
    except (OperationalError, DBAPIError) as exc:
        client.delete(_flag(slot))
        if slot:
            _rearm(client)
            raise
        raise retry_or_give_up(self, exc, max_retries=8) from exc
    client.delete(_flag(slot))
    _rearm(client)
    return stored


def reap_stalled_buffer() -> int:
    """Lease reaper (app.lease_reapers, run by every worker's maintenance loop): batches left in flight
    by a dead flush go back into the buffer, and a buffer that no flush is due to drain gets one. Without
    it, accepted events waited for the next POST to schedule a flush. Returns the events re-queued."""
    client = redis_client()
    if client is None:
        return 0
    moved = requeue_stale(client, _config("ANALYTICS_INFLIGHT_STALE_SECONDS"))
    _rearm(client)
    return moved


def _rearm(client) -> None:
    """Events left in the buffer get the API's flush (slot 0) unless one is already pending."""
    if client.llen(key("buffer")) and client.set(key("flush-pending"), "1", nx=True,
                                                 ex=_config("ANALYTICS_FLUSH_TTL_SECONDS")):
        _schedule_flush(client)
