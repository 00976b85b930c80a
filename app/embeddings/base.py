"""The embedder interface and its errors.

An embedder turns a batch of texts into unit-length float vectors (cosine geometry: the pipeline
stores them in pgvector and ranks by cosine distance). Backends differ in where the model runs; the
callers (record pipeline, `$similar` queries) only see this interface and these errors.

Errors are split so a Celery task can retry exactly what is worth retrying:
`EmbedderTransientError` (connection trouble, 429, 5xx, timeouts) may succeed later;
any other `EmbedderError` (bad key, unknown model, rejected input) will not.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

from app.observability import metrics

Vector = list[float]


class EmbedderError(Exception):
    """An embedding request failed and retrying the same request will not help."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.status = status


class EmbedderTransientError(EmbedderError):
    """A failure that may clear by itself (network, rate limit, upstream 5xx): retry with backoff.

    `retry_after` is the delay in seconds the upstream asked for (429 Retry-After), if any.
    """

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None):
        super().__init__(message, status=status)
        self.retry_after = retry_after


class EmbedderConfigError(EmbedderError):
    """The embedder is not configured well enough to run (missing endpoint, unknown backend, …)."""


class Embedder(ABC):
    """Embeds texts into normalised vectors with one fixed model and dimension count."""

    #: Model name stored next to each vector (what actually produced it).
    model: str
    #: Largest number of texts sent to the model in one call; `embed` splits bigger inputs.
    max_batch_size: int

    @property
    @abstractmethod
    def dimensions(self) -> int | None:
        """Vector length this embedder produces; None while unknown (remote model, no dimensions set)."""

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Embed `texts` in order; one unit-length vector per text.

        Input is checked first: every item must be a non-blank string (a blank text has no meaning
        to embed, and remote APIs reject it) — an `EmbedderError` names the first bad index.
        """
        items = validate_texts(texts)
        vectors: list[Vector] = []
        for start in range(0, len(items), self.max_batch_size):
            vectors.extend(self._timed_batch(items[start:start + self.max_batch_size]))
        return vectors

    #: The `backend` label of gateway_embedding_request_duration_seconds.
    backend: str = "other"

    def _timed_batch(self, texts: list[str]) -> list[Vector]:
        started, outcome = time.perf_counter(), "error"
        try:
            vectors = self._embed_batch(texts)
            outcome = "ok"
            return vectors
        except EmbedderTransientError:
            outcome = "transient_error"
            raise
        finally:
            metrics.observe_embedding(self.backend, str(getattr(self, "model", "") or ""), outcome,
                                      time.perf_counter() - started)

    def embed_one(self, text: str) -> Vector:
        """Embed a single text (a `$similar` query)."""
        return self.embed([text])[0]

    @abstractmethod
    def _embed_batch(self, texts: list[str]) -> list[Vector]:
        """Embed at most `max_batch_size` validated texts."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} model={self.model!r} dimensions={self.dimensions}>"


def validate_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str | bytes):
        raise EmbedderError("texts must be a list of strings, not a single string")
    items = list(texts)
    for index, text in enumerate(items):
        if not isinstance(text, str):
            raise EmbedderError(f"text at index {index} is {type(text).__name__}, not a string")
        if not text.strip():
            raise EmbedderError(f"text at index {index} is blank")
    return items


def normalise(vector: Sequence[float]) -> Vector:
    """Scale to unit length so cosine distance = 1 - dot product; a zero or non-finite vector is an error."""
    values = [float(x) for x in vector]
    norm = math.sqrt(math.fsum(x * x for x in values))
    if not math.isfinite(norm) or norm == 0.0:
        raise EmbedderError("the model returned a zero or non-finite vector")
    return [x / norm for x in values]
