"""Embedders behind one interface; the backend is chosen by EMBEDDINGS_BACKEND (`local` | `openai`).

`build_embedder(config, model=..., dimensions=...)` makes one; `get_embedder(...)` returns the
app's shared instance for that model/dimensions (built once per process, so the local model and the
HTTP connection pool are reused). `get_query_cache()` is the app's `$similar` query-vector cache.
"""

from __future__ import annotations

import logging

import redis
from flask import current_app
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.embeddings.base import (
    Embedder,
    EmbedderConfigError,
    EmbedderError,
    EmbedderTransientError,
    Vector,
)
from app.embeddings.cache import QueryEmbeddingCache
from app.embeddings.local import LocalEmbedder
from app.embeddings.openai_compat import OpenAICompatibleEmbedder
from app.embeddings.text import build_embedding_text, embedding_content_hash
from app.registry import find_service

__all__ = [
    "BACKENDS", "Embedder", "EmbedderConfigError", "EmbedderError", "EmbedderTransientError",
    "QueryEmbeddingCache", "Vector", "build_embedder", "build_embedder_service", "build_embedding_text",
    "build_query_cache", "build_query_cache_service",
    "embedding_content_hash", "get_embedder", "get_query_cache", "redis_cache_client",
]

log = logging.getLogger(__name__)

BACKENDS = ("local", "openai")


def build_embedder(config, *, model: str | None = None, dimensions: int | None = None) -> Embedder:
    """A new embedder for `config`; `model`/`dimensions` come from a definition's embeddingsConfig.

    The local backend has one model and its native size: a requested model or dimension count is
    not something it can honour, so it answers with its own (the stored vector records the model
    and dimensions that really produced it, which is what staleness checks compare).
    """
    backend = (config.get("EMBEDDINGS_BACKEND") or "local").strip().lower()
    if backend == "local":
        embedder = LocalEmbedder.from_config(config)
        if model and model != embedder.model:
            log.debug("local embedder serves %s in place of requested model %s", embedder.model, model)
        return embedder
    if backend == "openai":
        return OpenAICompatibleEmbedder.from_config(config, model=model, dimensions=dimensions)
    raise EmbedderConfigError(f"unknown EMBEDDINGS_BACKEND {backend!r} (use {' or '.join(BACKENDS)})")


def build_embedder_service(config, backend: str, model: str = "", dimensions: int = 0) -> Embedder:
    """Factory of service `embedder` (app.registry), keyed by backend (and model/dimensions)."""
    return build_embedder(config, model=model or None, dimensions=dimensions or None)


def get_embedder(model: str | None = None, dimensions: int | None = None) -> Embedder:
    """The current app's embedder for this model/dimensions, built once and shared across threads."""
    backend = current_app.config.get("EMBEDDINGS_BACKEND") or "local"
    if backend == "local":  # the local backend ignores model/dimensions: one instance for every definition
        return find_service("embedder", backend)
    return find_service("embedder", backend, model or "", dimensions or 0)


def build_query_cache(config, redis_client=None) -> QueryEmbeddingCache:
    return QueryEmbeddingCache(ttl=float(config["EMBEDDINGS_QUERY_CACHE_TTL"]),
                               maxsize=int(config["EMBEDDINGS_QUERY_CACHE_SIZE"]), redis_client=redis_client)


def build_query_cache_service(config) -> QueryEmbeddingCache:
    """Factory of service `query_cache` (app.registry): in-process, plus Redis when REDIS_URL is set."""
    return build_query_cache(config, redis_cache_client(config.get("REDIS_URL")))


def get_query_cache() -> QueryEmbeddingCache:
    """The app's query-vector cache (service `query_cache`)."""
    return find_service("query_cache")


def redis_cache_client(url: str | None):
    """A Redis client for the query cache (None without a URL): fails fast rather than retrying."""
    if not url:
        return None
    # Short timeouts and no retries: a slow cache must cost less than the embedding it saves.
    return redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25, retry=Retry(NoBackoff(), 0))
