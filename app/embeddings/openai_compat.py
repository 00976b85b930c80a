"""The `openai` backend: any OpenAI-compatible embeddings endpoint (OpenAI, Azure OpenAI, self-hosted).

Wire format: `POST {endpoint}/embeddings` with `{"model", "input": [...], "dimensions"?}` →
`{"data": [{"embedding", "index"}], "model", "usage"}`. `endpoint` is the API base (`…/v1`). An Azure
deployment URL works too: a query string on the endpoint (`…/deployments/NAME?api-version=…`) is
kept after the `/embeddings` path. Authentication is `Authorization: Bearer KEY`, or Azure's
`api-key: KEY` header (EMBEDDINGS_AUTH_HEADER; `auto` picks `api-key` for *.azure.com hosts).

Failures are classified for the Celery pipeline: connection errors, timeouts, 408, 429 (with its
Retry-After) and 5xx are `EmbedderTransientError`; other 4xx, quota exhaustion and malformed
answers are permanent `EmbedderError`. The API key never appears in an error message.
"""

from __future__ import annotations

import email.utils
import logging
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from app.embeddings.base import (
    Embedder,
    EmbedderConfigError,
    EmbedderError,
    EmbedderTransientError,
    Vector,
    normalise,
)

log = logging.getLogger(__name__)

DEFAULT_OPENAI_MODEL = "text-embedding-3-large"
# Native sizes of the well-known models, so the dimension is known before the first call.
KNOWN_DIMENSIONS = {"text-embedding-3-large": 3072, "text-embedding-3-small": 1536, "text-embedding-ada-002": 1536}
# OpenAI accepts up to 2048 inputs per request; a smaller configured batch size always wins.
API_MAX_INPUTS = 2048
TRANSIENT_STATUSES = {408, 425, 429}  # and every 5xx
# OpenAI answers 429 for an exhausted quota as well; waiting does not refill it.
PERMANENT_ERROR_CODES = {"insufficient_quota", "billing_hard_limit_reached"}
AUTH_HEADERS = ("auto", "bearer", "api-key")


