"""The image provider interface and registry, the call budget and the shared upstream HTTP client.

Each adapter is one module of this package: a `@register`ed `ImageProvider` subclass declaring its
`id` (the request's `provider`), its model `families` (what each takes: a reference image, a mask;
and how an error names it) and `from_config` (its settings). It turns an `ImageJob` into the
provider's wire request and the provider's answer (or error) into a `ProviderImage` (or one of our
`ApiError`s). What the service says about the providers as a whole (which ids exist, which take a
mask, which to use instead) is derived from the registry. `UpstreamClient` owns what the adapters
share: one pooled `requests.Session` per provider, the budget-aware timeouts, and the retry rule (at
most one retry, only after a connection failure or a 5xx, only when the budget still has room).
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import requests
from requests.adapters import HTTPAdapter

from app.errors import GatewayTimeout, InvalidInput, ServiceUnavailable, ValidationFailed

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
RETRY_BACKOFF = 0.5
MIN_RETRY_BUDGET = 1.0  # a retry with less room than this cannot finish; answer instead
MAX_UPSTREAM_BYTES = 100 * 1024 * 1024
DEFAULT_RETRY_AFTER = 10


class Budget:
    """The time left for one image call (fetch + upstream + store)."""

    def __init__(self, seconds: float, clock=time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.deadline = clock() + seconds

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def require(self, what: str) -> float:
        """Seconds left, or 504 when the budget is spent."""
        left = self.remaining()
        if left <= 0:
            raise GatewayTimeout(f"The image call exceeded the {self.seconds:g} second budget ({what}).")
        return left


@dataclass(frozen=True)
class ImageJob:
    """One validated image request, with reference and mask bytes already decoded."""

    model: str
    prompt: str
    size: str | None = None
    quality: str | None = None
    style: str | None = None
    negative_prompt: str | None = None
    reference: bytes | None = None
    reference_mime: str | None = None
    reference_size: tuple[int, int] | None = None  # (width, height) from the decode
    mask: bytes | None = None

    @property
    def mode(self) -> str:
        return "edit" if self.reference is not None else "generate"


@dataclass(frozen=True)
class ProviderImage:
    data: bytes
    revised_prompt: str | None = None
    usage: dict[str, int] | None = None


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    headers: Any  # case-insensitive mapping
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass(frozen=True)
class ModelFamily:
    """Models of one provider that take the same inputs and options."""

    key: str  # e.g. "general"; "<id> (<key> model)" names it where the mask rule lists the families taking one
    wording: str  # how an error names it: "the provider-a general model" (or just the provider's id)
    edit: bool = True  # takes a reference image (edit mode)
    mask: bool = False  # takes an inpainting mask with the reference


class ImageProvider(ABC):
    """An upstream image API behind the one interface the service uses."""

    id: ClassVar[str]  # the request's `provider`
    families: ClassVar[tuple[ModelFamily, ...]]  # its model families; `family(model)` picks one

    @classmethod
    @abstractmethod
    def from_config(cls, config) -> ImageProvider:
        """The adapter built from the app's settings (app.config; service `image_provider`)."""

    @property
    @abstractmethod
    def configured(self) -> bool:
        """False when the settings this provider needs are missing (the call answers 503)."""

    @classmethod
    def takes_mask(cls) -> bool:
        return any(family.mask for family in cls.families)

    def family(self, model: str) -> ModelFamily:
        """The family of `model` (a provider with one family: that one)."""
        return self.families[0]

    def check_capabilities(self, model: str, *, reference: bool, mask: bool) -> None:
        """Raise ValidationFailed for inputs the model family cannot take (reference, mask)."""
        family = self.family(model)
        if (reference or mask) and not family.edit:
            raise ValidationFailed(f"{_capitalised(family.wording)} does not support reference images or masks; "
                                   f"use {_wordings(lambda f: f.edit)}.", {"field": "referenceImage", "model": model})
        if mask and not family.mask:
            raise ValidationFailed(f"{_capitalised(family.wording)} does not support masks; "
                                   f"use {_wordings(lambda f: f.mask)}.", {"field": "mask", "model": model})

    @abstractmethod
    def check_options(self, job: ImageJob) -> None:
        """Raise InvalidInput for a size/quality/style value the model family does not accept."""

    @abstractmethod
    def generate(self, job: ImageJob, budget: Budget) -> ProviderImage:
        """Call the upstream once (plus at most one retry) and return the image bytes."""


_PROVIDERS: dict[str, type[ImageProvider]] = {}


def register(cls: type[ImageProvider]) -> type[ImageProvider]:
    """Class decorator: requests naming `cls.id` as their `provider` are served by `cls`."""
    if cls.id in _PROVIDERS and _PROVIDERS[cls.id] is not cls:
        raise RuntimeError(f"two image providers declare the id {cls.id!r}")
    _PROVIDERS[cls.id] = cls
    return cls


def provider_ids() -> list[str]:
    """The registered provider ids, sorted (the order every message and the OpenAPI enum list them in)."""
    return sorted(_PROVIDERS)


def provider_class(provider_id: str) -> type[ImageProvider]:
    return _PROVIDERS[provider_id]


def mask_refusal() -> ValidationFailed:
    """A mask for a provider none of whose families takes one (a mask is refused before any call)."""
    takers = [f"{cls.id} ({family.key} model)" if len(cls.families) > 1 else cls.id
              for cls in map(provider_class, provider_ids()) for family in cls.families if family.mask]
    return ValidationFailed(f"mask is supported only by {' or '.join(takers)}.", {"field": "mask"})


def _wordings(can) -> str:
    """The families of every provider that `can` (ModelFamily -> bool), as an error names them."""
    return " or ".join(family.wording for cls in map(provider_class, provider_ids()) for family in cls.families
                       if can(family))


