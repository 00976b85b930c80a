"""Image generation: validate in a fixed order (the first failure answers), load references, call the
provider, store, record.

Order of checks (all before any upstream call):
  1-4  provider, model, prompt, referenceImage/mask shape            -> 400 INVALID_INPUT
  5-8  mask without reference, mask for a provider without a mask-taking family, mask bytes,
       reference URL scheme/allowlist (plus family capabilities)      -> 400 VALIDATION_ERROR
  then size/quality/style for the model family                        -> 400 INVALID_INPUT
  then provider configured?                                           -> 503
  then reference/mask URLs are read (own blobs from storage, others through the SSRF-safe fetcher)
  and their bytes checked like inline bytes are, then the one upstream call.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import time
from dataclasses import dataclass, replace
from typing import Any

from flask import current_app
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app.config import csv_setting
from app.db import db
from app.errors import ApiError, InvalidInput, ServiceUnavailable, SystemFailure, ValidationFailed
from app.images.fetcher import REFUSED_MESSAGE, ReferenceFetcher, ReferenceRefused
from app.images.imaging import ImageInfo, NotAnImage, inspect_image
from app.images.models import ImageUsage
from app.images.providers import (
    Budget,
    ImageJob,
    ImageProvider,
    ProviderImage,
    get_provider,
    mask_refusal,
    provider_class,
    provider_ids,
)
from app.observability import metrics
from app.registry import find_service
from app.storage import BlobStore, get_blob_store
from app.storage.base import BlobNotFound, BlobStoreError
from app.storage.keys import image_key
from app.tenancy import Tenant

log = logging.getLogger(__name__)

SERVICE = "image-generation"
REFERENCE_MIME_TYPES = ("image/png", "image/jpeg")
MAX_PROMPT_CHARS = 4000
MAX_REFERENCE_BYTES = 20 * 1024 * 1024
_MAX_B64_CHARS = (MAX_REFERENCE_BYTES + 2) // 3 * 4
# Model ids go into upstream URL paths: deployment names and published model ids only.
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


@dataclass(frozen=True)
class _Source:
    """Where a reference or mask comes from: inline bytes, one of our blobs, or a fetched URL."""

    field: str
    data: bytes | None = None
    blob_key: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class ImagePlan:
    """A request that passed every static rule: what to call, with what."""

    provider: ImageProvider
    job: ImageJob
    reference: _Source | None
    mask: _Source | None
    declared_mime: str | None = None  # referenceImage.mimeType as the caller sent it

    @property
    def mode(self) -> str:
        return "edit" if self.reference is not None else "generate"


# -- entry point ---------------------------------------------------------------------------------

def generate_image(payload: dict[str, Any], tenant: Tenant) -> dict[str, Any]:
    """Validate, call the provider, store the image; returns the ImageResult dict."""
    started = time.monotonic()
    budget = Budget(float(current_app.config["IMAGE_TIMEOUT_SECONDS"]))
    store = get_blob_store()
    plan = validate_request(payload, store, get_fetcher())
    try:
        result = _run(plan, tenant, store, budget)
    except ApiError as exc:
        _record_usage(tenant, plan, started, outcome=exc.code, status=exc.status)
        raise
    except Exception:
        _record_usage(tenant, plan, started, outcome="SYSTEM_ERROR", status=500)
        raise
    _record_usage(tenant, plan, started, outcome="success", status=200, usage=result.get("usage"),
                  image_bytes=result["bytes"])
    return result


def build_fetcher(config) -> ReferenceFetcher:
    """The reference fetcher: our own blob host plus IMAGE_REF_ALLOWED_HOSTS."""
    return ReferenceFetcher([get_blob_store().public_host, *csv_setting(config["IMAGE_REF_ALLOWED_HOSTS"])])


def get_fetcher() -> ReferenceFetcher:
    """The app's reference fetcher (service `image_fetcher`; tests override it with a loopback-only one)."""
    return find_service("image_fetcher")


