"""A short-lived cache of query embeddings for `$similar`.

Paging through results re-sends the same `$similar` text; embedding it again costs a model call
(tens of ms locally, a paid request remotely). Entries are keyed by organization + model +
dimensions + text: keying by organization keeps one tenant from learning through response times
what another tenant searched for. Two levels: an in-process LRU with a TTL, then Redis when a
client is given (shared by every API process; failures there are logged and ignored, never fatal).
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from app.embeddings.base import Embedder, Vector

log = logging.getLogger(__name__)

REDIS_PREFIX = "pg:qemb:"
REDIS_BACKOFF_SECONDS = 30


class QueryEmbeddingCache:
    """TTL + LRU cache of query vectors; `ttl` of 0 disables caching."""

    def __init__(self, ttl: float = 300, maxsize: int = 1024, redis_client=None,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.maxsize = maxsize
        self.redis = redis_client
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Vector]] = OrderedDict()
        self._lock = threading.Lock()
        self._redis_down_until = 0.0

    @staticmethod
    def key(org_id: str, model: str, dimensions: int | None, text: str) -> str:
        raw = "\x1f".join((org_id, model, "" if dimensions is None else str(dimensions), text))
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()

    def get_or_embed(self, org_id: str, text: str, embedder: Embedder) -> Vector:
        """The cached vector for this org's query text, embedding (and caching) it on a miss."""
        if self.ttl <= 0:
            return embedder.embed_one(text)
        key = self.key(org_id, embedder.model, embedder.dimensions, text)
        vector = self._get_local(key)
        if vector is not None:
            return vector  # a hit does not extend the entry's life: the TTL bounds staleness
        vector = self._get_redis(key)
        if vector is None:
            vector = embedder.embed_one(text)
            self._set_redis(key, vector)
        self._set_local(key, vector)
        return vector

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _get_local(self, key: str) -> Vector | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires, vector = entry
            if expires <= self._clock():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return vector

    def _set_local(self, key: str, vector: Vector) -> None:
        with self._lock:
            self._entries[key] = (self._clock() + self.ttl, vector)
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)

    def _redis_usable(self) -> bool:
        return self.redis is not None and self._clock() >= self._redis_down_until

    def _redis_failed(self, action: str, exc: Exception) -> None:
        # A cache outage must never fail (or slow down) a search: skip Redis for a while.
        self._redis_down_until = self._clock() + REDIS_BACKOFF_SECONDS
        log.warning("query embedding cache: redis %s failed (%s); local cache only for %ds",
                    action, exc, REDIS_BACKOFF_SECONDS)

    def _get_redis(self, key: str) -> Vector | None:
        if not self._redis_usable():
            return None
        try:
            blob = self.redis.get(REDIS_PREFIX + key)
        except Exception as exc:
            self._redis_failed("get", exc)
            return None
        return unpack_vector(blob) if blob else None

    def _set_redis(self, key: str, vector: Vector) -> None:
        if not self._redis_usable():
            return
        try:
            self.redis.set(REDIS_PREFIX + key, pack_vector(vector), ex=max(1, int(self.ttl)))
        except Exception as exc:
            self._redis_failed("set", exc)


def pack_vector(vector: Vector) -> bytes:
    """float32 little-endian: 1.5 KB for 384 dims (the vectors are stored in float32 by pgvector too)."""
    return struct.pack(f"<{len(vector)}f", *vector)


def unpack_vector(blob: bytes) -> Vector | None:
    if len(blob) % 4:
        return None
    return list(struct.unpack(f"<{len(blob) // 4}f", blob))