class OpenAICompatibleEmbedder(Embedder):
    """Embeds through an OpenAI-compatible HTTP API, batching by `max_batch_size` inputs per request."""

    backend = "openai"

    def __init__(self, endpoint: str, api_key: str = "", *, model: str = DEFAULT_OPENAI_MODEL,
                 dimensions: int | None = None, max_batch_size: int = 64, timeout: float = 30.0,
                 auth_header: str = "auto", session: requests.Session | None = None):
        if not endpoint:
            raise EmbedderConfigError("EMBEDDINGS_ENDPOINT is not set (the openai backend needs an API base URL)")
        parts = urlsplit(endpoint.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise EmbedderConfigError(f"EMBEDDINGS_ENDPOINT must be an http(s) URL, got {endpoint!r}")
        if auth_header not in AUTH_HEADERS:
            raise EmbedderConfigError(f"EMBEDDINGS_AUTH_HEADER must be one of {', '.join(AUTH_HEADERS)}")
        if dimensions is not None and dimensions < 1:
            raise EmbedderConfigError("dimensions must be a positive integer")
        if max_batch_size < 1:
            raise EmbedderConfigError("max batch size must be at least 1")
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/embeddings", parts.query, ""))
        self.model = model or DEFAULT_OPENAI_MODEL
        self.requested_dimensions = dimensions
        self.max_batch_size = min(max_batch_size, API_MAX_INPUTS)
        # Connect quickly or give up; the read budget covers a large batch on a busy upstream.
        self.timeout = (min(5.0, timeout), timeout)
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            if auth_header == "auto":
                auth_header = "api-key" if parts.hostname and parts.hostname.endswith(".azure.com") else "bearer"
            if auth_header == "api-key":
                self._headers["api-key"] = api_key
            else:
                self._headers["Authorization"] = f"Bearer {api_key}"
        self._session = session or _pooled_session()
        self._seen_dimensions: int | None = None

    @classmethod
    def from_config(cls, config, *, model: str | None = None,
                    dimensions: int | None = None) -> OpenAICompatibleEmbedder:
        """Settings from config; `model`/`dimensions` (a definition's embeddingsConfig) override the defaults."""
        return cls(config["EMBEDDINGS_ENDPOINT"], config["EMBEDDINGS_API_KEY"],
                   model=model or config["EMBEDDINGS_MODEL"] or DEFAULT_OPENAI_MODEL,
                   dimensions=dimensions or int(config["EMBEDDINGS_DIMENSIONS"]) or None,
                   max_batch_size=int(config["EMBEDDINGS_BATCH_SIZE"]),
                   timeout=float(config["EMBEDDINGS_TIMEOUT_SECONDS"]),
                   auth_header=config["EMBEDDINGS_AUTH_HEADER"])

    @property
    def dimensions(self) -> int | None:
        return self.requested_dimensions or KNOWN_DIMENSIONS.get(self.model) or self._seen_dimensions

    def _embed_batch(self, texts: list[str]) -> list[Vector]:
        body: dict[str, Any] = {"model": self.model, "input": texts}
        if self.requested_dimensions:
            body["dimensions"] = self.requested_dimensions
        try:
            response = self._session.post(self.url, json=body, headers=self._headers, timeout=self.timeout)
        except requests.Timeout as exc:
            raise EmbedderTransientError(f"embeddings endpoint timed out: {type(exc).__name__}") from exc
        except requests.ConnectionError as exc:
            raise EmbedderTransientError(f"cannot reach the embeddings endpoint: {type(exc).__name__}") from exc
        except requests.RequestException as exc:
            raise EmbedderError(f"embeddings request failed: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise _status_error(response)
        return self._parse(response, len(texts))

    def _parse(self, response: requests.Response, expected: int) -> list[Vector]:
        try:
            payload = response.json()
            items = payload["data"]
            by_index = {int(item["index"]): item["embedding"] for item in items}
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbedderError("the embeddings endpoint returned a malformed response", status=200) from exc
        if sorted(by_index) != list(range(expected)) or len(items) != expected:
            raise EmbedderError(f"the embeddings endpoint returned {len(items)} vectors for {expected} inputs",
                                status=200)
        vectors = []
        for index in range(expected):
            raw = by_index[index]
            if not isinstance(raw, list) or not raw or not all(isinstance(x, int | float) for x in raw):
                raise EmbedderError(f"embedding {index} is not a list of numbers (encoding_format must be float)",
                                    status=200)
            vectors.append(normalise(raw))
        lengths = {len(v) for v in vectors}
        wanted = self.requested_dimensions
        if len(lengths) != 1 or (wanted and lengths != {wanted}):
            raise EmbedderError(f"the embeddings endpoint returned vectors of {sorted(lengths)} dimensions"
                                + (f", expected {wanted}" if wanted else ""), status=200)
        self._seen_dimensions = lengths.pop()
        return vectors


def _pooled_session() -> requests.Session:
    session = requests.Session()
    # Retry only failed *connects* (nothing reached the server); anything later is the caller's call.
    retry = Retry(total=2, connect=2, read=False, status=0, other=0, redirect=0, backoff_factor=0.2,
                  allowed_methods=None, raise_on_status=False)
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=16, max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _status_error(response: requests.Response) -> EmbedderError:
    status = response.status_code
    code, detail = _upstream_error(response)
    message = f"embeddings endpoint answered {status}" + (f": {detail}" if detail else "")
    if (status in TRANSIENT_STATUSES or status >= 500) and code not in PERMANENT_ERROR_CODES:
        return EmbedderTransientError(message, status=status, retry_after=_retry_after(response))
    return EmbedderError(message, status=status)


def _upstream_error(response: requests.Response) -> tuple[str | None, str]:
    """The OpenAI error body `{"error": {"message", "code", "type"}}`, shortened; plain text otherwise."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None, response.text[:200].strip()
    if isinstance(error, dict):
        return error.get("code") or error.get("type"), str(error.get("message") or "")[:300]
    return None, str(error or "")[:300]


def _retry_after(response: requests.Response) -> float | None:
    """Seconds to wait from `retry-after-ms` (Azure) or `Retry-After` (seconds or an HTTP date)."""
    millis = response.headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