# -- validation (no I/O beyond base64 decoding) --------------------------------------------------

def validate_request(payload: dict[str, Any], store: BlobStore, fetcher: ReferenceFetcher) -> ImagePlan:
    """Apply the rules in order; raises the first failure. The order: provider, model and prompt; each
    of referenceImage/mask with exactly one of url/b64 (and a PNG/JPEG mimeType); a mask only with a
    reference and a provider that takes masks; the model's capabilities; inline bytes (an image, the
    mask the reference's size); URLs (scheme and allowed host, on their text); the model's options."""
    provider_name, model, prompt = _check_basics(payload)
    reference_in, mask_in = payload.get("referenceImage"), payload.get("mask")
    if reference_in is not None:
        _check_one_of(reference_in, "referenceImage")
        if reference_in.get("mimeType") not in REFERENCE_MIME_TYPES:
            raise InvalidInput("referenceImage.mimeType must be image/png or image/jpeg.",
                               {"field": "referenceImage.mimeType"})
    if mask_in is not None:
        _check_one_of(mask_in, "mask")
    # a mask needs a reference, and a provider that takes masks
    if mask_in is not None and reference_in is None:
        raise ValidationFailed("mask requires referenceImage (a mask only applies to an edit).", {"field": "mask"})
    if mask_in is not None and not provider_class(provider_name).takes_mask():
        raise mask_refusal()
    provider = get_provider(provider_name)
    provider.check_capabilities(model, reference=reference_in is not None, mask=mask_in is not None)
    # inline bytes (decoded and checked), then URLs (scheme and allowed host, on their text)
    reference = _inline_source(reference_in, "referenceImage")
    mask = _inline_source(mask_in, "mask")
    job = ImageJob(model=model, prompt=prompt, size=payload.get("size"), quality=payload.get("quality"),
                   style=payload.get("style"), negative_prompt=payload.get("negativePrompt"))
    if reference is not None and reference.data is not None:
        job = _with_reference(job, reference.data, reference_in["mimeType"], url_sourced=False)
    if mask is not None and mask.data is not None:
        _check_mask(mask.data, job, url_sourced=False)
    reference = _url_source(reference_in, reference, "referenceImage", store, fetcher)
    mask = _url_source(mask_in, mask, "mask", store, fetcher)
    provider.check_options(job)
    return ImagePlan(provider, replace(job, mask=mask.data if mask else None), reference, mask,
                     reference_in["mimeType"] if reference_in is not None else None)


def _check_basics(payload: dict[str, Any]) -> tuple[str, str, str]:
    provider = payload.get("provider")
    if provider not in provider_ids():
        raise InvalidInput(f"provider must be one of: {', '.join(provider_ids())}.", {"field": "provider"})
    model = (payload.get("model") or "").strip()
    if not model:
        raise InvalidInput("model is required (the provider's deployment id or model name).", {"field": "model"})
    if not _MODEL_ID.match(model):
        raise InvalidInput(f"Unknown model '{model[:140]}'.", {"field": "model"})
    prompt = payload.get("prompt") or ""
    if not prompt.strip():
        raise InvalidInput("prompt is required.", {"field": "prompt"})
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidInput(f"prompt is longer than {MAX_PROMPT_CHARS} characters.",
                           {"field": "prompt", "maxLength": MAX_PROMPT_CHARS, "length": len(prompt)})
    return provider, model, prompt


def _check_one_of(obj: dict[str, Any], field: str) -> None:
    has_url, has_b64 = bool(obj.get("url")), bool(obj.get("b64"))
    if has_url == has_b64:
        raise InvalidInput(f"{field} needs exactly one of url and b64.", {"field": field})


