"""The `$similar` query-vector cache: per org + model + text, TTL, LRU, optional Redis level."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from app.embeddings import build_query_cache, redis_cache_client
from app.embeddings.base import Embedder
from app.embeddings.cache import REDIS_PREFIX, QueryEmbeddingCache, pack_vector, unpack_vector


class CountingEmbedder(Embedder):
    """Test double: records which texts reached the model."""

    def __init__(self, model="m", dims=3):
        self.model, self.max_batch_size, self._dims, self.calls = model, 8, dims, []

    @property
    def dimensions(self):
        return self._dims

    def _embed_batch(self, texts):
        self.calls.extend(texts)
        return [[float(len(t)), 1.0, float(len(self.calls))][: self._dims] for t in texts]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_second_lookup_is_served_from_cache():
    cache, embedder = QueryEmbeddingCache(ttl=60), CountingEmbedder()
    first = cache.get_or_embed("org-a", "red cars", embedder)
    second = cache.get_or_embed("org-a", "red cars", embedder)
    assert first == second and embedder.calls == ["red cars"]


def test_entries_are_per_org_model_and_dimensions():
    cache = QueryEmbeddingCache(ttl=60)
    small, large = CountingEmbedder("small"), CountingEmbedder("large")
    cache.get_or_embed("org-a", "q", small)
    cache.get_or_embed("org-b", "q", small)  # another tenant never shares an entry
    cache.get_or_embed("org-a", "q", large)
    cache.get_or_embed("org-a", "q", CountingEmbedder("small", dims=2))
    assert small.calls == ["q", "q"] and large.calls == ["q"]
    assert len(cache) == 4


def test_entries_expire_after_ttl():
    clock = Clock()
    cache, embedder = QueryEmbeddingCache(ttl=30, clock=clock), CountingEmbedder()
    cache.get_or_embed("o", "q", embedder)
    clock.now += 29.9
    cache.get_or_embed("o", "q", embedder)
    assert embedder.calls == ["q"]
    clock.now += 0.2
    cache.get_or_embed("o", "q", embedder)
    assert embedder.calls == ["q", "q"]


def test_least_recently_used_entry_is_evicted():
    cache, embedder = QueryEmbeddingCache(ttl=60, maxsize=2), CountingEmbedder()
    cache.get_or_embed("o", "a", embedder)
    cache.get_or_embed("o", "b", embedder)
    cache.get_or_embed("o", "a", embedder)  # a is now the most recent
    cache.get_or_embed("o", "c", embedder)  # evicts b
    cache.get_or_embed("o", "a", embedder)
    cache.get_or_embed("o", "b", embedder)
    assert embedder.calls == ["a", "b", "c", "b"] and len(cache) == 2


def test_ttl_zero_disables_caching():
    cache, embedder = QueryEmbeddingCache(ttl=0), CountingEmbedder()
    cache.get_or_embed("o", "q", embedder)
    cache.get_or_embed("o", "q", embedder)
    assert embedder.calls == ["q", "q"] and len(cache) == 0


def test_vector_packing_round_trips_float32():
    vector = [0.5, -0.25, 0.125, 1.0]
    assert unpack_vector(pack_vector(vector)) == vector
    assert len(pack_vector([0.1] * 384)) == 1536
    assert unpack_vector(b"abc") is None


def test_redis_level_is_shared_between_processes(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    org = f"org-{uuid.uuid4().hex[:8]}"
    writer, embedder = QueryEmbeddingCache(ttl=60, redis_client=client), CountingEmbedder()
    vector = writer.get_or_embed(org, "shared query", embedder)

    key = REDIS_PREFIX + QueryEmbeddingCache.key(org, "m", 3, "shared query")
    assert 0 < client.ttl(key) <= 60
    reader, other_embedder = QueryEmbeddingCache(ttl=60, redis_client=client), CountingEmbedder()
    assert reader.get_or_embed(org, "shared query", other_embedder) == pytest.approx(vector)
    assert other_embedder.calls == []  # served from Redis, not the model
    client.delete(key)


def test_unreachable_redis_degrades_to_the_local_cache():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = redis_cache_client(f"redis://127.0.0.1:{port}/0")
    clock = Clock()
    cache, embedder = QueryEmbeddingCache(ttl=60, redis_client=client, clock=clock), CountingEmbedder()
    started = time.perf_counter()
    assert cache.get_or_embed("o", "q", embedder) == cache.get_or_embed("o", "q", embedder)
    assert embedder.calls == ["q"]
    assert time.perf_counter() - started < 2  # no retry storm against the dead server
    assert not cache._redis_usable()  # backed off after the failure: the next misses skip Redis
    clock.now += 31
    assert cache._redis_usable()


def test_built_from_config():
    cache = build_query_cache({"EMBEDDINGS_QUERY_CACHE_TTL": 12.5, "EMBEDDINGS_QUERY_CACHE_SIZE": 7})
    assert (cache.ttl, cache.maxsize, cache.redis) == (12.5, 7, None)