def _capitalised(wording: str) -> str:
    return wording[:1].upper() + wording[1:]


def reject_option(field: str, value: str, accepted: list[str], family: str) -> None:
    raise InvalidInput(f"{field} '{value}' is not accepted by {family}; use one of: {', '.join(accepted)}.",
                       {"field": field, "accepted": accepted})


def retry_after_seconds(headers) -> int | None:
    """Seconds from `retry-after-ms` or `Retry-After` (delta seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(1, math.ceil(float(millis) / 1000))
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return max(1, int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(1, math.ceil(when.timestamp() - time.time()))


def unavailable(provider: str, message: str, status: int | None, headers=None) -> ServiceUnavailable:
    """503 with the retry hint in `details` (and a Retry-After header)."""
    retry_after = (retry_after_seconds(headers) if headers is not None else None) or DEFAULT_RETRY_AFTER
    details: dict[str, Any] = {"provider": provider, "retryable": True, "retryAfterSeconds": retry_after}
    if status is not None:
        details["upstreamStatus"] = status
    return ServiceUnavailable(message, details, headers={"Retry-After": str(retry_after)})


def upstream_error(provider: str, response: UpstreamResponse) -> tuple[dict[str, Any], str]:
    """The provider's `error` object and its message (both APIs answer `{error: {..., message}}`)."""
    payload = response.json()
    error = payload.get("error") if isinstance(payload, dict) else None
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message") or f"{provider} answered HTTP {response.status}.")[:1000]
    return error, message


def service_error(provider: str, response: UpstreamResponse, message: str) -> ServiceUnavailable | None:
    """The answers the caller cannot fix: 429 and 5xx (retry hint), 401/403 (our credentials)."""
    if response.status == 429:
        return unavailable(provider, f"{provider} is rate limiting requests; retry later.", 429, response.headers)
    if response.status >= 500:
        return unavailable(provider, f"{provider} failed (HTTP {response.status}); retry later.",
                           response.status, response.headers)
    if response.status in (401, 403):
        # the upstream's text may describe our key; it is logged, not returned
        log.error("%s rejected the gateway's credentials (HTTP %s): %s", provider, response.status, message)
        return ServiceUnavailable(f"{provider} rejected the gateway's credentials.",
                                  {"provider": provider, "upstreamStatus": response.status})
    return None


class UpstreamClient:
    """HTTP to one provider: pooled connections, budget-bounded timeouts, the one-retry rule."""

    # as many pooled connections as a gunicorn worker has threads (docker/gunicorn.conf.py)
    def __init__(self, provider: str, base_url: str = "", pool_size: int = 128) -> None:
        self.provider = provider
        self.session = requests.Session()
        # Proxy and CA settings from the environment are read once for the provider's endpoint, not
        # on every call (requests re-scans os.environ per request when trust_env is on).
        self.session.trust_env = False
        if base_url:
            self.session.proxies = requests.utils.get_environ_proxies(base_url)
        self.session.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0, pool_block=False)
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)

    def post(self, url: str, budget: Budget, **kwargs) -> UpstreamResponse:
        """POST with at most one retry (connection failure or 5xx) inside the budget."""
        for attempt in (1, 2):
            may_retry = attempt == 1
            try:
                response = self._attempt(url, budget, **kwargs)
            except _ConnectionFailed as exc:
                if may_retry and self._room_for_retry(budget):
                    log.warning("%s: connection failed (%s); retrying once", self.provider, exc)
                    continue
                raise unavailable(self.provider, f"{self.provider} could not be reached.", None) from None
            if response.status >= 500 and may_retry and self._room_for_retry(budget):
                log.warning("%s: upstream answered %s; retrying once", self.provider, response.status)
                continue
            return response
        raise AssertionError("unreachable")

    def _room_for_retry(self, budget: Budget) -> bool:
        if budget.remaining() <= MIN_RETRY_BUDGET + RETRY_BACKOFF:
            return False
        time.sleep(RETRY_BACKOFF)
        return True

    def _attempt(self, url: str, budget: Budget, **kwargs) -> UpstreamResponse:
        left = budget.require("waiting for the provider")
        try:
            response = self.session.post(url, timeout=(min(CONNECT_TIMEOUT, left), left), stream=True,
                                         allow_redirects=False, **kwargs)
        except requests.exceptions.ConnectTimeout as exc:
            raise _ConnectionFailed(str(exc)) from None
        except requests.exceptions.Timeout:
            raise self._timeout(budget) from None
        except requests.exceptions.ConnectionError as exc:
            raise _ConnectionFailed(str(exc)) from None
        try:
            body = self._read(response, budget)
        finally:
            response.close()
        return UpstreamResponse(response.status_code, response.headers, body)

    def _read(self, response: requests.Response, budget: Budget) -> bytes:
        chunks, total = [], 0
        try:
            for chunk in response.iter_content(256 * 1024):
                total += len(chunk)
                if total > MAX_UPSTREAM_BYTES:
                    raise unavailable(self.provider, f"{self.provider} sent an oversized response.",
                                      response.status_code)
                chunks.append(chunk)
                if budget.remaining() <= 0:
                    raise self._timeout(budget)
        except requests.exceptions.Timeout:
            raise self._timeout(budget) from None
        except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
            raise _ConnectionFailed(str(exc)) from None
        return b"".join(chunks)

    def _timeout(self, budget: Budget) -> GatewayTimeout:
        return GatewayTimeout(f"{self.provider} did not answer within the {budget.seconds:g} second budget.",
                              {"provider": self.provider, "timeoutSeconds": budget.seconds})


class _ConnectionFailed(Exception):
    pass