def _inline_source(obj: dict[str, Any] | None, field: str) -> _Source | None:
    if obj is None:
        return None
    if obj.get("url"):
        return _Source(field, url=obj["url"])
    text = obj["b64"]
    if len(text) > _MAX_B64_CHARS:
        raise ValidationFailed(f"{field}.b64 is larger than {MAX_REFERENCE_BYTES // (1024 * 1024)} MB.",
                               {"field": f"{field}.b64"})
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationFailed(f"{field}.b64 is not valid base64 (standard alphabet, padded, no data: prefix).",
                               {"field": f"{field}.b64"}) from None
    return _Source(field, data=data)


def _url_source(obj, source: _Source | None, field: str, store: BlobStore, fetcher: ReferenceFetcher):
    """URL references: our own blob URLs are read from storage; other URLs must pass the fetcher's text checks."""
    if source is None or source.url is None:
        return source
    key = store.key_for_url(source.url)
    if key is not None:
        return replace(source, blob_key=key)
    try:
        fetcher.check_url(source.url)
    except ReferenceRefused as exc:
        log.info("%s.url refused before fetch: %s", field, exc.reason)
        raise ValidationFailed(REFUSED_MESSAGE, {"field": f"{field}.url"}) from None
    return source


def _with_reference(job: ImageJob, data: bytes, declared_mime: str, *, url_sourced: bool) -> ImageJob:
    info = _inspect(data, "referenceImage", url_sourced)
    if info.mime_type != declared_mime:
        raise ValidationFailed(f"referenceImage.mimeType is {declared_mime} but the bytes are {info.mime_type}.",
                               {"field": "referenceImage.mimeType"})
    return replace(job, reference=data, reference_mime=info.mime_type, reference_size=(info.width, info.height))


def _check_mask(data: bytes, job: ImageJob, *, url_sourced: bool) -> None:
    """Rule 7: a real PNG with an alpha channel, the size of the reference."""
    info = _inspect(data, "mask", url_sourced)
    if info.mime_type != "image/png":
        raise ValidationFailed("mask must be a PNG.", {"field": "mask"})
    if not info.has_alpha:
        raise ValidationFailed("mask must have an alpha channel (alpha 0 marks the area to repaint).",
                               {"field": "mask"})
    if job.reference_size is not None and job.reference_size != (info.width, info.height):
        width, height = job.reference_size
        raise ValidationFailed(f"mask is {info.width}x{info.height} but the reference image is "
                               f"{width}x{height}; they must match.", {"field": "mask"})


def _inspect(data: bytes, field: str, url_sourced: bool) -> ImageInfo:
    if len(data) > MAX_REFERENCE_BYTES:
        raise ValidationFailed(f"{field} is larger than 20 MB.", {"field": field})
    try:
        return inspect_image(data)
    except NotAnImage:
        if url_sourced:  # the uniform refusal: nothing about what the URL served
            raise ValidationFailed(REFUSED_MESSAGE, {"field": f"{field}.url"}) from None
        kinds = "PNG" if field == "mask" else "PNG or JPEG"
        raise ValidationFailed(f"{field} is not a decodable {kinds} image.", {"field": field}) from None


# -- the call ------------------------------------------------------------------------------------

def _run(plan: ImagePlan, tenant: Tenant, store: BlobStore, budget: Budget) -> dict[str, Any]:
    provider, job = plan.provider, plan.job
    if not provider.configured:
        raise ServiceUnavailable(f"{provider.id} is not configured on this deployment.",
                                 {"provider": provider.id})
    job = _load_urls(plan, store, budget)
    image = _call_provider(provider, job, budget)
    try:
        info = inspect_image(image.data, decode=False)
    except NotAnImage:
        raise ServiceUnavailable(f"{provider.id} returned bytes that are not a PNG or JPEG image.",
                                 {"provider": provider.id}) from None
    budget.require("storing the image")
    try:
        url = store.put(image_key(tenant.org_id, info.mime_type), image.data, info.mime_type)
    except BlobStoreError as exc:
        log.error("storing an image failed: %s", exc)
        raise SystemFailure("Storing the generated image failed.") from None
    result: dict[str, Any] = {"url": url, "mimeType": info.mime_type, "bytes": len(image.data),
                              "width": info.width, "height": info.height}
    if image.revised_prompt:
        result["revisedPrompt"] = image.revised_prompt
    result.update(provider=provider.id, model=job.model, mode=job.mode)
    if image.usage is not None:
        result["usage"] = image.usage
    return result


def _call_provider(provider: ImageProvider, job: ImageJob, budget: Budget) -> ProviderImage:
    """`provider.generate`, timed by provider, model family and outcome (gateway_image_provider_*)."""
    started, outcome = time.perf_counter(), "error"
    try:
        image = provider.generate(job, budget)
        outcome = "ok"
        return image
    except ApiError as exc:
        outcome = exc.code
        raise
    finally:
        metrics.observe_image_call(provider.id, provider.family(job.model).key, outcome,
                                   time.perf_counter() - started)


def _load_urls(plan: ImagePlan, store: BlobStore, budget: Budget) -> ImageJob:
    job = plan.job
    if plan.reference is not None and plan.reference.data is None:
        data = _read_source(plan.reference, store, budget)
        job = _with_reference(job, data, plan.declared_mime or "", url_sourced=True)
    if plan.mask is not None and plan.mask.data is None:
        data = _read_source(plan.mask, store, budget)
        _check_mask(data, job, url_sourced=True)
        job = replace(job, mask=data)
    elif plan.mask is not None and plan.reference is not None and plan.reference.data is None:
        _check_mask(plan.mask.data or b"", job, url_sourced=False)  # reference came by URL: sizes now known
    return job


def _read_source(source: _Source, store: BlobStore, budget: Budget) -> bytes:
    if source.blob_key is not None:
        try:
            return store.get(source.blob_key)
        except BlobNotFound:
            raise ValidationFailed(REFUSED_MESSAGE, {"field": f"{source.field}.url"}) from None
        except BlobStoreError as exc:
            log.error("reading %s from blob storage failed: %s", source.blob_key, exc)
            raise SystemFailure("Reading the reference image from blob storage failed.") from None
    left = budget.require("fetching the reference image")
    try:
        data = get_fetcher().fetch(source.url or "", budget_seconds=left)
    except ReferenceRefused as exc:
        metrics.count_reference_fetch("refused")
        log.info("%s.url refused: %s", source.field, exc.reason)
        raise ValidationFailed(REFUSED_MESSAGE, {"field": f"{source.field}.url"}) from None
    except Exception:
        metrics.count_reference_fetch("error")
        raise
    metrics.count_reference_fetch("ok")
    return data


# -- usage ---------------------------------------------------------------------------------------

def _record_usage(tenant: Tenant, plan: ImagePlan, started: float, *, outcome: str, status: int,
                  usage: dict[str, int] | None = None, image_bytes: int | None = None) -> None:
    """One usage line per call that passed validation; a failure to record never fails the call."""
    usage = usage or {}
    line = ImageUsage(org_id=tenant.org_id, user_id=tenant.user_id, service=SERVICE,
                      provider=plan.provider.id, model=plan.job.model, mode=plan.mode,
                      outcome=outcome, http_status=status, input_tokens=usage.get("inputTokens", 0),
                      output_tokens=usage.get("outputTokens", 0), total_tokens=usage.get("totalTokens", 0),
                      latency_ms=int((time.monotonic() - started) * 1000), image_bytes=image_bytes)
    try:
        # its own unit of work: the line of a call that failed is kept while the request rolls back
        with db.product_session(tenant.product) as session:
            # A usage line is analytics: do not wait for the WAL flush (a crash may lose the last few lines).
            session.execute(text("SET LOCAL synchronous_commit = off"))
            session.add(line)
    except SQLAlchemyError:
        log.exception("recording image usage failed (org %s)", tenant.org_id)
